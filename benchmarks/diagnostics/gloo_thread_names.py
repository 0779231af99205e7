"""The names of a process's threads once c10d's gloo has made a one-rank process group: which
name this torch's gloo gives its network thread (``gloo_tcp_loop`` under torch 2.13). The gloo
guard (``torchcomms/csrc/gloo_guard.cpp``) once required that name, and a size mismatch under
torch 2.11 still aborted the process; run this there to see what 2.11 calls the thread.

    python3 benchmarks/diagnostics/gloo_thread_names.py
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist


def thread_names() -> list[str]:
    """The ``comm`` name of every thread of this process, sorted."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
            names.append(f.read().strip())
    return sorted(names)


def main() -> None:
    before = thread_names()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    after = thread_names()
    added = list(after)
    for name in before:
        added.remove(name)
    print(f"torch {torch.__version__}: threads before {before}; added by the gloo group {added}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
