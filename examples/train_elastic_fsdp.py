"""Elastic HSDP training: a replica that loses a rank drops out, the others carry on without a
restart, and the replacement heals back in from a live replica.

    torchcomms-run --nproc-per-node 4 --on-failure shrink --max-restarts 1 \\
        examples/train_elastic_fsdp.py --shard 2 --steps 40 --fail-rank 3 --fail-step 10

The small Llama of kernels.model on CPU, 2 replicas x 2 shards (``fsdp2.elastic``). Rank
``--fail-rank`` SIGKILLs itself in its first life during step ``--fail-step`` (``--fail-at``:
``forward``, ``backward`` or ``random``: a random instant of the step). Its replica's other ranks leave
(``ReplicaLostError``, exit 1); the other replica keeps its gradients, computes the lost
replica's samples of the step too and applies it (``--redo``: redoes the step with the whole
global batch instead); the launcher starts the failed replica's processes again, they are admitted at a step
boundary and receive the parameters and optimizer state over the replicate communicators.
The lowest live rank prints the loss of every step, which replicas trained it, and what changed.
"""
from __future__ import annotations

import time

T_START = time.time()  # this process's start, for the heal time of benchmarks/elastic_bench.py

import argparse
import hashlib
import json
import os
import random
import signal
import sys
import threading
import warnings
from datetime import timedelta

import torch

from fsdp2.elastic import ElasticHSDP, ReplicaLostError
from kernels.model import Llama, LlamaConfig

warnings.filterwarnings("ignore", message="FSDP2-wrapped module")  # the model returns a view of its loss


def sample(i: int, seq: int, vocab: int) -> torch.Tensor:
    """Sample ``i`` of the data set: x[t] = (x[t-1] + x[t-2]) mod vocab from a start fixed by ``i``."""
    g = torch.Generator().manual_seed(1000 + i)
    x = torch.empty(seq + 1, dtype=torch.long)
    x[:2] = torch.randint(0, vocab, (2,), generator=g)
    for t in range(2, seq + 1):
        x[t] = (x[t - 1] + x[t - 2]) % vocab
    return x


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shard", type=int, default=2, help="ranks per replica")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8, help="global batch (sequences per step, all ranks)")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--lr-decay", type=float, default=0.0,
                   help="an LR schedule: lr / (1 + DECAY * step) (LambdaLR; ElasticHSDP steps it with each "
                   "applied step)")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=10)
    p.add_argument("--fail-at", choices=("forward", "backward", "random"), default="backward")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds each step waits (slows the job)")
    p.add_argument("--stop-after-heal", type=int, default=0,
                   help="end K steps after a replica healed in, whatever --steps says (tests, demos)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds: every communicator's op timeout")
    p.add_argument("--record", default="", help="append one JSON line per applied step to RECORD.<rank>")
    p.add_argument("--no-hash", action="store_true", help="records leave out the parameters' sha256")
    p.add_argument("--redo", action="store_true", help="after a failure the survivors redo the step with the whole "
                   "global batch (ElasticHSDP.train_step) instead of computing only the lost replica's samples")
    p.add_argument("--plain", action="store_true", help="the same job without elasticity (fsdp2.fully_shard HSDP "
                   "on one communicator), for torchrun --max-restarts (benchmarks/elastic_bench.py's anchor)")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.plain:
        return plain(args)

    el = ElasticHSDP(shard_size=args.shard, timeout=timedelta(seconds=args.timeout))
    torch.manual_seed(0)
    cfg = LlamaConfig.tiny(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=4, n_kv_heads=2,
                           ffn_dim=4 * args.dim)
    model = Llama(cfg)
    for blk in model.blocks:
        el.fully_shard(blk)
    el.fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + args.lr_decay * s)) if args.lr_decay else None
    first_life = el.incarnation == 1

    def loss_on(indices: list[int] | range) -> torch.Tensor:
        x = torch.stack([sample(i, args.seq, args.vocab) for i in indices])
        return model(x[:, :-1], x[:, 1:])

    per_rank = max(1, -(-args.batch // (el.n_replicas * args.shard)))  # a step's part with every replica live
    if not el.start(model, opt, warm_up=lambda: loss_on(range(per_rank)), scheduler=sched):
        print(f"[rank {el.rank}] the job finished before this replica was admitted", flush=True)
        return
    end = args.steps
    if not first_life:
        print(f"[rank {el.rank}] replica {el.replica} healed in at step {el.step}", flush=True)
        if args.stop_after_heal:
            end = el.step + args.stop_after_heal
    record = open(f"{args.record}.{el.rank}", "a") if args.record else None
    if record is not None:
        record.write(json.dumps({"start": T_START, "joined": time.time(), "incarnation": el.incarnation,
                                 "at_step": el.step, "heal": el.heal_times}) + "\n")
        record.flush()
    while el.step < end:
        doomed = first_life and el.rank == args.fail_rank and el.step == args.fail_step
        if doomed and record is not None:
            record.write(json.dumps({"killed": time.time(), "at_step": el.step}) + "\n")
            record.flush()
        calls = 0

        def mean_loss_of(indices: list[int] | range) -> torch.Tensor:
            nonlocal calls
            calls += 1
            if doomed and calls == 1 and args.fail_at == "random":
                threading.Timer(random.uniform(0, 0.2), os.kill, (os.getpid(), signal.SIGKILL)).start()
            if doomed and args.fail_at == "forward":
                os.kill(os.getpid(), signal.SIGKILL)
            loss = loss_on(indices)
            if doomed and args.fail_at == "backward":
                loss.register_hook(lambda g: os.kill(os.getpid(), signal.SIGKILL))
            if args.step_sleep:
                time.sleep(args.step_sleep)
            return loss

        def forward_backward() -> torch.Tensor:
            loss = mean_loss_of(el.batch_indices(args.batch))
            loss.backward()
            return loss

        try:
            if args.redo:
                res = el.train_step(forward_backward)
            else:
                res = el.train_batch(mean_loss_of, args.batch)
        except ReplicaLostError as e:
            print(f"[rank {el.rank}] {e}", flush=True)
            sys.exit(1)
        if res.event == "healed" and args.stop_after_heal:
            end = el.step + args.stop_after_heal
        if res.applied and record is not None:
            h = hashlib.sha256()
            for q in [] if args.no_hash else model.parameters():
                h.update(q.detach().to_local().contiguous().numpy().tobytes())
            digest = h.hexdigest()
            record.write(json.dumps({"step": res.step, "loss": res.loss, "replicas": list(res.replicas),
                                     "event": res.event, "params": digest, "time": time.time(),
                                     "recovery_s": el.recovery_s, "passes": res.passes,
                                     "lr": opt.param_groups[0]["lr"]}) + "\n")
            record.flush()
        if el.rank == el.members()[0] and (res.event or res.step % 5 == 0 or el.step == end):
            what = f"step {res.step:3d}  loss {res.loss:.4f}" if res.applied else f"step {res.step:3d}  not applied"
            print(f"{what}  replicas {list(res.replicas)}{'  (' + res.event + ')' if res.event else ''}", flush=True)
    el.finish()


def plain(args: argparse.Namespace) -> None:
    """The same model, data and kill without elasticity: HSDP on one communicator; a failure
    ends the attempt and torchrun starts every worker again from step 0."""
    import torch.distributed as dist

    import fsdp2
    import torchcomms

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True);
    # elsewhere (torchcomms-run, plain env vars) rank 0 hosts it
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.PrefixStore(f"attempt{attempt}", dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
        is_master=rank == 0 and not agent_store, timeout=timedelta(seconds=args.timeout)))
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="plain", store=store,
                               timeout=timedelta(seconds=args.timeout))
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=4,
                                   n_kv_heads=2, ffn_dim=4 * args.dim))
    for blk in model.blocks:
        fsdp2.fully_shard(blk, comm, replicate_size=world // args.shard)
    fsdp2.fully_shard(model, comm, replicate_size=world // args.shard)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    record = open(f"{args.record}.{rank}", "a") if args.record else None
    if record is not None:
        record.write(json.dumps({"start": T_START, "incarnation": attempt + 1, "at_step": 0, "heal": {}}) + "\n")
    for step in range(args.steps):
        if attempt == 0 and rank == args.fail_rank and step == args.fail_step:
            if record is not None:
                record.write(json.dumps({"killed": time.time(), "at_step": step}) + "\n")
                record.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.time()
        per, extra = divmod(args.batch, world)
        lo = step * args.batch + rank * per + min(rank, extra)
        x = torch.stack([sample(i, args.seq, args.vocab) for i in range(lo, lo + per + (rank < extra))])
        loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if record is not None:
            record.write(json.dumps({"step": step, "loss": float(loss.detach()), "time": time.time(),
                                     "attempt": attempt, "passes": [[t0, time.time()]]}) + "\n")
            record.flush()
    fsdp2.release_comms(fsdp2.comms_of(model))
    comm.finalize()


if __name__ == "__main__":
    main()
