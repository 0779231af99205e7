"""What the experiment scripts share: timing over a region of CUDA events, and the chunk shape
of the fused loss's products at N=16384 (V x H weight, K rows per chunk) as arguments."""
from __future__ import annotations

import argparse
from collections.abc import Callable

import torch


def region_ms(fn: Callable[[], object], reps: int) -> float:
    """ms per call of ``reps`` calls queued back to back; the region opens behind one call
    already queued, so the GPU is busy from its first event (not waiting for the host)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def chunk_shape_parser(rounds: int = 7) -> argparse.ArgumentParser:
    """``--v --h --k`` (the loss's vocabulary, hidden size and chunk rows) and ``--rounds
    --reps`` (round-robin rounds, calls per region); a script may add its own arguments."""
    p = argparse.ArgumentParser()
    p.add_argument("--v", type=int, default=128256)
    p.add_argument("--h", type=int, default=4096)
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--reps", type=int, default=5)
    return p
