"""GPU tests of the nccl backend: marked ``gpu``, skipped cleanly where CUDA or NCCL is missing."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist


def nccl_usable() -> bool:
    return torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available()


def gpus() -> int:
    return torch.cuda.device_count() if nccl_usable() else 0


needs_gpu = pytest.mark.skipif(not nccl_usable(), reason="needs CUDA and NCCL")


def needs_gpus(n: int) -> pytest.MarkDecorator:
    """NCCL refuses two ranks on one GPU: a test of ``n`` ranks needs ``n`` GPUs."""
    return pytest.mark.skipif(gpus() < n, reason=f"needs {n} GPUs (NCCL allows one rank per GPU)")
