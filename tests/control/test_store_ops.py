"""Every store op against a real server, including waits, prefixes and concurrency."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from torchcomms.control.client import ControlClient
from torchcomms.control.errors import (
    ControlArgumentError,
    ControlArgumentTypeError,
    ControlLimitError,
    ControlTimeoutError,
    ControlValueError,
)
from torchcomms.control.server import StoreServer

from .conftest import spawn_python, stop_process


def test_set_get_roundtrip_binary(client: ControlClient) -> None:
    value = bytes(range(256)) * 10
    client.set("blob", value)
    assert client.get("blob") == value
    client.set("blob", b"")
    assert client.get("blob") == b""


def test_unicode_keys(client: ControlClient) -> None:
    client.set("ключ/🔑", b"x")
    assert client.get("ключ/🔑") == b"x"
    assert client.keys("ключ") == ["ключ/🔑"]


def test_add_counts_and_stores_decimal(client: ControlClient) -> None:
    assert client.add("n", 5) == 5
    assert client.add("n", -7) == -2
    assert client.add("n", 0) == -2
    assert client.get("n") == b"-2"
    client.set("m", b"40")
    assert client.add("m", 2) == 42


def test_add_on_non_integer_is_a_value_error(client: ControlClient) -> None:
    client.set("text", b"hello")
    with pytest.raises(ControlValueError, match="not an integer"):
        client.add("text", 1)
    assert client.get("text") == b"hello"


def test_add_overflow_is_refused(client: ControlClient) -> None:
    client.add("big", 2**63 - 1)
    with pytest.raises(ControlValueError, match="overflow"):
        client.add("big", 1)


def test_compare_set_semantics(client: ControlClient) -> None:
    # absent key, non-empty expected: nothing set, expected returned (c10d semantics)
    assert client.compare_set("cs", b"old", b"new") == b"old"
    assert not client.check(["cs"])
    # absent key, empty expected: set
    assert client.compare_set("cs", b"", b"first") == b"first"
    # mismatch: current value returned, unchanged
    assert client.compare_set("cs", b"wrong", b"second") == b"first"
    # match: swapped
    assert client.compare_set("cs", b"first", b"second") == b"second"
    assert client.get("cs") == b"second"


def test_delete_and_check(client: ControlClient) -> None:
    client.set("a", b"1")
    client.set("b", b"2")
    assert client.check(["a", "b"]) and client.check("a")
    assert client.delete("a") is True
    assert client.delete("a") is False
    assert not client.check(["a", "b"])
    assert client.check(["b"])


def test_keys_prefix_and_num_keys(client: ControlClient) -> None:
    for key in ("job/0/a", "job/0/b", "job/1/a", "other"):
        client.set(key, b"")
    assert client.keys("job/0/") == ["job/0/a", "job/0/b"]
    assert client.keys("job/") == ["job/0/a", "job/0/b", "job/1/a"]
    assert client.keys("nothing") == []
    assert client.num_keys() == 4
    assert client.delete_prefix("job/0/") == 2
    assert client.keys("") == ["job/1/a", "other"]
    assert client.num_keys() == 2


def test_append_multi_get_multi_set(client: ControlClient) -> None:
    client.append("log", b"ab")
    client.append("log", b"cd")
    assert client.get("log") == b"abcd"
    client.multi_set(["x", "y"], [b"1", b"2"])
    assert client.multi_get(["y", "x", "log"]) == [b"2", b"1", b"abcd"]


def test_queue_ops(client: ControlClient) -> None:
    assert client.queue_len("q") == 0
    client.queue_push("q", b"1")
    client.queue_push("q", b"2")
    assert client.queue_len("q") == 2
    assert client.queue_pop("q") == b"1"
    assert client.queue_pop("q") == b"2"
    with pytest.raises(ControlTimeoutError, match="empty"):
        client.queue_pop("q", block=False)
    pusher = threading.Timer(0.2, lambda: client.queue_push("q", b"late"))
    pusher.start()
    assert client.queue_pop("q", timeout=5) == b"late"
    pusher.join(5)  # its reply may land after the pop's: the fixture closing the client failed the push


def test_get_waits_for_a_later_set(client: ControlClient, server: StoreServer,
                                   secret: bytes) -> None:
    with ControlClient(server.address, secret) as other:
        setter = threading.Timer(0.2, lambda: other.set("later", b"v"))
        setter.start()
        assert client.get("later", timeout=5) == b"v"
        setter.join(5)  # its reply may land after get's: closing `other` first failed the set


def test_get_timeout_names_the_key(client: ControlClient) -> None:
    start = time.monotonic()
    with pytest.raises(ControlTimeoutError, match="missing-key") as info:
        client.get("missing-key", timeout=0.3)
    elapsed = time.monotonic() - start
    assert 0.3 <= elapsed < 0.3 + 2.0  # honoured, with a generous margin
    assert info.value.keys == ["missing-key"]


def test_wait_timeout_names_only_the_missing_keys(client: ControlClient) -> None:
    client.set("here", b"")
    with pytest.raises(ControlTimeoutError) as info:
        client.wait(["here", "absent1", "absent2"], timeout=timedelta(milliseconds=200))
    assert info.value.keys == ["absent1", "absent2"]


def test_wait_zero_timeout_checks_without_blocking(client: ControlClient) -> None:
    with pytest.raises(ControlTimeoutError):
        client.wait(["nope"], timeout=0)
    client.set("yes", b"")
    client.wait(["yes"], timeout=0)


def test_wait_completes_when_all_keys_arrive(client: ControlClient, server: StoreServer,
                                             secret: bytes) -> None:
    done = threading.Event()

    def waiter() -> None:
        client.wait(["k1", "k2", "k3"], timeout=10)
        done.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    with ControlClient(server.address, secret) as other:
        other.set("k1", b"")
        other.set("k2", b"")
        time.sleep(0.1)
        assert not done.is_set()
        other.set("k3", b"")
    thread.join(10)
    assert done.is_set()


def test_key_deleted_before_the_rest_arrive_keeps_the_wait_open(client: ControlClient) -> None:
    results: list[object] = []

    def waiter() -> None:
        try:
            client.wait(["d1", "d2"], timeout=1.0)
            results.append("ok")
        except ControlTimeoutError as exc:
            results.append(exc.keys)

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.1)
    client.set("d1", b"")
    client.delete("d1")
    client.set("d2", b"")
    thread.join(10)
    assert results == [["d1"]]


def test_many_threads_block_while_others_use_the_store(client: ControlClient) -> None:
    n = 16
    out: dict[int, bytes] = {}

    def getter(i: int) -> None:
        out[i] = client.get(f"t/{i}", timeout=20)

    threads = [threading.Thread(target=getter, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for i in range(n):  # the same client serves sets while 16 threads are blocked in get
        client.set(f"t/{i}", str(i).encode())
    for t in threads:
        t.join(20)
    assert out == {i: str(i).encode() for i in range(n)}


def test_concurrent_add_from_threads(client: ControlClient) -> None:
    def worker() -> None:
        for _ in range(50):
            client.add("counter", 1)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert client.add("counter", 0) == 400


ADDER = """
import sys
from torchcomms.control.client import ControlClient
with ControlClient(sys.argv[1], bytes.fromhex(sys.argv[2]), timeout=20) as c:
    me = int(sys.argv[3])
    for _ in range(25):
        c.add("procs/counter", 1)
    c.set(f"procs/done/{me}", b"1")
    c.wait([f"procs/done/{i}" for i in range(int(sys.argv[4]))], timeout=20)
    print(c.get("procs/counter").decode())
"""


def test_concurrent_clients_in_processes(server: StoreServer, secret: bytes) -> None:
    n = 4
    procs = [spawn_python(ADDER, server.address, secret.hex(), str(i), str(n),
                          stdout=-1) for i in range(n)]
    try:
        outputs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            stop_process(p)
    assert [p.returncode for p in procs] == [0] * n
    assert [o.strip() for o in outputs] == [str(25 * n)] * n


# -- argument errors: typed, clear, raised before anything is sent ---------------------------

@pytest.mark.parametrize("call,exc,match", [
    (lambda c: c.set(1, b""), ControlArgumentTypeError, "key must be a str"),
    (lambda c: c.set("", b""), ControlArgumentError, "must not be empty"),
    (lambda c: c.set("k" * 5000, b""), ControlArgumentError, "key limit"),
    (lambda c: c.set("k", "text"), ControlArgumentTypeError, "value must be bytes"),
    (lambda c: c.get("k", timeout=-1), ControlArgumentError, ">= 0"),
    (lambda c: c.get("k", timeout="1"), ControlArgumentTypeError, "seconds"),
    (lambda c: c.add("k", 1.0), ControlArgumentTypeError, "delta must be an int"),
    (lambda c: c.add("k", True), ControlArgumentTypeError, "delta must be an int"),
    (lambda c: c.add("k", 2**70), ControlArgumentError, "int64"),
    (lambda c: c.wait(5), ControlArgumentTypeError, "list of str"),
    (lambda c: c.wait(["ok", 3]), ControlArgumentTypeError, r"keys\[1\]"),
    (lambda c: c.multi_set(["a"], [b"1", b"2"]), ControlArgumentError, "1 keys but 2"),
    (lambda c: c.keys(None), ControlArgumentTypeError, "prefix must be a str"),
    (lambda c: c.compare_set("k", "a", b"b"), ControlArgumentTypeError, "expected"),
    (lambda c: c.queue_pop("k", block="yes"), ControlArgumentTypeError, "block"),
])
def test_argument_errors(client: ControlClient, call, exc, match) -> None:
    with pytest.raises(exc, match=match):
        call(client)


def test_value_over_the_limit_is_refused_client_side(small_server: StoreServer,
                                                     secret: bytes) -> None:
    from torchcomms.control.protocol import Limits
    with ControlClient(small_server.address, secret, limits=Limits(
            max_value_bytes=1024, message_overhead_bytes=1024)) as c:
        with pytest.raises(ControlArgumentError, match="value limit"):
            c.set("k", b"x" * 1025)
        c.set("k", b"x" * 1024)
        assert len(c.get("k")) == 1024


def test_server_enforces_its_limits_on_a_lenient_client(small_server: StoreServer,
                                                        secret: bytes) -> None:
    with ControlClient(small_server.address, secret) as c:  # default (larger) client limits
        with pytest.raises(ControlLimitError, match="value limit"):
            c.set("k", b"x" * 2000)
        c.set("k", b"x" * 1000)
        with pytest.raises(ControlLimitError, match="value limit"):
            c.append("k", b"x" * 100)
        assert len(c.get("k")) == 1000


def test_lone_surrogate_key_is_refused(client: ControlClient) -> None:
    with pytest.raises(ControlArgumentError, match="not valid Unicode"):
        client.set("bad\udcff", b"")


def test_oversized_event_payload_is_refused(client: ControlClient) -> None:
    with pytest.raises(ControlArgumentError, match="payload limit"):
        client.publish("custom", {"blob": b"x" * (client.limits.max_payload_bytes + 1)})


def test_expired_waits_leave_no_bookkeeping(client: ControlClient, server: StoreServer) -> None:
    for i in range(20):
        with pytest.raises(ControlTimeoutError):
            client.wait([f"never/{i}", "never/shared"], timeout=0.01)
    with pytest.raises(ControlTimeoutError):
        client.queue_pop("never/q", timeout=0.01)
    client.ping()  # one more loop turn
    assert server._pending == 0
    assert server._waiters_by_key == {} and server._queue_waiters == {}
