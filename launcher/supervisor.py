"""Worker processes: start, watch, signal and stop them.

Each worker runs in its own process group with ``PR_SET_PDEATHSIG = SIGKILL``, so it does not
outlive the agent, even when the agent is SIGKILLed; what it forks is ended with its group when
the agent stops it or exits, and, when the agent is SIGKILLed, by the agent's watcher
(:mod:`launcher.watcher`), which a group given a :class:`~launcher.watch.Watch` tells of each
worker it starts and ends. Exits are seen at once (one waiter thread per worker) and reported through
``on_exit`` and a queue.

A worker that is still not reaped ``KILL_WAIT_S`` after its SIGKILL (a process in
uninterruptible sleep, state D, in a hung driver or file system call, cannot exit until the
kernel lets it) is *given up*: it is reported once, like an exit, with
``WorkerResult.unreapable`` set and its state from ``/proc/<pid>/stat``, its output reader
stops (its pipes stay open as long as it lives), and nothing waits for it again. Should it
exit later, that exit is ignored: it must not be taken for its successor.

Workers must be started from the agent's main thread: the kernel delivers the death signal
when the *thread* that forked the child ends, and the main thread lives as long as the agent.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Protocol

from torchcomms.control.host_process import process_state

from .catchers import catches, group_members
from .env import WorkerPlacement
from .exceptions import WorkerStartError
from .orphans import end_adopted
from .output import STDERR, STDOUT, OutputPump
from .watch import Watch

__all__ = ["WorkerSpec", "WorkerResult", "Worker", "WorkerGroup", "ProcessHandle",
           "spawn_process", "child_setup", "exit_code_of", "proc_state", "KILL_WAIT_S"]

#: How long a SIGKILLed worker may take to exit before it is given up as unreapable: one in
#: an uninterruptible sleep (a hung driver or file system) cannot exit until the kernel lets
#: it. Read when a :class:`WorkerGroup` is made.
KILL_WAIT_S = 10.0

_STATES = {"R": "running", "S": "sleeping", "D": "uninterruptible sleep", "Z": "zombie",
           "T": "stopped", "t": "tracing stop", "X": "dead", "I": "idle", "P": "parked",
           "W": "paging", "K": "wakekill"}

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_prctl.restype = ctypes.c_int


def child_setup(parent_pid: int) -> Callable[[], None]:
    """What a child of the agent runs before exec: its own process group, and death with the
    thread that forked it (``PR_SET_PDEATHSIG``)."""

    def setup() -> None:  # runs in the forked child, before exec
        os.setpgid(0, 0)
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:  # the agent died between fork and prctl
            os._exit(128 + int(signal.SIGKILL))

    return setup


def proc_state(pid: int) -> str | None:
    """The process's state from ``/proc/<pid>/stat``, e.g. ``"D (uninterruptible sleep),
    wchan nfs_wait_bit_killable"``; ``None`` where /proc cannot tell (not Linux, gone)."""
    code = process_state(pid)
    if code is None:
        return None
    text = f"{code} ({_STATES.get(code, 'unknown state')})"
    try:
        with open(f"/proc/{pid}/wchan", "rb") as f:
            wchan = f.read().decode("ascii", "replace").strip()
    except OSError:
        wchan = ""
    return f"{text}, wchan {wchan}" if wchan and wchan != "0" else text


def exit_code_of(returncode: int) -> int:
    """Shell convention: a signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class WorkerResult:
    """How one worker ended: ``exit_code`` or ``signal``; ``lost`` when its node vanished;
    ``unreapable`` when it was given up still alive after SIGKILL (``state`` is its process
    state then, from /proc, where known)."""

    rank: int
    local_rank: int
    node_rank: int
    host: str
    pid: int | None
    started: float
    ended: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    error_file: str | None = None
    lost: bool = False
    error_message: str | None = None
    error_traceback: str | None = None
    unreapable: bool = False
    state: str | None = None
    #: when it was reported failed while its process lived on (a stopped rank, which ends
    #: only at the SIGKILL that stops the job): the time of its failure, not its end
    failed_at: float | None = None
    #: judged hung (heartbeats silent, no progress) and so killed by the agent
    hung: bool = False

    @property
    def failed(self) -> bool:
        return self.lost or self.unreapable or self.signal is not None or bool(self.exit_code)

    @property
    def failure_time(self) -> float:
        """When it failed: reported failed while alive, else when it ended."""
        if self.failed_at is not None:
            return self.failed_at
        return self.ended if self.ended is not None else float("inf")

    @property
    def code(self) -> int:
        """The process-style code: exit code, 128 + signal, or 1 for a lost node or a worker
        given up as unreapable (it never ended, so it has no code of its own)."""
        if self.lost or self.unreapable:
            return 1
        if self.signal is not None:
            return 128 + self.signal
        if self.exit_code is not None:
            return self.exit_code
        return 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerResult:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class WorkerSpec:
    """Everything needed to start one worker."""

    placement: WorkerPlacement
    argv: Sequence[str]
    env: dict[str, str]
    host: str
    error_file: str | None = None
    output: OutputPump | None = None
    cwd: str | None = None
    #: what ``argv`` runs, for a fork server: (mode, target, args), see :meth:`LaunchConfig.worker_entry`
    entry: tuple[str, str, tuple[str, ...]] | None = None


class ProcessHandle(Protocol):
    """What the supervisor needs of a started worker process (a ``subprocess.Popen``)."""

    pid: int
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None

    def wait(self, timeout: float | None = None) -> int: ...

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...


def spawn_process(spec: WorkerSpec, preexec_fn: Callable[[], None]) -> ProcessHandle:
    """Start one worker's process (the seam :class:`WorkerGroup` starts workers through)."""
    pipe = subprocess.PIPE if spec.output is not None else None
    return subprocess.Popen(  # noqa: S603 - the user's own command line
        list(spec.argv), env=spec.env, cwd=spec.cwd, stdin=subprocess.DEVNULL,
        stdout=pipe, stderr=pipe, preexec_fn=preexec_fn, close_fds=True,
    )


@dataclass
class Worker:
    """A running (or finished) worker. ``done`` is set once it is reaped; ``abandoned`` once
    it was given up unreaped (see the module docstring)."""

    spec: WorkerSpec
    proc: ProcessHandle
    result: WorkerResult
    done: threading.Event = field(default_factory=threading.Event)
    abandoned: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        """Still supervised: neither reaped nor given up."""
        return not self.done.is_set() and not self.abandoned

    def signal_group(self, sig: int) -> bool:
        """Send ``sig`` to the worker's process group, and to the worker itself when it moved
        out of that group (no group signal reaches it then); False when nothing got it."""
        sent = False
        try:
            os.killpg(self.proc.pid, sig)
            sent = True
        except (ProcessLookupError, PermissionError):
            pass
        if not self.done.is_set():  # not reaped (maybe abandoned): the pid is still its
            try:
                outside = os.getpgid(self.proc.pid) != self.proc.pid
            except ProcessLookupError:
                outside = False
            if outside:
                try:
                    self.proc.send_signal(sig)
                    sent = True
                except (ProcessLookupError, PermissionError):
                    pass
        return sent


    def request_dump(self, sig: int) -> bool:
        """Send ``sig`` (a dump request) to the processes of the worker's group, and the
        worker itself, that catch it; False when none does (the request is then dropped:
        its default action would end them)."""
        pids = set(group_members(self.proc.pid))
        if not self.done.is_set():
            pids.add(self.proc.pid)
        sent = False
        for pid in sorted(pids):
            if catches(pid, sig):
                try:
                    os.kill(pid, sig)
                    sent = True
                except (ProcessLookupError, PermissionError):
                    pass
        return sent


class WorkerGroup:
    """The workers of one node for one attempt.

    ``on_exit`` and the ``exits`` queue hear of every worker exactly once: when it is reaped,
    or when it is given up as unreapable (:meth:`abandon`). ``spawn`` starts a process
    (default :func:`spawn_process`); ``kill_wait`` defaults to ``KILL_WAIT_S``; ``watch`` is
    told of every worker started, and of every worker reaped once its group was killed; ``spare``
    names the agent's other children (a fork server), never ended with the orphans it adopted."""

    def __init__(self, on_exit: Callable[[Worker], None] | None = None, *,
                 spawn: Callable[[WorkerSpec, Callable[[], None]], ProcessHandle] | None = None,
                 kill_wait: float | None = None, watch: Watch | None = None,
                 spare: Iterable[int] = ()) -> None:
        self.workers: list[Worker] = []
        self.exits: queue.Queue[Worker] = queue.Queue()
        self.kill_wait = KILL_WAIT_S if kill_wait is None else kill_wait
        self._on_exit = on_exit
        self._spawn = spawn_process if spawn is None else spawn
        self._watch = watch
        self._spare = set(spare)
        self._lock = threading.Lock()  # a worker is reaped or abandoned, never both

    def start(self, specs: Iterable[WorkerSpec]) -> list[Worker]:
        """Start every worker (call from the main thread, see the module docstring)."""
        setup = child_setup(os.getpid())
        for spec in specs:
            p = spec.placement
            try:
                proc = self._spawn(spec, setup)
            except OSError as e:  # the workers started so far are stopped by the agent
                raise WorkerStartError(p.rank, spec.argv[0], e) from None
            if self._watch is not None:
                self._watch.add(proc.pid)
            result = WorkerResult(rank=p.rank, local_rank=p.local_rank, node_rank=p.node_rank,
                                  host=spec.host, pid=proc.pid, started=time.time(),
                                  error_file=spec.error_file)
            worker = Worker(spec=spec, proc=proc, result=result)
            if spec.output is not None:
                assert proc.stdout is not None and proc.stderr is not None
                spec.output.start({STDOUT: proc.stdout, STDERR: proc.stderr})
            threading.Thread(target=self._wait, args=(worker,), daemon=True,
                             name=f"wait-rank-{p.rank}").start()
            self.workers.append(worker)
        return self.workers

    def _wait(self, worker: Worker) -> None:
        rc = worker.proc.wait()
        with self._lock:
            if worker.abandoned:  # reported as unreapable already: its late exit changes
                worker.done.set()  # nothing, but the pid may be reused from now on
                return
            worker.result.ended = time.time()
            if rc < 0:
                worker.result.signal = -rc
            else:
                worker.result.exit_code = rc
            worker.done.set()
        self._report(worker)

    def _report(self, worker: Worker) -> None:
        if self._on_exit is not None:
            try:
                self._on_exit(worker)
            except Exception:  # noqa: BLE001 - a reporting failure must not lose the exit
                pass
        self.exits.put(worker)

    def abandon(self, worker: Worker) -> bool:
        """Give up a worker that is not reaped (call it some time after its SIGKILL): it gets
        one more SIGKILL, so that it dies the moment the kernel lets it go, its result becomes
        ``unreapable`` with its /proc state, its output is no longer read (its reader thread
        ends), and it is reported like an exit. False when it was reaped (or given up)
        already."""
        if worker.alive:
            worker.signal_group(signal.SIGKILL)
        with self._lock:
            if worker.done.is_set() or worker.abandoned:
                return False
            worker.abandoned = True
            worker.result.unreapable = True
            worker.result.state = proc_state(worker.pid)
            worker.result.ended = time.time()
        if worker.spec.output is not None:  # its pipes stay open as long as it lives
            worker.spec.output.detach()
        self._report(worker)
        return True

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.alive]

    def signal_all(self, sig: int) -> None:
        for w in self.alive():
            w.signal_group(sig)

    def stop(self, grace: float, first: int = signal.SIGTERM,
             dump: int | None = signal.SIGUSR1) -> list[Worker]:
        """Stop every worker: ``first`` now, ``dump`` to those still alive shortly before
        the grace period ends (a flight-recorder dump), SIGKILL when it ends. Returns when
        every worker has exited and its process group is emptied, or ``kill_wait`` after
        the SIGKILL (returns the workers given up as unreapable then, see :meth:`kill_all`)."""
        self.signal_all(first)
        deadline = time.monotonic() + grace
        dump_at = deadline - min(2.0, grace / 4)
        dumped = dump is None
        while self.alive():
            now = time.monotonic()
            if now >= deadline:
                break
            if not dumped and now >= dump_at:
                for w in self.alive():
                    w.request_dump(dump)  # type: ignore[arg-type]
                dumped = True
            for w in self.alive():
                w.done.wait(min(0.02, max(0.0, deadline - now)))
                break
        return self.kill_all()

    def kill_all(self, wait: float | None = None) -> list[Worker]:
        """SIGKILL every worker's process group (including stray grandchildren) and wait, at
        most ``wait`` seconds in all (default ``kill_wait``), for the workers to exit. Those
        still not reaped then are given up (:meth:`abandon`) and returned; workers given up
        before are not waited for again."""
        pending = self.alive()
        for w in self.workers:
            w.signal_group(signal.SIGKILL)
        deadline = time.monotonic() + (self.kill_wait if wait is None else wait)
        for w in pending:
            w.done.wait(max(0.0, deadline - time.monotonic()))
        left = [w for w in pending if self.abandon(w)]
        for w in self.workers:
            w.signal_group(signal.SIGKILL)  # children forked just before the leader died
        own = {w.pid for w in self.workers} | self._spare | ({self._watch.pid} if self._watch is not None else set())
        end_adopted(own)  # and those that left the workers' groups
        if self._watch is not None:
            for w in self.workers:
                if w.done.is_set() and not w.abandoned:  # reaped: its pid may be reused from now on
                    self._watch.drop(w.pid)
        for w in self.workers:
            if w.spec.output is not None and not w.abandoned:  # its pipes may never close
                w.spec.output.join(timeout=2.0)
        return left
