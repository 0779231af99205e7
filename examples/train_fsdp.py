"""Train the small Llama (kernels.model) with fsdp2.fully_shard: torch's FSDP2 with all-gather
and reduce-scatter on their own torchcomms communicators.

    torchcomms-run --nproc-per-node 2 examples/train_fsdp.py --steps 40
    torchcomms-run --nproc-per-node 4 examples/train_fsdp.py --replicate 2     # HSDP 2 x 2
    torchcomms-run --nproc-per-node 2 examples/train_fsdp.py --no-overlap      # one communicator

CPU (gloo) by default; on CUDA (nccl) when a GPU is present, with bf16 mixed precision and a
sliding-window attention (the window kernel) switched on. The loss is the fused linear +
cross-entropy of kernels.lce where importable. The data is a synthetic language (each token
follows from the previous two by a fixed rule) so the loss visibly falls. Rank 0 prints the
global loss, then throughput and peak memory.
"""
from __future__ import annotations

import argparse
import time
import warnings

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

import fsdp2
import torchcomms
from kernels.model import Llama, LlamaConfig, fused_loss_available

warnings.filterwarnings("ignore", message="FSDP2-wrapped module")  # the model returns a view of its loss


def batch(gen: torch.Generator, n: int, seq: int, vocab: int, device: torch.device) -> torch.Tensor:
    """Sequences of x[t] = (x[t-1] + x[t-2]) mod vocab from random starts."""
    x = torch.empty(n, seq + 1, dtype=torch.long)
    x[:, :2] = torch.randint(0, vocab, (n, 2), generator=gen)
    for t in range(2, seq + 1):
        x[:, t] = (x[:, t - 1] + x[:, t - 2]) % vocab
    return x.to(device)


def peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--replicate", type=int, default=1, help="HSDP replica groups (1: plain FSDP)")
    p.add_argument("--no-overlap", action="store_true", help="all-gather and reduce-scatter on one communicator")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = p.parse_args()

    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda") if use_cuda else torch.device("cpu")
    if not use_cuda:
        torch.set_num_threads(1)
    comm = torchcomms.new_comm("nccl" if use_cuda else "gloo", device, name="fsdp",
                               abort_process_on_timeout_or_error=False)
    rank, size = comm.get_rank(), comm.get_size()
    device = comm.get_device()
    torch.manual_seed(0)  # identical initial weights on every rank
    cfg = LlamaConfig.tiny(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=4, n_kv_heads=2,
                           ffn_dim=4 * args.dim, attn_window=args.seq // 2 if use_cuda else None)
    model = Llama(cfg).to(device)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if use_cuda else None
    kw = dict(mp_policy=mp, replicate_size=args.replicate, overlap=not args.no_overlap)
    for blk in model.blocks:
        fsdp2.fully_shard(blk, comm, **kw)
    fsdp2.fully_shard(model, comm, **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1 + rank)
    if rank == 0:
        comms = fsdp2.comms_of(model)
        print(f"world {size} ({'HSDP %dx%d' % (comms.replicate_size, comms.shard_size) if comms.is_hsdp else 'FSDP'}) "
              f"on {device}; communicators {[c.get_name() for c in comms.communicators()]}; "
              f"{model.num_params() / 1e6:.2f} M params; fused loss: {fused_loss_available()}", flush=True)
    tokens = 0
    t0 = time.perf_counter()
    for step in range(args.steps):
        x = batch(gen, args.batch, args.seq, args.vocab, device)
        loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens += x[:, 1:].numel() * size
        g = loss.detach().float().reshape(1)
        comm.all_reduce(g, torchcomms.ReduceOp.AVG, async_op=False)
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {g.item():.4f}", flush=True)
    secs = time.perf_counter() - t0
    if rank == 0:
        print(f"{tokens / secs:,.0f} tokens/s over {args.steps} steps ({secs:.1f} s); "
              f"peak memory rank 0: {peak_memory_mib(device):.0f} MiB", flush=True)
    fsdp2.release_comms(fsdp2.comms_of(model))
    comm.finalize()


if __name__ == "__main__":
    main()
