"""Bad input is refused locally, before dispatch, with a typed error naming what was wrong."""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import pytest
import torch

import torchcomms
from torchcomms import CommAbortedError, CommTypeError, CommValueError, ReduceOp


@pytest.fixture
def comm():
    c = torchcomms.new_comm("fake", torch.device("cpu"), "bad-input", hints={"rank": "1", "size": "4"})
    yield c
    c.finalize()


def t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.ones(*shape, dtype=dtype)


NONCONTIG = torch.ones(4, 4).t()
CASES: list[tuple[str, Callable[[Any], Any], type, str]] = [
    ("not a tensor", lambda c: c.all_reduce([1.0], ReduceOp.SUM, False), CommTypeError, "must be a torch.Tensor"),
    ("non-contiguous", lambda c: c.all_reduce(NONCONTIG, ReduceOp.SUM, False), CommValueError, "contiguous"),
    ("sparse", lambda c: c.broadcast(torch.eye(3).to_sparse(), 0, False), CommTypeError, "dense"),
    ("wrong device", lambda c: c.all_reduce(torch.ones(2, device="meta"), ReduceOp.SUM, False), CommValueError, "device"),
    ("root out of range", lambda c: c.broadcast(t(2), 4, False), CommValueError, "root=4 is out of range"),
    ("negative root", lambda c: c.reduce(t(2), -1, ReduceOp.SUM, False), CommValueError, "root=-1"),
    ("root not int", lambda c: c.broadcast(t(2), 0.5, False), CommTypeError, "root must be an int"),
    ("send to self", lambda c: c.send(t(2), 1, False), CommValueError, "itself"),
    ("recv peer out of range", lambda c: c.recv(t(2), 9, False), CommValueError, "src=9"),
    ("reduce op not ReduceOp", lambda c: c.all_reduce(t(2), "sum", False), CommTypeError, "ReduceOp"),
    ("bitwise op on float", lambda c: c.all_reduce(t(2), ReduceOp.BAND, False), CommTypeError, "integer"),
    ("AVG on bool", lambda c: c.all_reduce(t(2, dtype=torch.bool), ReduceOp.AVG, False), CommTypeError, "AVG"),
    ("PREMUL_SUM on int", lambda c: c.all_reduce(t(2, dtype=torch.int64), ReduceOp.PREMUL_SUM(2.0), False),
     CommTypeError, "PREMUL_SUM"),
    ("PREMUL_SUM complex factor on a real tensor",
     lambda c: c.all_reduce(t(2), ReduceOp.PREMUL_SUM(torch.tensor(2 + 1j)), False), CommTypeError, "complex"),
    ("PREMUL_SUM factor on another device",
     lambda c: c.reduce_scatter_v(t(1), [t(1)] * 4, ReduceOp.PREMUL_SUM(torch.tensor(2.0, device="meta")), False),
     CommValueError, "factor is on meta"),
    ("all_gather list length", lambda c: c.all_gather([t(2)] * 3, t(2), False), CommValueError, "must have 4"),
    ("all_gather shape", lambda c: c.all_gather([t(3)] * 4, t(2), False), CommValueError, "shape"),
    ("all_gather dtype", lambda c: c.all_gather([t(2, dtype=torch.float64)] * 4, t(2), False), CommTypeError, "dtype"),
    ("all_gather not a list", lambda c: c.all_gather(t(8), t(2), False), CommTypeError, "list of tensors"),
    ("all_gather_single size", lambda c: c.all_gather_single(t(7), t(2), False), CommValueError, "world_size (4)"),
    ("reduce_scatter list length", lambda c: c.reduce_scatter(t(2), [t(2)] * 5, ReduceOp.SUM, False),
     CommValueError, "must have 4"),
    ("reduce_scatter shapes", lambda c: c.reduce_scatter(t(2), [t(3)] * 4, ReduceOp.SUM, False),
     CommValueError, "shape"),
    ("reduce_scatter_single size", lambda c: c.reduce_scatter_single(t(2), t(9), ReduceOp.SUM, False),
     CommValueError, "world_size"),
    ("reduce_scatter_v own chunk", lambda c: c.reduce_scatter_v(t(2), [t(1), t(3), t(2), t(2)], ReduceOp.SUM, False),
     CommValueError, "input_list[1]"),
    ("all_to_all_single uneven", lambda c: c.all_to_all_single(t(6), t(6), False), CommValueError, "evenly"),
    ("all_to_all_single numel", lambda c: c.all_to_all_single(t(8), t(4), False), CommValueError, "elements"),
    ("split sizes don't add up", lambda c: c.all_to_all_v_single(t(4), t(4), [1, 1, 1, 1], [1, 1, 1, 2], False),
     CommValueError, "add up to 5"),
    ("split sizes length", lambda c: c.all_to_all_v_single(t(4), t(4), [2, 2], [1, 1, 1, 1], False),
     CommValueError, "4 entries"),
    ("negative split size", lambda c: c.all_to_all_v_single(t(4), t(4), [2, 2, 1, -1], [1, 1, 1, 1], False),
     CommValueError, "negative"),
    ("split sizes not ints", lambda c: c.all_to_all_v_single(t(4), t(4), [1.0, 1, 1, 1], [1, 1, 1, 1], False),
     CommTypeError, "list of ints"),
    ("all_to_all mixed dtypes", lambda c: c.all_to_all([t(1)] * 4, [t(1)] * 3 + [t(1, dtype=torch.float64)], False),
     CommTypeError, "dtype"),
    ("scatter root list length", lambda c: c.scatter(t(2), [t(2)] * 2, 1, False), CommValueError, "must have 4"),
    ("gather root list shapes", lambda c: c.gather([t(3)] * 4, t(2), 1, False), CommValueError, "shape"),
    ("gather_single size", lambda c: c.gather_single(t(5), t(2), 1, False), CommValueError, "world_size"),
    ("async_op not bool", lambda c: c.barrier(None), CommTypeError, "async_op must be a bool"),
    ("negative timeout", lambda c: c.barrier(False, timeout=timedelta(seconds=-1)), CommValueError, "positive"),
    ("timeout wrong type", lambda c: c.barrier(False, timeout="5s"), CommTypeError, "timeout"),
    ("hints wrong type", lambda c: c.barrier(False, hints={"a": 1}), CommTypeError, "hints"),
    ("split duplicates", lambda c: c.split([1, 1, 2], "dup"), CommValueError, "duplicates"),
    ("split out of range", lambda c: c.split([1, 7], "oor"), CommValueError, "out of range"),
    ("split without self", lambda c: c.split([0, 2], "noself"), CommValueError, "non-members must pass []"),
    ("split empty name", lambda c: c.split([1], ""), CommValueError, "name"),
    ("empty batch", lambda c: c.batch_op_create().issue(False), CommValueError, "empty"),
    ("batch send to self", lambda c: c.batch_op_create().send(t(2), 1), CommValueError, "itself"),
    ("set_timeout zero", lambda c: c.set_timeout(timedelta(0)), CommValueError, "positive"),
    ("hook not callable", lambda c: c.register_pre_hook(5), CommTypeError, "callable"),
]


#: refusals that are collective: the refusing rank still takes part in the op's exchange (so that
#: the other ranks raise too instead of waiting for it), which takes one sequence number everywhere
COLLECTIVE_REFUSALS = {"split duplicates", "split out of range", "split without self", "split empty name"}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_typed_error(comm, case) -> None:
    label, call, exc_type, fragment = case
    seq_before = comm._last_seq
    with pytest.raises(exc_type) as info:
        call(comm)
    err = info.value
    assert isinstance(err, torchcomms.CommError) and isinstance(err, RuntimeError)
    assert isinstance(err, ValueError if exc_type is CommValueError else TypeError)
    assert fragment in str(err), str(err)
    assert "comm 'bad-input'" in str(err)
    taken = 1 if label in COLLECTIVE_REFUSALS else 0
    assert comm._last_seq == seq_before + taken, "a refused op must not consume a sequence number"
    # the communicator is still usable afterwards
    x = t(2)
    comm.all_reduce(x, ReduceOp.SUM, False)
    assert x.tolist() == [4.0, 4.0]


def test_numpy_integer_ranks_are_taken(comm) -> None:
    """A rank computed with numpy (np.argmax) is an int to the reference (pybind converts it); it
    was refused with CommTypeError. The op's record holds a plain int (traces are JSON)."""
    import numpy as np

    roots: list[object] = []
    comm.register_pre_hook(lambda name, op_id, rec: roots.append(rec.root if rec.root is not None else rec.peer))
    x = t(2)
    comm.broadcast(x, np.int64(2), False)
    comm.reduce(x, np.int32(0), ReduceOp.SUM, False)
    comm.send(x, np.int64(3), False)
    batch = comm.batch_op_create()
    batch.send(x, np.int64(0))
    batch.issue(False)
    assert roots[:3] == [2, 0, 3] and all(type(r) is int for r in roots[:3]), roots
    with pytest.raises(CommTypeError, match="root must be an int"):
        comm.broadcast(x, np.float64(1.0), False)


def test_at_least_25_cases() -> None:
    assert len(CASES) >= 25


@pytest.mark.parametrize("how", ["finalize", "abort"])
def test_use_after_end_raises_aborted(how: str) -> None:
    c = torchcomms.new_comm("fake", "cpu", f"ended-{how}", hints={"rank": "0", "size": "2"})
    getattr(c, how)()
    with pytest.raises(CommAbortedError, match="finalized|aborted"):
        c.all_reduce(t(2), ReduceOp.SUM, False)
    getattr(c, how)()  # idempotent


def test_new_comm_bad_arguments() -> None:
    with pytest.raises(torchcomms.BackendNotFoundError, match="no torchcomms backend named 'nope'.*gloo"):
        torchcomms.new_comm("nope", "cpu", "x")
    with pytest.raises(ModuleNotFoundError, match="failed to find backend 'nope'"):
        torchcomms.new_comm("nope", "cpu", "x")
    with pytest.raises(CommValueError, match="name"):
        torchcomms.new_comm("fake", "cpu", "")
    with pytest.raises(CommTypeError, match="timeout"):
        torchcomms.new_comm("fake", "cpu", "x", timeout=5)
    with pytest.raises(CommValueError, match="runs on cpu"):
        torchcomms.new_comm("gloo", torch.device("meta"), "x")
    c = torchcomms.new_comm("fake", "cpu", "dup-name")
    with pytest.raises(CommValueError, match="already exists"):
        torchcomms.new_comm("fake", "cpu", "dup-name")
    c.finalize()
    torchcomms.new_comm("fake", "cpu", "dup-name").finalize()  # the name is free again


def test_reduce_op_factor_validation() -> None:
    with pytest.raises(ValueError, match="one element"):
        ReduceOp.PREMUL_SUM(torch.ones(2))
    with pytest.raises(TypeError, match="number or a tensor"):
        ReduceOp.PREMUL_SUM("2")
