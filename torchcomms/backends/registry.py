"""The backend registry: built-ins, entry points (group ``torchcomms.backends``) and
``register_backend``."""
from __future__ import annotations

import importlib
import threading
from importlib import metadata

from torchcomms.errors import BackendNotFoundError, CommTypeError

_BUILTIN: dict[str, str] = {
    "fake": "torchcomms.backends.fake:FakeBackend",
    "gloo": "torchcomms.backends.gloo:GlooBackend",
    "nccl": "torchcomms.backends.nccl:NcclBackend",
    "mpi": "torchcomms.backends.mpi:MpiBackend",
}
_registered: dict[str, type] = {}
_lock = threading.Lock()


def register_backend(name: str, cls: type) -> None:
    """Make ``new_comm(name, ...)`` use ``cls`` (a ``TorchCommBackend`` subclass)."""
    from torchcomms.backends.base import TorchCommBackend

    if not isinstance(name, str) or not name:
        raise CommTypeError(f"backend name must be a non-empty string, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, TorchCommBackend)):
        raise CommTypeError(f"backend class must subclass torchcomms.TorchCommBackend, got {cls!r}")
    with _lock:
        _registered[name] = cls


def _entry_points() -> dict[str, str]:
    try:
        eps = metadata.entry_points(group="torchcomms.backends")
    except Exception:  # noqa: BLE001 - broken metadata must not break the registry
        return {}
    return {ep.name: ep.value for ep in eps}


def _load(spec: str) -> type:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def get_backend_class(name: str) -> type:
    """The class registered for ``name``, or ``BackendNotFoundError`` listing what exists."""
    with _lock:
        cls = _registered.get(name)
    if cls is not None:
        return cls
    spec = _BUILTIN.get(name) or _entry_points().get(name)
    if spec is None:
        raise BackendNotFoundError(
            f"failed to find backend {name!r}: no torchcomms backend named {name!r}; "
            f"built backends: {', '.join(built_backends())}"
        )
    cls = _load(spec)
    with _lock:
        _registered.setdefault(name, cls)
    return cls


def built_backends() -> list[str]:
    """Names of every backend that can be created in this installation."""
    names = set(_BUILTIN) | set(_entry_points())
    with _lock:
        names |= set(_registered)
    return sorted(n for n in names if is_backend_built(n))


def is_backend_built(name: str) -> bool:
    """True when ``name`` can be created here (its module imports and its engine exists)."""
    with _lock:
        if name in _registered:
            return True
    spec = _BUILTIN.get(name) or _entry_points().get(name)
    if spec is None:
        return False
    try:
        cls = _load(spec)
    except Exception:  # noqa: BLE001
        return False
    available = getattr(cls, "is_available", None)
    return bool(available()) if callable(available) else True
