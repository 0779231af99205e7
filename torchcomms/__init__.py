"""torchcomms: explicit, fault-tolerant communicators for PyTorch.

The public API is re-exported here lazily (PEP 562), so that ``import torchcomms.control``
(the launcher's agent does it) does not import torch.
"""
from __future__ import annotations

from torchcomms._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # communicator
    "new_comm": "torchcomms.setup.create",
    "job_store": "torchcomms.setup.assemble",
    "TorchComm": "torchcomms.core.comm",
    "BatchSendRecv": "torchcomms.core.comm",
    "TorchWork": "torchcomms.core.work",
    # value types
    "ReduceOp": "torchcomms.core.types",
    "RedOpType": "torchcomms.core.types",
    "OpName": "torchcomms.core.types",
    "Timeout": "torchcomms.core.types",
    "CommOptions": "torchcomms.core.types",
    "WorkStatus": "torchcomms.core.types",
    "P2POp": "torchcomms.core.types",
    "P2POpType": "torchcomms.core.types",
    "BatchP2POptions": "torchcomms.core.types",
    "OpRecord": "torchcomms.core.op",
    # backends
    "TorchCommBackend": "torchcomms.backends.base",
    "register_backend": "torchcomms.backends.registry",
    "is_backend_built": "torchcomms.backends.registry",
    "built_backends": "torchcomms.backends.registry",
    # errors
    "CommError": "torchcomms.core.errors",
    "CommTimeoutError": "torchcomms.core.errors",
    "PeerFailureError": "torchcomms.core.errors",
    "CommAbortedError": "torchcomms.core.errors",
    "CollectiveMismatchError": "torchcomms.core.errors",
    "BackendError": "torchcomms.core.errors",
    "CommArgumentError": "torchcomms.core.errors",
    "CommValueError": "torchcomms.core.errors",
    "CommTypeError": "torchcomms.core.errors",
    "BackendNotFoundError": "torchcomms.core.errors",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports('torchcomms', _EXPORTS, globals())
