"""Build and load the C++ part of :class:`torchcomms._comms._BackendWrapper`.

The extension is compiled with torch's C++ extension tooling (``torch.utils.cpp_extension.load``,
ninja, the system C++ compiler) into a cache directory keyed by the torch version, the Python
version and a hash of the source, so one machine can hold builds for several torch versions
(2.13 in CI, 2.11 on the GPU machine) and a changed source rebuilds by itself.

- ``python -m torchcomms.csrc.build`` builds it now (``scripts/setup.sh`` runs this);
- the first call of :class:`torchcomms._comms._BackendWrapper` (the route's first process
  group) loads a finished build directly from the cache (no compiler, no ninja), or builds it
  then. Importing :mod:`torchcomms._comms` (torch does it on every ``import torch``) loads
  nothing.

Cache root: ``TORCHCOMMS_EXTENSIONS_DIR``, else ``~/.cache/torchcomms/extensions``.

Processes that build at once (the ranks of a job on a machine without a build) take turns on a
``flock`` of ``build.flock`` in the cache entry: the kernel releases it when its holder dies,
so a builder that was killed (a rank SIGKILLed mid-build) never blocks the next one. Torch's
own lock file there (``lock``, which it waits on without end while it exists) is then removed
by the holder before it builds. Waiting for another builder is bounded by
``TORCHCOMM_EXTENSION_BUILD_TIMEOUT_S`` (``torchcomms.config``, default 900), then
:class:`ExtensionBuildTimeout` names the process that holds the build.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).resolve().parent / "backend_wrapper.cpp"
_LOAD_LOCK = threading.Lock()
_DONE_MARK = "build.ok"
_BUILD_FLOCK = "build.flock"
_TORCH_BATON = "lock"  # torch.utils.cpp_extension's lock file in the build directory
#: pause between two tries of a held build lock (seconds)
_LOCK_POLL_S = 0.2


class ExtensionBuildTimeout(TimeoutError):
    """Another process held the extension's build for longer than the build timeout."""


@contextmanager
def _build_turn(directory: Path) -> Iterator[None]:
    """Hold the cache entry's build lock (see the module doc) for the ``with`` body."""
    from torchcomms.config import settings

    path = directory / _BUILD_FLOCK
    timeout = settings().extension_build_timeout_s
    deadline = time.monotonic() + timeout
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                    raise ExtensionBuildTimeout(
                        f"torchcomms: process {holder} has been building the C++ extension in {directory} "
                        f"for over {timeout:g} s (TORCHCOMM_EXTENSION_BUILD_TIMEOUT_S); build it ahead with "
                        "`python -m torchcomms.csrc.build`") from None
                time.sleep(_LOCK_POLL_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _torch_include_dir() -> Path:
    import torch

    return Path(torch.__file__).parent / "include" / "torch" / "csrc" / "distributed" / "c10d"


def _premul_supplement_name() -> str:
    """The PREMUL_SUM supplement's class name in this torch (it was renamed across versions)."""
    text = (_torch_include_dir() / "Types.hpp").read_text()
    return "NCCLPreMulSumSupplement" if "struct NCCLPreMulSumSupplement" in text else "PreMulSumSupplement"


@functools.lru_cache(maxsize=None)
def build_key() -> str:
    """``torch<version>-py<maj><min>-<source hash>``: one cache entry per torch and source."""
    import torch

    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(_premul_supplement_name().encode())
    return f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest.hexdigest()[:12]}"


def cache_root() -> Path:
    """Where the native builds are kept: ``TORCHCOMMS_EXTENSIONS_DIR``, else ``~/.cache/torchcomms/extensions``."""
    return Path(os.environ.get("TORCHCOMMS_EXTENSIONS_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "torchcomms", "extensions"))


def cache_dir() -> Path:
    return cache_root() / build_key()


def module_name() -> str:
    return "torchcomms_c10d_" + build_key().rsplit("-", 1)[1]


def _import_built(directory: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, directory / f"{name}.so")
    if spec is None or spec.loader is None:
        raise ImportError(f"torchcomms: cannot load the C++ extension from {directory}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def build(verbose: bool = False) -> ModuleType:
    """Compile (or find up to date) the extension and load it."""
    from torch.utils import cpp_extension

    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with _build_turn(directory):
        # nobody else builds here now: a torch lock file is a killed builder's
        (directory / _TORCH_BATON).unlink(missing_ok=True)
        module = cpp_extension.load(
            name=module_name(),
            sources=[str(SOURCE)],
            build_directory=str(directory),
            extra_cflags=["-O2", f"-DTC_PREMUL_SUPPLEMENT={_premul_supplement_name()}"],
            verbose=verbose,
        )
        (directory / _DONE_MARK).write_text(build_key() + "\n")
    sys.modules[module_name()] = module  # what load() and wrapper_class() look up
    return module


def load() -> ModuleType:
    """The extension module: from the cache when built, else built now (see the module doc).
    One load per process, whichever thread asks first (a second import of the same pybind
    module would register its class twice)."""
    name = module_name()
    with _LOAD_LOCK:
        if name in sys.modules:
            return sys.modules[name]
        directory = cache_dir()
        if (directory / _DONE_MARK).exists():
            return _import_built(directory, name)
        return build()


def wrapper_class(loaded_only: bool = False) -> type | None:
    """The C++ ``_BackendWrapper`` class, the extension loaded (or built) first; with
    ``loaded_only``, None while the extension is not loaded in this process (nothing is loaded)."""
    module = sys.modules.get(module_name()) if loaded_only else load()
    return None if module is None else getattr(module, "_BackendWrapper")


def main() -> None:
    start = time.perf_counter()
    build(verbose="-v" in sys.argv)
    print(f"torchcomms: C++ backend wrapper ready in {cache_dir()} ({time.perf_counter() - start:.1f} s)")
    from torchcomms.csrc import gloo_guard  # imports this module: only once it is whole

    start = time.perf_counter()
    print(f"torchcomms: gloo's size-mismatch guard ready in {gloo_guard.built_library().parent} "
          f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
