"""Failures on the mpi backend: deadlines with a stopped peer, ULFM's revoke/shrink/agree after
a SIGKILL at a random instant (3-8 ranks), and without ULFM a clear end, never a hang."""
from __future__ import annotations

import contextlib
import os
import random
import signal
import time

import pytest

from tests.helpers.mpi_ranks import (MpiJob, mpi_available, open_mpi_major, process_running, run_mpi_ranks,
                                     ulfm_available)

pytestmark = pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed")

TIMEOUT_S = 3.0
#: TC_CHAOS_REPEAT=N repeats every chaos case N times (repeat mode for hunting rare failures)
REPEAT = int(os.environ.get("TC_CHAOS_REPEAT", "1"))


# the engine thread's blocking calls, and MPI's nonblocking calls polled on the caller's thread
PATHS = [{"mpi.collectives": "blocking"}, {"mpi.nonblocking_max_bytes": "262144"}]


@pytest.mark.parametrize("hints", PATHS, ids=["engine-thread", "caller-thread"])
def test_stopped_peer_times_out_everyone_at_the_deadline(hints: dict[str, str] | None) -> None:
    # the survivors' exit ends the job (MPI_Abort: their op is still blocked on the stopped rank),
    # so each waits for both results before exiting
    with MpiJob(3, "tests.mpi.workers:stalled_peer", {"timeout_s": TIMEOUT_S, "victim": 2, "hints": hints},
                env={"TC_EXIT_AFTER_RESULTS": "0,1"}) as job:
        job.wait_ready([0, 1, 2])
        os.kill(job.pid_of(2), signal.SIGSTOP)
        (job.dir / "go").touch()
        results = job.results_of([0, 1], timeout=60)
        # mpiexec may already have ended the stopped rank: the others left without finalizing
        victim = job.pid_of(2)
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
    for res in results:
        v = res.value
        assert v is not None, (res.error, res.stderr[-3000:])
        assert v["raised"] == "CommTimeoutError", v
        assert v["op"] == "all_reduce" and v["seq"] == 2, v
        assert TIMEOUT_S - 0.5 <= v["elapsed"] <= TIMEOUT_S + 2.0, v
        assert v["after"] == "CommAbortedError" and v["after_elapsed"] < 1.0, v


def test_shrink_without_ulfm_names_what_the_mpi_lacks() -> None:
    results = run_mpi_ranks(2, "tests.mpi.workers:shrink_without_ulfm", timeout=90)
    for res in results:
        v = res.value
        assert v["shrink_capability"] is False
        assert v["raised"] == "BackendError", v
        assert "ULFM" in v["message"] and "mpiexec --with-ft ulfm" in v["message"], v


def test_killed_rank_without_ulfm_ends_the_job_rather_than_hanging() -> None:
    """Open MPI without ULFM takes the whole job down when a rank dies: every survivor ends."""
    with MpiJob(3, "tests.mpi.workers:ops_until_failure", {"timeout_s": 30.0, "limit_s": 60.0}) as job:
        job.wait_ready([0, 1, 2])
        time.sleep(random.uniform(0.0, 0.2))
        os.kill(job.pid_of(1), signal.SIGKILL)
        t0 = time.monotonic()
        job.proc.wait(60)
        ended = time.monotonic() - t0
    assert job.proc.returncode != 0
    assert ended < 30.0, ended


def test_a_communicator_of_ranks_not_started_by_mpiexec_is_refused() -> None:
    """Rank/size from TORCHCOMM_* that are not the MPI world's: a clear error, not a hang."""
    results = run_mpi_ranks(1, "tests.mpi.workers:wrong_world", env={"TORCHCOMM_RANK": "1", "TORCHCOMM_SIZE": "2"},
                            timeout=60)
    v = results[0].value
    assert v["raised"] == "CommValueError", v
    assert "mpiexec -n 2" in v["message"] and "torchcomms-run" in v["message"], v


@pytest.mark.skipif(not ulfm_available(), reason="this mpiexec has no ULFM (--with-ft ulfm)")
@pytest.mark.parametrize("run", range(REPEAT))
@pytest.mark.parametrize("world,victims,numel", [(3, 1, 4096), (4, 2, 4096), (8, 1, 4096), (3, 1, 1 << 18), (4, 2, 1 << 18)],
                         ids=["3r-1dead", "4r-2dead", "8r-1dead", "3r-1dead-1MiB", "4r-2dead-1MiB"])
def test_ulfm_survivors_get_a_typed_error_shrink_and_carry_on(world: int, victims: int, numel: int, run: int) -> None:
    """A rank killed at a random instant of a loop of 16 KiB or 1 MiB all-reduces (MPI's
    nonblocking call on the caller's thread, both sizes by default)."""
    rng = random.Random(f"{world}/{victims}/{run}/{time.time_ns()}")
    dead = sorted(rng.sample(range(world), victims))
    kwargs = {"timeout_s": 30.0, "limit_s": 60.0, "numel": numel}
    with MpiJob(world, "tests.mpi.workers:ops_until_failure", kwargs, ulfm=True) as job:
        job.wait_ready(list(range(world)))
        time.sleep(rng.uniform(0.0, 0.3))  # a random instant inside the all_reduce loop
        (job.dir / "killed_at").write_text(repr(time.monotonic()))
        victims = {r: job.pid_of(r) for r in dead}
        for pid in victims.values():
            os.kill(pid, signal.SIGKILL)
        survivors = [r for r in range(world) if r not in dead]
        results = job.results_of(survivors, timeout=120)
        # shown if a survivor never raised: were the victims gone, did it know the whole job?
        where = f"victims {victims}, still running {[p for p in victims.values() if process_running(p)]}"
    for res in results:
        v = res.value
        assert v is not None, (res.error, res.stderr[-4000:])
        assert "wrong_sum" not in v, v
        assert v["raised"] in ("PeerFailureError", "CommAbortedError"), (v, where, res.stderr[-3000:])
        assert v["new_size"] == len(survivors), v
        assert v["global_ranks"] == survivors, v
        assert v["new_rank"] == survivors.index(v["rank"]), v
        assert v["sum"] == float(sum(survivors)), v
        assert v["old_after"] == "CommAbortedError", v
    # the rank that saw the failure first names it as a peer failure
    assert any(res.value["raised"] == "PeerFailureError" for res in results)


def test_exit_with_a_communicator_blocked_on_a_stopped_peer_ends_the_job_with_a_message() -> None:
    """Without ULFM an engine thread blocked on a stopped peer cannot be released, and
    MPI_Finalize would wait for it forever: the exit guard ends the job with MPI_Abort instead."""
    with MpiJob(2, "tests.mpi.workers:exit_with_a_stopped_peer", {"timeout_s": 2.0}) as job:
        res = job.results_of([0], timeout=90)[0]
        job.proc.wait(90)
        out = job.output()
    assert res.value == {"raised": "CommTimeoutError"}, (res.error, out)
    assert job.proc.returncode != 0
    assert "blocked on a failed or stopped peer" in out and "mpiexec --with-ft ulfm" in out, out


@pytest.mark.skipif(not ulfm_available(), reason="this mpiexec has no ULFM (--with-ft ulfm)")
def test_agree_uses_mpi_agreement_under_ulfm_healthy_and_after_a_death() -> None:
    """No store exists under plain mpiexec, so every decision here comes from MPI_Comm_iagree."""
    with MpiJob(4, "tests.mpi.workers:agree_rounds", {"no_voter": 1, "victim": 3}, ulfm=True) as job:
        results = job.results_of([0, 1, 2], timeout=120)
    for res in results:
        v = res.value
        assert v is not None, (res.error, res.stderr[-4000:])
        assert v["engine_agree"] is True
        assert (v["all_yes"], v["one_no"]) == (True, False), v
        assert v["raised"] in ("PeerFailureError", "CommAbortedError"), v
        # the dead rank's missing vote does not count: the survivors' AND
        assert (v["after_all_yes"], v["after_one_no"]) == (True, False), v
        assert v["after_elapsed"] < 10.0, v


def test_agree_without_ulfm_or_store_names_what_is_missing() -> None:
    results = run_mpi_ranks(2, "tests.mpi.workers:agree_without_ulfm", timeout=90)
    for res in results:
        v = res.value
        assert v["raised"] == "BackendError", v
        assert "mpiexec --with-ft ulfm" in v["message"] and "torchcomms-run" in v["message"], v


@pytest.mark.skipif(not ulfm_available(), reason="this mpiexec has no ULFM (--with-ft ulfm)")
@pytest.mark.parametrize("kind", ["async", "batch"])
def test_ulfm_peer_failure_in_an_async_op_or_a_batch_is_a_peer_failure(kind: str) -> None:
    """Ops of several requests, or driven by the progress thread, are polled with MPI_Testall,
    which reports a failed request as MPI_ERR_IN_STATUS: the request's own error (a failed or
    revoked peer) must still make the op a PeerFailureError, not a BackendError."""
    with MpiJob(3, "tests.mpi.workers:killed_peer_in", {"kind": kind}, ulfm=True) as job:
        results = job.results_of([0, 1], timeout=120)
    for res in results:
        v = res.value
        assert v is not None, (res.error, res.stderr[-3000:])
        assert v["raised"] == "PeerFailureError", v


@pytest.mark.skipif(not ulfm_available(), reason="this mpiexec has no ULFM (--with-ft ulfm)")
@pytest.mark.parametrize("timed_out_first", [False, True], ids=["aborted", "timed-out-then-aborted"])
def test_ulfm_op_on_a_communicator_a_peer_revoked_is_a_peer_failure(timed_out_first: bool) -> None:
    """A peer aborted (revoked) the communicator, after its own op timed out or not: the others'
    next op fails as a peer failure, whichever error MPI's libnbc schedule reports it with
    (it reports a revoke met inside a started collective as MPI_ERR_OTHER)."""
    results = run_mpi_ranks(2, "tests.mpi.workers:op_after_a_peer_aborted",
                            {"numel": 16, "timed_out_first": timed_out_first}, ulfm=True, timeout=120)
    v = results[1].value
    assert v["raised"] == "PeerFailureError", v


def test_new_comm_that_a_peer_does_not_join_times_out_and_the_job_goes_on() -> None:
    """new_comm's timeout bounds the MPI communicator's creation: rank 0 gave up after it (it
    waited until rank 1 came, however late, before), and the ranks' next communicator works."""
    results = run_mpi_ranks(2, "tests.mpi.workers:new_comm_with_a_late_peer", timeout=120)
    assert results[0].value["second"].startswith("CommTimeoutError"), results[0].value
    assert "new_comm" in results[0].value["second"], results[0].value
    if (open_mpi_major() or 0) < 5:
        # Open MPI 4.1 (the GPU host's): an MPI_Comm_idup given up on does not match the late
        # rank's, so the next creation fails too; bounded and typed, as every creation is
        for res in results:
            assert "third_sum" in res.value or res.value["third"].startswith("CommTimeoutError"), res.value
        return
    for res in results:
        v = res.value
        assert v.get("third_sum") == [2.0] * 4, v


@pytest.mark.skipif(not ulfm_available(), reason="this mpiexec has no ULFM (--with-ft ulfm)")
def test_ulfm_new_comm_over_a_world_with_a_dead_rank_is_a_peer_failure() -> None:
    """MPI_Comm_idup of a world with a failed process fails with MPI_ERR_INTERN in Open MPI 5.0
    (its blocking MPI_Comm_dup with MPI_ERR_PROC_FAILED): either way the creation is refused as a
    peer failure, typed."""
    with MpiJob(3, "tests.mpi.workers:new_comm_after_a_death", ulfm=True) as job:
        results = job.results_of([0, 1], timeout=120)
    for res in results:
        v = res.value
        assert v is not None, (res.error, res.stderr[-3000:])
        assert v["raised"] == "PeerFailureError", v


@pytest.mark.skipif(not ulfm_available(), reason="this mpiexec has no ULFM (--with-ft ulfm)")
def test_ulfm_job_ends_after_its_survivors_recovered_and_exited() -> None:
    """After a rank died in an op, the survivors shrank, checked the result and exited: the job
    must end. Open MPI 5.0's MPI_Finalize begins with a PMIx fence that, after a process failure,
    never completed on about one run in five (every survivor waited in it forever); torchcomms
    turns that fence off in ULFM jobs. Three jobs, so that such a hang is likely to show."""
    for _ in range(3):
        with MpiJob(3, "tests.mpi.workers:recover_then_exit", ulfm=True) as job:
            results = job.wait(timeout=90)
        for res in results[:2]:
            v = res.value
            assert v is not None, (res.error, res.stderr[-3000:])
            assert v["raised"] in ("PeerFailureError", "CommAbortedError"), v
            assert (v["size"], v["sum"]) == (2, [1.0] * 4), v
