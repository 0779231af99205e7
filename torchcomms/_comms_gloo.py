"""The reference API's ``torchcomms._comms_gloo``: ``TorchCommGloo`` is the type of what
``comm.get_backend_impl()`` returns on a gloo communicator (c10d's ``ProcessGroupGloo``, the
engine this package drives)."""
from __future__ import annotations

from torch.distributed import ProcessGroupGloo as TorchCommGloo

__all__ = ["TorchCommGloo"]
