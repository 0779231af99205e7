"""Collectives of picklable Python objects over a communicator.

Each object is serialized with ``torch.save`` into a ``uint8`` tensor, the bytes travel through
the communicator's ordinary collectives (so timeouts and typed errors apply), and the receiver
rebuilds it with ``torch.load``.

Arguments a rank refuses (a list of the wrong length, an object ``torch.save`` cannot serialize)
are refused on every rank that takes part: the refusing rank sends a refusal mark (a size of -1)
in the op's first exchange and then raises its own error; the ranks that receive the mark raise
``CollectiveMismatchError`` naming it, instead of waiting for it until the timeout.

Trust model: what a rank deserializes comes from the other ranks of the same communicator, that
is, processes of the same job (with ``torchcomms-run`` they authenticated to the control plane;
without it, whoever could reach the rendezvous store). With ``weights_only=True`` (the default)
loading uses torch's restricted unpickler: tensors, containers, numbers, strings and the types
allow-listed with ``torch.serialization.add_safe_globals`` load, anything else is refused
(``pickle.UnpicklingError``), so a peer cannot make this process run code by sending an object.
``weights_only=False`` loads arbitrary pickles: it runs whatever code the sending rank chose,
and is only for objects whose types are not allow-listed, between ranks you trust as yourself.
"""
from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import torch

from torchcomms.errors import CollectiveMismatchError, CommError, CommValueError

__all__ = [
    "all_gather_object", "gather_object", "send_object_list", "recv_object_list",
    "broadcast_object_list", "scatter_object_list",
]


#: the size a rank sends in an op's first exchange when it refused its own arguments
_REFUSED = -1


def _to_bytes(obj: Any, device: torch.device) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8).to(device)


def _from_bytes(t: torch.Tensor, weights_only: bool) -> Any:
    data = t.cpu().numpy().tobytes()
    return torch.load(io.BytesIO(data), weights_only=weights_only, map_location="cpu")


def _size_of(comm: Any, payload: torch.Tensor | None, refused: Exception | None = None) -> torch.Tensor:
    size = _REFUSED if refused is not None else 0 if payload is None else payload.numel()
    return torch.tensor([size], dtype=torch.int64, device=comm.get_device())


def _padded(payload: torch.Tensor, length: int) -> torch.Tensor:
    out = torch.zeros(length, dtype=torch.uint8, device=payload.device)
    out[: payload.numel()] = payload
    return out


def _check_list(comm: Any, name: str, what: str, lst: Any, n: int) -> None:
    if not isinstance(lst, list) or len(lst) != n:
        got = len(lst) if isinstance(lst, list) else type(lst).__name__
        raise CommValueError(f"{what} must be a list of {n} entries, got {got}", comm=comm.get_name(), op=name)


def _prepared(comm: Any, name: str, make: Any) -> tuple[Any, Exception | None]:
    """``make()``'s value, or ``None`` and the error it raised (an argument check or serialization
    failing on this rank: it takes part in the op's first exchange with a refusal mark, then raises)."""
    try:
        return make(), None
    except CommError as e:
        return None, e
    except Exception as e:  # noqa: BLE001 - torch.save raises whatever pickling raised
        return None, CommValueError(f"the object cannot be serialized ({type(e).__name__}: {e})",
                                    comm=comm.get_name(), op=name)


def _raise_refusals(comm: Any, name: str, sizes: list[int], refused: Exception | None) -> None:
    """After an op's first exchange: this rank's own refusal, else the refusal marks of others."""
    if refused is not None:
        raise refused
    refusers = [r for r, size in enumerate(sizes) if size == _REFUSED]
    if refusers:
        raise CollectiveMismatchError(f"rank(s) {refusers} refused their arguments (their error says why)",
                                      comm=comm.get_name(), op=name, ranks=refusers)


def _gather_sizes(comm: Any, payload: torch.Tensor | None, refused: Exception | None,
                  timeout: timedelta | None) -> list[int]:
    sizes = torch.empty(comm.get_size(), dtype=torch.int64, device=comm.get_device())
    comm.all_gather_single(sizes, _size_of(comm, payload, refused), False, timeout=timeout)
    return sizes.tolist()


def all_gather_object(comm: Any, object_list: list[Any], obj: Any, timeout: timedelta | None = None,
                      weights_only: bool = True) -> None:
    """Fill ``object_list`` (one slot per rank) with every rank's ``obj``."""
    n, op = comm.get_size(), "all_gather_object"

    def make() -> torch.Tensor:
        _check_list(comm, op, "object_list", object_list, n)
        return _to_bytes(obj, comm.get_device())

    payload, refused = _prepared(comm, op, make)
    sizes = _gather_sizes(comm, payload, refused, timeout)
    _raise_refusals(comm, op, sizes, refused)
    width = max(sizes)
    out = torch.empty(n * width, dtype=torch.uint8, device=comm.get_device())
    comm.all_gather_single(out, _padded(payload, width), False, timeout=timeout)
    for r in range(n):
        object_list[r] = _from_bytes(out[r * width : r * width + sizes[r]], weights_only)


def gather_object(comm: Any, obj: Any, root: int, object_gather_list: list[Any] | None = None,
                  timeout: timedelta | None = None, weights_only: bool = True) -> None:
    """On ``root``, fill ``object_gather_list`` with every rank's ``obj`` (others pass None)."""
    n, me, op = comm.get_size(), comm.get_rank(), "gather_object"

    def make() -> torch.Tensor:
        if me == root:
            _check_list(comm, op, "object_gather_list on the root", object_gather_list, n)
        return _to_bytes(obj, comm.get_device())

    payload, refused = _prepared(comm, op, make)
    sizes = _gather_sizes(comm, payload, refused, timeout)
    _raise_refusals(comm, op, sizes, refused)
    width = max(sizes)
    outs = [torch.empty(width, dtype=torch.uint8, device=comm.get_device()) for _ in range(n)] if me == root else []
    comm.gather(outs, _padded(payload, width), root, False, timeout=timeout)
    if me == root:
        for r in range(n):
            object_gather_list[r] = _from_bytes(outs[r][: sizes[r]], weights_only)  # type: ignore[index]


def send_object_list(comm: Any, object_list: list[Any], dst: int, timeout: timedelta | None = None) -> None:
    """Send the list's objects to ``dst`` (which calls :func:`recv_object_list`)."""
    payload, refused = _prepared(comm, "send_object_list", lambda: _to_bytes(list(object_list), comm.get_device()))
    comm.send(_size_of(comm, payload, refused), dst, False, timeout=timeout)
    if refused is not None:
        raise refused
    comm.send(payload, dst, False, timeout=timeout)


def recv_object_list(comm: Any, object_list: list[Any], src: int, timeout: timedelta | None = None,
                     weights_only: bool = True) -> None:
    """Fill ``object_list`` in place with the objects ``src`` sent (same length as sent)."""
    op = "recv_object_list"
    size = _size_of(comm, None)
    comm.recv(size, src, False, timeout=timeout)
    _raise_refusals(comm, op, [int(size.item()) if q == src else 0 for q in range(comm.get_size())], None)
    payload = torch.empty(int(size.item()), dtype=torch.uint8, device=comm.get_device())
    comm.recv(payload, src, False, timeout=timeout)
    objs = _from_bytes(payload, weights_only)
    _check_list(comm, op, "object_list", object_list, len(objs))
    object_list[:] = objs


def broadcast_object_list(comm: Any, object_list: list[Any], root: int, timeout: timedelta | None = None,
                          weights_only: bool = True) -> None:
    """Replace ``object_list``'s entries on every rank with ``root``'s (same length everywhere)."""
    me, op = comm.get_rank(), "broadcast_object_list"
    payload, refused = None, None
    if me == root:
        payload, refused = _prepared(comm, op, lambda: _to_bytes(list(object_list), comm.get_device()))
    size = _size_of(comm, payload, refused)
    comm.broadcast(size, root, False, timeout=timeout)
    _raise_refusals(comm, op, [int(size.item()) if r == root else 0 for r in range(comm.get_size())], refused)
    if payload is None:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=comm.get_device())
    comm.broadcast(payload, root, False, timeout=timeout)
    if me != root:
        objs = _from_bytes(payload, weights_only)
        _check_list(comm, op, "object_list", object_list, len(objs))
        object_list[:] = objs


def scatter_object_list(comm: Any, root: int, scatter_object_output_list: list[Any],
                        scatter_object_input_list: list[Any] | None = None, timeout: timedelta | None = None,
                        weights_only: bool = True) -> None:
    """Rank ``r`` gets ``root``'s ``scatter_object_input_list[r]`` in ``scatter_object_output_list[0]``.
    A rank whose output list has no slot takes part, then raises."""
    n, me, dev, op = comm.get_size(), comm.get_rank(), comm.get_device(), "scatter_object_list"
    no_slot = not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1
    meta = torch.zeros(n + 1, dtype=torch.int64, device=dev)  # [width, size of rank 0's, ...]
    payloads: list[torch.Tensor] = []
    refused: Exception | None = None
    if me == root:
        def make() -> list[torch.Tensor]:
            _check_list(comm, op, "scatter_object_input_list on the root", scatter_object_input_list, n)
            return [_to_bytes(o, dev) for o in scatter_object_input_list]  # type: ignore[union-attr]

        payloads, refused = _prepared(comm, op, make)
        if refused is None:
            meta[1:] = torch.tensor([p.numel() for p in payloads], dtype=torch.int64)
            meta[0] = int(meta[1:].max())
        else:
            meta[0] = _REFUSED
    comm.broadcast(meta, root, False, timeout=timeout)
    _raise_refusals(comm, op, [int(meta[0]) if r == root else 0 for r in range(n)], refused)
    width = int(meta[0])
    out = torch.empty(width, dtype=torch.uint8, device=dev)
    ins = [_padded(p, width) for p in payloads] if me == root else []
    comm.scatter(out, ins, root, False, timeout=timeout)
    if no_slot:
        raise CommValueError("scatter_object_output_list must be a list with at least one slot",
                             comm=comm.get_name(), op=op)
    scatter_object_output_list[0] = _from_bytes(out[: int(meta[1 + me])], weights_only)
