"""CUDA checks shared by the GPU tests."""
from __future__ import annotations

from collections.abc import Callable

import torch


def returns_while_the_gpu_is_busy(fn: Callable[[], object]) -> bool:
    """Run ``fn`` behind about a second of queued GPU work; True when that work is still running
    when ``fn`` returns, i.e. ``fn`` never made the host wait for the stream (no timing bound:
    the spin outlasts any call here by orders of magnitude, and a synchronising call waits it out).
    ``set_sync_debug_mode`` is not enough: it does not see a blocking host-to-device copy."""
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of spinning at H200 clocks
    fn()
    busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    return busy
