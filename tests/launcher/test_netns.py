"""Multi-node jobs with network namespaces as hosts (root + ip netns; skipped otherwise).

Each namespace has its own network stack, so the rendezvous port is the same fixed one in
every test without clashing with anything outside.
"""

from __future__ import annotations

import time

import pytest

from conftest import NetHost, base_env, launcher_cmd, pid_alive, read_pids, wait_for, worker

pytestmark = pytest.mark.netns

PORT = 29400  # inside private namespaces: nothing else listens there


def _agent(host: NetHost, first: NetHost, secret_file, *extra: str, node_rank: int, nnodes: str = "2",
           nproc: int = 2, env=None, script: str = "ticker.py"):
    # the node rank is pinned: by order of arrival a loaded machine sometimes let the second
    # agent join first, and the tests' expectations about "node 1" then named the other node
    argv = launcher_cmd("--nnodes", nnodes, "--nproc-per-node", str(nproc), "--node-rank", str(node_rank),
                        "--rdzv-endpoint", f"{first.ip}:{PORT}", "--rdzv-id", "nsjob",
                        "--job-secret-file", str(secret_file), *extra, worker(script))
    return host.popen(argv, env=env or base_env())


def _finish(proc, timeout=120) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


@pytest.mark.slow
def test_two_nodes_two_workers_all_reduce(netns_hosts, secret_file):
    h0, h1 = netns_hosts
    # node names do not resolve inside namespaces; and this test is not about hang detection,
    # so a starved CI box must not get a rank declared hung by its heartbeats
    env = base_env(GLOO_SOCKET_IFNAME="eth0", TORCHCOMM_HEARTBEAT_LIMIT_S="60")
    # torch.distributed (rank 0's TCPStore at MASTER_ADDR/PORT) and torchcomms.new_comm
    # (the agent's control plane, reached across the bridge) in the same workers
    a = _agent(h0, h0, secret_file, node_rank=0, env=env, script="two_stacks.py")
    b = _agent(h1, h0, secret_file, node_rank=1, env=env, script="two_stacks.py")
    out_a, out_b = _finish(a, 300), _finish(b, 300)
    assert (a.returncode, b.returncode) == (0, 0), out_a + out_b
    for rank, (host, out) in enumerate([("node0", out_a)] * 2 + [("node1", out_b)] * 2):
        assert (f"[{host}:{rank}] both stacks ok rank={rank} local_rank={rank % 2} world=4 "
                "sum=10/10") in out, out
    assert "this is node 1 (ranks 2-3)" in out_b


def test_node_rank_holds_whatever_the_order_of_arrival(netns_hosts, secret_file):
    # node 1 joins first (it waits for the rendezvous host); --node-rank still decides
    h0, h1 = netns_hosts
    env = base_env(DURATION="0")
    b = _agent(h1, h0, secret_file, node_rank=1, env=env)
    time.sleep(1.0)
    a = _agent(h0, h0, secret_file, node_rank=0, env=env)
    out_a, out_b = _finish(a), _finish(b)
    assert (a.returncode, b.returncode) == (0, 0), out_a + out_b
    assert "this is node 0 (ranks 0-1)" in out_a and "this is node 1 (ranks 2-3)" in out_b, out_a + out_b


@pytest.mark.parametrize("netns_hosts", [3], indirect=True)
def test_min_max_starts_with_min_after_last_call(netns_hosts, secret_file):
    h0, h1, _absent = netns_hosts  # the third node never arrives
    conf = ("--rdzv-conf", "last_call_timeout=1,join_timeout=60")
    env = base_env(DURATION="0")
    a = _agent(h0, h0, secret_file, *conf, node_rank=0, nnodes="2:3", env=env)
    b = _agent(h1, h0, secret_file, *conf, node_rank=1, nnodes="2:3", env=env)
    out_a, out_b = _finish(a), _finish(b)
    assert (a.returncode, b.returncode) == (0, 0), out_a + out_b
    assert "round 0: 2 node(s), world size 4" in out_a
    for rank in range(4):
        assert f"rank {rank} of 4 up" in out_a + out_b


def test_node_lost_agent_killed_fail_policy(netns_hosts, secret_file, tmp_path):
    h0, h1 = netns_hosts
    conf = ("--rdzv-conf", "heartbeat_interval=0.2,heartbeat_timeout=1.5", "--grace-period", "3")
    env = base_env(PID_DIR=str(tmp_path))
    a = _agent(h0, h0, secret_file, *conf, node_rank=0, env=env, script="sleeper.py")
    b = _agent(h1, h0, secret_file, *conf, node_rank=1, env=env, script="sleeper.py")
    pids = read_pids(tmp_path, 4)
    b.kill()  # SIGKILL the second node's agent
    b.wait(timeout=10)
    out_a = _finish(a, 60)
    assert a.returncode == 1, out_a
    assert "node 1 (node1, ranks 2-3) lost: no heartbeat" in out_a
    assert "node 1 lost; stopping the job" in out_a
    rows = [ln.split() for ln in out_a.splitlines() if ln.startswith(("2 ", "3 "))]
    assert [(r[0], r[1], r[4], r[5]) for r in rows] == [("2", "node1", "node", "lost"),
                                                        ("3", "node1", "node", "lost")]
    assert "root cause: rank 2 on node1 (node lost)" in out_a
    assert wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=10)


def test_node_lost_link_cut_shrink_policy(netns_hosts, secret_file, tmp_path):
    h0, h1 = netns_hosts
    conf = ("--rdzv-conf", "heartbeat_interval=0.2,heartbeat_timeout=1.5", "--on-failure",
            "shrink", "--grace-period", "2")
    env = base_env(PID_DIR=str(tmp_path), DURATION="6")
    a = _agent(h0, h0, secret_file, *conf, node_rank=0, env=env)
    b = _agent(h1, h0, secret_file, *conf, node_rank=1, env=env)
    pids = read_pids(tmp_path, 4)
    h1.cut()  # unplug node1
    out_b = _finish(b, 60)
    out_a = _finish(a, 60)
    # survivors on node0 kept running to the end and exited 0: the loss was tolerated
    assert a.returncode == 0, out_a
    assert "node 1 lost; survivors keep running (--on-failure shrink)" in out_a
    assert "[node0:0] rank 0 done" in out_a and "[node0:1] rank 1 done" in out_a
    # the cut-off node noticed that its rendezvous host was gone and stopped its workers
    assert b.returncode == 1, out_b
    assert "lost the rendezvous host" in out_b
    assert wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=10)


@pytest.mark.slow
def test_node_lost_survivor_communicators_shrink(netns_hosts, secret_file, tmp_path):
    """A whole node cut off mid-job: the survivors' in-flight all_reduce ends with
    PeerFailureError (node_lost on the event bus), they shrink to the node that is left and
    compute correctly on the shrunk communicator."""
    import json

    h0, h1 = netns_hosts
    # a 3 s node heartbeat limit: with 1.5 s a starved 2-core box once declared node 1 lost at
    # start-up (a 1.65 s gap, before the cut) and the survivors' new_comm waited for it 60 s
    conf = ("--rdzv-conf", "heartbeat_interval=0.2,heartbeat_timeout=3", "--on-failure",
            "shrink", "--grace-period", "2")
    env = base_env(PID_DIR=str(tmp_path), TORCHCOMM_TRACING_DISABLE="1", TORCHCOMM_HEARTBEAT_LIMIT_S="30")
    a = _agent(h0, h0, secret_file, *conf, node_rank=0, env=env, script="shrink_on_loss.py")
    b = _agent(h1, h0, secret_file, *conf, node_rank=1, env=env, script="shrink_on_loss.py")
    pids = read_pids(tmp_path, 4)
    time.sleep(1.0)  # let the all_reduce loop run
    h1.cut()
    out_a = _finish(a, 120)
    _finish(b, 60)
    results = {r: json.loads((tmp_path / f"result{r}.json").read_text()) for r in range(4)
               if (tmp_path / f"result{r}.json").exists()}
    survivors = sorted(results)  # the two ranks of node0
    assert len(survivors) == 2, out_a
    for r, v in results.items():
        assert v["raised"] == "PeerFailureError" and v["detected_by"] == "node_lost", v
        assert v["survivors"] == survivors and v["new_rank"] == survivors.index(r), v
        assert v["sum"] == float(sum(survivors)), v
    assert a.returncode == 0, out_a
    assert wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=15)
