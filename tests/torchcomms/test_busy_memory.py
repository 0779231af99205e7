"""Which ops in flight a later op must wait for: the byte spans of tensors and views, and
read/write conflicts (the engine-level ordering runs on real ranks in test_collectives.py)."""
from __future__ import annotations

import torch

from torchcomms.core.busy_memory import BusyMemory, spans


def test_spans_cover_a_views_elements_from_its_lowest_to_its_highest() -> None:
    t = torch.zeros(4, 6)
    base, size = t.data_ptr(), t.element_size()
    assert spans([t]) == ((base, base + 24 * size),)
    assert spans([t[1]]) == ((base + 6 * size, base + 12 * size),)
    assert spans([t[:, 2]]) == ((base + 2 * size, base + 21 * size),)  # column: strided
    assert spans([t.t()]) == ((base, base + 24 * size),)
    assert spans([t[2:2]]) == ()  # empty
    assert spans([torch.zeros(3, device="meta")]) == ()
    assert spans([torch.eye(3).to_sparse()]) == ()


def test_a_later_op_conflicts_only_where_one_of_the_two_writes() -> None:
    busy = BusyMemory()
    t, u = torch.zeros(8), torch.zeros(8)
    send, reduce = object(), object()
    busy.claim(send, [t], [])  # reads t
    assert busy.conflicts([t], []) == []  # another read of t: no wait
    assert busy.conflicts([], [t[4:]]) == [send]  # a write into t: after the read
    assert busy.conflicts([u], [u]) == []
    busy.claim(reduce, [u], [u])  # in place: reads and writes u
    assert busy.conflicts([u[:2]], []) == [reduce]  # a read of what it writes
    assert busy.conflicts([t], [u]) == [reduce]
    assert busy.conflicts([t], [t]) == [send]
    busy.release(send)
    assert busy.conflicts([t], [t]) == []
    busy.release(reduce)
    assert busy.ops == {}


def test_disjoint_slices_of_one_buffer_do_not_conflict() -> None:
    busy = BusyMemory()
    flat = torch.zeros(16)
    first = object()
    busy.claim(first, [flat[:8]], [flat[:8]])
    assert busy.conflicts([flat[8:]], [flat[8:]]) == []
    assert busy.conflicts([flat[7:9]], [flat[7:9]]) == [first]


def test_point_to_point_ops_wait_for_collectives_only() -> None:
    busy = BusyMemory()
    t = torch.zeros(8)
    send, reduce = object(), object()
    busy.claim(send, [t], [], p2p=True)
    assert busy.conflicts([], [t], p2p=True) == []  # a receive into a send's buffer: not ordered
    assert busy.conflicts([t], [t]) == [send]  # a collective writing it: after the send
    busy.claim(reduce, [t], [t])
    assert busy.conflicts([], [t], p2p=True) == [reduce]
