"""The agent's watcher (launcher/watcher.py): what the workers started dies with a SIGKILLed
agent; a normal exit kills nothing; which processes are the job's."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from launcher.watcher import MARK_VAR, Proc, job_targets

from conftest import REPO, base_env, launcher_cmd, pid_alive, read_pids, wait_for, worker
from tests.helpers.cpu_load import oversubscribed


def _proc(pid: int, ppid: int = 1, pgrp: int | None = None, session: int = 100, start: int = 7,
          marked: bool = False, zombie: bool = False) -> Proc:
    return Proc(pid=pid, ppid=ppid, pgrp=pid if pgrp is None else pgrp, session=session, start=start,
                zombie=zombie, marked=marked)


def _kids(directory: Path, ranks: int) -> list[int]:
    assert wait_for(lambda: len(list(directory.glob("*.kids"))) >= ranks, 60), "the workers never started their kids"
    return [int(p) for f in sorted(directory.glob("*.kids")) for p in f.read_text().split()]


def test_the_job_is_the_marked_processes_the_worker_groups_and_what_they_lead_or_started() -> None:
    procs = {p.pid: p for p in [
        _proc(1, ppid=0),
        _proc(10, ppid=1, pgrp=10, session=100),                # the user's shell: nothing of the job
        _proc(21, ppid=1, pgrp=20, session=100),                # in a dead worker's group, environment replaced
        _proc(30, ppid=1, pgrp=30, session=30, marked=True),    # a daemon in a session of its own
        _proc(31, ppid=30, pgrp=30, session=30),                # its child, environment replaced
        _proc(32, ppid=1, pgrp=32, session=30),                 # in the daemon's session, parent gone
        _proc(33, ppid=31, pgrp=33, session=33),                # a grandchild that left it all
        _proc(40, ppid=1, pgrp=40, session=40),                 # unmarked, own session, parent gone: unreachable
        _proc(50, ppid=1, pgrp=50, session=100, start=99),      # a worker's pid taken by another process
        _proc(51, ppid=50, pgrp=50, session=100),
        _proc(60, ppid=1, pgrp=60, session=100, marked=True, zombie=True),
        _proc(70, ppid=1, pgrp=70, session=70, marked=True),    # the watcher itself (spared)
    ]}
    groups = {20: 5, 50: 8, 90: None}  # 90: a worker whose group is empty
    assert job_targets(procs, groups, spare=(70,)) == {21, 30, 31, 32, 33}


def test_a_worker_pid_of_unknown_start_counts_only_while_no_unmarked_process_holds_it() -> None:
    procs = {p.pid: p for p in [_proc(20, pgrp=20), _proc(21, ppid=20, pgrp=20)]}
    assert job_targets(procs, {20: None}) == set()
    assert job_targets({21: procs[21]}, {20: None}) == {21}


@pytest.mark.parametrize("load, start", [(False, "fresh"), (True, "fresh"), (True, "fork-server")],
                         ids=["idle", "oversubscribed", "oversubscribed-fork-server"])
def test_what_the_workers_started_dies_with_a_sigkilled_launcher(tmp_path, load, start):
    """Workers die with the agent (PR_SET_PDEATHSIG), but a ``sleep 600``, a Python child and a
    double-forked daemon in a session of its own they started ran on under init after a
    ``kill -9`` of the launcher. A worker forked by the fork server is the agent's child as well."""
    env = base_env(PID_DIR=str(tmp_path), DAEMON="1")
    run_id = f"watched{os.getpid()}{'load' if load else ''}{start[:4]}"
    kids: list[int] = []
    with oversubscribed(per_core=4, limit_s=120) if load else contextlib.nullcontext():
        argv = launcher_cmd("--nproc-per-node", "1", "--rdzv-id", run_id,
                            *(["--fork-server"] if start == "fork-server" else []), worker("spawns_children.py"))
        agent = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            kids = _kids(tmp_path, 1)
            read_pids(tmp_path, 1)
            agent.send_signal(signal.SIGKILL)
            out, _ = agent.communicate(timeout=30)  # until the watcher, which holds its stderr, ended
            gone = wait_for(lambda: not [p for p in kids if pid_alive(p)], 30)
            assert gone, f"left running: {[p for p in kids if pid_alive(p)]}\n{out}"
        finally:
            if agent.poll() is None:
                agent.kill()
            for p in kids:
                if pid_alive(p):
                    os.kill(p, signal.SIGKILL)
    assert len(kids) == 3
    assert not list(Path(tempfile.gettempdir()).glob(f"torchcomms-run-{run_id}-*")), "its run folder (secret) stayed"
    assert "[torchcomms-run watcher] the agent" in out and "died without stopping its workers" in out, out
    assert "fork server" not in out, out


def test_a_launcher_that_exits_normally_stops_its_watcher_which_kills_nothing(tmp_path):
    """A process outside the job that carries the job's mark (the worker hands it out) is left
    alone when the launcher ends the job itself."""
    env = base_env(PID_DIR=str(tmp_path), EXIT_WHEN=str(tmp_path / "go"))
    agent = subprocess.Popen(launcher_cmd("--nproc-per-node", "1", worker("hands_out_mark.py")), env=env, cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outsider = None
    try:
        assert wait_for(lambda: (tmp_path / "mark").exists(), 60), "the worker never wrote its mark"
        mark = (tmp_path / "mark").read_text()
        outsider = subprocess.Popen(["sleep", "60"], env={"PATH": os.environ["PATH"], MARK_VAR: mark},
                                    start_new_session=True)
        (tmp_path / "go").write_text("")
        out, _ = agent.communicate(timeout=60)
        assert agent.returncode == 0, out
        watchers = [p for p in Path("/proc").glob("[0-9]*") if _cmdline(p).endswith(f"watcher.py\0{mark}\0")]
        assert not watchers, f"the watcher outlived the launcher: {watchers}"
        assert outsider.poll() is None and "watcher" not in out, out
    finally:
        if agent.poll() is None:
            agent.kill()
        if outsider is not None:
            outsider.kill()
            outsider.wait()


def _cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_the_watcher_is_no_orphan_the_agent_ends_and_leaves_only_when_told() -> None:
    """The agent is a child subreaper that SIGKILLs every child it did not start as a worker when
    it stops a group: its watcher, a child too, must outlive every stop and exit 0 when let go."""
    code = ("import sys\n"
            "from launcher.orphans import become_subreaper\n"
            "from launcher.env import WorkerPlacement\n"
            "from launcher.supervisor import WorkerGroup, WorkerSpec\n"
            "from launcher.watch import Watch\n"
            "assert become_subreaper()\n"
            "watch = Watch()\n"
            "group = WorkerGroup(watch=watch)\n"
            "place = WorkerPlacement(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,"
            " num_nodes=1)\n"
            "group.start([WorkerSpec(placement=place, argv=['sleep', '60'], env={}, host='h')])\n"
            "group.stop(0.1, dump=None)\n"
            "alive = watch._proc.poll() is None\n"
            "watch.close()\n"
            "print(alive, watch._proc.returncode)\n")
    out = subprocess.run([sys.executable, "-c", code], env=base_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "0"], out.stdout + out.stderr
