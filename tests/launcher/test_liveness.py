"""Liveness that tells slow from dead: real ranks under a real agent.

A rank is hung only when it is alive, not stopped, its heartbeats silent AND its process
uses no CPU; a stopped (SIGSTOP) rank is reported as stopped, not killed; a rank that holds
the GIL for seconds in a C call, or is starved of CPU, is never killed. The judge's own
logic is checked on a scripted clock at the end.
"""
from __future__ import annotations

import json
import os
import signal

import pytest
from conftest import base_env, pid_alive, read_pids, run_launcher, wait_for, worker

from launcher.liveness import LivenessJudge, ProcSample
from tests.helpers.cpu_load import oversubscribed


def _run(tmp_path, behaviour: str, *flags: str, timeout: float = 120, **env: str):
    e = base_env(PID_DIR=str(tmp_path), BEHAVIOUR=behaviour, **env)
    return run_launcher("--nproc-per-node", "2", "--grace-period", "2", *flags,
                        worker("liveness.py"), env=e, timeout=timeout)


def test_gil_held_sleeping_in_c_for_5s_is_not_killed(tmp_path):
    """Heartbeats silent 5 s, no CPU used: shorter than the default hung timeout."""
    proc = _run(tmp_path, "gil_sleep")
    assert proc.returncode == 0, proc.stderr
    assert float((tmp_path / "1.held").read_text()) >= 4.9
    assert "is hung" not in proc.stderr and not (tmp_path / "1.usr1").exists()


def test_gil_held_busy_in_c_for_5s_is_not_killed_even_past_the_hung_timeout(tmp_path):
    """Heartbeats silent for 5 s (more than --hung-timeout 2), but the process burns CPU:
    it makes progress, so it is slow, not hung. Before the agent judged CPU progress, the
    server's 2 s heartbeat silence alone made the agent SIGKILL such a rank."""
    proc = _run(tmp_path, "gil_busy", "--hung-timeout", "2")
    assert proc.returncode == 0, proc.stderr
    assert float((tmp_path / "1.held").read_text()) >= 5.0
    assert "is hung" not in proc.stderr and not (tmp_path / "1.usr1").exists()


def test_gil_holder_survives_an_oversubscribed_cpu(tmp_path):
    with oversubscribed(per_core=8, limit_s=150):
        proc = _run(tmp_path, "gil_busy", "--hung-timeout", "2", timeout=150)
    assert proc.returncode == 0, proc.stderr
    assert "is hung" not in proc.stderr


def test_really_hung_rank_is_still_detected(tmp_path):
    """Alive, asleep in a C call holding the GIL forever: its heartbeat thread is blocked and
    its CPU time stands still, so it is hung: dumped (SIGUSR1), then SIGKILLed."""
    proc = _run(tmp_path, "hang", "--hung-timeout", "3")
    assert "rank 1 on" in proc.stderr and "is hung (no heartbeat for" in proc.stderr, proc.stderr
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    assert "SIGKILL  <- root cause" in proc.stderr


def test_really_hung_rank_is_detected_under_an_oversubscribed_cpu(tmp_path):
    with oversubscribed(per_core=8, limit_s=150):
        proc = _run(tmp_path, "hang", "--hung-timeout", "3", timeout=150)
    assert "is hung (no heartbeat for" in proc.stderr, proc.stderr
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr


def test_stopped_rank_is_reported_as_stopped_not_killed(tmp_path):
    """SIGSTOP: reported once as ``rank_failed`` with reason ``stopped`` (the survivors go
    on, --on-failure shrink), never as hung, and left alive (stopped) for the policy."""
    e = base_env(PID_DIR=str(tmp_path), BEHAVIOUR="stop", WAIT_FOR_FAILURE="1")
    import subprocess

    from conftest import launcher_cmd
    from conftest import REPO

    agent = subprocess.Popen(launcher_cmd("--nproc-per-node", "2", "--on-failure", "shrink",
                                          "--grace-period", "2", worker("liveness.py")),
                             env=e, cwd=REPO, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    try:
        pids = read_pids(tmp_path, 2)
        assert wait_for(lambda: (tmp_path / "0.done").exists(), timeout=60)
        events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert [(ev["rank"], ev["reason"]) for ev in events] == [(1, "stopped")], events
        assert pid_alive(pids[1]) and not (tmp_path / "1.usr1").exists()  # not killed
        os.kill(pids[1], signal.SIGKILL)
        _, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.communicate()
    assert "rank 1 (pid" in err and "is stopped" in err, err
    assert "is hung" not in err, err


@pytest.mark.parametrize("flags,message", [
    (("--start-method", "fork"), "--start-method fork applies to function entry points"),
    (("--rdzv-backend", "static", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1",
      "--rdzv-id", "x"), "--rdzv-backend static needs --node-rank"),
    (("--rdzv-backend", "static", "--nnodes", "1:2", "--node-rank", "0", "--rdzv-endpoint",
      "127.0.0.1:1", "--rdzv-id", "x"), "--rdzv-backend static needs a fixed --nnodes"),
    (("--hung-timeout", "0"), "--hung-timeout must be"),
])
def test_flags_that_would_be_ignored_are_refused(flags, message):
    from launcher.args import parse_args
    from launcher.exceptions import UsageError

    with pytest.raises(UsageError, match=message):
        parse_args([*flags, "x.py"], {})


# ---------------------------------------------------------------------- the judge's logic

class _Proc:
    def __init__(self) -> None:
        self.now, self.state, self.cpu = 0.0, "S", 0.0

    def sample(self, pid: int) -> ProcSample:
        return ProcSample(self.state, self.cpu)

    def advance(self, judge: LivenessJudge, seconds: float, cpu_share: float = 0.0) -> list:
        verdicts = []
        for _ in range(int(seconds * 10)):
            self.now += 0.1
            self.cpu += 0.1 * cpu_share
            verdicts += judge.check()
        return verdicts


def _judge(p: _Proc, **kw) -> LivenessJudge:
    judge = LivenessJudge(sample=p.sample, clock=lambda: p.now, **kw)
    judge.watch(1, pid=100)
    return judge


def test_judge_silent_but_busy_is_never_hung():
    p = _Proc()
    judge = _judge(p, hung_after=3.0)
    judge.silent(1, 1.0, pid=100)
    assert p.advance(judge, 60, cpu_share=0.05) == []  # a starved share of one core


def test_judge_silent_and_starved_is_never_hung():
    """Runnable but given almost no CPU (a box at load 50): waiting for a CPU is not hung.
    Before the runnable state counted, a starved busy rank got under the CPU floor and was
    killed (seen with a 5 s GIL-holding C loop at load 52)."""
    p = _Proc()
    judge = _judge(p, hung_after=3.0)
    judge.silent(1, 1.0, pid=100)
    p.state = "R"
    assert p.advance(judge, 60, cpu_share=0.001) == []


def test_judge_silent_and_idle_is_hung_once():
    p = _Proc()
    judge = _judge(p, hung_after=3.0)
    judge.silent(1, 1.0, pid=100)
    verdicts = p.advance(judge, 10, cpu_share=0.001)
    assert [(v.rank, v.kind) for v in verdicts] == [(1, "hung")]
    assert verdicts[0].quiet_s >= 3.0


def test_judge_heard_again_clears_the_suspicion():
    p = _Proc()
    judge = _judge(p, hung_after=3.0)
    judge.silent(1, 1.0, pid=100)
    p.advance(judge, 1.5)
    judge.heard(1, pid=100)
    assert p.advance(judge, 10) == []


def test_judge_stopped_is_reported_after_its_limit_and_is_not_hung():
    p = _Proc()
    judge = _judge(p, hung_after=3.0, stopped_after=2.0)
    judge.silent(1, 1.0, pid=100)
    p.state = "T"
    verdicts = p.advance(judge, 10)
    assert [(v.rank, v.kind) for v in verdicts] == [(1, "stopped")]
    assert 2.0 <= verdicts[0].quiet_s < 2.2


def test_judge_ignores_a_predecessors_silence():
    p = _Proc()
    judge = _judge(p, hung_after=3.0)
    judge.silent(1, 1.0, pid=99)  # the rank's previous process
    assert p.advance(judge, 10) == []
