"""The reference API's ``torchcomms._comms`` names.

``_BackendWrapper(comm)`` is the c10d ``Backend`` that ``torch.distributed`` registers for a
process group when ``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1``: a small C++ class (``csrc/``, built
by :mod:`torchcomms.csrc.build`) forwarding every c10d op to ``comm`` through
:class:`torchcomms._comms.forward.CommForwarder`.

torch imports ``_BackendWrapper`` while ``torch.distributed`` itself is being imported (so on
every ``import torch``), whether or not the route is used. The name is therefore a stand-in
that loads the C++ extension only when it is first called (from the cache, or built there):
``_BackendWrapper(comm)`` returns an instance of the C++ class, and ``isinstance(x,
_BackendWrapper)`` holds exactly for those (it is False, without loading anything, while the
extension is not loaded). The other names are imported on first use.
"""
from __future__ import annotations

from typing import Any

from torchcomms.csrc import build


class _LoadedOnCall(type):
    """Metaclass of the stand-in: construction, instance checks and attributes go to the C++
    class, loaded on first construction or attribute access."""

    def __call__(cls, comm: Any) -> Any:
        from torchcomms._comms import backend_names, fresh_groups, registration

        backend_names.install()
        fresh_groups.install()
        backend = build.wrapper_class()(comm)
        registration.register_as_engine_type(backend)
        return backend

    def __instancecheck__(cls, obj: Any) -> bool:
        real = build.wrapper_class(loaded_only=True)
        return real is not None and isinstance(obj, real)

    def __subclasscheck__(cls, sub: type) -> bool:
        real = build.wrapper_class(loaded_only=True)
        return sub is cls or (real is not None and issubclass(sub, real))

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(build.wrapper_class(), name)


class _BackendWrapper(metaclass=_LoadedOnCall):
    """``_BackendWrapper(comm)``: the c10d ``Backend`` forwarding to ``comm`` (see the module doc)."""


_LAZY = {
    # torch 2.11's import-time probe takes new_comm from here (2.13's from the package root)
    "new_comm": ("torchcomms", "new_comm"),
    "TorchCommBackend": ("torchcomms.backends.base", "TorchCommBackend"),
    "OpName": ("torchcomms.types", "OpName"),
    "ReduceOp": ("torchcomms.types", "ReduceOp"),
    "RedOpType": ("torchcomms.types", "RedOpType"),
    "RemovableHandle": ("torch.utils.hooks", "RemovableHandle"),
}
_HOOK_ARGS = "torchcomms._comms.hook_args"

__all__ = ["_BackendWrapper", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        module, attr = _LAZY[name]
    elif name.endswith(("PreHookArgs", "PostHookArgs")):
        module, attr = _HOOK_ARGS, name
    else:
        raise AttributeError(f"module 'torchcomms._comms' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), attr)
    except AttributeError:
        raise AttributeError(f"module 'torchcomms._comms' has no attribute {name!r}") from None
    globals()[name] = value
    return value
