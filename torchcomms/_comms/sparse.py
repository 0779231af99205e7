"""c10d's all_reduce of a sparse COO tensor (what DDP runs for ``nn.Embedding(sparse=True)``
gradients), on a communicator's dense ops, as c10d's gloo does it: every rank's indices and
values are gathered, their sum is coalesced, and the input tensor becomes that sum (SUM only)."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from torchcomms.core.errors import CommValueError
from torchcomms.types import ReduceOp, RedOpType


def all_reduce_sparse(comm: Any, tensor: torch.Tensor, op: ReduceOp, timeout: timedelta | None) -> list[Any]:
    """Sums ``tensor`` (sparse COO) over ``comm`` into ``tensor`` itself, blocking; returns the
    completed works of the ops it ran."""
    if op.type is not RedOpType.SUM:
        raise CommValueError("an all_reduce of sparse tensors supports ReduceOp.SUM only (as c10d's gloo), "
                             f"got {op.type.name}", comm=comm.get_name(), op="all_reduce")
    n = comm.get_size()
    local = tensor.coalesce()
    indices = local.indices().t().contiguous()  # (nnz, sparse_dim)
    values = local.values().contiguous()  # (nnz, *dense_shape)
    counts = torch.empty(n, dtype=torch.int64)
    works = [comm.all_gather_single(counts, torch.tensor([indices.shape[0]], dtype=torch.int64), True,
                                    timeout=timeout)]
    works[0].wait()
    sizes = counts.tolist()
    all_indices = [indices.new_empty((k, indices.shape[1])) for k in sizes]
    all_values = [values.new_empty((k, *values.shape[1:])) for k in sizes]
    works += [comm.all_gather_v(all_indices, indices, True, timeout=timeout),
              comm.all_gather_v(all_values, values, True, timeout=timeout)]
    for w in works[1:]:
        w.wait()
    total = torch.sparse_coo_tensor(torch.cat(all_indices).t(), torch.cat(all_values), tensor.shape,
                                    dtype=tensor.dtype).coalesce()
    tensor.copy_(total)
    return works
