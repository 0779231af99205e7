"""Worker error files, in torchrun's format, and the ``record`` decorator that writes them.

A worker whose entry point is decorated with :func:`record` writes, when an exception
escapes, a JSON file at ``$TORCHELASTIC_ERROR_FILE``::

    {"message": {"message": "ValueError: bad batch",
                 "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1732900000"}}}

which is the layout torch.distributed.elastic uses, so either launcher can read the other's
files. The launcher reads the root-cause worker's file for its end-of-job summary.
"""

from __future__ import annotations

import functools
import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["ERROR_FILE_ENV", "WorkerError", "record", "write_error_file", "read_error_file"]

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class WorkerError:
    """What a worker's error file says: the message, the Python traceback and when."""

    message: str
    traceback: str
    timestamp: float | None


def write_error_file(path: str | os.PathLike[str], exc: BaseException) -> None:
    """Write ``exc`` (with the traceback currently being handled) to ``path``."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    data = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {"py_callstack": tb, "timestamp": str(int(time.time()))},
        }
    }
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, target)


def read_error_file(path: str | os.PathLike[str]) -> WorkerError | None:
    """Parse an error file; ``None`` when it is missing or not in a known layout."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    message = data.get("message")
    if isinstance(message, str):  # the "new" flat layout torch also accepts
        return WorkerError(message=message, traceback="", timestamp=None)
    if not isinstance(message, dict):
        return None
    text = message.get("message")
    extra = message.get("extraInfo") if isinstance(message.get("extraInfo"), dict) else {}
    stack = extra.get("py_callstack", "")
    try:
        ts: float | None = float(extra.get("timestamp"))
    except (TypeError, ValueError):
        ts = None
    return WorkerError(
        message=text if isinstance(text, str) else "",
        traceback=stack if isinstance(stack, str) else "",
        timestamp=ts,
    )


def record(fn: F) -> F:
    """Decorate a worker's entry point so an escaping exception lands in its error file.

    The exception is re-raised afterwards, so the process still exits non-zero. Without
    ``TORCHELASTIC_ERROR_FILE`` (not run under a launcher) the decorator does nothing.
    ``SystemExit`` and ``KeyboardInterrupt`` are not recorded.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            path = os.environ.get(ERROR_FILE_ENV)
            if path:
                try:
                    write_error_file(path, exc)
                except OSError:
                    pass  # never mask the worker's own exception
            raise

    return wrapper  # type: ignore[return-value]
