"""Why did the window kernel's "never makes the host wait" test fail once under pytest -n 4?

Repeats the test's measured step and reports, per call: whether the queued spin was still
running when the call returned, the call's host time, the spin's own GPU time (events around
it) and the allocator segments the call created (a new segment means a cudaMalloc). A call
whose host time is shorter than the spin yet finds it finished has waited for the stream.

    python3 benchmarks/gpu/exp/window_host_wait.py --tag solo --calls 20
"""
import argparse
import time

import torch

from kernels.attention import attention
from kernels.attention.masks import SlidingWindow

parser = argparse.ArgumentParser()
parser.add_argument("--tag", default="solo")
parser.add_argument("--calls", type=int, default=20)
parser.add_argument("--reset-grads", action="store_true")
parser.add_argument("--warmups", type=int, default=1)
args = parser.parse_args()

q, k, v = (torch.randn(1, 4, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))


def step() -> None:
    if args.reset_grads:
        q.grad = k.grad = v.grad = None
    attention(q, k, v, SlidingWindow(256), backend="triton_window").sum().backward()


for _ in range(args.warmups):
    step()
rows = []
for i in range(args.calls):
    torch.cuda.synchronize()
    start, spin_done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(2_000_000_000)
    spin_done.record()
    segs = torch.cuda.memory_stats().get("segment.all.allocated", 0)
    t0 = time.perf_counter()
    step()
    host_ms = (time.perf_counter() - t0) * 1e3
    busy = not spin_done.query()
    new_segs = torch.cuda.memory_stats().get("segment.all.allocated", 0) - segs
    torch.cuda.synchronize()
    spin_ms = start.elapsed_time(spin_done)
    rows.append((i, busy, host_ms, spin_ms, new_segs))
waited = [r for r in rows if not r[1] and r[2] < r[3]]
for i, busy, host_ms, spin_ms, new_segs in rows:
    if not busy or i < 2:
        print(f"[{args.tag}] call {i:2d} busy={busy} host {host_ms:8.2f} ms spin {spin_ms:8.1f} ms new segments {new_segs}")
hosts = sorted(r[2] for r in rows)
print(f"[{args.tag}] {len(rows)} calls: spin finished before return {sum(not r[1] for r in rows)}, "
      f"of which the call was shorter than the spin {len(waited)}; host ms median {hosts[len(hosts)//2]:.2f} max {hosts[-1]:.2f}")
