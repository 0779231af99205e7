"""Memory-layout guards for the attention kernels' operands."""
from __future__ import annotations

import torch
from torch import Tensor

#: the base alignment the fast paths assume (TMA descriptors require it; vectorized loads want it)
ALIGNMENT_BYTES = 16


def aligned(t: Tensor) -> Tensor:
    """``t``, or a copy of it when its data starts off a 16-byte boundary.

    A contiguous view into a larger tensor (``buf[1:].view(...)``) can start anywhere. TMA
    descriptors refuse such a base, and torch 2.11's SDPA with a boolean mask returned wrong
    values for one on an H200 (relative error 1.41 against the reference; ``docs/bench/attention.md``),
    so no kernel here is handed one.

    Under ``torch.compile`` a traced tensor has no address: ``t`` is returned as it is (the
    window kernel's operators check again on the real tensors; a compiled SDPA call is
    lowered by Inductor, which places its own buffers)."""
    if torch.compiler.is_compiling():
        return t
    return t if t.data_ptr() % ALIGNMENT_BYTES == 0 else t.clone()
