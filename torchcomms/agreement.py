"""Survivor agreement over a key-value store: every survivor gets the same member list.

Survivors check in under a membership epoch; once every member not known to have failed has
checked in (or the deadline passed), a proposal is written with compare-and-set. The first
proposal wins and everybody adopts it, so there is no split brain by construction. Works on any
torch ``Store`` (the control plane's, or a TCPStore).
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any


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
    not contain ``me`` (it was too late, or declared failed)."""
    store.set(f"{key_prefix}/in/{me}", b"1")
    decision_key = f"{key_prefix}/decision"
    arrived: set[int] = set()
    while True:
        if store.check([decision_key]):
            return _decode(store.get(decision_key))
        failed = known_failed()
        expected = [r for r in candidates if r not in failed]
        for r in expected:
            if r not in arrived and store.check([f"{key_prefix}/in/{r}"]):
                arrived.add(r)
        if all(r in arrived for r in expected) or time.monotonic() >= deadline:
            proposal = sorted(r for r in arrived if r not in failed)
            stored = store.compare_set(decision_key, b"", json.dumps(proposal).encode())
            return _decode(stored if stored else json.dumps(proposal).encode())
        time.sleep(poll_s)
