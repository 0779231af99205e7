"""Does a small host-to-device tensor constructor make the host wait for queued GPU work?

Queues ~50 ms of matmuls, then times on the host: torch.tensor(..., device=cuda), torch.full,
and the fused loss's coefficient function (as committed, and with the old torch.tensor line).
A host time near the queued GPU time means the call waited for the stream."""
import time

import torch

from kernels.lce.config import LossConfig, reduction_coefficients

a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t = torch.randint(0, 1000, (4096,), device="cuda")


def queue_work() -> None:
    for _ in range(40):
        a @ a  # ~1.4 ms each on an H200


def host_ms(fn) -> float:
    torch.cuda.synchronize()
    queue_work()
    t0 = time.perf_counter()
    fn()
    ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    return ms


def gpu_ms() -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    queue_work()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


gpu_ms()
print(f"queued GPU work: {gpu_ms():.1f} ms")
cases = {
    "torch.tensor(3.0, device=cuda)": lambda: torch.tensor(3.0, device="cuda"),
    "torch.full((), 3.0, device=cuda)": lambda: torch.full((), 3.0, device="cuda"),
    "reduction_coefficients (mean)": lambda: reduction_coefficients(LossConfig(), t, None, 1000, torch.float32),
    "reduction_coefficients (sum)": lambda: reduction_coefficients(LossConfig("sum"), t, None, 1000, torch.float32),
}
for name, fn in cases.items():
    fn()
    print(f"{name:36s} host {min(host_ms(fn) for _ in range(5)):8.3f} ms (min of 5)")
