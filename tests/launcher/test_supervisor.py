"""WorkerGroup with real worker processes: stopping them is bounded whatever they do."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

from launcher.env import WorkerPlacement
from launcher.output import STDERR, STDOUT, Console, OutputPump, StreamRoute
from launcher.supervisor import WorkerGroup, WorkerSpec, proc_state, spawn_process

from conftest import base_env, pid_alive, wait_for, worker


def _spec(rank: int, script: str, **env: str) -> WorkerSpec:
    placement = WorkerPlacement(rank=rank, local_rank=rank, world_size=1, local_world_size=1, node_rank=0,
                                num_nodes=1)
    return WorkerSpec(placement=placement, argv=[sys.executable, worker(script)],
                      env=base_env(RANK=str(rank), **env), host="localhost")


def test_stop_kills_a_worker_that_left_its_process_group(tmp_path) -> None:
    """A worker that moved into another process group (and ignores SIGTERM) is out of reach of
    the group signals: stop() must still kill it and return (it used to wait for it forever)."""
    group = WorkerGroup()
    group.start([_spec(0, "leaves_group.py", PID_DIR=str(tmp_path), JOIN_PGID=str(os.getpgrp()), SLEEP="60")])
    deadline = time.monotonic() + 20
    while not (tmp_path / "pid").exists():
        assert time.monotonic() < deadline, "the worker never got ready"
        time.sleep(0.02)
    pid = int((tmp_path / "pid").read_text())
    assert os.getpgid(pid) == os.getpgrp()  # it really left the group made for it
    stopper = threading.Thread(target=group.stop, args=(0.5,), kwargs={"dump": None}, daemon=True)
    stopper.start()
    stopper.join(10)
    hung = stopper.is_alive()
    if hung:
        os.kill(pid, signal.SIGKILL)  # let the stuck stop() end
        stopper.join(10)
    assert not hung, "stop() waited forever for a worker outside its process group"
    assert not group.alive() and group.workers[0].result.signal == signal.SIGKILL


def test_unreapable_worker_is_given_up_once_and_the_others_are_reaped(tmp_path) -> None:
    """Rank 1 is a fake process handle (``unkillable.py``: a stand-in for a process in
    uninterruptible sleep, which no test can make portably) whose wait/poll never report an
    exit and which drops every signal. stop() gives it up after ``kill_wait``, reporting it
    once as unreapable with its /proc state, while the real workers are reaped with their own
    ends as before: rank 0 (ignores SIGTERM) SIGKILLed, rank 2 its exit code 3. An exit it
    makes later is ignored, and nothing waits for it again."""
    from unkillable import UnkillableProcess

    fakes: list[UnkillableProcess] = []

    def spawn(spec: WorkerSpec, preexec_fn):
        if spec.placement.rank != 1:
            return spawn_process(spec, preexec_fn)
        fakes.append(UnkillableProcess(spec))
        return fakes[0]

    reported: list[tuple[int, bool]] = []
    group = WorkerGroup(on_exit=lambda w: reported.append((w.result.rank, w.result.unreapable)),
                        spawn=spawn, kill_wait=0.5)
    env = {"PID_DIR": str(tmp_path), "IGNORE_TERM_RANKS": "0", "EXIT_RANK": "2", "SLEEP": "60"}
    group.start([_spec(r, "sleeper.py", **env) for r in range(3)])
    try:
        assert wait_for(lambda: len(list(tmp_path.glob("*.pid"))) == 3, timeout=20)
        assert group.workers[2].done.wait(20)  # exited 3 by itself, before any signal
        t0 = time.monotonic()
        left = group.stop(0.3, dump=None)
        took = time.monotonic() - t0
        w0, w1, w2 = group.workers
        assert left == [w1] and not group.alive()
        assert 0.8 <= took < 5, took  # grace 0.3 s + kill_wait 0.5 s, not forever
        r0, r2 = w0.result, w2.result  # reaped as before, with their own ends
        assert (r0.signal, r0.unreapable, w0.done.is_set()) == (signal.SIGKILL, False, True)
        assert (r2.exit_code, r2.unreapable, w2.done.is_set()) == (3, False, True)
        assert w1.result.unreapable and w1.abandoned and not w1.done.is_set()
        assert w1.result.signal is None and w1.result.exit_code is None and w1.result.failed
        assert w1.result.code == 1 and w1.result.state and w1.result.state[0] in "RSD"
        assert w1.result.pid == fakes[0].pid and signal.SIGKILL in fakes[0].signals
        assert sorted(reported) == [(0, False), (1, True), (2, False)]
        assert sorted(group.exits.get_nowait().result.rank for _ in range(3)) == [0, 1, 2]
        t0 = time.monotonic()
        assert group.kill_all() == []  # it is not waited for again
        assert time.monotonic() - t0 < 0.4
        fakes[0].release()  # the kernel lets it go at last: the exit is not reported again
        assert w1.done.wait(5)
        time.sleep(0.05)
        assert len(reported) == 3 and group.exits.empty()
        assert w1.result.unreapable and w1.result.signal is None
    finally:
        for fake in fakes:
            fake.release()


def _readers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("output-") and t.is_alive()}


def test_a_given_up_workers_output_reader_ends_while_its_pipes_stay_open(tmp_path) -> None:
    """Three attempts, each with one worker that cannot be killed (``unkillable.py``: its
    process keeps running, so its pipes never close): giving it up ends its output reader at
    once, after what it printed reached the console and its log, so readers do not pile up
    across attempts."""
    from unkillable import UnkillableProcess

    fakes: list[UnkillableProcess] = []

    def spawn(spec: WorkerSpec, preexec_fn):
        fakes.append(UnkillableProcess(spec))
        return fakes[-1]

    out = io.BytesIO()
    console = Console(out=out, err=io.BytesIO())
    before = _readers()
    try:
        for attempt in range(3):
            log = tmp_path / f"stdout.{attempt}.log"
            routes = {STDOUT: StreamRoute(True, log), STDERR: StreamRoute(True, None)}
            pids = tmp_path / str(attempt)
            pids.mkdir()
            spec = replace(_spec(0, "sleeper.py", PID_DIR=str(pids), SLEEP="60"),
                           output=OutputPump(console, f"[a{attempt}]", {"rank": 0}, routes))
            group = WorkerGroup(spawn=spawn, kill_wait=0.2)
            group.start([spec])
            said = f"[a{attempt}] rank 0 pid {fakes[-1].pid} ready\n".encode()
            assert wait_for(lambda: said in out.getvalue(), timeout=20), out.getvalue()
            assert _readers() - before  # its output is being read
            assert group.kill_all() == group.workers  # given up, still running
            assert fakes[-1].poll() is None and pid_alive(fakes[-1].pid)
            assert _readers() - before == set(), f"attempt {attempt}"
            assert log.read_bytes() == said[len(f"[a{attempt}] "):]
    finally:
        for fake in fakes:
            fake.release()


def test_output_lines_are_framed_across_reads_and_the_last_one_needs_no_newline(tmp_path):
    """The reader gets bytes as the pipe has them: lines split over two writes come out
    whole and prefixed, a last line without its newline still comes out, the log holds the
    bytes as written, and stderr goes to its own stream."""
    code = ("import sys, time\n"
            "sys.stdout.write('one\\ntw'); sys.stdout.flush(); time.sleep(0.05)\n"
            "sys.stdout.write('o\\nlast'); sys.stdout.flush()\n"
            "sys.stderr.write('oops\\n')\n")
    out, err = io.BytesIO(), io.BytesIO()
    log = tmp_path / "stdout.log"
    routes = {STDOUT: StreamRoute(True, log), STDERR: StreamRoute(True, None)}
    spec = replace(_spec(0, "ticker.py"), argv=[sys.executable, "-c", code],
                   output=OutputPump(Console(out=out, err=err), "[r0]", {"rank": 0}, routes))
    group = WorkerGroup()
    group.start([spec])
    assert group.workers[0].done.wait(20)
    spec.output.join(timeout=20)
    assert out.getvalue() == b"[r0] one\n[r0] two\n[r0] last\n"
    assert err.getvalue() == b"[r0] oops\n"
    assert log.read_bytes() == b"one\ntwo\nlast"


def test_proc_state_reads_proc() -> None:
    assert (proc_state(os.getpid()) or "R")[0] in "RS"  # None where there is no /proc
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    assert proc_state(child.pid) is None  # reaped: nothing to read


class _HeldStream(io.BytesIO):
    """A console stream whose first write waits until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.go = threading.Event(), threading.Event()

    def write(self, data: bytes) -> int:  # type: ignore[override]
        if not self.entered.is_set():
            self.entered.set()
            assert self.go.wait(20), "the test never let the first write go"
        return super().write(data)


def test_detach_keeps_what_the_pipes_already_hold(tmp_path) -> None:
    """A worker given up alive may have written lines the reader has not read yet (the reader
    was busy printing another stream's line). ``detach`` used to stop at the wake-up and drop
    them; it reads what the pipes hold, without waiting for more, before it stops."""
    out, err = _HeldStream(), io.BytesIO()
    pump = OutputPump(Console(out=out, err=err), "[w]", {"rank": 0},
                      {STDOUT: StreamRoute(True, None), STDERR: StreamRoute(True, tmp_path / "err.log")})
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    try:
        pump.start({STDOUT: os.fdopen(out_r, "rb", buffering=0), STDERR: os.fdopen(err_r, "rb", buffering=0)})
        os.write(out_w, b"first\n")
        assert out.entered.wait(20)  # the reader is inside the console's write of "first"
        detacher = threading.Thread(target=pump.detach, kwargs={"timeout": 20})
        detacher.start()
        assert wait_for(lambda: pump._wake is None, timeout=20)  # the wake-up is sent ...
        os.write(err_w, b"last words\n")  # ... and only then does the worker write again
        out.go.set()
        detacher.join(30)
        assert not detacher.is_alive()
        assert out.getvalue() == b"[w] first\n"
        assert err.getvalue() == b"[w] last words\n"
        assert (tmp_path / "err.log").read_bytes() == b"last words\n"
    finally:
        out.go.set()
        os.close(out_w)
        os.close(err_w)


def test_a_progress_bar_shows_before_its_newline_and_the_log_keeps_its_bytes(tmp_path) -> None:
    """Text rewritten in place with carriage returns (a progress bar) was held until a newline
    came, which for a bar is when it finished: its latest state is shown as a line meanwhile
    (at most once per PROGRESS_INTERVAL_S); the log file keeps the bytes as written."""
    out, err = io.BytesIO(), io.BytesIO()
    pump = OutputPump(Console(out=out, err=err), "[w]", {"rank": 0},
                      {STDOUT: StreamRoute(True, tmp_path / "out.log"), STDERR: StreamRoute(True, None)})
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    pump.start({STDOUT: os.fdopen(out_r, "rb", buffering=0), STDERR: os.fdopen(err_r, "rb", buffering=0)})
    try:
        os.write(out_w, b"\rstep 1/3")
        os.write(out_w, b"\rstep 2/3\r")
        assert wait_for(lambda: b"[w] step 2/3\n" in out.getvalue(), timeout=20), out.getvalue()
        os.write(out_w, b"step 3/3\rdone\n")
    finally:
        os.close(out_w)
        os.close(err_w)
        pump.join(timeout=20)
    shown = out.getvalue()
    assert shown.endswith(b"[w] done\n") and b"\r" not in shown, shown
    assert (tmp_path / "out.log").read_bytes() == b"\rstep 1/3\rstep 2/3\rstep 3/3\rdone\n"
