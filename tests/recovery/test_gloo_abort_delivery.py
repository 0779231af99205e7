"""``GlooBackend.abort()`` returns only once every op pending on the engine was failed and its
callbacks ran, also when gloo's thread fails the op before abort looks for pending ops.

Two engines of one 2-rank gloo group live in this process; rank 1 never joins rank 0's
all_reduce, so that op is pending when rank 0's engine is aborted. The op's callback is slow
(0.5 s), and the shutdown of the engine's connections is followed by a pause (a caller
descheduled right after it, on a loaded host): gloo's thread then marks the op's future done
and starts its callbacks before abort() waits. abort() used to wait only for futures not yet
done, so it returned while the callback still ran (seen once in a full suite run on the 2-core
VM: ``delivered_before_abort_returned`` False in ``test_gloo_abandon.py``)."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from torchcomms.backends.base import BackendContext
from torchcomms.backends.gloo import GlooBackend
from torchcomms.backends.gloo_sockets import EngineSockets
from torchcomms.core.types import ReduceOp


def _engines(store: dist.Store) -> list[GlooBackend]:
    made: dict[int, GlooBackend] = {}

    def build(rank: int) -> None:
        ctx = BackendContext(name="abort-delivery", rank=rank, size=2, device=torch.device("cpu"), store=store,
                             store_prefix="e0", timeout=timedelta(seconds=60), hints={"gloo.hostname": "127.0.0.1"})
        backend = GlooBackend(ctx)
        backend.init()
        made[rank] = backend

    threads = [threading.Thread(target=build, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(made) == [0, 1], "the two engines were not built"
    return [made[0], made[1]]


def test_abort_returns_after_the_callbacks_of_an_op_failed_before_it_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    real_shut_down = EngineSockets.shut_down

    def shut_down_then_descheduled(self: EngineSockets) -> int:
        done = real_shut_down(self)
        time.sleep(0.3)
        return done

    engine0, _engine1 = _engines(dist.HashStore())
    delivered: list[BaseException | None] = []

    def slow_callback(error: BaseException | None) -> None:
        time.sleep(0.5)
        delivered.append(error)

    engine0.all_reduce(torch.ones(1024), ReduceOp.SUM).on_done(slow_callback)  # pending: rank 1 never joins
    time.sleep(0.2)
    assert not delivered
    monkeypatch.setattr(EngineSockets, "shut_down", shut_down_then_descheduled)
    engine0.abort()
    assert len(delivered) == 1 and delivered[0] is not None, delivered
    assert engine0.classify_error(delivered[0]) == "peer", delivered
