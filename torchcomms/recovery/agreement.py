"""Survivor agreement over a key-value store: every survivor gets the same member list.

Survivors check in under a membership epoch; once every member not known to have failed has
checked in (or the deadline passed), a proposal is written with compare-and-set. The first
proposal wins and everybody adopts it, so there is no split brain by construction. Works on any
torch ``Store`` (the control plane's, or a TCPStore).

Every store call is bounded by the agreement's deadline, whatever the store's own timeout: a
store whose host is stopped or cut off raises ``StoreNotAnswering`` at the deadline (plus
``STORE_CALL_GRACE_S``); see ``store_calls`` for why the store's own timeout cannot do that.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from torchcomms.core.store_calls import STORE_CALL_GRACE_S, BoundedCalls


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
        check_in = f"{key_prefix}/in/{me}"
        call(f"set({check_in!r})", lambda: store.set(check_in, b"1"))
        decision_key = f"{key_prefix}/decision"
        arrived: set[int] = set()
        while True:
            if call(f"check({decision_key!r})", lambda: store.check([decision_key])):
                return _decode(call(f"get({decision_key!r})", lambda: store.get(decision_key)))
            failed = known_failed()
            expected = [r for r in candidates if r not in failed]
            for r in expected:
                key = f"{key_prefix}/in/{r}"
                if r not in arrived and call(f"check({key!r})", lambda: store.check([key])):
                    arrived.add(r)
            if all(r in arrived for r in expected) or time.monotonic() >= deadline:
                proposal = json.dumps(sorted(r for r in arrived if r not in failed)).encode()
                stored = call(f"compare_set({decision_key!r})", lambda: store.compare_set(decision_key, b"", proposal))
                return _decode(stored if stored else proposal)
            time.sleep(poll_s)
    finally:
        call.close()


_YES, _NO = b"1", b"0"


def _decode_flag(raw: bytes) -> bool:
    if raw not in (_YES, _NO):
        raise ValueError(f"malformed outcome decision {raw!r}")
    return raw == _YES


def agree_on_flag(
    store: Any,
    key_prefix: str,
    me: int,
    members: list[int],
    flag: bool,
    known_failed: Callable[[], set[int]],
    deadline: float,
    poll_s: float = 0.002,
) -> bool:
    """The AND of the flags of ``members`` not known to have failed, decided once under
    ``key_prefix`` and the same for everybody who returns.

    A ``False`` flag decides ``False`` at once (compare-and-set); a ``True`` flag is written as a
    vote and the caller waits for every member not known failed to vote ``True`` (then proposes
    ``True``) or for the deadline (then proposes ``False``: a member that did not vote counts as
    a no). The first proposal wins and everybody adopts it, so no two callers ever return
    different values. Bounded like :func:`agree_on_survivors`."""
    call = BoundedCalls(deadline + STORE_CALL_GRACE_S, "torchcomms-agreement-store")
    decision_key = f"{key_prefix}/decision"
    try:
        if not flag:
            stored = call(f"compare_set({decision_key!r})", lambda: store.compare_set(decision_key, b"", _NO))
            return _decode_flag(stored if stored else _NO)
        vote = f"{key_prefix}/yes/{me}"
        call(f"set({vote!r})", lambda: store.set(vote, _YES))
        seen: set[int] = {me}
        while True:
            if call(f"check({decision_key!r})", lambda: store.check([decision_key])):
                return _decode_flag(call(f"get({decision_key!r})", lambda: store.get(decision_key)))
            failed = known_failed()
            expected = [r for r in members if r not in failed]
            for r in expected:
                key = f"{key_prefix}/yes/{r}"
                if r not in seen and call(f"check({key!r})", lambda: store.check([key])):
                    seen.add(r)
            if all(r in seen for r in expected):
                proposal = _YES
            elif time.monotonic() >= deadline:
                proposal = _NO
            else:
                time.sleep(poll_s)
                continue
            stored = call(f"compare_set({decision_key!r})", lambda: store.compare_set(decision_key, b"", proposal))
            return _decode_flag(stored if stored else proposal)
    finally:
        call.close()
