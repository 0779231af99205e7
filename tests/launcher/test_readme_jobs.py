"""The README's jobs, run as a user runs them (``python -m launcher``, which is ``torchcomms-run``)
with fewer steps: the main job (``examples/train_ddp.py``) and the shrink example
(``examples/elastic_train.py`` losing a rank), judged by what they print."""

from __future__ import annotations

import os
import re

from conftest import REPO, base_env

from tests.helpers.launcher_job import run_launcher_job

#: the commands as README.md writes them (after ``torchcomms-run``)
MAIN_JOB = ["--nproc-per-node", "2", "examples/train_ddp.py", "--steps", "40"]
SHRINK_JOB = ["--nproc-per-node", "4", "--on-failure", "shrink", "examples/elastic_train.py",
              "--steps", "60", "--fail-rank", "2", "--fail-step", "20"]
#: a job that has not ended by then is killed, and its processes' stacks are in the failure
LIMIT_S = 120
HOST = os.uname().nodename


def readme_commands() -> str:
    """README.md with its shell line continuations joined and its whitespace collapsed."""
    return " ".join((REPO / "README.md").read_text().replace("\\\n", " ").split())


def with_values(args: list[str], **values: int) -> list[str]:
    """``args`` with the value after each ``--flag`` of ``values`` (``fail_step``: ``--fail-step``) replaced."""
    out = list(args)
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        out[out.index(flag) + 1] = str(value)
    return out


def rank_lines(output: str, rank: int) -> list[str]:
    """What the worker of job rank ``rank`` printed, without the launcher's ``[host:rank] `` prefix."""
    prefix = f"[{HOST}:{rank}] "
    return [ln[len(prefix):] for ln in output.splitlines() if ln.startswith(prefix)]


def summary_table(output: str) -> dict[int, str]:
    """The launcher's summary table: each worker's rank and its result (``exit 0``, ``SIGKILL  <- root cause``)."""
    lines = output.splitlines()
    header = [i for i, ln in enumerate(lines) if ln.split() == ["rank", "host", "local", "pid", "result", "duration"]]
    assert len(header) == 1, f"no summary table:\n{output}"
    start = header[0]
    rows: dict[int, str] = {}
    for ln in lines[start + 2:]:
        m = re.fullmatch(r"(\d+)\s+(\S+)\s+\d+\s+\d+\s+(.+?)\s+[\d.]+s", ln)
        if m is None:
            break
        assert m.group(2) == HOST, ln
        rows[int(m.group(1))] = " ".join(m.group(3).split())
    return rows


def test_main_job_trains_and_prints_the_summary():
    assert "torchcomms-run " + " ".join(MAIN_JOB) in readme_commands()
    steps = 12
    rc, out = run_launcher_job(with_values(MAIN_JOB, steps=steps), base_env(), LIMIT_S)
    assert rc == 0, out
    # rank 0 prints every 5th step and the last one, then the first and last loss; rank 1 no loss
    said = [ln for ln in rank_lines(out, 0) if ln.startswith(("step ", "loss "))]
    logged = [re.fullmatch(r"step +(\d+)  loss (\d+\.\d+)  \(world 2\)", ln) for ln in said[:-1]]
    assert said and all(logged), out
    assert [int(m.group(1)) for m in logged] == [0, 5, 10, steps - 1], out
    losses = [float(m.group(2)) for m in logged]
    assert losses[-1] < losses[0] / 2, out
    m = re.match(rf"loss (\d+\.\d+) -> (\d+\.\d+) in {steps} steps, ", said[-1])
    assert m and (float(m.group(1)), float(m.group(2))) == (losses[0], losses[-1]), out
    assert not any("loss" in ln for ln in rank_lines(out, 1)), out
    assert "finished with exit code 0" in out
    assert summary_table(out) == {0: "exit 0", 1: "exit 0"}, out


def test_shrink_example_survives_a_failed_rank():
    assert "torchcomms-run " + " ".join(SHRINK_JOB) in readme_commands()
    steps, fail_step = 25, 10
    args = with_values(SHRINK_JOB, nproc_per_node=3, steps=steps, fail_step=fail_step)
    rc, out = run_launcher_job(args, base_env(), LIMIT_S)
    # --on-failure shrink: a failure while other workers ran is tolerated, and the survivors
    # finished with exit 0, so the job exits 0 (README, "Failure policy")
    assert rc == 0, out
    assert f"[job rank 2] failing now (SIGKILL) at step {fail_step}" in rank_lines(out, 2), out
    # rank 0's own lines (its structured log events, JSON on stderr, are left out): the step's
    # failure, the shrink to the survivors, and the steps to the last one in a world of 2, the
    # failed step redone
    said = [ln for ln in rank_lines(out, 0) if ln.startswith(("step ", "[step "))]
    assert [ln.split("]")[0] if ln.startswith("[") else " ".join(ln.split()[:2]) for ln in said] == \
        ["step 0", f"[step {fail_step}", f"[step {fail_step}", f"step {fail_step}", "step 20", f"step {steps - 1}"], out
    # the op in flight when rank 2 died fails (PeerFailureError), or the next one is refused, the
    # failure having been published before rank 0 issued it (CommAbortedError); which rank failed
    # is in the error when the control plane named it in time (within a second), and in the shrink
    assert re.match(rf"\[step {fail_step}\] (PeerFailureError|CommAbortedError): ", said[1]), out
    assert re.fullmatch(rf"\[step {fail_step}\] membership \[0, 1, 2\] -> \[0, 1\] \(world 3 -> 2\), "
                        r"shrink took \d+\.\d ms; redoing the step", said[2]), out
    logged = [re.fullmatch(r"step +\d+  loss \d+\.\d+  world (\d)", ln) for ln in said[:1] + said[3:]]
    assert all(logged) and [int(m.group(1)) for m in logged] == [3, 2, 2, 2], out
    assert "rank 2 failed; survivors keep running (--on-failure shrink)" in out
    assert "finished with exit code 0" in out
    assert summary_table(out) == {0: "exit 0", 1: "exit 0", 2: "SIGKILL <- root cause"}, out
