"""Run a ``torchcomms-run`` job from a test: its whole output, and its exit code or ``None``
when it outlived its limit (then the whole job, launcher and workers, is killed, and every
Python process of it first writes its threads' stacks into the output)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers.paths import REPO

#: the folder whose ``sitecustomize`` makes each process of the job dump its stacks on SIGUSR2
STACK_DUMP_SITE = Path(__file__).resolve().parent / "stack_dump"
#: how long the processes get to write their stacks before the job is killed (seconds)
STACKS_WAIT_S = 2.0
#: when set, the folder where each killed job's stack files are kept (a sub-folder per job)
KEEP_STACKS_ENV = "TC_JOB_STACKS_OUT"
#: where the stacks begin in the output of a job killed at its limit
STACKS_MARK = "\n--- stacks of "


def run_launcher_job(launcher_args: list[str], env: dict[str, str], limit_s: float) -> tuple[int | None, str]:
    """``python -m launcher *launcher_args`` in a session of its own; ``(returncode, output)``."""
    keep = os.environ.get(KEEP_STACKS_ENV)
    if keep:
        os.makedirs(keep, exist_ok=True)
    stacks_dir = tempfile.mkdtemp(prefix="tc-job-stacks-", dir=keep or None)
    env = dict(env, TC_STACKS_DIR=stacks_dir,
               PYTHONPATH=os.pathsep.join(p for p in (str(STACK_DUMP_SITE), env.get("PYTHONPATH", "")) if p))
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *launcher_args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit_s)
        return proc.returncode, out.decode(errors="replace")
    except subprocess.TimeoutExpired:
        job = [proc.pid, *descendants(proc.pid)]
        for pid in job:
            _signal(pid, signal.SIGUSR2)
        time.sleep(STACKS_WAIT_S)
        for pid in job:  # the workers run in process groups of their own
            _signal(pid, signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out.decode(errors="replace") + stacks_report(Path(stacks_dir))
    finally:
        if not keep:
            for f in Path(stacks_dir).glob("*"):
                f.unlink(missing_ok=True)
            os.rmdir(stacks_dir)


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (from ``/proc``), parents before children."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stacks_report(stacks_dir: Path) -> str:
    """The stacks the job's processes wrote, one section per process."""
    parts = []
    for f in sorted(stacks_dir.glob("*.txt")):
        text = f.read_text(errors="replace").strip()
        if text:
            parts.append(f"{STACKS_MARK}pid {f.stem} ---\n{text}\n")
    return "".join(parts) if parts else f"{STACKS_MARK}no process: none of the job wrote any ---\n"


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
