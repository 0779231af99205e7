"""One agreement round over a key-value store: members check in, one proposal is written
with compare-and-set, and everybody who returns reads the same decision (used by
``agreement``).

The round costs each member four store requests whatever the number of members: a member
checks in with an entry in the round's arrival log (``append``) and an arrival counter
(``add``); the member whose count completes the round confirms every check-in with one read of
the log and proposes; the others block on the decision key (the store's ``wait``, in slices)
and read it. One member, the *leader* (the lowest member not known failed), polls the log with
back-off meanwhile and proposes when the check-ins are complete but no count made a member
propose: the member that completed the count died, a failure was learnt after the others
checked in, or a check-in was not counted. Members put the failures they know in the log and
the leader counts them too, so a failure that one member knows is not waited for because the
leader has not learnt it yet. At the deadline the leader proposes from the log; the others
adopt its decision, or propose themselves a moment after (the leader may have died). A store
without the extended API (a FileStore) has no log: members set a key each, the leader checks
them all in one ``check`` and the others poll the decision.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from torchcomms.control.errors import ControlNoReplyError
from torchcomms.core.store_calls import STORE_CALL_GRACE_S, BoundedCalls

#: ``propose(complete, arrived, expected)``: the proposal once every expected member arrived
#: (``complete``) or the deadline passed; ``arrived`` and ``expected`` exclude known failures.
Propose = Callable[[bool, list[int], list[int]], bytes]

#: The leader's poll interval doubles from ``poll_s`` up to this.
POLL_MAX_S = 0.1
#: How often the leader checks the keys of the members missing from the log (without a log:
#: every member's key) when neither the log nor the counter calls for it: check-ins that are
#: a key only (set by hand, or by a member on a store without a log).
LIST_CHECK_S = 1.0
#: A member other than the leader waits for the decision in slices: the first of at least
#: this and of ``WAIT_SLICE_PER_MEMBER_S`` per member (so that the waiting members together
#: send about 1,000 waits a second at most), each next one twice as long, up to
#: ``WAIT_SLICE_MAX_S`` (a wait that times out costs the store a request, and a TCPStore
#: client logs a warning for it); between slices it looks whether it became the leader.
WAIT_SLICE_S = 1.0
WAIT_SLICE_PER_MEMBER_S = 0.001
WAIT_SLICE_MAX_S = 5.0
#: How long past the deadline a member other than the leader waits for the leader's proposal
#: before it proposes itself (its store calls are bounded by the deadline plus the grace).
FOLLOWER_LAG_S = STORE_CALL_GRACE_S / 2
#: The most keys one ``check`` asks for (a request's size stays under the stores' limits).
CHECK_KEYS = 8192
#: The shortest wait asked of a store (c10d stores count whole milliseconds, and read 0 as
#: their own timeout).
MIN_WAIT_S = 0.002


def _has_append(store: Any) -> bool:
    """Whether ``store`` has the extended API (``append`` for the arrival log, a ``wait`` that
    honours short timeouts); without it members set keys, poll the decision and the deadline's
    proposal checks the members' keys one by one (the way for small stores: a FileStore)."""
    try:
        return bool(store.has_extended_api())
    except Exception:  # noqa: BLE001 - a store without the method
        return False


def _is_wait_timeout(error: BaseException) -> bool:
    """Whether a store's ``wait`` raised because its timeout ran out (not because it failed),
    or because the control server did not answer it over a connection that stood (stopped or
    starved: asked again while the round's deadline allows; a lost connection is raised)."""
    return isinstance(error, (dist.DistStoreError, ControlNoReplyError)) or (
        type(error) is RuntimeError and "timeout" in str(error).lower())  # a store's plain "Wait timeout"


class _Log:
    """What the arrival log says: the members who checked in, and those reported failed."""

    __slots__ = ("arrived", "failed")

    def __init__(self, raw: bytes, members: list[int]) -> None:
        wanted = set(members)
        self.arrived: set[int] = set()
        self.failed: set[int] = set()
        for token in raw.split(b","):
            into, digits = (self.failed, token[1:]) if token.startswith(b"!") else (self.arrived, token)
            if digits.isdigit() and int(digits) in wanted:
                into.add(int(digits))


class Round:
    """The store keys of one round and the requests on them, each through ``call``.

    The arrival log (where the store has the extended API) holds ``<rank>,`` for each member
    that checked in and ``!<rank>,`` for each failure a member reported: the leader counts a
    failure any member knows, so that a leader that has not learnt it yet does not wait for
    the failed member."""

    def __init__(self, call: BoundedCalls, store: Any, key_prefix: str, mark: str, me: int,
                 members: list[int]) -> None:
        self.call, self.store, self.me, self.members = call, store, me, members
        self.prefix = f"{key_prefix}/{mark}"
        self.decision = f"{key_prefix}/decision"
        self.counter = f"{self.prefix}-count"
        self.log = f"{self.prefix}-log" if _has_append(store) else None
        self.reported: set[int] = set()  # the failures this member put in the log

    def key(self, r: int) -> str:
        return f"{self.prefix}/{r}"

    def keys(self, members: list[int]) -> list[str]:
        """Every key of the round but the decision's."""
        return [self.counter, *([self.log] if self.log else []), *map(self.key, members)]

    def _append(self, entry: bytes) -> None:
        log, store = self.log, self.store
        self.call(f"append({log!r})", lambda: store.append(log, entry))

    def _failures(self, failed: set[int]) -> bytes:
        new = sorted(r for r in failed if r in self.members and r not in self.reported)
        self.reported.update(new)
        return b"".join(b"!%d," % r for r in new)

    def check_in(self, failed: set[int]) -> int:
        """Log this member (with the failures it knows) or, where the store has no log, set its
        key; count it. Returns the count."""
        if self.log is not None:
            self._append(b"%d," % self.me + self._failures(failed))
        else:
            mine, store = self.key(self.me), self.store
            self.call(f"set({mine!r})", lambda: store.set(mine, b"1"))
        return self.count(1)

    def report(self, failed: set[int]) -> None:
        """Put the failures in ``failed`` that this member did not report yet in the log."""
        if self.log is not None and not failed <= self.reported:
            entry = self._failures(failed)
            if entry:
                self._append(entry)

    def count(self, delta: int = 0) -> int:
        counter, store = self.counter, self.store
        return int(self.call(f"add({counter!r})", lambda: store.add(counter, delta)))

    def read_log(self) -> _Log | None:
        """The arrival log; ``None`` where the store has none (or it is gone: the round closed)."""
        log, store = self.log, self.store
        if log is None or not self.call(f"check({log!r})", lambda: store.check([log])):
            return None
        return _Log(bytes(self.call(f"get({log!r})", lambda: store.get(log))), self.members)

    def complete(self, expected: list[int], log: _Log | None) -> bool:
        """Whether every member of ``expected`` checked in: in ``log``, or by its key (one
        request per ``CHECK_KEYS`` members not in the log)."""
        return self.all_in([r for r in expected if r not in log.arrived] if log is not None else expected)

    def all_in(self, expected: list[int]) -> bool:
        """Whether every member of ``expected`` set its key: one request per ``CHECK_KEYS`` members."""
        store = self.store
        for i in range(0, len(expected), CHECK_KEYS):
            keys = [self.key(r) for r in expected[i:i + CHECK_KEYS]]
            if not self.call(f"check({self.prefix}/<{len(keys)} members>)", lambda: store.check(keys)):
                return False
        return True

    def scan(self) -> set[int]:
        """The members who checked in, by each key's check (a store without the log)."""
        found, store = {self.me}, self.store
        for r in self.members:
            key = self.key(r)
            if r not in found and self.call(f"check({key!r})", lambda: store.check([key])):
                found.add(r)
        return found

    def decided(self) -> bytes | None:
        decision, store = self.decision, self.store
        if self.call(f"check({decision!r})", lambda: store.check([decision])):
            return bytes(self.call(f"get({decision!r})", lambda: store.get(decision)))
        return None

    def wait_decided(self, secs: float) -> bytes | None:
        """The decision, waited for up to ``secs`` with one blocking ``wait``; ``None`` if none came."""
        decision, store = self.decision, self.store
        started = time.monotonic()
        try:
            self.call(f"wait({decision!r})", lambda: store.wait([decision], timedelta(seconds=secs)), secs)
        except Exception as e:  # noqa: BLE001 - a store may raise anything
            if not _is_wait_timeout(e) or time.monotonic() - started < secs / 2:  # failed, did not wait
                raise
            return None
        return bytes(self.call(f"get({decision!r})", lambda: store.get(decision)))

    def propose(self, proposal: bytes) -> bytes:
        """The stored decision: ``proposal`` if it was the first, else the one before it."""
        decision, store = self.decision, self.store
        stored = self.call(f"compare_set({decision!r})", lambda: store.compare_set(decision, b"", proposal))
        return bytes(stored) if stored else proposal


def decide(call: BoundedCalls, store: Any, key_prefix: str, mark: str, me: int, members: list[int],
            known_failed: Callable[[], set[int]], deadline: float, poll_s: float, propose: Propose,
            arrivals: bool = True) -> bytes:
    """Check in under ``<key_prefix>/<mark>`` (the log ``<mark>-log``, or the key ``<mark>/<me>``
    where the store has no log; a key set by a member counts as its check-in either way) and
    return the stored decision: another member's, or ``propose(...)`` written with
    compare-and-set once every member not known failed checked in (or ``deadline`` passed).
    ``arrivals``: whether a proposal at the deadline needs the members who arrived (else it is
    given none)."""
    rnd = Round(call, store, key_prefix, mark, me, members)
    failed = set(known_failed())
    count = rnd.check_in(failed)
    expected = [r for r in members if r not in failed]
    if count >= len(expected) and rnd.complete(expected, rnd.read_log()):  # this member completed the count
        return rnd.propose(propose(True, sorted(expected), expected))
    wait_slice = max(WAIT_SLICE_S, len(members) * WAIT_SLICE_PER_MEMBER_S)
    max_slice = max(WAIT_SLICE_MAX_S, wait_slice)
    interval = poll_s
    listed: tuple[int, int] | None = None  # (arrived, expected) at the leader's last check of every key
    listed_at = -math.inf
    while True:
        failed = set(known_failed())
        rnd.report(failed)
        expected = [r for r in members if r not in failed]
        now = time.monotonic()
        if not expected or min(expected) == me:  # the leader
            if now >= deadline:
                return _at_deadline(rnd, failed, propose, arrivals)
            decided = rnd.decided()
            if decided is not None:
                return decided
            log = rnd.read_log()
            if log is not None:
                failed |= log.failed
                expected = [r for r in members if r not in failed]
                arrived = len(log.arrived.intersection(expected))
            else:
                arrived = rnd.count()
            if arrived >= len(expected) and log is not None:  # every one of them is in the log
                return rnd.propose(propose(True, sorted(expected), expected))
            if (arrived >= len(expected) and (arrived, len(expected)) != listed) or now - listed_at >= LIST_CHECK_S:
                listed, listed_at = (arrived, len(expected)), now
                if rnd.complete(expected, log):
                    return rnd.propose(propose(True, sorted(expected), expected))
            time.sleep(max(0.0, min(interval, deadline - time.monotonic())))
            interval = min(interval * 2, max(poll_s, POLL_MAX_S))
        else:
            until = deadline + FOLLOWER_LAG_S
            if now >= until - MIN_WAIT_S:  # a store reads a wait of 0 ms as its own (long) timeout
                time.sleep(max(0.0, until - now))
                return _at_deadline(rnd, failed, propose, arrivals)
            if rnd.log is None:  # a store without the extended API (a FileStore waits in whole seconds): poll
                decided = rnd.decided()
                if decided is None:
                    time.sleep(max(0.0, min(interval, until - time.monotonic())))
                    interval = min(interval * 2, max(poll_s, POLL_MAX_S))
            else:
                decided = rnd.wait_decided(min(wait_slice, until - now))
                wait_slice = min(2 * wait_slice, max_slice)
            if decided is not None:
                return decided


def _at_deadline(rnd: Round, failed: set[int], propose: Propose, arrivals: bool) -> bytes:
    """The decision at the deadline: the one stored, or this member's proposal (failures
    reported in the log count as known)."""
    decided = rnd.decided()
    if decided is not None:
        return decided
    log = rnd.read_log()
    if log is not None:
        failed = failed | log.failed
    expected = [r for r in rnd.members if r not in failed]
    if rnd.complete(expected, log):
        return rnd.propose(propose(True, sorted(expected), expected))
    arrived = ((log.arrived | {rnd.me}) if log is not None else rnd.scan()) if arrivals else set()
    return rnd.propose(propose(False, sorted(arrived - failed), expected))
