"""Small dump sets that exercise every branch of the analysis (hangs, mismatches of each kind,
failures, stuck ops, evicted history, duplicate numbers, point-to-point gaps and size
mismatches, PyTorch and JSON dumps), written deterministically. ``analyze_reference.json``
holds the reports of these sets as the Op-by-Op analysis gave them; the columnar analysis must
give the same."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO, child_pythonpath
from tests.tracing._support import Rec, write_job

T0 = 1_790_000_000_000_000_000
REFERENCE = Path(__file__).parent / "data" / "analyze_reference.json"


def _gen(out: Path, *args: str) -> Path:
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "trace_dumps_gen.py"), str(out), "--procs", "1", *args],
                   check=True, env={"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin"}, capture_output=True)
    return out


def _rec(comm: str, ranks: tuple[int, ...], rank: int, name: str, seq: int, t: int, **kw: object) -> Rec:
    return Rec(comm, ranks, rank, name, seq, t0=T0 + t * 1_000_000 + rank * 1_000, **kw)  # type: ignore[arg-type]


def _mixed(out: Path) -> Path:
    """Four ranks on ``dp`` and pairs on ``pp``: every finding kind at least once."""
    dp = (0, 1, 2, 3)
    per_rank: dict[int, list[Rec]] = {}
    for r in dp:
        recs = [_rec("dp", dp, r, "all_reduce", s, s).complete(1_000_000 + s * 1000 + r) for s in range(1, 4)]
        failed = _rec("dp", dp, r, "all_reduce", 4, 4).start()
        if r == 1:
            failed.state, failed.error = "failed", "NCCL error: unhandled system error"
        recs.append(failed if r == 1 else failed.complete())
        recs.append(_rec("dp", dp, r, "all_reduce", 5, 5, dtype="bfloat16" if r == 2 else "float32").complete())
        recs.append(_rec("dp", dp, r, "broadcast", 6, 6, root=1 if r == 3 else 0).complete())
        recs.append(_rec("dp", dp, r, "all_gather" if r == 0 else "all_reduce", 7, 7).complete())
        recs.append(_rec("dp", dp, r, "reduce_scatter", 8, 8, sizes=[[64], [64]] if r else [[64]]).complete(0))
        recs.append(_rec("dp", dp, r, "barrier", 9, 9, sizes=[]).complete())
        timed = _rec("dp", dp, r, "all_reduce", 10, 10).start()
        if r == 0:
            timed.state = "timed_out"
        recs.append(timed)
        recs.append(_rec("dp", dp, r, "all_reduce", 11, 11).start())  # every rank in, none done
        if r != 2:
            recs.append(_rec("dp", dp, r, "all_reduce", 12, 12).start())
        if r == 0:
            recs.append(_rec("dp", dp, r, "all_reduce", 12, 12).complete())  # a second #12 on rank 0
        per_rank[r] = recs
    pp = (0, 1, 2, 3)
    for r in pp:
        peer = r ^ 1
        name = "send" if r % 2 == 0 else "recv"
        n = 3 if r != 3 else 2  # rank 3 posts one recv fewer
        for i in range(n):
            sizes = [[128]] if not (r == 1 and i == 1) else [[256]]
            per_rank[r].append(_rec("pp", pp, r, name, i + 1, 20 + i, is_p2p=True, peer=peer, sizes=sizes).complete())
    ev = (0, 1)
    for r in ev:  # rank 0 kept more history than rank 1 (evicted, not missing)
        for s in range(1 if r == 0 else 4, 7):
            per_rank[r].append(_rec("ev", ev, r, "all_gather", s, 30 + s).complete(500_000 * (1 + r)))
    write_job(out, per_rank)
    return out


def _pytorch_and_json(out: Path) -> Path:
    """The mixed job's dumps without the torchcomms section (PyTorch's), half as JSON."""
    src = _mixed(out.parent / (out.name + "_src"))
    out.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.iterdir()):
        d = pickle.loads(p.read_bytes())
        rank = d["torchcomms"]["rank"]
        del d["torchcomms"]
        if rank % 2:
            (out / p.name).write_text(json.dumps(d))
        else:
            (out / p.name).write_bytes(pickle.dumps(d, protocol=4))
    return out


def _scheduled_only(out: Path) -> Path:
    """PyTorch gloo-like dumps whose entries never left 'scheduled'."""
    ranks = (0, 1, 2)
    write_job(out, {r: [_rec("g", ranks, r, "all_reduce", s, s) for s in range(1, 5)] for r in ranks})
    for p in sorted(out.iterdir()):
        d = pickle.loads(p.read_bytes())
        del d["torchcomms"]
        p.write_bytes(pickle.dumps(d, protocol=4))
    return out


def build(root: Path) -> dict[str, Path]:
    """Every set, by name, under ``root``."""
    return {
        "gen80": _gen(root / "gen80", "--ranks", "80", "--entries", "64", "--mismatch-seq", "10"),
        "gen16": _gen(root / "gen16", "--ranks", "16", "--entries", "300", "--node-size", "4",
                      "--late-rank", "2", "--mismatch-rank", "9", "--mismatch-seq", "7"),
        "mixed": _mixed(root / "mixed"),
        "pytorch_json": _pytorch_and_json(root / "pytorch_json"),
        "scheduled": _scheduled_only(root / "scheduled"),
    }


def report_of(path: Path, top: int = 10) -> dict[str, object]:
    """The report as ``analyze --json`` prints it (parsed back)."""
    from torchcomms.tracing.viewer.analyze import analyze
    from torchcomms.tracing.viewer.load import load_dumps

    text = json.dumps(analyze(load_dumps([path]), top=top).as_dict(), default=str)
    return json.loads(text.replace(str(REPO), "<repo>"))  # call sites name this checkout's files


if __name__ == "__main__":  # write the reference: python3 -m tests.tracing._varied_jobs DIR
    sets = build(Path(sys.argv[1]))
    REFERENCE.write_text(json.dumps({name: report_of(p, top=3 if name == "gen80" else 10) for name, p in sets.items()},
                                    indent=1, sort_keys=True) + "\n")
    print(f"wrote {REFERENCE}")
