"""torchcomms: explicit, fault-tolerant communicators for PyTorch.

The public API is re-exported here lazily (PEP 562), so that ``import torchcomms.control``
(the launcher's agent does it) does not import torch.
"""
from __future__ import annotations

from torchcomms._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # communicator
    "new_comm": "torchcomms.create",
    "TorchComm": "torchcomms.comm",
    "BatchSendRecv": "torchcomms.comm",
    "TorchWork": "torchcomms.work",
    # value types
    "ReduceOp": "torchcomms.types",
    "RedOpType": "torchcomms.types",
    "OpName": "torchcomms.types",
    "Timeout": "torchcomms.types",
    "CommOptions": "torchcomms.types",
    "WorkStatus": "torchcomms.types",
    "P2POp": "torchcomms.types",
    "P2POpType": "torchcomms.types",
    "BatchP2POptions": "torchcomms.types",
    "OpRecord": "torchcomms.op",
    # backends
    "TorchCommBackend": "torchcomms.backends.base",
    "register_backend": "torchcomms.backends.registry",
    "is_backend_built": "torchcomms.backends.registry",
    "built_backends": "torchcomms.backends.registry",
    # errors
    "CommError": "torchcomms.errors",
    "CommTimeoutError": "torchcomms.errors",
    "PeerFailureError": "torchcomms.errors",
    "CommAbortedError": "torchcomms.errors",
    "CollectiveMismatchError": "torchcomms.errors",
    "BackendError": "torchcomms.errors",
    "CommArgumentError": "torchcomms.errors",
    "CommValueError": "torchcomms.errors",
    "CommTypeError": "torchcomms.errors",
    "BackendNotFoundError": "torchcomms.errors",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports('torchcomms', _EXPORTS, globals())
