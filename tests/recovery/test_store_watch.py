"""The store watch (failure detection without the launcher, ``recovery/store_watch.py``) on
real ranks and a TCPStore the test hosts, with the CPU oversubscribed (the ranks on one CPU
beside 8 busy processes): a peer that leaves cleanly is not reported failed, a SIGKILLed one is, within the
detection bound; ``agree`` learns of the death through it instead of waiting for its timeout;
and ``agree`` leaves no key of its rounds in the store."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cpu_load import oversubscribed
from tests.helpers.ranks import RankGroup
from tests.helpers.store_host import watched_tcp_store

WORLD = 3
#: a SIGKILLed peer is reported within this (its process is looked at every 50 ms; the rest is
#: the scheduling of a starved box; the same bound as test_without_launcher.py)
DETECT_BOUND_S = 5.0
#: how long a survivor waits for any verdict on a peer that left (the verdict, not its time, is tested)
VERDICT_WITHIN_S = 60.0
AGREE_TIMEOUT_S = 60.0



def _leave(how: str, leaver: int = WORLD - 1) -> tuple[list, float]:
    with watched_tcp_store("tc-store-watch-") as env, oversubscribed(per_core=8, limit_s=240):
        if how == "exit":
            env["TC_RANK_EXIT_NORMALLY"] = "1"
        with RankGroup(WORLD, "tests.recovery.nolaunch_workers:peer_leaves",
                       {"leaver": leaver, "how": how, "seen_within_s": VERDICT_WITHIN_S}, env=env) as g:
            results = g.wait(timeout=VERDICT_WITHIN_S + 120)
        left_at = float((Path(env["TC_READY_DIR"]) / "left").read_text())
    return results, left_at


@pytest.mark.parametrize("how", ["finalize", "exit"])
def test_a_peer_that_leaves_cleanly_is_not_reported_failed(how: str) -> None:
    """``finalize`` then ``os._exit``, or the interpreter's normal exit without finalizing: the
    other ranks' watches see the process gone and take it for a clean exit (their
    communicators stay unbroken). Both used to be reported ``process_gone`` and break them."""
    results, _ = _leave(how)
    assert results[WORLD - 1].ok(), results[WORLD - 1].stderr[-3000:]
    for r in results[:-1]:
        assert r.ok(), (r.error, r.stderr[-3000:])
        v = r.value
        assert v["gone"] and v["verdict"] == "exited" and not v["broken"] and v["failed"] == [], v


def test_a_sigkilled_peer_is_reported_failed_within_the_bound() -> None:
    results, killed_at = _leave("kill")
    assert results[WORLD - 1].returncode == -signal.SIGKILL
    for r in results[:-1]:
        assert r.ok(), (r.error, r.stderr[-3000:])
        v = r.value
        assert v["verdict"] == "failed" and v["broken"] and v["failed"] == [WORLD - 1], v
        assert v["at"] - killed_at < DETECT_BOUND_S, (v["at"] - killed_at, v)


def test_agree_without_the_launcher_learns_of_a_killed_member() -> None:
    """Without the control plane a SIGKILLed member's vote never comes: agree used to wait for
    its whole timeout and decide False. The store watch reports the death; agree then decides
    over the live members (all said yes) within the detection bound."""
    with watched_tcp_store("tc-store-watch-") as env, oversubscribed(per_core=8, limit_s=240):
        with RankGroup(WORLD, "tests.recovery.nolaunch_workers:agree_after_kill",
                       {"victim": WORLD - 1, "agree_timeout_s": AGREE_TIMEOUT_S}, env=env) as g:
            results = g.wait(timeout=AGREE_TIMEOUT_S + 120)
        killed_at = float((Path(env["TC_READY_DIR"]) / "killed").read_text())
    assert results[WORLD - 1].returncode == -signal.SIGKILL
    for r in results[:-1]:
        assert r.ok(), (r.error, r.stderr[-3000:])
        v = r.value
        assert v["decided"] is True, v
        assert v["at"] - killed_at < DETECT_BOUND_S, (v["at"] - killed_at, v)


def test_agree_leaves_no_key_of_its_rounds_in_the_store() -> None:
    """30 agrees by 3 real ranks: the store holds one key more than before them (the highest
    closed round); it used to hold 4 more per agree (the votes and the decision)."""
    rounds = 30
    with watched_tcp_store("tc-store-watch-") as env:
        env["TORCHCOMM_STORE_WATCH"] = "0"
        with RankGroup(WORLD, "tests.recovery.nolaunch_workers:agree_rounds", {"rounds": rounds}, env=env) as g:
            results = g.wait(timeout=180)
    for r in results:
        assert r.ok(), (r.error, r.stderr[-3000:])
    expected = [n % 3 != 0 for n in range(rounds)]
    assert all(r.value["decided"] == expected for r in results), [r.value["decided"] for r in results]
    v = results[0].value
    assert v["after"] - v["before"] == 1, v


def test_a_peer_is_watched_once_its_identity_is_read_whatever_the_others() -> None:
    """Peers' identities are read one by one: a rank that never published its own (killed
    before its watch ran) used to keep every other peer of the host unwatched too."""
    import json

    import torch.distributed as dist

    from torchcomms.config import settings
    from torchcomms.recovery.store_watch import StoreWatch, _identity  # noqa: PLC2701

    store = dist.HashStore()
    watch = StoreWatch(store, 0, 3)
    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        key = f"torchcomms/{settings().job_id}/liveness/proc/1"
        store.set(key, json.dumps({**_identity(), "pid": peer.pid}).encode())
        watch._learn_identities()  # noqa: SLF001 - rank 2 never published
        assert watch._local == {1: peer.pid}  # noqa: SLF001
    finally:
        peer.kill()
        peer.wait()
