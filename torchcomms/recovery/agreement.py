"""Agreement over a key-value store: every member who returns gets the same decision.

Members check in (or vote) in a round (``agreement_round``); once every member not known to
have failed has checked in (or the deadline passed), a proposal is written with
compare-and-set. The first proposal wins and everybody adopts it, so there is no split brain by
construction. Works on any torch ``Store`` (the control plane's, or a TCPStore). Two decisions
are built on that one round (:func:`decide`): the survivor list of a shrink and the AND of a
flag (``agree``).

Every store call is bounded by the agreement's deadline, whatever the store's own timeout: a
store whose host is stopped or cut off raises ``StoreNotAnswering`` at the deadline (plus
``STORE_CALL_GRACE_S``); see ``store_calls`` for why the store's own timeout cannot do that.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from torchcomms.core.store_calls import STORE_CALL_GRACE_S, BoundedCalls, StoreNotAnswering
from torchcomms.recovery.agreement_round import decide, Round

class RoundClosed(Exception):
    """This member read an ``agree`` round after every member it was decided for had read it
    and its keys were deleted: the others held this member failed and went on without it."""


def _decode(raw: bytes) -> list[int]:
    data = json.loads(raw.decode())
    if not isinstance(data, list) or not all(isinstance(r, int) for r in data):
        raise ValueError(f"malformed membership decision {raw!r}")
    return data


def agree_on_survivors(
    store: Any,
    key_prefix: str,
    me: int,
    candidates: list[int],
    known_failed: Callable[[], set[int]],
    deadline: float,
    poll_s: float = 0.002,
) -> list[int]:
    """The agreed survivor list (sorted global ranks). ``me`` checks in first; the result may
    not contain ``me`` (it was too late, or declared failed). Returns or raises by ``deadline``
    plus ``STORE_CALL_GRACE_S``: ``store_calls.StoreNotAnswering`` when a store call was not
    answered by then; an error the store raised is raised as it is."""
    call = BoundedCalls(deadline + STORE_CALL_GRACE_S, "torchcomms-agreement-store")
    try:
        return _decode(decide(call, store, key_prefix, "in", me, candidates, known_failed, deadline, poll_s,
                               lambda complete, arrived, expected: json.dumps(arrived).encode()))
    finally:
        call.close()


_YES, _NO = b"1", b"0"


def _flag_value(flag: bool, readers: list[int]) -> bytes:
    """A flag decision: ``1`` or ``0``, then ``:`` and the members it is decided for (those who
    must read it before its keys go), comma-separated."""
    return (_YES if flag else _NO) + b":" + ",".join(map(str, readers)).encode()


def _decode_flag(raw: bytes) -> tuple[bool, list[int]]:
    value, sep, readers = raw.partition(b":")
    if value not in (_YES, _NO) or not sep or not all(r.isdigit() for r in readers.split(b",") if readers):
        raise ValueError(f"malformed outcome decision {raw!r}")
    return value == _YES, [int(r) for r in readers.split(b",")] if readers else []


def agree_on_flag(
    store: Any,
    prefix: str,
    round_no: int,
    me: int,
    members: list[int],
    flag: bool,
    known_failed: Callable[[], set[int]],
    deadline: float,
    poll_s: float = 0.002,
) -> bool:
    """The AND of the flags of ``members`` not known to have failed; see :func:`agree_on_flag_for`."""
    return agree_on_flag_for(store, prefix, round_no, me, members, flag, known_failed, deadline, poll_s)[0]


def agree_on_flag_for(
    store: Any,
    prefix: str,
    round_no: int,
    me: int,
    members: list[int],
    flag: bool,
    known_failed: Callable[[], set[int]],
    deadline: float,
    poll_s: float = 0.002,
) -> tuple[bool, list[int]]:
    """The AND of the flags of ``members`` not known to have failed, decided once for round
    ``round_no`` (keys ``<prefix>/agree<round_no>/...``) and the same for everybody who returns,
    with the members it was decided for (the same list for everybody too).

    A ``False`` flag decides ``False`` at once (compare-and-set); a ``True`` flag is written as a
    vote and the caller waits for every member not known failed to vote ``True`` (then proposes
    ``True``) or for the deadline (then proposes ``False``: a member that did not vote counts as
    a no). The first proposal wins and everybody adopts it, so no two callers ever return
    different values.

    The decision names the members it is decided for (those not known failed by its proposer).
    Each of them counts its read; the last one deletes the round's keys, so a slow reader
    always finds the decision. It first raises ``<prefix>/agree/closed`` to ``round_no``: a
    member the decision was not for that comes after that raises :class:`RoundClosed` instead
    of deciding the round again. Bounded like :func:`agree_on_survivors`."""
    call = BoundedCalls(deadline + STORE_CALL_GRACE_S, "torchcomms-agreement-store")
    key_prefix = f"{prefix}/agree{round_no}"
    decision_key = f"{key_prefix}/decision"
    votes = Round(call, store, key_prefix, "yes", me, members)
    try:
        if flag:
            raw = decide(call, store, key_prefix, "yes", me, members, known_failed, deadline, poll_s,
                          lambda complete, arrived, expected: _flag_value(complete, expected), arrivals=False)
        else:
            failed = known_failed()
            mine = _flag_value(False, [r for r in members if r not in failed])
            stored = call(f"compare_set({decision_key!r})", lambda: store.compare_set(decision_key, b"", mine))
            raw = bytes(stored) if stored else mine
        decided, readers = _decode_flag(raw)
        closed_key = f"{prefix}/agree/closed"
        if call(f"check({closed_key!r})", lambda: store.check([closed_key])):
            closed = call(f"get({closed_key!r})", lambda: store.get(closed_key))
            if int(closed) >= round_no:  # what this member found or wrote came after: remove it
                for key in (decision_key, *votes.keys([me])):
                    call(f"delete_key({key!r})", lambda: store.delete_key(key))
                raise RoundClosed(f"agree round {round_no} was decided and closed without member {me}")
        if me in readers:
            read_key = f"{key_prefix}/read"
            if call(f"add({read_key!r})", lambda: store.add(read_key, 1)) == len(readers):
                try:
                    _close(call, store, closed_key, round_no, [decision_key, read_key, *votes.keys(members)])
                except StoreNotAnswering:
                    # the decision stands (every member it is for read it); its keys stay in the
                    # store, as a round's whose reader died do, and a late member still finds
                    # either the decision or the closed round
                    pass
        return decided, readers
    finally:
        call.close()


def _close(call: BoundedCalls, store: Any, closed_key: str, round_no: int, keys: list[str]) -> None:
    """Raise ``closed_key`` to ``round_no`` (never lower it: rounds may close out of order),
    then delete ``keys``."""
    want = str(round_no).encode()
    current = bytes(call(f"get({closed_key!r})", lambda: store.get(closed_key))) if call(
        f"check({closed_key!r})", lambda: store.check([closed_key])) else b""
    while not current or int(current) < round_no:
        stored = bytes(call(f"compare_set({closed_key!r})", lambda: store.compare_set(closed_key, current, want)))
        if stored == want:
            break
        current = stored
    for key in keys:
        call(f"delete_key({key!r})", lambda: store.delete_key(key))
