"""CUDA checks shared by the GPU tests."""
from __future__ import annotations

from collections.abc import Callable

import torch


def returns_while_the_gpu_is_busy(fn: Callable[[], object], warmups: int = 2) -> bool:
    """Run ``fn`` behind about a second of queued GPU spinning; True when that spin has not yet
    finished when ``fn`` returns, i.e. ``fn`` never made the host wait for the stream.

    ``fn`` runs ``warmups`` times first, so that what it launches is compiled and loaded: CUDA
    loads a kernel's module lazily at its first launch, which can wait for the context's queued
    work (seen on the H200: the first call that accumulated into existing ``.grad`` tensors
    waited, the later ones did not, and with ``CUDA_MODULE_LOADING=EAGER`` none did).

    The end of the spin is marked by its own event: querying the whole stream is not enough,
    since a call that waited for the spin has queued its own later kernels by the time it
    returns, and they keep the stream busy. No timing bound: the spin outlasts any call here by
    orders of magnitude. ``set_sync_debug_mode`` is not enough either: it does not see a
    blocking host-to-device copy."""
    for _ in range(warmups):
        fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of spinning at H200 clocks
    spin_done = torch.cuda.Event()
    spin_done.record()
    fn()
    busy = not spin_done.query()
    torch.cuda.synchronize()
    return busy
