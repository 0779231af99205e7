"""Host time of one call through a torch.library custom operator with registered autograd
against the same call through a torch.autograd.Function (the eager path the window kernel and
the fused loss keep), on a trivial op, so that the difference is the dispatch alone.

  python3 benchmarks/diagnostics/custom_op_overhead.py [--reps 5000] [--rounds 5]

Prints forward and forward+backward microseconds per call for both, and the ratio; each
round alternates the two, the table shows medians over rounds.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


@torch.library.custom_op("tc_bench::identity", mutates_args=())
def _op(x: torch.Tensor, window: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return x.clone(), x.new_empty(x.shape[:3])


@_op.register_fake
def _(x: torch.Tensor, window: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), x.new_empty(x.shape[:3])


@torch.library.custom_op("tc_bench::identity_backward", mutates_args=())
def _op_backward(x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    return grad.clone()


@_op_backward.register_fake
def _(x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(grad)


def _setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])


def _backward(ctx, grad, _grad_lse):
    return _op_backward(ctx.saved_tensors[0], grad), None, None


_op.register_autograd(_backward, setup_context=_setup)


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, window, scale):  # type: ignore[override]
        ctx.save_for_backward(x)
        return x.clone(), x.new_empty(x.shape[:3])

    @staticmethod
    def backward(ctx, grad, _grad_lse):  # type: ignore[override]
        return grad.clone(), None, None


def _per_call_us(fn, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    x = torch.randn(1, 2, 4, 8, requires_grad=True)
    calls = {"autograd.Function": lambda: _Function.apply(x, 3, 0.5), "custom operator": lambda: _op(x, 3, 0.5)}
    times: dict[tuple[str, str], list[float]] = {(n, k): [] for n in calls for k in ("fwd", "fb")}
    for rnd in range(args.rounds):
        for name in (list(calls) if rnd % 2 == 0 else list(calls)[::-1]):
            fn = calls[name]
            for _ in range(200):
                fn()
            times[name, "fwd"].append(_per_call_us(fn, args.reps))
            times[name, "fb"].append(_per_call_us(lambda fn=fn: torch.autograd.grad(fn()[0], x, x), args.reps // 2))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"host µs per call, median of {args.rounds} alternating rounds (torch {torch.__version__})")
    print(f"{'path':<20} {'forward':>9} {'fwd+bwd':>9}")
    for name in calls:
        print(f"{name:<20} {med[name, 'fwd']:>9.1f} {med[name, 'fb']:>9.1f}")
    a, b = "custom operator", "autograd.Function"
    print(f"{'ratio op/Function':<20} {med[a, 'fwd'] / med[b, 'fwd']:>8.2f}x {med[a, 'fb'] / med[b, 'fb']:>8.2f}x")


if __name__ == "__main__":
    main()
