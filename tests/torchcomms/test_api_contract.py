"""The public API contract (``API.md``: the torchcomms Python API PyTorch 2.13 knows), held as data.

Users call these positionally: each entry lists the parameters a signature must start with, in
order, with the defaults the contract states (``REQUIRED`` where it states none). Parameters this
project adds after them are allowed only with a default (extra trailing optionals keep the
contract; renamed, reordered or missing ones break it). Behaviour that a signature cannot show is
checked on a world-of-1 gloo communicator (and a fake one for point-to-point ops).
"""
from __future__ import annotations

import builtins
import copy
import dataclasses
import importlib
import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch

import torchcomms

REQUIRED = inspect.Parameter.empty
ANY_NAME = "*"  # the contract fixes the position, not the name (API.md writes a type there)
Params = list[tuple[str, Any]]

TAIL = [("async_op", REQUIRED), ("hints", None), ("timeout", None)]  # every collective ends so


def _req(*names: str) -> Params:
    return [(n, REQUIRED) for n in names]


COLLECTIVES: dict[str, Params] = {
    "send": _req("tensor", "dst") + TAIL,
    "recv": _req("tensor", "src") + TAIL,
    "broadcast": _req("tensor", "root") + TAIL,
    "all_reduce": _req("tensor", "op") + TAIL,
    "reduce": _req("tensor", "root", "op") + TAIL,
    "all_gather": _req("tensor_list", "tensor") + TAIL,
    "all_gather_v": _req("tensor_list", "tensor") + TAIL,
    "all_gather_single": _req("output", "input") + TAIL,
    "reduce_scatter": _req("output", "input_list", "op") + TAIL,
    "reduce_scatter_v": _req("output", "input_list", "op") + TAIL,
    "reduce_scatter_single": _req("output", "input", "op") + TAIL,
    "all_to_all_single": _req("output", "input") + TAIL,
    "all_to_all_v_single": _req("output", "input", "output_split_sizes", "input_split_sizes") + TAIL,
    "all_to_all": _req("output_tensor_list", "input_tensor_list") + TAIL,
    "barrier": TAIL,
    "scatter": _req("output_tensor", "input_tensor_list", "root") + TAIL,
    "gather": _req("output_tensor_list", "input_tensor", "root") + TAIL,
    "gather_single": _req("output", "input", "root") + TAIL,
}

NO_ARGS = "finalize abort is_abort_supported is_aborted get_rank get_size get_name get_device get_options " \
          "get_backend get_backend_version get_backend_impl batch_op_create get_init_handle".split()

# "module:attr" (attr may be "Class.method") -> the parameters it must start with (self excluded)
SIGNATURES: dict[str, Params] = {
    "torchcomms:new_comm": _req("backend", "device", "name") + [
        ("abort_process_on_timeout_or_error", None), ("timeout", None), ("is_high_priority_stream", None),
        ("store", None), ("enable_reconfigure", False), ("hints", None)],
    **{f"torchcomms:TorchComm.{name}": params for name, params in COLLECTIVES.items()},
    **{f"torchcomms:TorchComm.{name}": [] for name in NO_ARGS},
    "torchcomms:TorchComm.split": _req("ranks", "name") + [("hints", None), ("timeout", None)],
    "torchcomms:TorchComm.set_timeout": _req(ANY_NAME),
    "torchcomms:TorchComm.set_hints": _req(ANY_NAME),
    "torchcomms:TorchComm.register_pre_hook": _req(ANY_NAME),
    "torchcomms:TorchComm.register_post_hook": _req(ANY_NAME),
    "torchcomms:TorchComm.register_abort_hook": _req(ANY_NAME),
    "torchcomms:TorchComm.reconfigure": _req("uuid", "init_handles") + [("timeout", None), ("hints", None)],
    "torchcomms:TorchComm.shrink": [("timeout", None)],
    "torchcomms:BatchSendRecv.send": _req(ANY_NAME, "dst"),
    "torchcomms:BatchSendRecv.recv": _req(ANY_NAME, "src"),
    "torchcomms:BatchSendRecv.issue": _req("async_op"),
    "torchcomms:TorchWork.wait": [("timeout", None)],
    "torchcomms:TorchWork.wait_blocking": [],
    "torchcomms:TorchWork.is_completed": [],
    "torchcomms:TorchWork.exception": [],
    "torchcomms:ReduceOp.PREMUL_SUM": _req("factor"),
    "torchcomms:register_backend": _req("name", "cls"),
    "torchcomms:is_backend_built": _req("name"),
    "torchcomms:built_backends": [],
    "torchcomms.hooks:FlightRecorderHook": [("max_entries", 2048), ("isolated", False)],
    "torchcomms.hooks:FlightRecorderHook.register_with_comm": _req("comm"),
    "torchcomms.hooks:FlightRecorderHook.dump_json": [("include_completed", True)],
    "torchcomms.hooks:FlightRecorderHook.dump_file": _req("rank") + [("include_completed", True)],
    "torchcomms.hooks:FlightRecorderHook.reset": [],
    "torchcomms.hooks:FlightRecorderHook.is_enabled": [],
    "torchcomms.hooks:FlightRecorderHook.size": [],
    "torchcomms.hooks:NanCheckHook": [],
    "torchcomms.hooks:NanCheckHook.register_with_comm": _req("comm"),
    "torchcomms.device_mesh:init_device_mesh": _req("mesh_dim_comms", "mesh_dim_names") + [("_global_comm", None)],
    "torchcomms.device_mesh:_create_torchcomm_process_group": _req("comm", "group_name") + [
        ("backend_str", "torchcomm"), ("global_ranks_mapping", None)],
    "torchcomms.device_mesh:_flatten_with_comm": _req("mesh", "mesh_dim_name", "comm", "global_ranks", "layout"),
    "torchcomms.objcol:all_gather_object": _req("comm", "object_list", "obj") + [
        ("timeout", None), ("weights_only", True)],
    "torchcomms.objcol:gather_object": _req("comm", "obj", "root") + [
        ("object_gather_list", None), ("timeout", None), ("weights_only", True)],
    "torchcomms.objcol:send_object_list": _req("comm", "object_list", "dst") + [("timeout", None)],
    "torchcomms.objcol:recv_object_list": _req("comm", "object_list", "src") + [
        ("timeout", None), ("weights_only", True)],
    "torchcomms.objcol:broadcast_object_list": _req("comm", "object_list", "root") + [
        ("timeout", None), ("weights_only", True)],
    "torchcomms.objcol:scatter_object_list": _req("comm", "root", "scatter_object_output_list") + [
        ("scatter_object_input_list", None), ("timeout", None), ("weights_only", True)],
    "torchcomms.functional:is_torch_compile_supported": [("min_version", "2.12.0.dev0")],
    "torchcomms.functional:is_torch_compile_supported_and_enabled": [],
    "torchcomms._comms:_BackendWrapper": _req("comm"),
    "torchcomms._comms:RemovableHandle.remove": [],
    # typed hook arguments: their fields, in order (the constructor of each dataclass)
    "torchcomms._comms:AllReducePreHookArgs": _req("tensor", "async_op"),
    "torchcomms._comms:BroadcastPreHookArgs": _req("tensor", "root", "async_op"),
    "torchcomms._comms:SendPreHookArgs": _req("tensor", "peer", "async_op"),
    "torchcomms._comms:RecvPreHookArgs": _req("tensor", "peer", "async_op"),
}

EXPORTS = ("new_comm TorchComm TorchWork WorkStatus ReduceOp RedOpType OpName Timeout CommOptions BatchSendRecv "
           "P2POp P2POpType BatchP2POptions TorchCommBackend register_backend is_backend_built built_backends").split()
OP_NAMES = ("send recv broadcast all_reduce reduce all_gather all_gather_v all_gather_single reduce_scatter "
            "reduce_scatter_v reduce_scatter_single all_to_all_single all_to_all_v_single all_to_all barrier "
            "scatter gather gather_single split new_window finalize").split()
#: ops this project adds, which hooks and records name too (batched p2p, shrink, reconfigure)
PROJECT_OP_NAMES = {"batch_p2p", "shrink", "reconfigure"}
ERROR_BASES: dict[str, tuple[str, ...]] = {
    "CommError": ("RuntimeError",),
    "CommTimeoutError": ("CommError",),
    "PeerFailureError": ("CommError",),
    "CommAbortedError": ("CommError",),
    "CollectiveMismatchError": ("CommError",),
    "CommValueError": ("CommError", "ValueError"),
    "CommTypeError": ("CommError", "TypeError"),
}
POST_HOOK_ARGS = ["AllReducePostHookArgs", "BroadcastPostHookArgs", "SendPostHookArgs", "RecvPostHookArgs"]


def resolve(target: str) -> Any:
    module, _, path = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("target", sorted(SIGNATURES))
def test_signature_starts_with_the_contracts_parameters(target: str) -> None:
    params = [p for p in inspect.signature(resolve(target)).parameters.values() if p.name != "self"]
    expected = SIGNATURES[target]
    assert len(params) >= len(expected), f"{target}{[p.name for p in params]} lacks {expected[len(params):]}"
    for p, (name, default) in zip(params, expected):
        assert name in (ANY_NAME, p.name), f"{target}: parameter {p.name!r} where the contract has {name!r}"
        passable = (p.POSITIONAL_OR_KEYWORD,) if name != ANY_NAME else (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY)
        assert p.kind in passable, f"{target}: {p.name!r} cannot be passed both ways the contract allows ({p.kind})"
        assert p.default == default, f"{target}: {p.name!r} defaults to {p.default!r}, the contract to {default!r}"
    for p in params[len(expected):]:  # this project's additions: optional, after the contract's
        assert p.default is not REQUIRED or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD), \
            f"{target}: added parameter {p.name!r} is required"


@pytest.mark.parametrize("name", EXPORTS)
def test_module_exports(name: str) -> None:
    assert getattr(torchcomms, name) is not None
    assert name in torchcomms.__all__


@pytest.mark.parametrize("name", sorted(ERROR_BASES))
def test_error_classes_and_their_bases(name: str) -> None:
    cls = getattr(torchcomms, name)
    for base in ERROR_BASES[name]:
        assert issubclass(cls, getattr(torchcomms, base, None) or getattr(builtins, base)), f"{name} is not a {base}"


def test_value_types() -> None:
    from torchcomms import OpName, RedOpType, ReduceOp, Timeout, WorkStatus

    assert {s.name for s in WorkStatus} == {"NOT_STARTED", "INPROGRESS", "COMPLETED", "TIMEDOUT", "ERROR"}
    for op in "SUM PRODUCT MIN MAX BAND BOR BXOR AVG".split():
        assert getattr(ReduceOp, op).type is RedOpType[op]
        assert copy.copy(getattr(ReduceOp, op)) == getattr(ReduceOp, op)
    for factor in (0.5, torch.tensor(0.5)):
        premul = ReduceOp.PREMUL_SUM(factor)
        assert premul.type is RedOpType.PREMUL_SUM and copy.copy(premul).type is RedOpType.PREMUL_SUM
    assert [OpName(v).value for v in OP_NAMES] == OP_NAMES  # each value spelled as listed
    assert {o.value for o in OpName} - set(OP_NAMES) == PROJECT_OP_NAMES
    assert issubclass(Timeout, timedelta) and Timeout(seconds=3) == timedelta(seconds=3)
    assert resolve("torchcomms._comms:OpName") is OpName and resolve("torchcomms._comms:ReduceOp") is ReduceOp
    assert resolve("torchcomms._comms:TorchCommBackend") is torchcomms.TorchCommBackend
    assert torchcomms.is_backend_built("gloo") is True and "gloo" in torchcomms.built_backends()


def test_flight_recorder_with_no_entries_is_disabled() -> None:
    from torchcomms.hooks import FlightRecorderHook

    assert FlightRecorderHook(0).is_enabled() is False  # PyTorch passes max_entries=0 by default
    assert FlightRecorderHook().is_enabled() is True


@pytest.mark.parametrize("name", POST_HOOK_ARGS)
def test_post_hook_argument_types_match_the_pre_hook_ones(name: str) -> None:
    assert dataclasses.is_dataclass(resolve(f"torchcomms._comms:{name}"))


# --- behaviour on real communicators -------------------------------------------------------------
@pytest.fixture(scope="module")
def gloo() -> Any:
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "api-contract", timeout=timedelta(seconds=60))
    yield comm
    comm.finalize()


def _x() -> torch.Tensor:
    return torch.arange(4, dtype=torch.float32)


def _out() -> torch.Tensor:
    return torch.zeros(4)


SUM = torchcomms.ReduceOp.SUM
#: a collective's positional arguments before ``async_op`` on a world of 1 (every output then holds
#: the input, arange(4)), and the tensors to check afterwards
CALLS: dict[str, Callable[[], tuple[list[Any], list[torch.Tensor]]]] = {
    "broadcast": lambda: ([t := _x(), 0], [t]),
    "all_reduce": lambda: ([t := _x(), SUM], [t]),
    "reduce": lambda: ([t := _x(), 0, SUM], [t]),
    "all_gather": lambda: ([[o := _out()], _x()], [o]),
    "all_gather_v": lambda: ([[o := _out()], _x()], [o]),
    "all_gather_single": lambda: ([o := _out(), _x()], [o]),
    "reduce_scatter": lambda: ([o := _out(), [_x()], SUM], [o]),
    "reduce_scatter_v": lambda: ([o := _out(), [_x()], SUM], [o]),
    "reduce_scatter_single": lambda: ([o := _out(), _x(), SUM], [o]),
    "all_to_all_single": lambda: ([o := _out(), _x()], [o]),
    "all_to_all_v_single": lambda: ([o := _out(), _x(), [4], [4]], [o]),
    "all_to_all": lambda: ([[o := _out()], [_x()]], [o]),
    "barrier": lambda: ([], []),
    "scatter": lambda: ([o := _out(), [_x()], 0], [o]),
    "gather": lambda: ([[o := _out()], _x(), 0], [o]),
    "gather_single": lambda: ([o := _out(), _x(), 0], [o]),
}


@pytest.mark.parametrize("by_keyword", [False, True], ids=["positional", "keyword"])
@pytest.mark.parametrize("op", sorted(CALLS))
def test_collective_runs_called_as_the_contract_writes_it(gloo: Any, op: str, by_keyword: bool) -> None:
    args, outputs = CALLS[op]()
    args += [False, None, timedelta(seconds=30)]  # async_op, hints, timeout
    names = [name for name, _ in COLLECTIVES[op]]
    work = getattr(gloo, op)(**dict(zip(names, args))) if by_keyword else getattr(gloo, op)(*args)
    assert isinstance(work, torchcomms.TorchWork) and work.is_completed()
    for out in outputs:
        assert out.tolist() == [0.0, 1.0, 2.0, 3.0], op


def test_point_to_point_called_as_the_contract_writes_it() -> None:
    comm = torchcomms.new_comm("fake", torch.device("cpu"), "api-contract-p2p", hints={"rank": "0", "size": "2"})
    try:
        for work in (comm.send(_x(), 1, False, None, None), comm.recv(_out(), 1, False, None, None),
                     comm.send(tensor=_x(), dst=1, async_op=True, hints=None, timeout=None),
                     comm.recv(tensor=_out(), src=1, async_op=True, hints=None, timeout=None)):
            work.wait()
            assert work.status is torchcomms.WorkStatus.COMPLETED
        batch = comm.batch_op_create()
        batch.send(_x(), 1)
        batch.recv(_out(), src=1)
        assert batch.issue(False).status is torchcomms.WorkStatus.COMPLETED
        comm.abort()
        comm.abort()  # never raises
        assert comm.is_aborted() is True
        with pytest.raises(torchcomms.CommAbortedError):
            comm.barrier(False)
    finally:
        comm.finalize()


def test_management_calls_on_a_world_of_one(gloo: Any) -> None:
    from torchcomms._comms_gloo import TorchCommGloo

    assert (gloo.get_rank(), gloo.get_size(), gloo.get_name(), gloo.get_backend()) == (0, 1, "api-contract", "gloo")
    assert gloo.get_device() == torch.device("cpu") and isinstance(gloo.get_options(), torchcomms.CommOptions)
    assert isinstance(gloo.get_backend_version(), str) and isinstance(gloo.get_backend_impl(), TorchCommGloo)
    assert gloo.is_abort_supported() is True and gloo.is_aborted() is False
    gloo.set_timeout(timedelta(seconds=60))
    gloo.set_hints({"api.contract": "1"})
    child = gloo.split([0], "api-contract-child", None, None)
    assert child is not None and child.get_size() == 1
    child.finalize()
    child.finalize()  # idempotent: PyTorch calls it twice on teardown


def test_pre_hook_arguments_carry_the_contracts_fields(gloo: Any) -> None:
    """``register_pre_hook(cb(name, op_id, args))``: ``args`` has the fields of the op's
    ``…PreHookArgs`` (all_reduce: ``tensor``, ``async_op``; broadcast: also ``root``)."""
    t = _x()
    seen: list[tuple[str, bool, bool, Any]] = []

    def pre_hook(name: Any, op_id: int, args: Any) -> None:
        seen.append((str(name), args.tensor is t, args.async_op, getattr(args, "root", None)))

    handle = gloo.register_pre_hook(pre_hook)
    try:
        gloo.all_reduce(t, SUM, False)
        gloo.broadcast(t, 0, True).wait()
    finally:
        handle.remove()
    assert seen == [("all_reduce", True, False, None), ("broadcast", True, True, 0)]


def test_nccl_backend_type_is_importable_where_torch_has_nccl() -> None:
    try:
        from torchcomms._comms_nccl import TorchCommNCCL
    except ImportError as e:
        pytest.skip(f"torch without NCCL: {e}")
    assert isinstance(TorchCommNCCL, type)
