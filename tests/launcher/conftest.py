"""Helpers for launcher tests: run torchcomms-run in real processes, and network
namespaces as hosts (root + ``ip netns``; skipped cleanly otherwise)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.ports import free_port  # noqa: F401 - the launcher tests import it from here

WORKERS = Path(__file__).parent / "workers"
REPO = Path(__file__).resolve().parents[2]


def worker(name: str) -> str:
    return str(WORKERS / name)


def communicate_all(procs: Sequence[subprocess.Popen], timeout: float) -> list[tuple[str, str]]:
    """Every agent's (stdout, stderr) once all exited; past ``timeout`` they are killed and
    the assertion shows what each had said (a bare TimeoutExpired shows nothing)."""
    deadline = time.monotonic() + timeout
    try:
        return [p.communicate(timeout=max(0.1, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        outs = [p.communicate() for p in procs]
        said = "\n".join(f"--- agent {i} stderr:\n{err[-3000:]}" for i, (_, err) in enumerate(outs))
        raise AssertionError(f"the agents had not all exited after {timeout:g} s:\n{said}") from None


def launcher_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher", *args]


#: MCA parameters that Open MPI's mpiexec sets for the ranks of its job
_OMPI_JOB_PARAMETERS = ("OMPI_MCA_orte_", "OMPI_MCA_prte_", "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_initial_wdir")


def _outer_job_variable(key: str) -> bool:
    """A variable by which an outer launcher describes its job to its ranks. Open MPI's own
    configuration (``OMPI_MCA_*``, e.g. a machine's ``plm_rsh_agent`` where there is no ssh)
    stays, except the parameters mpiexec writes for the ranks it starts."""
    if key.startswith(("TORCHCOMM_", "TORCHELASTIC_", "SLURM_", "PMI_", "PMIX_")):
        return True
    if key.startswith("OMPI_"):
        return not key.startswith("OMPI_MCA_") or key.startswith(_OMPI_JOB_PARAMETERS)
    return False


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):  # never let an outer launcher's job leak into ours
        if _outer_job_variable(key):
            del env[key]
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_launcher(*args: str, timeout: float = 120, env: dict[str, str] | None = None,
                 ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(launcher_cmd(*args), capture_output=True, text=True,
                          timeout=timeout, env=env or base_env(), cwd=REPO)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def read_pids(directory: Path, count: int, timeout: float = 60) -> list[int]:
    assert wait_for(lambda: len(list(directory.glob("*.pid"))) >= count, timeout), \
        f"workers did not write {count} pid files in {directory}"
    time.sleep(0.05)
    return sorted(int(p.read_text()) for p in directory.glob("*.pid"))


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.secret"
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return path


# ---------------------------------------------------------------------- network namespaces


@dataclass
class NetHost:
    """One network namespace standing in for a node."""

    ns: str
    ip: str
    veth: str  # root-namespace end of its link (set it down to cut the node off)
    name: str
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen[str]:
        cmd = ["ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c",
               f'hostname {self.name} && exec "$@"', "sh", *argv]
        proc = subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=kwargs.pop("env", base_env()),
                                cwd=REPO, **kwargs)
        self.procs.append(proc)
        return proc

    def cut(self) -> None:
        subprocess.run(["ip", "link", "set", self.veth, "down"], check=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _netns_usable() -> str | None:
    if os.geteuid() != 0:
        return "network-namespace tests need root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "network-namespace tests need iproute2 (ip) and util-linux (unshare)"
    probe = f"tcprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"ip netns is unavailable here: {getattr(exc, 'stderr', exc)}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@pytest.fixture
def netns_hosts(request: pytest.FixtureRequest) -> Iterator[list[NetHost]]:
    """``@pytest.mark.parametrize("netns_hosts", [3], indirect=True)`` for 3 hosts (default 2)."""
    reason = _netns_usable()
    if reason:
        pytest.skip(reason)
    count = getattr(request, "param", 2)
    tag = f"{os.getpid() % 100000}{secrets.token_hex(2)}"
    bridge = f"b{tag}"
    hosts: list[NetHost] = []
    created_ns: list[str] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "set", bridge, "up")
        for i in range(count):
            ns, veth, peer = f"tc{tag}n{i}", f"v{tag}{i}", f"p{tag}{i}"
            _ip("netns", "add", ns)
            created_ns.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", ns)
            _ip("-n", ns, "link", "set", peer, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"10.77.0.{i + 1}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "set", veth, "master", bridge)
            _ip("link", "set", veth, "up")
            hosts.append(NetHost(ns=ns, ip=f"10.77.0.{i + 1}", veth=veth, name=f"node{i}"))
        yield hosts
    finally:
        for h in hosts:
            for p in h.procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=10)
        for ns in created_ns:
            # kill anything still inside the namespace, then remove it
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        for i in range(count):
            subprocess.run(["ip", "link", "del", f"v{tag}{i}"], capture_output=True)


def sigterm_once_started(directory: Path, workers: int, *launcher_args: str, env: dict[str, str]) -> tuple[int, str]:
    """Run the launcher, send it SIGTERM once ``workers`` workers wrote their pid files in
    ``directory``, and return its exit code and stderr."""
    agent = subprocess.Popen(launcher_cmd(*launcher_args), env=env, cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        read_pids(directory, workers)
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
    return agent.returncode, err
