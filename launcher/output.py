"""Worker output: prefixed console lines, per-rank log files and optional JSON lines.

Each worker's stdout and stderr are pipes read by one thread each. A line goes to the
agent's matching console stream (prefixed, e.g. ``[node1:3] loss 0.12``) unless it is
redirected or filtered out, and to the worker's log file when logs are kept.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["Console", "StreamRoute", "OutputPump", "STDOUT", "STDERR"]

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


@dataclass(frozen=True)
class StreamRoute:
    """Where one stream of one worker goes."""

    to_console: bool
    log_file: Path | None


class OutputPump:
    """Copies a worker's stdout/stderr pipes to the console and its log files."""

    def __init__(self, console: Console, prefix: str, meta: dict[str, Any],
                 routes: dict[int, StreamRoute]) -> None:
        self._console = console
        self._prefix = (prefix + " ").encode() if prefix else b""
        self._meta = meta
        self._routes = routes
        self._threads: list[threading.Thread] = []

    def start(self, pipes: dict[int, IO[bytes]]) -> None:
        """Start one reader thread per pipe."""
        for stream, pipe in pipes.items():
            t = threading.Thread(target=self._pump, args=(stream, pipe),
                                 name=f"output-{self._meta.get('rank')}-{stream}", daemon=True)
            t.start()
            self._threads.append(t)

    def _pump(self, stream: int, pipe: IO[bytes]) -> None:
        route = self._routes[stream]
        log = open(route.log_file, "ab", buffering=0) if route.log_file else None  # noqa: SIM115
        try:
            for line in iter(pipe.readline, b""):
                if log is not None:
                    log.write(line)
                if route.to_console:
                    self._console.worker_line(stream, self._prefix, line, self._meta)
        except (OSError, ValueError):
            pass
        finally:
            if log is not None:
                log.close()
            try:
                pipe.close()
            except OSError:
                pass

    def join(self, timeout: float | None = None) -> None:
        """Wait until the pipes are drained (the worker and its children closed them)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
