"""Code that runs inside rank processes for the communicator tests (see tests/helpers/ranks.py)."""
from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import torch

import torchcomms
from tests.helpers.rank_sync import start_together
from torchcomms import ReduceOp

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64}


def engine() -> str:
    """The backend under test: ``TC_BACKEND`` (set by the ``launch`` fixture), else gloo."""
    return os.environ.get("TC_BACKEND", "gloo")


def data(rank: int, numel: int, dtype: torch.dtype, salt: int) -> torch.Tensor:
    """Rank ``rank``'s deterministic input: small integers 1..3, exact in every dtype."""
    base = (torch.arange(numel, dtype=torch.int64) * (rank + 2) + salt * 7 + rank) % 3 + 1
    return base.to(dtype)


def ops_for(dtype: torch.dtype) -> list[tuple[str, ReduceOp]]:
    ops = [("SUM", ReduceOp.SUM), ("PRODUCT", ReduceOp.PRODUCT), ("MIN", ReduceOp.MIN), ("MAX", ReduceOp.MAX)]
    if dtype.is_floating_point:
        ops += [("AVG", ReduceOp.AVG), ("PREMUL_SUM", ReduceOp.PREMUL_SUM(0.5))]
    else:
        ops += [("BAND", ReduceOp.BAND), ("BOR", ReduceOp.BOR), ("BXOR", ReduceOp.BXOR)]
    return ops


def reduce_ref(name: str, xs: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    if name in ("BAND", "BOR", "BXOR"):
        out = xs[0].clone()
        for x in xs[1:]:
            out = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[name](out, x)
        return out
    st = torch.stack([x.double() for x in xs])
    out = {
        "SUM": lambda: st.sum(0), "PRODUCT": lambda: st.prod(0), "MIN": lambda: st.min(0).values,
        "MAX": lambda: st.max(0).values, "AVG": lambda: st.mean(0), "PREMUL_SUM": lambda: (st * 0.5).sum(0),
    }[name]()
    return out.to(dtype)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:
        tol = 1e-2 if a.dtype == torch.bfloat16 else 1e-6
        return torch.allclose(a.double(), b.double(), rtol=tol, atol=tol)
    return torch.equal(a, b)


def collective_matrix() -> dict[str, Any]:
    """Every collective × dtype × reduce op on the backend under test, against a local reference,
    issued synchronously and then asynchronously on one communicator (one job for both: rank
    processes of an MPI job each start a fresh interpreter)."""
    comm = torchcomms.new_comm(engine(), torch.device("cpu"), "matrix")
    out = {mode: _matrix(comm, async_op) for mode, async_op in (("sync", False), ("async", True))}
    comm.finalize()
    return out


def _matrix(comm: torchcomms.TorchComm, async_op: bool) -> dict[str, Any]:
    r, n = comm.get_rank(), comm.get_size()
    failures: list[str] = []
    count = 0
    salt = 0

    def check(label: str, got: torch.Tensor, want: torch.Tensor) -> None:
        nonlocal count
        count += 1
        if got.shape != want.shape or not close(got, want):
            failures.append(f"{label}: got {got.tolist()} want {want.tolist()}")

    def run(work: torchcomms.TorchWork) -> None:
        if async_op:
            assert work.wait() is True
        assert work.is_completed()

    for dname, dt in DTYPES.items():
        numel = 5
        for opname, op in ops_for(dt):
            salt += 1
            allin = [data(q, numel, dt, salt) for q in range(n)]
            lab = f"{dname}/{opname}"
            # all_reduce
            t = allin[r].clone()
            run(comm.all_reduce(t, op, async_op))
            check(f"all_reduce {lab}", t, reduce_ref(opname, allin, dt))
            # reduce
            for root in range(n):
                t = allin[r].clone()
                run(comm.reduce(t, root, op, async_op))
                if r == root:
                    check(f"reduce root={root} {lab}", t, reduce_ref(opname, allin, dt))
            # reduce_scatter (list), reduce_scatter_single, reduce_scatter_v
            ins = [[data(q, numel, dt, salt + 100 + k) for k in range(n)] for q in range(n)]
            out = torch.empty(numel, dtype=dt)
            run(comm.reduce_scatter(out, [x.clone() for x in ins[r]], op, async_op))
            check(f"reduce_scatter {lab}", out, reduce_ref(opname, [ins[q][r] for q in range(n)], dt))
            out = torch.empty(numel, dtype=dt)
            run(comm.reduce_scatter_single(out, torch.cat(ins[r]), op, async_op))
            check(f"reduce_scatter_single {lab}", out, reduce_ref(opname, [ins[q][r] for q in range(n)], dt))
            vs = [k + 1 for k in range(n)]
            vins = [[data(q, vs[k], dt, salt + 200 + k) for k in range(n)] for q in range(n)]
            out = torch.empty(vs[r], dtype=dt)
            run(comm.reduce_scatter_v(out, [x.clone() for x in vins[r]], op, async_op))
            check(f"reduce_scatter_v {lab}", out, reduce_ref(opname, [vins[q][r] for q in range(n)], dt))
        # non-reducing collectives, once per dtype
        salt += 1
        allin = [data(q, 4, dt, salt) for q in range(n)]
        for root in range(n):
            t = allin[r].clone()
            run(comm.broadcast(t, root, async_op))
            check(f"broadcast root={root} {dname}", t, allin[root])
        outs = [torch.empty(4, dtype=dt) for _ in range(n)]
        run(comm.all_gather(outs, allin[r], async_op))
        for q in range(n):
            check(f"all_gather[{q}] {dname}", outs[q], allin[q])
        out = torch.empty(4 * n, dtype=dt)
        run(comm.all_gather_single(out, allin[r], async_op))
        check(f"all_gather_single {dname}", out, torch.cat(allin))
        # the flat ops take any shapes of the right element counts (0-dim, dim 0 not world_size ×)
        out = torch.empty(n, dtype=dt)
        run(comm.all_gather_single(out, allin[r][0].clone(), async_op))
        check(f"all_gather_single 0-dim input {dname}", out, torch.stack([x[0] for x in allin]))
        out = torch.empty(2 * n, 2, dtype=dt)
        run(comm.all_gather_single(out, allin[r].view(2, 2).t().contiguous(), async_op))
        check(f"all_gather_single reshaped {dname}", out.view(-1),
              torch.cat([x.view(2, 2).t().reshape(-1) for x in allin]))
        out = torch.empty((), dtype=dt)
        run(comm.reduce_scatter_single(out, allin[r][:n].clone(), ReduceOp.SUM, async_op))  # n <= 4
        check(f"reduce_scatter_single 0-dim output {dname}", out, reduce_ref("SUM", [x[r] for x in allin], dt))
        out = torch.empty(2, 2, dtype=dt)
        run(comm.reduce_scatter_single(out, allin[r].repeat(n).view(2, 2 * n), ReduceOp.SUM, async_op))
        check(f"reduce_scatter_single reshaped {dname}", out, reduce_ref("SUM", allin, dt).view(2, 2))
        vin = [data(q, q + 2, dt, salt) for q in range(n)]
        outs = [torch.empty(q + 2, dtype=dt) for q in range(n)]
        run(comm.all_gather_v(outs, vin[r], async_op))
        for q in range(n):
            check(f"all_gather_v[{q}] {dname}", outs[q], vin[q])
        a2a = [data(q, 3 * n, dt, salt + 1) for q in range(n)]
        out = torch.empty(3 * n, dtype=dt)
        run(comm.all_to_all_single(out, a2a[r], async_op))
        check(f"all_to_all_single {dname}", out, torch.cat([a2a[q][3 * r : 3 * r + 3] for q in range(n)]))
        # all_to_all_v_single: rank q sends (q + k + 1) rows to rank k
        rows = lambda q, k: q + k + 1  # noqa: E731
        ins_v = [data(q, sum(rows(q, k) for k in range(n)) * 2, dt, salt + 2).view(-1, 2) for q in range(n)]
        insz = [rows(r, k) for k in range(n)]
        outsz = [rows(q, r) for q in range(n)]
        out = torch.empty(sum(outsz), 2, dtype=dt)
        run(comm.all_to_all_v_single(out, ins_v[r], outsz, insz, async_op))
        want = torch.cat([ins_v[q][sum(rows(q, k) for k in range(r)) : sum(rows(q, k) for k in range(r + 1))]
                          for q in range(n)])
        check(f"all_to_all_v_single {dname}", out, want)
        lists = [[data(q, 2, dt, salt + 10 * k) for k in range(n)] for q in range(n)]
        outs = [torch.empty(2, dtype=dt) for _ in range(n)]
        run(comm.all_to_all(outs, lists[r], async_op))
        for q in range(n):
            check(f"all_to_all[{q}] {dname}", outs[q], lists[q][r])
        # pieces of their own size per pair (rank q sends q + k + 1 rows to rank k)
        vlists = [[data(q, rows(q, k) * 2, dt, salt + 20 + k).view(-1, 2) for k in range(n)] for q in range(n)]
        outs = [torch.empty(rows(q, r), 2, dtype=dt) for q in range(n)]
        run(comm.all_to_all(outs, vlists[r], async_op))
        for q in range(n):
            check(f"all_to_all sized[{q}] {dname}", outs[q], vlists[q][r])
        for root in range(n):
            out = torch.empty(2, dtype=dt)
            run(comm.scatter(out, lists[root] if r == root else [], root, async_op))
            check(f"scatter root={root} {dname}", out, lists[root][r])
            outs = [torch.empty(4, dtype=dt) for _ in range(n)] if r == root else []
            run(comm.gather(outs, allin[r], root, async_op))
            if r == root:
                for q in range(n):
                    check(f"gather[{q}] root={root} {dname}", outs[q], allin[q])
            out = torch.empty(4 * n, dtype=dt)
            run(comm.gather_single(out, allin[r], root, async_op))
            if r == root:
                check(f"gather_single root={root} {dname}", out, torch.cat(allin))
        run(comm.barrier(async_op))
        # point to point: a ring
        if n > 1:
            nxt, prv = (r + 1) % n, (r - 1) % n
            got = torch.empty(4, dtype=dt)
            if r % 2 == 0:
                run(comm.send(allin[r], nxt, async_op))
                run(comm.recv(got, prv, async_op))
            else:
                run(comm.recv(got, prv, async_op))
                run(comm.send(allin[r], nxt, async_op))
            check(f"send/recv ring {dname}", got, allin[prv])
            batch = comm.batch_op_create()
            got = torch.empty(4, dtype=dt)
            batch.send(allin[r], nxt)
            batch.recv(got, prv)
            run(batch.issue(async_op))
            check(f"batch p2p ring {dname}", got, allin[prv])
    return {"failures": failures, "checks": count}


def split_behaviour() -> dict[str, Any]:
    """split into odd/even subgroups, a subgroup of rank 0 only, and non-members get None."""
    comm = torchcomms.new_comm(engine(), torch.device("cpu"), "parent")
    r, n = comm.get_rank(), comm.get_size()
    seen: list[tuple[str, int]] = []
    comm.register_pre_hook(lambda name, op_id, rec: seen.append((str(name), rec.seq)))
    evens = [q for q in range(n) if q % 2 == 0]
    odds = [q for q in range(n) if q % 2 == 1]
    mine = evens if r % 2 == 0 else odds
    sub = comm.split(mine, "half")
    assert sub is not None
    t = torch.tensor([float(r)])
    sub.all_reduce(t, ReduceOp.SUM, False)
    only0 = comm.split([0] if r == 0 else [], "only0")
    out = {
        "sub_rank": sub.get_rank(), "sub_size": sub.get_size(), "sub_sum": t.item(),
        "global_ranks": sub.get_global_ranks(), "only0_is_none": only0 is None,
    }
    if only0 is not None:
        t0 = torch.tensor([5.0])
        only0.all_reduce(t0, ReduceOp.SUM, False)
        out["only0_sum"] = t0.item()
        only0.finalize()
    # reversed order: new rank = index in the list
    rev = comm.split(list(reversed(range(n))), "reversed")
    out["rev_rank"] = rev.get_rank()
    t = torch.tensor([float(r)])
    rev.broadcast(t, 0, False)
    out["rev_root_value"] = t.item()
    # mismatch between members is detected
    try:
        bad = list(range(n)) if r != n - 1 else list(reversed(range(n)))
        comm.split(bad, "bad")
        out["mismatch"] = None
    except torchcomms.CollectiveMismatchError as e:
        out["mismatch"] = str(e)
    out["parent_seqs"] = [s for name, s in seen]
    out["parent_ops"] = [name for name, s in seen]
    if engine() == "gloo":  # the reference names the engine's type in torchcomms._comms_gloo
        from torchcomms._comms_gloo import TorchCommGloo

        out["impl_types"] = [isinstance(c.get_backend_impl(), TorchCommGloo) for c in (comm, sub, rev)]
    # arguments one rank refuses are refused on every rank, promptly (the others passed [], or a
    # valid list), and the parent goes on
    refusals = {"duplicates": [0, 0] if r == 0 else [], "out of range": [0, n] if r == 0 else [],
                "without self": [0] if r in (0, n - 1) else []}
    out["refused"] = {}
    for case, ranks in refusals.items():
        try:
            comm.split(ranks, f"refused-{case}", timeout=timedelta(seconds=30))
            out["refused"][case] = "returned"
        except torchcomms.CommError as e:
            out["refused"][case] = f"{type(e).__name__}: {e}"
    t = torch.ones(1)
    comm.all_reduce(t, ReduceOp.SUM, False)
    out["sum_after_refusals"] = t.item()
    sub.finalize()
    rev.finalize()
    comm.finalize()
    return out


def stalled_peer(op: str, timeout_s: float, victim: int) -> dict[str, Any]:
    """Everyone runs one warm-up all_reduce, then ``op``; the victim is stopped or killed by the
    test in between (it sleeps forever), the others report how their op ended."""
    start_together()
    comm = torchcomms.new_comm(engine(), torch.device("cpu"), "stall", timeout=timedelta(seconds=timeout_s))
    r = comm.get_rank()
    t = torch.ones(1024)
    comm.all_reduce(t, ReduceOp.SUM, False)
    marker = os.environ["TC_READY_DIR"] + f"/ready{r}"
    open(marker, "w").close()
    if r == victim:
        time.sleep(3600)
    # wait until the test has stopped the victim
    while not os.path.exists(os.environ["TC_READY_DIR"] + "/go"):
        time.sleep(0.01)
    t0 = time.monotonic()
    try:
        if op == "all_reduce":
            comm.all_reduce(t, ReduceOp.SUM, False)
        elif op == "barrier":
            comm.barrier(False)
        elif op == "all_gather_single":
            comm.all_gather_single(torch.empty(1024 * comm.get_size()), t, False)
        result: dict[str, Any] = {"raised": None}
    except torchcomms.CommError as e:
        result = {"raised": type(e).__name__, "message": str(e), "seq": e.seq, "op": e.op,
                  "is_comm_error": True}
    result["elapsed"] = time.monotonic() - t0
    # a broken communicator fails fast afterwards
    t1 = time.monotonic()
    try:
        comm.all_reduce(t, ReduceOp.SUM, False)
        result["after"] = None
    except torchcomms.CommError as e:
        result["after"] = type(e).__name__
    result["after_elapsed"] = time.monotonic() - t1
    return result


def sync_op_with_stopped_peer() -> dict[str, Any]:
    """Rank 1 idles (the test stops it); rank 0 runs a synchronous all_reduce with a long
    timeout and reports how and when it ended."""
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "sync-stop", timeout=timedelta(seconds=120))
    r = comm.get_rank()
    t = torch.ones(8)
    comm.all_reduce(t, ReduceOp.SUM, False)
    open(os.environ["TC_READY_DIR"] + f"/ready{r}", "w").close()
    if r == 1:
        time.sleep(3600)
    while not os.path.exists(os.environ["TC_READY_DIR"] + "/go"):
        time.sleep(0.01)
    t0 = time.monotonic()
    try:
        comm.all_reduce(t, ReduceOp.SUM, False)
        return {"raised": None}
    except torchcomms.CommError as e:
        return {"raised": type(e).__name__, "failed_ranks": getattr(e, "failed_ranks", None),
                "detected_by": getattr(e, "detected_by", None), "elapsed": time.monotonic() - t0}


def mismatched_calls(case: str) -> dict[str, Any]:
    """With the collective check on, one rank makes a call that does not fit the others';
    report what every rank raised, and how the communicator behaves afterwards."""
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), f"check-{case}", timeout=timedelta(seconds=60),
                               hints={"torchcomms.check_collectives": "1"})
    r, n = comm.get_rank(), comm.get_size()
    out: dict[str, Any] = {}
    try:
        comm.all_reduce(torch.ones(4), ReduceOp.SUM, False)  # seq 1 agrees everywhere
        if case == "shape":
            comm.all_reduce(torch.ones(8 if r == n - 1 else 16), ReduceOp.SUM, False)
        elif case == "dtype":
            comm.all_reduce(torch.ones(16, dtype=torch.float64 if r == 0 else torch.float32), ReduceOp.SUM, False)
        elif case == "op":
            if r == 1:
                comm.broadcast(torch.ones(16), 0, False)
            else:
                comm.all_reduce(torch.ones(16), ReduceOp.SUM, False)
        elif case == "root":
            comm.broadcast(torch.ones(16), 1 if r == 0 else 0, False)
        elif case == "skipped":
            if r != 0:
                comm.barrier(False)
            comm.all_reduce(torch.ones(16), ReduceOp.SUM, False)
        elif case == "splits":  # each rank's own splits fit its tensors, but rank n-1 expects 2 rows from rank 0
            expect = [2] + [1] * (n - 1) if r == n - 1 else [1] * n
            comm.all_to_all_v_single(torch.empty(sum(expect)), torch.ones(n), expect, [1] * n, False)
        elif case == "threads":
            # two threads share the communicator, each running the same all_reduces: every rank's
            # calls fit whichever thread took which sequence number. On rank 0 the op that took #2
            # waits in a pre-hook (at most 1 s) for #3 to pass its own, so that #3 reaches the check
            # first wherever nothing keeps the threads in sequence order
            import threading

            sums: list[list[float]] = []
            errors: list[str] = []
            third_passed = threading.Event()

            def hold_second(_name: object, _op_id: int, rec: Any) -> None:
                if rec.seq == 2:
                    third_passed.wait(1.0)
                elif rec.seq == 3:
                    third_passed.set()

            if r == 0:
                comm.register_pre_hook(hold_second)

            def run() -> None:
                try:
                    for _ in range(20):
                        t = torch.ones(4)
                        comm.all_reduce(t, ReduceOp.SUM, False)
                        sums.append(t.tolist())
                except torchcomms.CommError as e:
                    errors.append(f"{type(e).__name__}: {e}")

            threads = [threading.Thread(target=run) for _ in range(2)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            out.update(threads=sums, thread_errors=errors)
        elif case == "fits":
            # calls whose tensors legitimately differ per rank must pass the check
            t = torch.full((r + 1,), float(r))
            outs = [torch.empty(i + 1) for i in range(n)]
            comm.all_gather_v(outs, t, False)
            out["all_gather_v"] = [o.tolist() for o in outs]
            got = torch.empty(2)
            comm.scatter(got, [torch.full((2,), float(i)) for i in range(n)] if r == 0 else [], 0, False)
            out["scatter"] = got.tolist()
            gathered = [torch.empty(3) for _ in range(n)] if r == 1 else []
            comm.gather(gathered, torch.full((3,), float(r)), 1, False)
            out["gather"] = [g.tolist() for g in gathered]
            x = torch.full((4,), float(r + 1))
            comm.all_reduce(x, ReduceOp.SUM, False)
            out["all_reduce"] = x.tolist()
            a2a = torch.empty(sum(j + 1 for j in range(n)), 2)  # rank j sends j + 1 rows of 2 to every rank
            comm.all_to_all_v_single(a2a, torch.full(((r + 1) * n, 2), float(r)), [j + 1 for j in range(n)],
                                     [r + 1] * n, False)
            out["all_to_all_v_single"] = a2a[:, 0].tolist()
        out["raised"] = None
    except torchcomms.CommError as e:
        out.update(raised=type(e).__name__, message=str(e), ranks=e.ranks, seq=e.seq)
        try:
            comm.all_reduce(torch.ones(4), ReduceOp.SUM, False)
            out["after"] = None
        except torchcomms.CommError as e2:
            out["after"] = type(e2).__name__
    comm.finalize()
    return out


def sync_op_aborted_from_another_thread() -> dict[str, Any]:
    """Rank 1 never joins; rank 0 blocks in a synchronous all_reduce (waiting in the engine)
    and another thread aborts the communicator after 0.5 s."""
    import threading

    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "sync-abort", timeout=timedelta(seconds=120))
    r = comm.get_rank()
    comm.barrier(False)
    if r == 1:
        time.sleep(30)
        return {"raised": None}
    threading.Timer(0.5, comm.abort).start()
    t0 = time.monotonic()
    try:
        comm.all_reduce(torch.ones(8), ReduceOp.SUM, False)
        return {"raised": None}
    except torchcomms.CommError as e:
        return {"raised": type(e).__name__, "message": str(e), "elapsed": time.monotonic() - t0}


def split_with_member_stalled_before_its_engine(split_timeout_s: float) -> dict[str, Any]:
    """Both ranks exchange the split's member lists; rank 1 then stalls (in a post-hook of the
    split's exchange) before building the new communicator's engine. Rank 0 reports how its
    split ended: bounded by the split's own timeout, not the communicator's 60 s."""
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "split-stall", timeout=timedelta(seconds=60))
    r = comm.get_rank()
    comm.all_reduce(torch.ones(4), ReduceOp.SUM, False)
    if r == 1:
        comm.register_post_hook(lambda op_id, rec: time.sleep(3600) if str(rec.name) == "split" else None)
    t0 = time.monotonic()
    try:
        comm.split([0, 1], "child", timeout=timedelta(seconds=split_timeout_s))
        out: dict[str, Any] = {"raised": None}
    except Exception as e:  # noqa: BLE001 - report whatever it was
        out = {"raised": type(e).__name__, "is_comm_error": isinstance(e, torchcomms.CommError),
               "message": str(e)[:300], "op": getattr(e, "op", None)}
    out["elapsed"] = time.monotonic() - t0
    # the name is free again: a retry with the same name is not refused as a duplicate
    try:
        torchcomms.new_comm("fake", "cpu", "child", hints={"rank": "0", "size": "1"}).finalize()
        out["name_free"] = True
    except torchcomms.CommError:
        out["name_free"] = False
    return out


def op_outlasting_the_engine_timeout(late_s: float, after_shrink: bool) -> str:
    """Rank 1 enters an all_reduce ``late_s`` after rank 0: longer than the timeout the engine
    was built with, within the op's own. Either on a communicator whose timeout is shorter than
    the op's own, or on the communicator that a shrink with a short timeout built (nobody failed:
    the same two ranks). The op must complete: only its own deadline may end it."""
    base = late_s / 2 if not after_shrink else late_s + 30
    start_together()  # the 2 s timeout bounds the rendezvous too: not the ranks' start-up skew
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "outlast", timeout=timedelta(seconds=base))
    r = comm.get_rank()
    comm.all_reduce(torch.ones(4), ReduceOp.SUM, False)
    op_timeout = timedelta(seconds=late_s + 30)
    if after_shrink:
        comm = comm.shrink(timeout=timedelta(seconds=late_s / 2))
        op_timeout = None  # the communicator's own (late_s + 30)
    if r == 1:
        time.sleep(late_s)
    t = torch.tensor([float(r + 1)])
    try:
        comm.all_reduce(t, ReduceOp.SUM, False, timeout=op_timeout)
    except torchcomms.CommError as e:
        return f"{type(e).__name__}: {str(e)[:200]}"
    comm.finalize()
    return f"sum={t.item():g}"


def sync_ops_and_the_watchdog_table() -> dict[str, Any]:
    """Synchronous ops, each with whether it entered the watchdog's table and how long the call
    took (the caller's clock: an op is entered after its caller waited a whole slice, while the
    op's own record may say it completed sooner, when the thread that completed it was
    descheduled before waking the caller); then one that outlasts the first wait slice (rank 1
    joins 2 s late), sampled 1 s in."""
    import threading

    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "sync-table", timeout=timedelta(seconds=60))
    r = comm.get_rank()
    watchdog = comm._core.watchdog  # noqa: SLF001 - the table itself is what is asserted
    t = torch.ones(8)
    quick = []
    for _ in range(50):
        called = time.monotonic()
        w = comm.all_reduce(t, ReduceOp.SUM, False)
        quick.append((w.tracked, time.monotonic() - called))
    comm.barrier(False)
    if r == 1:
        time.sleep(2.0)
    seen: list[int] = []
    sampler = threading.Timer(1.0, lambda: seen.append(len(watchdog.inflight)))
    sampler.start()
    w = comm.all_reduce(t, ReduceOp.SUM, False)
    sampler.join()
    slow = {"tracked": w.tracked, "in_table_while_blocked": seen[0], "in_table_after": len(watchdog.inflight)}
    comm.barrier(False)
    comm.finalize()
    return {"quick": quick, "slow": slow, "sum": t[0].item()}


def finalize_during_a_sync_op_in_its_first_slice(peer_joins: bool) -> dict[str, Any]:
    """Rank 0: a thread's synchronous all_reduce (timeout 3 s) waits for rank 1 inside its first
    engine wait slice (lengthened to 5 s, so the op is there for sure, not yet in the watchdog's
    table), and the main thread calls finalize() 0.2 s into it. Rank 1 joins 1 s late, or never
    (it leaves after 12 s). finalize must wait for the op: it completes with the right sum, or
    ends at its deadline with CommTimeoutError; either way finalize returns after it."""
    import threading

    import torchcomms.core.dispatch as dispatch_module

    dispatch_module.ENGINE_WAIT_SLICE_S = 5.0
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "finalize-first-slice", timeout=timedelta(seconds=30))
    r = comm.get_rank()
    comm.barrier(False)
    t = torch.ones(8)
    if r == 1:
        if not peer_joins:
            time.sleep(12.0)
            return {"sum": None}
        time.sleep(1.0)
        comm.all_reduce(t, ReduceOp.SUM, False)
        comm.finalize()
        return {"sum": t[0].item()}
    started = threading.Event()
    comm.register_pre_hook(lambda name, op_id, rec: started.set() if str(name) == "all_reduce" else None)
    outcome: dict[str, Any] = {}

    def op() -> None:
        try:
            comm.all_reduce(t, ReduceOp.SUM, False, timeout=timedelta(seconds=3))
            outcome["op"] = "completed"
        except Exception as e:  # noqa: BLE001 - reported to the test
            outcome["op"] = type(e).__name__

    th = threading.Thread(target=op, daemon=True)
    th.start()
    started.wait(10)
    time.sleep(0.2)
    t0 = time.monotonic()
    done = threading.Event()
    threading.Thread(target=lambda: (comm.finalize(), done.set()), daemon=True).start()
    finalized = done.wait(10)
    th.join(10)
    return {"op": outcome.get("op"), "sum": t[0].item(), "finalize_returned": finalized,
            "finalize_s": round(time.monotonic() - t0, 1)}


def peer_failure_during_a_sync_op_in_its_first_slice() -> dict[str, Any]:
    """Rank 0: a synchronous all_reduce waits for rank 1 (which never joins) inside its first
    engine wait slice (lengthened to 2 s, so the op is surely there, not yet in the watchdog's
    table); 0.3 s in, another thread reports rank 1 failed. The op's record must say failed at
    once (0.6 s in, sampled), the caller raise PeerFailureError when its slice ends, and the
    watchdog's table be empty afterwards."""
    import threading

    import torchcomms.core.dispatch as dispatch_module

    dispatch_module.ENGINE_WAIT_SLICE_S = 2.0
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "break-first-slice", timeout=timedelta(seconds=30))
    r = comm.get_rank()
    comm.barrier(False)
    if r == 1:
        time.sleep(8.0)
        return {}
    records: list[Any] = []
    comm.register_pre_hook(lambda name, op_id, rec: records.append(rec) if str(name) == "all_reduce" else None)
    sampled: list[str] = []
    threading.Timer(0.3, lambda: comm.notify_peer_failure([1], "exited")).start()
    threading.Timer(0.6, lambda: sampled.append(records[0].state if records else "no record")).start()
    t0 = time.monotonic()
    try:
        comm.all_reduce(torch.ones(8), ReduceOp.SUM, False)
        raised = None
    except torchcomms.CommError as e:
        raised = type(e).__name__
    elapsed = time.monotonic() - t0
    time.sleep(0.5)  # the sampler has run
    return {"raised": raised, "state_at_0.6s": sampled[0] if sampled else None, "elapsed": elapsed,
            "in_table": len(comm._core.watchdog.inflight)}  # noqa: SLF001


def ops_on_shared_memory(rounds: int = 15) -> dict[str, int]:
    """Ops on one tensor issued back to back, the earlier ones asynchronous and not waited for:
    each must see the result of the one before it, as on a device stream. Per case, the rounds
    whose result was wrong (gloo ran the two all-reduces together and summed a half-reduced
    tensor in most rounds; MPI in every one)."""
    comm = torchcomms.new_comm(engine(), torch.device("cpu"), "shared", timeout=timedelta(seconds=60))
    n, r = comm.get_size(), comm.get_rank()
    total = float(n * (n + 1) // 2)
    wrong = {"all_reduce twice": 0, "a slice, then the whole": 0, "all_reduce, then a sync broadcast": 0}
    numel = 1 << 16
    for _ in range(rounds):
        t = torch.ones(numel)
        first, second = comm.all_reduce(t, ReduceOp.SUM, True), comm.all_reduce(t, ReduceOp.SUM, True)
        first.wait()
        second.wait()
        wrong["all_reduce twice"] += not bool(torch.all(t == n * n))
        t = torch.ones(numel)
        first = comm.all_reduce(t[: numel // 2], ReduceOp.SUM, True)
        second = comm.all_reduce(t, ReduceOp.SUM, True)
        second.wait()
        first.wait()
        wrong["a slice, then the whole"] += not (bool(torch.all(t[: numel // 2] == n * n))
                                                 and bool(torch.all(t[numel // 2:] == n)))
        t = torch.full((numel,), float(r + 1))
        first = comm.all_reduce(t, ReduceOp.SUM, True)
        comm.broadcast(t, 0, False)
        first.wait()
        wrong["all_reduce, then a sync broadcast"] += not bool(torch.all(t == total))
    comm.finalize()
    return wrong


def waits_for_an_earlier_op_within_its_own_deadline() -> dict[str, Any]:
    """Rank 0 issues an all-reduce that rank 1 does not join, then a second all-reduce of the
    same tensor with a 1 s timeout: the second waits for the first, and ends at its own deadline
    saying what it waited for. Rank 1 only keeps its communicator until rank 0 is done."""
    from tests.helpers.rank_sync import reach

    comm = torchcomms.new_comm(engine(), torch.device("cpu"), "blocked", timeout=timedelta(seconds=60))
    out: dict[str, Any] = {}
    if comm.get_rank() == 0:
        t = torch.ones(8)
        first = comm.all_reduce(t, ReduceOp.SUM, True)
        try:
            comm.all_reduce(t, ReduceOp.SUM, False, timeout=timedelta(seconds=1))
        except torchcomms.CommError as e:
            out = {"error": type(e).__name__, "message": str(e)}
        try:  # the timeout broke the communicator, which ends the first op too
            first.wait()
        except torchcomms.CommError as e:
            out["first"] = type(e).__name__
    reach("done")
    comm.abort()
    return out
