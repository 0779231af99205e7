"""Elastic FSDP against torchrun's restart of the same job (examples/train_elastic_fsdp.py).

Both runs train the small Llama of kernels.model (``--dim/--layers/--vocab``: 512/9/32000 is
51.8 M parameters) on CPU, 2 replicas x 2 shards, and SIGKILL rank ``--victim`` at the start of
step ``--fail-step`` (the example's ``--fail-at forward``):

- ours: ``torchcomms-run --on-failure shrink --max-restarts 1``: the surviving replica keeps
  its gradients and computes the lost replica's samples of the step too (``--redo``: redoes the
  whole step instead), the launcher restarts the lost replica, which heals in;
- anchor: ``torchrun --max-restarts 1`` on the example's ``--plain`` mode (the same model and
  data, HSDP on one communicator): every worker is started again and training resumes at step 0
  (no checkpoint: the restart's cost alone).

Printed: the survivors' stall (kill -> their next completed step) for both and the ratio, and
the part of it they were stopped (not computing samples: for ours, the stall less the passes
after the kill; for torchrun, kill -> its restarted workers begin their first step); the
normal step time; the heal (the replacement's processes started -> first completed step with
them) and its parts as the healed rank measured them (waiting for admission, re-forming the
communicators, receiving the state: the state sent once over the same engine), with the load.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_elastic_fsdp.py"


def run(cmd: list[str], limit_s: float, log: Path) -> tuple[int | None, str]:
    """Run ``cmd``, its output going to ``log`` as it comes; returns its exit code (None: killed
    at the limit) and the output."""
    env = dict(os.environ, TORCHCOMM_TRACING_DISABLE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            rc = None
    return rc, log.read_text(errors="replace")


def lines(prefix: Path, world: int) -> dict[int, list[dict]]:
    return {r: [json.loads(x) for x in Path(f"{prefix}.{r}").read_text().splitlines()]
            for r in range(world) if Path(f"{prefix}.{r}").exists()}


def measure(recs: dict[int, list[dict]], victim: int, shard: int, fail_step: int, heal: bool = True) -> dict:
    """Times from one run's records (each rank's JSON lines: start, steps, the kill, the heal)."""
    killed = next(d["killed"] for d in recs[victim] if "killed" in d)
    survivor = next(r for r in recs if r // shard != victim // shard)
    steps = [d for d in recs[survivor] if "step" in d]
    before = [d["time"] for d in steps if d["step"] < fail_step and d.get("attempt", 0) == 0]
    # the next completed step: the redone step (ours), or the restarted job's first (torchrun)
    after = next(d for d in steps if d["time"] > killed and (d.get("attempt", 0) > 0 or d["step"] >= fail_step))
    # the survivors' stop: the part of kill -> next completed step they spent not computing
    # samples (their passes after the kill are work a job of fewer replicas does too; torchrun's
    # restarted job computes its first step again from the start)
    computing = sum(max(0.0, b - max(a, killed)) for a, b in after.get("passes", []))
    out = {"stall_s": after["time"] - killed, "stopped_s": after["time"] - killed - computing,
           "recovery_s": after.get("recovery_s"),
           "step_s": statistics.median(b - a for a, b in zip(before, before[1:])) if len(before) > 1 else None}
    lost = [r for r in recs if r // shard == victim // shard]
    starts = [d for r in lost for d in recs[r] if "start" in d and d["incarnation"] > 1]
    if heal and len(starts) == len(lost):  # the replacement processes: started -> first step with them
        healed_at = min(d["at_step"] for d in starts)
        first = min(d["time"] for r in lost for d in recs[r] if "step" in d and d["step"] >= healed_at)
        out["replacements_started_after_kill_s"] = max(d["start"] for d in starts) - killed
        out["heal_s"] = first - max(d["start"] for d in starts)
        parts = [d["heal"] for d in starts if d["heal"]]
        if parts and all("joined" in d for d in starts):
            out["heal_parts"] = parts
            # admitted (re-forming begins) -> the first step with the healed replica completed
            out["admitted_to_first_step_s"] = max(
                first - d["joined"] + d["heal"]["reform_s"] + d["heal"]["state_s"] for d in starts)
            out["state_send_s"] = max(d["heal"]["state_s"] for d in starts)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=9)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--fail-step", type=int, default=3)
    ap.add_argument("--victim", type=int, default=3)
    ap.add_argument("--limit-s", type=float, default=1800)
    ap.add_argument("--no-torchrun", action="store_true")
    ap.add_argument("--redo", action="store_true", help="ours redoes the failed step (ElasticHSDP.train_step)")
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="elastic-bench-"))
    model = ["--dim", str(args.dim), "--layers", str(args.layers), "--vocab", str(args.vocab), "--seq", str(args.seq),
             "--batch", str(args.batch), "--shard", "2", "--fail-rank", str(args.victim),
             "--fail-step", str(args.fail_step), "--fail-at", "forward", "--timeout", "300", "--no-hash"]
    redo = ["--redo"] if args.redo else []
    load0 = os.getloadavg()
    t0 = time.time()
    rc, log = run([sys.executable, "-m", "launcher", "--nproc-per-node", "4", "--on-failure", "shrink",
                   "--max-restarts", "1", "--no-summary", str(EXAMPLE), *model, "--steps", "100000",
                   "--stop-after-heal", "2", "--record", str(d / "ours"), *redo], args.limit_s, d / "ours.log")
    ours = measure(lines(d / "ours", 4), args.victim, 2, args.fail_step) if rc == 0 else {"error": log[-3000:]}
    t1 = time.time()
    anchor: dict = {}
    if not args.no_torchrun:
        rc2, log2 = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                         "--max-restarts", "1", str(EXAMPLE), "--plain", *model, "--steps", str(args.fail_step + 2),
                         "--record", str(d / "torchrun")], args.limit_s, d / "torchrun.log")
        anchor = measure(lines(d / "torchrun", 4), args.victim, 2, args.fail_step, heal=False) if rc2 == 0 \
            else {"error": log2[-3000:]}
    load1 = os.getloadavg()
    from kernels.model import Llama, LlamaConfig

    n = Llama(LlamaConfig.tiny(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=4, n_kv_heads=2,
                               ffn_dim=4 * args.dim)).num_params()
    result = {"params_M": n / 1e6, "ours": ours, "torchrun": anchor, "load_before": load0, "load_after": load1,
              "ours_wall_s": t1 - t0, "anchor_wall_s": time.time() - t1}
    if "stall_s" in ours and "stall_s" in anchor:
        result["stall_ratio"] = ours["stall_s"] / anchor["stall_s"]
        result["stopped_ratio"] = ours["stopped_s"] / anchor["stopped_s"]
    if "admitted_to_first_step_s" in ours and ours.get("step_s"):
        # the goal's reading: heal (admitted -> first step with it, less that step's own compute)
        # against sending the state once over the same engine
        result["heal_over_state_send"] = (ours["admitted_to_first_step_s"] - ours["step_s"]) / ours["state_send_s"]
    result["logs"] = str(d)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
