"""The fork server of ``torchcomms-run --fork-server``: one process per node that imports torch
and torchcomms once, and forks every worker from there, so that no worker imports torch again.

The agent (:mod:`launcher.forks`) starts it as ``python fork_server.py`` with one end of a Unix
socket pair as its stdin, in the agent's environment less each worker's own variables, and talks
to it in frames of a 4-byte length and a JSON object (nothing is unpickled). The server answers
``{"ready": pid}`` once it has imported torch and found itself fit to fork (one thread, CUDA not
initialised), or ``{"error": why}`` and exits. Then each request ``{"mode", "target", "args",
"env", "cwd"}`` (``mode``: ``path``, ``module`` or ``run_path``) comes with three descriptors, the
worker's stdin, stdout and stderr, and is answered ``{"pid": pid}`` or ``{"error": why}``.

The worker is made the agent's own child, so that the agent supervises it exactly as one it
started itself (its waiter thread reaps it and reads its exit status, signals reach it by pid and
process group): the server forks an intermediate process that forks the worker and exits, and the
worker is re-parented to the nearest child subreaper above it, the agent (which must be one; the
server is not). The worker waits until it is the agent's child, then takes ``PR_SET_PDEATHSIG``
(set earlier, the intermediate's exit would have sent it), leads its own process group, takes its
descriptors, environment, working directory, argv and ``sys.path[0]``, closes what the server
held, and runs the entry point in a fresh ``__main__`` module as ``python script.py`` (``python
-m module``, or the launcher's ``--run-path`` runner) would: the interpreter's own exit then
gives the exit code (``SystemExit``, a traceback and 1, death by SIGINT for an uncaught
``KeyboardInterrupt``), after ``atexit`` handlers and non-daemon threads, as always.

What a forked worker shares with its siblings: the hash seed of ``str`` (``PYTHONHASHSEED`` as
the server got it), and ``sys.flags``, ``sys.path`` and the variables read at interpreter start
or at torch's import (the server's environment is the workers' less their per-worker variables).
"""
from __future__ import annotations

import sys

if __name__ == "__main__":  # this file's folder holds the launcher's modules: nothing may import them
    del sys.path[0]

import ctypes  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from typing import Any  # noqa: E402

__all__ = ["MODES", "PRELOAD", "read_frame", "write_frame", "check_request", "Target", "serve"]

#: what a worker runs: a script (``python script.py``), a module (``python -m``), or a script
#: through ``runpy.run_path`` (``--run-path``)
MODES = ("path", "module", "run_path")
#: imported once by the server, before any fork
PRELOAD = ("torch", "torch.distributed", "torchcomms")
#: the longest frame accepted (an environment is a few KiB; this bounds a malformed length)
MAX_FRAME = 16 << 20
_PR_SET_PDEATHSIG = 1
_HEADER = struct.Struct(">I")


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def write_frame(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send one JSON frame; ``fds`` travel with its length (``SCM_RIGHTS``)."""
    payload = json.dumps(message).encode()
    header = _HEADER.pack(len(payload))
    if fds:
        socket.send_fds(sock, [header], fds)
    else:
        sock.sendall(header)
    sock.sendall(payload)


def read_frame(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any], list[int]] | None:
    """One JSON frame (an object) and the descriptors that came with it; None at the end of the
    stream. ValueError for a frame that is not one JSON object (its descriptors closed)."""
    if max_fds:
        header, fds, _, _ = socket.recv_fds(sock, _HEADER.size, max_fds)
    else:
        header, fds = sock.recv(_HEADER.size), []
    if not header:
        return None
    try:
        rest = _recv_exact(sock, _HEADER.size - len(header))
        if rest is None:
            raise ValueError("the stream ended inside a frame's length")
        (size,) = _HEADER.unpack(header + rest)
        if size > MAX_FRAME:
            raise ValueError(f"a frame of {size} bytes (at most {MAX_FRAME})")
        payload = _recv_exact(sock, size)
        if payload is None:
            raise ValueError("the stream ended inside a frame")
        message = json.loads(payload)
        if not isinstance(message, dict):
            raise ValueError("a frame that is not a JSON object")
    except (ValueError, UnicodeDecodeError) as exc:
        for fd in fds:
            os.close(fd)
        raise ValueError(str(exc)) from None
    return message, fds


def check_request(message: dict[str, Any], fds: list[int]) -> str | None:
    """Why ``message`` (with ``fds``) is no valid fork request; None when it is one."""
    if len(fds) != 3:
        return f"a fork request needs 3 descriptors (stdin, stdout, stderr), got {len(fds)}"
    if message.get("mode") not in MODES:
        return f"mode must be one of {', '.join(MODES)}, got {message.get('mode')!r}"
    if not isinstance(message.get("target"), str) or not message["target"]:
        return "target must be a non-empty string"
    args, env = message.get("args"), message.get("env")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return "args must be a list of strings"
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return "env must map strings to strings"
    cwd = message.get("cwd")
    if not isinstance(cwd, str) or not os.path.isdir(cwd):
        return f"cwd must be an existing folder, got {cwd!r}"
    if any("\0" in text for text in (message["target"], *args, *env, *env.values())):
        return "target, args and env must hold no NUL character"
    return None


def _open_fds() -> set[int]:
    """This process's descriptors (not the one that lists them)."""
    listed = {int(n) for n in os.listdir("/proc/self/fd")}
    found = set()
    for fd in listed:
        try:
            os.fstat(fd)
        except OSError:
            continue
        found.add(fd)
    return found


def _unfit() -> str | None:
    """Why this process must not fork now: a thread besides this one (a lock it holds would stay
    held in every child), or CUDA initialised."""
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads"
    tasks = len(os.listdir("/proc/self/task"))
    if tasks != 1:
        return f"{tasks} native threads"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised"
    return None


def _preload() -> str | None:
    """Import :data:`PRELOAD`; why the server cannot serve, or None."""
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported to the agent, which starts workers itself
            return f"import {name} failed: {type(exc).__name__}: {exc}"
    why = _unfit()
    if why is not None and "native" in why:
        # a library's pool (numpy's OpenBLAS) parks its threads at a fork: a first, empty fork
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        why = _unfit()
    return None if why is None else f"after importing {', '.join(PRELOAD)}: {why}"


class Target:
    """What a forked worker runs, at the top of the interpreter's stack (see :meth:`run`)."""

    def __init__(self, mode: str, target: str, args: list[str]) -> None:
        self.mode, self.target, self.args = mode, target, args

    def prepare(self) -> None:
        """``sys.argv`` and ``sys.path[0]`` as the interpreter sets them for this mode."""
        if self.mode == "path":
            sys.argv = [self.target, *self.args]
            if os.path.isfile(self.target):
                sys.path.insert(0, os.path.dirname(os.path.realpath(self.target)))
        elif self.mode == "module":
            sys.argv = ["-m", *self.args]  # the module's file replaces argv[0], as for python -m
            sys.path.insert(0, os.getcwd())
        else:
            sys.argv = [self.target, *self.args]
            sys.path.insert(0, "")

    @staticmethod
    def own_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
        """``tb`` from the entry point's first frame on (without this file's and runpy's)."""
        import runpy

        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__):
            tb = tb.tb_next
        return tb

    def run(self) -> None:
        """Run the entry point in a fresh ``__main__`` module; its exceptions propagate."""
        import runpy

        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        if self.mode == "module":
            runpy._run_module_as_main(self.target, alter_argv=True)  # what `python -m` runs
        elif self.mode == "run_path" or not os.path.isfile(self.target):  # a folder or zip: its __main__
            runpy.run_path(self.target, run_name="__main__")
        else:
            path = os.path.abspath(self.target)
            try:
                with open(path, "rb") as f:
                    source = f.read()
            except OSError as exc:
                print(f"{sys.executable}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}",
                      file=sys.stderr)
                raise SystemExit(2) from None
            from importlib.machinery import SourceFileLoader

            main.__dict__.update(__file__=path, __cached__=None, __builtins__=__builtins__, __spec__=None,
                                 __loader__=SourceFileLoader("__main__", path))
            exec(compile(source, path, "exec"), main.__dict__)  # noqa: S102 - the user's own script


def _become_worker(request: dict[str, Any], fds: list[int], agent: int, intermediate: int,
                   keep: set[int]) -> Target:
    """In the forked worker: wait to be the agent's child, then take the request's process
    group, descriptors, environment and working directory."""
    os.setpgid(0, 0)
    while os.getppid() == intermediate:  # it exits right after the fork
        time.sleep(0.0002)
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() != agent:  # the agent died (or is no subreaper): nobody supervises this worker
        os._exit(128 + 9)
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    for fd in _open_fds() - keep:
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    target = Target(request["mode"], request["target"], request["args"])
    target.prepare()
    return target


def _fork(request: dict[str, Any], fds: list[int], agent: int, keep: set[int]) -> tuple[int, Target | None]:
    """Fork the worker through an intermediate process; (its pid, None) in the server, (0,
    target) in the worker. OSError when it could not be forked."""
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # what the server holds stays out of the worker's collections: no copy of its pages for them
    read, write = os.pipe()
    try:
        middle = os.fork()
    except OSError:
        for fd in (read, write, *fds):
            os.close(fd)
        raise
    if middle == 0:
        os.close(read)
        me = os.getpid()
        try:
            pid = os.fork()
        except OSError as exc:
            os.write(write, f"error:{exc}".encode())
            os._exit(1)
        if pid == 0:
            os.close(write)
            try:
                return 0, _become_worker(request, fds, agent, me, keep)
            except BaseException as exc:  # noqa: BLE001 - it must never return into the server's loop
                os.write(2, f"torchcomms-run fork server: cannot start the worker: {exc!r}\n".encode())
                os._exit(1)
        try:
            os.setpgid(pid, pid)  # (the worker does it too): its group exists before the agent signals it
        except OSError:
            pass
        os.write(write, str(pid).encode())
        os._exit(0)
    os.close(write)
    for fd in fds:
        os.close(fd)
    with os.fdopen(read, "rb") as f:
        said = f.read().decode()
    os.waitpid(middle, 0)  # the worker is the agent's child from now on
    if not said.isdigit():
        raise OSError(said.removeprefix("error:") or "the intermediate process died")
    return int(said), None


def serve(sock: socket.socket) -> Target | None:
    """The server's loop; returns None at the end of the agent's stream, or, in a forked
    worker, what it runs."""
    agent = os.getppid()
    why = _preload()
    write_frame(sock, {"error": why} if why else {"ready": os.getpid()})
    if why:
        return None
    keep = _open_fds() - {sock.fileno()}
    while True:
        try:
            frame = read_frame(sock, max_fds=3)
        except ValueError as exc:
            write_frame(sock, {"error": f"bad request: {exc}"})
            continue
        if frame is None:
            return None
        request, fds = frame
        why = check_request(request, fds) or _unfit()
        if why is not None:
            for fd in fds:
                os.close(fd)
            write_frame(sock, {"error": why})
            continue
        try:
            pid, target = _fork(request, fds, agent, keep)
        except OSError as exc:
            write_frame(sock, {"error": f"fork failed: {exc}"})
            continue
        if target is not None:
            sock.detach()  # its descriptor, 0, is the worker's stdin now
            return target
        write_frame(sock, {"pid": pid})


if __name__ == "__main__":
    _target = serve(socket.socket(fileno=0))
    if _target is None:  # the server: nothing to flush or finalize (torch's teardown takes a few 100 ms)
        sys.stderr.flush()
        os._exit(0)
    try:
        _target.run()
    except BaseException as _exc:  # noqa: BLE001 - shown from the entry point's own frames on
        raise _exc.with_traceback(Target.own_frames(_exc.__traceback__))
