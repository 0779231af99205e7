"""Data-parallel training that survives the loss of a rank: shrink and carry on.

    torchcomms-run --nproc-per-node 4 --on-failure shrink examples/elastic_train.py \
        --steps 60 --fail-rank 2 --fail-step 20
    torchcomms-run --nproc-per-node gpu --on-failure shrink examples/elastic_train.py \
        --device cuda --fail-rank 1                       # nccl, one GPU per rank

Every rank trains on its own data; gradients are averaged over the *current* world size.
``--fail-rank`` SIGKILLs itself at ``--fail-step`` (a stand-in for a crashed node). The others
see ``PeerFailureError`` at once. A collective cut short by a failure may still complete on
some survivors, so each step's outcome is put to ``comm.agree(ok)``: the step is applied only if
every survivor's collectives succeeded; otherwise all survivors agree on the members with
``comm.shrink()``, print the membership change and redo the step together. The weights stay
identical on every survivor without being resynchronised. On a GPU a collective's failure is
known once the op ended, so each step waits on the host for its last collective before the
vote (``wait_blocking``), which then raises the failure of any of the step's collectives.
"""
from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.nn as nn

import torchcomms
from torchcomms import ReduceOp


def batch(gen: torch.Generator, dim: int = 16, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, dim, generator=gen)
    w = torch.linspace(-1, 1, dim).unsqueeze(1)
    return x, x @ w + 0.01 * torch.randn(n, 1, generator=gen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-step", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: the nccl backend, one GPU per rank (cuda:LOCAL_RANK)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    cuda = args.device == "cuda"
    comm = torchcomms.new_comm("nccl" if cuda else "gloo", torch.device(args.device), name="dp")
    device = comm.get_device()
    me = comm.get_rank()  # the job rank; comm ranks change after a shrink
    torch.manual_seed(0)
    model = nn.Linear(16, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(100 + me)
    step = 0
    while step < args.steps:
        if me == args.fail_rank and step == args.fail_step:
            print(f"[job rank {me}] failing now (SIGKILL) at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = (t.to(device) for t in batch(gen))
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        err: torchcomms.CommError | None = None
        try:
            for p in model.parameters():
                comm.all_reduce(p.grad, ReduceOp.AVG, async_op=False)
            report = loss.detach().reshape(1)
            # the step's last collective, waited for on the host: on a GPU a failure shows then
            comm.all_reduce(report, ReduceOp.AVG, async_op=False).wait_blocking()
        except torchcomms.CommError as e:
            err = e
        if not comm.agree(err is None):  # the same answer on every survivor
            t0 = time.perf_counter()
            old = comm.get_global_ranks()
            comm = comm.shrink()
            if comm.get_rank() == 0:
                why = f"{type(err).__name__}: {err}" if err is not None else "another rank's collectives failed"
                print(f"[step {step}] {why}", flush=True)
                print(f"[step {step}] membership {old} -> {comm.get_global_ranks()} "
                      f"(world {len(old)} -> {comm.get_size()}), shrink took "
                      f"{(time.perf_counter() - t0) * 1e3:.1f} ms; redoing the step", flush=True)
            continue  # every survivor redoes this step (nobody applied its gradients)
        opt.step()
        if comm.get_rank() == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {report.item():.4f}  world {comm.get_size()}", flush=True)
        step += 1
    comm.finalize()


if __name__ == "__main__":
    main()
