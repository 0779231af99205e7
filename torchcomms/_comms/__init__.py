"""The reference API's ``torchcomms._comms`` names.

``_BackendWrapper(comm)`` is the c10d ``Backend`` that ``torch.distributed`` registers for a
process group when ``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1``: a small C++ class (``csrc/``, built
by :mod:`torchcomms.csrc.build`) forwarding every c10d op to ``comm`` through
:class:`torchcomms._comms.forward.CommForwarder`. It is the one name loaded eagerly (torch imports
it while ``torch.distributed`` itself is being imported); the others are imported on first use.
"""
from __future__ import annotations

from typing import Any

from torchcomms.csrc.build import load as _load

_BackendWrapper = _load()._BackendWrapper

_LAZY = {
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
