"""``store_calls``: calls bounded by their caller's deadline, whatever the store's own timeout."""
from __future__ import annotations

import threading
import time

import pytest

from torchcomms.core.store_calls import BoundedCalls, PendingCall, StoreNotAnswering, call_until, describe_store


def test_call_until_returns_the_result_or_raises_the_calls_error() -> None:
    until = time.monotonic() + 5
    assert call_until("x", lambda: 7, until, thread_name="t") == 7
    with pytest.raises(KeyError):
        call_until("x", lambda: {}["missing"], until, thread_name="t")


def test_an_abandoned_call_hands_a_late_result_to_on_late() -> None:
    release, late = threading.Event(), []
    start = time.monotonic()
    with pytest.raises(StoreNotAnswering) as info:
        call_until("get('k')", lambda: release.wait(5) and "engine", start + 0.2, thread_name="t",
                   on_late=late.append)
    assert 0.2 <= time.monotonic() - start < 1.0
    assert info.value.call == "get('k')" and "get('k')" in str(info.value)
    release.set()
    deadline = time.monotonic() + 5
    while not late and time.monotonic() < deadline:
        time.sleep(0.01)
    assert late == ["engine"]


def test_give_up_ends_the_wait_before_the_deadline() -> None:
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    start = time.monotonic()
    with pytest.raises(StoreNotAnswering):
        call_until("x", lambda: time.sleep(2), start + 10, thread_name="t", give_up=stop.is_set)
    assert time.monotonic() - start < 1.0


def test_an_abandoned_call_cancels_its_calls_through_a_store_that_can() -> None:
    cancelled: list[threading.Thread] = []

    class Client:
        def cancel_calls_of(self, thread: threading.Thread) -> None:
            cancelled.append(thread)

    class Store:
        client = Client()

    class Prefixed:  # like torch's PrefixStore
        underlying_store = Store()

    with pytest.raises(StoreNotAnswering):
        call_until("x", lambda: time.sleep(1), time.monotonic() + 0.05, thread_name="abandoned", store=Prefixed())
    assert [t.name for t in cancelled] == ["abandoned"]


def test_many_callers_wait_for_one_pending_call_each_until_its_own_deadline() -> None:
    release = threading.Event()
    ended: list[PendingCall[str]] = []
    call = PendingCall(lambda: release.wait(5) and "store", on_end=ended.append).start("t")
    with pytest.raises(StoreNotAnswering):
        call.wait("connect", time.monotonic() + 0.05)
    release.set()
    assert call.wait("connect", time.monotonic() + 5) == "store" and ended == [call]


def test_bounded_calls_run_in_order_on_one_helper() -> None:
    calls = BoundedCalls(time.monotonic() + 5)
    try:
        names = [calls("a", lambda: threading.current_thread().name) for _ in range(3)]
    finally:
        calls.close()
    assert len(set(names)) == 1 and names[0] != threading.current_thread().name


def test_describe_store_names_the_innermost_store_and_its_address() -> None:
    class TCPStore:
        host, port = "10.0.0.1", 29500

    class PrefixStore:
        underlying_store = TCPStore()

    assert describe_store(PrefixStore()) == "the TCPStore at 10.0.0.1:29500"
