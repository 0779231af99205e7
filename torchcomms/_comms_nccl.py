"""The reference API's ``torchcomms._comms_nccl``: ``TorchCommNCCL`` is the type of what
``comm.get_backend_impl()`` returns on an nccl communicator (c10d's ``ProcessGroupNCCL``); an
``ImportError`` where torch was built without NCCL, as the reference's module is absent there."""
from __future__ import annotations

try:
    from torch.distributed import ProcessGroupNCCL as TorchCommNCCL
except ImportError as e:
    raise ImportError(f"torchcomms._comms_nccl needs a torch built with NCCL ({e})") from None

__all__ = ["TorchCommNCCL"]
