"""Build, load and query ``gloo_guard.cpp``: the terminate handler that parks gloo's network
thread, instead of aborting the process, when a message is longer than its receive buffer.

The library is compiled with the system C++ compiler (``$CXX``, else ``c++``; no torch headers,
well under a second) into the native build cache (``build.cache_root()``), under a name keyed
by the source's hash, on the first gloo engine of a machine; concurrent builders each write
their own file and rename it into place. Without a compiler the guard is absent and a size
mismatch aborts the process as before (logged once).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import threading
from pathlib import Path

from torchcomms.csrc.build import cache_root

SOURCE = Path(__file__).resolve().parent / "gloo_guard.cpp"
_MESSAGE_BYTES = 512
_log = logging.getLogger(__name__)
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def _library_path() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return cache_root() / f"gloo_guard-{digest}" / "libtc_gloo_guard.so"


def _build(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
    cmd = [os.environ.get("CXX") or "c++", "-O2", "-shared", "-fPIC", "-o", str(partial), str(SOURCE)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def built_library() -> Path:
    """The guard's library, built first if this machine's cache lacks it (set-up builds it)."""
    path = _library_path()
    if not path.exists():
        _build(path)
    return path


def install() -> bool:
    """Install the handler in this process (built first where needed); whether it is installed."""
    global _lib, _tried
    with _lock:
        if not _tried:
            _tried = True
            try:
                lib = ctypes.CDLL(str(built_library()))
                lib.tc_gloo_guard_message.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_int]
                lib.tc_gloo_guard_install()
                _lib = lib
            except (OSError, subprocess.SubprocessError) as e:
                _log.warning("torchcomms: gloo's size-mismatch guard is not available (%s): ranks that call a "
                             "collective with different sizes may abort in C++", e)
        return _lib is not None


def parked_message(tids: frozenset[int]) -> str | None:
    """gloo's message when one of the loop threads ``tids`` is parked by the guard, else None."""
    lib = _lib
    if lib is None or not tids or lib.tc_gloo_guard_parked_count() == 0:
        return None
    buf = ctypes.create_string_buffer(_MESSAGE_BYTES)
    for tid in tids:
        if lib.tc_gloo_guard_message(tid, buf, _MESSAGE_BYTES):
            return buf.value.decode(errors="replace")
    return None


def threads() -> set[int]:
    """The ids of this process's threads (empty where /proc is missing). Gloo's network thread
    names itself once running, so a device's is found as the thread that its creation added."""
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:
        return set()
