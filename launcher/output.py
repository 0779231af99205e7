"""Worker output: prefixed console lines, per-rank log files and optional JSON lines.

Each worker's stdout and stderr are pipes read by one thread per worker. A line goes to the
agent's matching console stream (prefixed, e.g. ``[node1:3] loss 0.12``) unless it is
redirected or filtered out, and to the worker's log file when logs are kept.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["Console", "ConsoleLogHandler", "StreamRoute", "OutputPump", "STDOUT", "STDERR"]

STDOUT, STDERR = 1, 2  # bits of torchrun's Std values (3 = both)


class Console:
    """The agent's terminal: one lock so lines from many workers never interleave."""

    def __init__(self, *, json_lines: bool = False, out: IO[bytes] | None = None,
                 err: IO[bytes] | None = None, host: str = "", tag: str = "torchcomms-run") -> None:
        self.json_lines = json_lines
        self._out = out if out is not None else sys.stdout.buffer
        self._err = err if err is not None else sys.stderr.buffer
        self._lock = threading.Lock()
        self._host = host
        self._tag = tag

    def worker_line(self, stream: int, prefix: bytes, line: bytes, meta: dict[str, Any]) -> None:
        """Print one line of a worker's output (``line`` ends with a newline or not)."""
        if self.json_lines:
            text = line.decode("utf-8", "replace").rstrip("\n")
            record = {"ts": time.time(), **meta,
                      "stream": "stdout" if stream == STDOUT else "stderr", "line": text}
            data = (json.dumps(record) + "\n").encode()
        else:
            data = prefix + line if line.endswith(b"\n") else prefix + line + b"\n"
        target = self._out if stream == STDOUT else self._err
        with self._lock:
            try:
                target.write(data)
                target.flush()
            except (OSError, ValueError):
                pass  # a closed terminal must not take the agent down

    def event(self, message: str, **fields: Any) -> None:
        """Print one of the agent's own messages (to stderr)."""
        if self.json_lines:
            data = (json.dumps({"ts": time.time(), "host": self._host, "source": self._tag,
                                "message": message, **fields}) + "\n").encode()
        else:
            data = f"[{self._tag}] {message}\n".encode()
        with self._lock:
            try:
                self._err.write(data)
                self._err.flush()
            except (OSError, ValueError):
                pass

    def text(self, text: str) -> None:
        """Print a block of text (the summary table) to stderr as is."""
        with self._lock:
            try:
                self._err.write(text.encode())
                self._err.flush()
            except (OSError, ValueError):
                pass


class ConsoleLogHandler(logging.Handler):
    """Prints the records of the libraries the agent runs (its control server's warnings: a
    refused client, a silent member) as the agent's own events: prefixed, or JSON records
    under ``--json-logs``. Without it Python's last-resort handler writes them bare to stderr,
    a line that is not JSON among JSON lines."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self._console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not take the agent down
            message = str(record.msg)
        self._console.event(message, logger=record.name, level=record.levelname.lower())


@dataclass(frozen=True)
class StreamRoute:
    """Where one stream of one worker goes."""

    to_console: bool
    log_file: Path | None


#: how much of what a detached worker's pipe still holds is read (a pipe holds 64 KiB by default)
DRAIN_LIMIT_BYTES = 1 << 20
#: the shortest interval between two console lines of one stream's progress state: text that a
#: worker rewrites in place with a carriage return and no newline (a progress bar)
PROGRESS_INTERVAL_S = 1.0


class _Stream:
    """One pipe being read: where its bytes go, and its unfinished last line."""

    def __init__(self, stream: int, pipe: IO[bytes], route: StreamRoute) -> None:
        self.stream = stream
        self.pipe = pipe
        self.route = route
        log = route.log_file
        self.log = open(log, "ab", buffering=0) if log else None  # noqa: SIM115
        self.partial = b""
        self.progress: bytes | None = None  # the latest progress state not yet shown
        self.progress_at = float("-inf")  # when one was last shown

    def close(self) -> None:
        for f in (self.log, self.pipe):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass


class OutputPump:
    """Copies a worker's stdout/stderr pipes to the console and its log files, on one reader
    thread that ends when both pipes are closed, or at once on :meth:`detach` (for a worker
    given up alive: its pipes would stay open as long as it lives)."""

    def __init__(self, console: Console, prefix: str, meta: dict[str, Any],
                 routes: dict[int, StreamRoute]) -> None:
        self._console = console
        self._prefix = (prefix + " ").encode() if prefix else b""
        self._meta = meta
        self._routes = routes
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._wake: int | None = None  # write end of the pipe that detach() hangs up

    def start(self, pipes: dict[int, IO[bytes]]) -> None:
        """Start the reader thread of ``pipes`` (stream bit -> pipe)."""
        wake_r, self._wake = os.pipe()
        self._thread = threading.Thread(target=self._pump, args=(pipes, wake_r),
                                        name=f"output-{self._meta.get('rank')}", daemon=True)
        self._thread.start()

    def _pump(self, pipes: dict[int, IO[bytes]], wake_r: int) -> None:
        sel = selectors.DefaultSelector()
        streams: dict[int, _Stream] = {}
        try:
            sel.register(wake_r, selectors.EVENT_READ)
            for stream, pipe in pipes.items():
                s = streams[pipe.fileno()] = _Stream(stream, pipe, self._routes[stream])
                sel.register(pipe.fileno(), selectors.EVENT_READ, s)
            while streams:
                waiting = [s for s in streams.values() if s.progress is not None]
                events = sel.select(PROGRESS_INTERVAL_S / 4 if waiting else None)
                for s in waiting:
                    self._show_progress(s, time.monotonic())
                for key, _ in events:
                    if key.fd == wake_r:
                        self._drain(streams)
                        return  # detached
                    s = key.data
                    try:
                        chunk = os.read(key.fd, 65536)
                    except OSError:
                        chunk = b""
                    if chunk:
                        self._feed(s, chunk)
                    else:  # the worker (and its children) closed it
                        sel.unregister(key.fd)
                        self._finish(streams.pop(key.fd))
        finally:
            sel.close()
            for s in streams.values():
                self._finish(s)
            for pipe in pipes.values():  # (closed already, unless a log file failed to open)
                try:
                    pipe.close()
                except OSError:
                    pass
            os.close(wake_r)
            with self._lock:
                if self._wake is not None:
                    os.close(self._wake)
                    self._wake = None

    def _drain(self, streams: dict[int, _Stream]) -> None:
        """Read what the pipes already hold, without waiting for more (at most
        :data:`DRAIN_LIMIT_BYTES` a pipe: a worker given up alive may still be writing)."""
        for fd, s in streams.items():
            try:
                os.set_blocking(fd, False)
                taken = 0
                while taken < DRAIN_LIMIT_BYTES:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    taken += len(chunk)
                    self._feed(s, chunk)
            except OSError:  # BlockingIOError: the pipe is empty
                pass

    def _feed(self, s: _Stream, chunk: bytes) -> None:
        if s.log is not None:
            try:
                s.log.write(chunk)
            except OSError:
                pass
        if not s.route.to_console:
            return
        *lines, s.partial = (s.partial + chunk).split(b"\n")
        if lines:
            s.progress = None  # a line ended: what it says is newer than any progress state
        for line in lines:
            if b"\r" in line:  # as a terminal shows it: the text after the last carriage return
                line = next((seg for seg in reversed(line.split(b"\r")) if seg), b"")
            self._console.worker_line(s.stream, self._prefix, line + b"\n", self._meta)
        if b"\r" in s.partial:
            # rewritten in place and no newline yet (a progress bar): the latest complete state
            # is shown, at most once per PROGRESS_INTERVAL_S, instead of waiting for the newline
            done, s.partial = s.partial.rsplit(b"\r", 1)
            latest = next((seg for seg in reversed(done.split(b"\r")) if seg), None)
            if latest is not None:
                s.progress = latest
                self._show_progress(s, time.monotonic())

    def _show_progress(self, s: _Stream, now: float) -> None:
        if s.progress is not None and now - s.progress_at >= PROGRESS_INTERVAL_S:
            self._console.worker_line(s.stream, self._prefix, s.progress + b"\n", self._meta)
            s.progress, s.progress_at = None, now

    def _finish(self, s: _Stream) -> None:
        if s.route.to_console:
            if s.partial:  # a last line without its newline
                self._console.worker_line(s.stream, self._prefix, s.partial, self._meta)
            elif s.progress is not None:  # the last progress state not shown yet
                self._console.worker_line(s.stream, self._prefix, s.progress + b"\n", self._meta)
        s.partial, s.progress = b"", None
        s.close()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the pipes are drained (the worker and its children closed them)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def detach(self, timeout: float = 2.0) -> None:
        """Stop reading, the pipes still open: what they already hold is read (without waiting
        for more; a last partial line is printed), and wait up to ``timeout`` for the reader
        thread to end."""
        with self._lock:
            if self._wake is not None:
                os.close(self._wake)  # the reader's end of it reads as closed: it returns
                self._wake = None
        self.join(timeout)
