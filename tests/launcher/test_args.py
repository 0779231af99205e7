import signal

import pytest

from launcher.args import parse_args, parse_std_spec
from launcher.exceptions import UsageError


def test_both_spellings_and_defaults():
    a = parse_args(["--nproc_per_node", "3", "--max-restarts", "2", "train.py", "--lr", "1"], {})
    b = parse_args(["--nproc-per-node=3", "--max_restarts=2", "train.py", "--lr", "1"], {})
    for cfg in (a, b):
        assert cfg.nproc_per_node == 3
        assert cfg.max_restarts == 2
        assert cfg.on_failure == "restart"  # default when restarts are allowed
        assert cfg.entrypoint == "train.py"
        assert cfg.entrypoint_args == ("--lr", "1")
        assert (cfg.min_nodes, cfg.max_nodes) == (1, 1)


def test_default_policy_without_restarts_is_fail():
    assert parse_args(["x.py"], {}).on_failure == "fail"


def test_script_flags_are_not_ours():
    cfg = parse_args(["x.py", "--nnodes", "7", "--bogus"], {})
    assert cfg.max_nodes == 1
    assert cfg.entrypoint_args == ("--nnodes", "7", "--bogus")


def test_unknown_flag_names_closest():
    with pytest.raises(UsageError, match=r"unknown option --nproc-per-nod; did you mean --nproc-per-node\?"):
        parse_args(["--nproc-per-nod", "2", "x.py"], {})
    with pytest.raises(UsageError, match="did you mean --max-restarts"):
        parse_args(["--max-restart=2", "x.py"], {})


def test_unknown_flag_without_neighbour():
    with pytest.raises(UsageError, match=r"unknown option --zzzzzz$"):
        parse_args(["--zzzzzz", "x.py"], {})


def test_nnodes_min_max():
    cfg = parse_args(["--nnodes", "2:4", "--rdzv-endpoint", "h:1234", "--rdzv-id", "j",
                      "x.py"], {})
    assert (cfg.min_nodes, cfg.max_nodes) == (2, 4)
    assert (cfg.rdzv_host, cfg.rdzv_port) == ("h", 1234)
    with pytest.raises(UsageError, match=r"MIN \(3\) is larger than MAX \(2\)"):
        parse_args(["--nnodes", "3:2", "x.py"], {})
    with pytest.raises(UsageError, match="--nnodes must be an integer"):
        parse_args(["--nnodes", "two", "x.py"], {})


def test_multinode_needs_endpoint_and_id():
    with pytest.raises(UsageError, match="--rdzv-endpoint"):
        parse_args(["--nnodes", "2", "x.py"], {})
    with pytest.raises(UsageError, match="--rdzv-id"):
        parse_args(["--nnodes", "2", "--rdzv-endpoint", "h", "x.py"], {})


def test_endpoint_default_port_and_master_addr():
    cfg = parse_args(["--nnodes", "2", "--rdzv-endpoint", "h", "--rdzv-id", "j", "x.py"], {})
    assert cfg.rdzv_port == 29400
    cfg = parse_args(["--nnodes", "2", "--master-addr", "m", "--master-port", "4000",
                      "--rdzv-id", "j", "x.py"], {})
    assert cfg.rdzv_endpoint == "m:4000"


def test_standalone_conflicts_with_nnodes():
    with pytest.raises(UsageError, match="--standalone"):
        parse_args(["--standalone", "--nnodes", "2", "x.py"], {})


def test_nproc_keywords():
    assert parse_args(["--nproc-per-node", "gpu", "x.py"],
                      {"CUDA_VISIBLE_DEVICES": "0,1,2"}).nproc_per_node == 3
    assert parse_args(["--nproc-per-node", "auto", "x.py"],
                      {"CUDA_VISIBLE_DEVICES": "4"}).nproc_per_node == 1
    with pytest.raises(UsageError, match="no GPU is visible"):
        parse_args(["--nproc-per-node", "gpu", "x.py"], {"CUDA_VISIBLE_DEVICES": ""})
    with pytest.raises(UsageError, match="--nproc-per-node must be >= 1"):
        parse_args(["--nproc-per-node", "0", "x.py"], {})


def test_rdzv_conf():
    cfg = parse_args(["--rdzv-conf", "join_timeout=5,last_call_timeout=1.5,is_host=true",
                      "x.py"], {})
    assert cfg.rdzv_conf.join_timeout == 5
    assert cfg.rdzv_conf.last_call_timeout == 1.5
    assert cfg.rdzv_conf.is_host is True
    with pytest.raises(UsageError, match="unknown key 'join_timout'; did you mean join_timeout"):
        parse_args(["--rdzv-conf", "join_timout=5", "x.py"], {})
    with pytest.raises(UsageError, match="must be a number"):
        parse_args(["--rdzv-conf", "join_timeout=soon", "x.py"], {})


def test_policy_and_backend_errors():
    with pytest.raises(UsageError, match="did you mean shrink"):
        parse_args(["--on-failure", "shrnk", "x.py"], {})
    with pytest.raises(UsageError, match="--rdzv-backend 'etcd' is not supported"):
        parse_args(["--rdzv-backend", "etcd", "x.py"], {})


def test_signals_and_prefix():
    cfg = parse_args(["--signals-to-handle", "SIGTERM,INT", "x.py"], {})
    assert cfg.signals_to_handle == (signal.SIGTERM, signal.SIGINT)
    with pytest.raises(UsageError, match="SIGKILL"):
        parse_args(["--signals-to-handle", "SIGKILL", "x.py"], {})
    with pytest.raises(UsageError, match="--line-prefix"):
        parse_args(["--line-prefix", "{hostname}", "x.py"], {})


def test_worker_argv_modes():
    assert parse_args(["-m", "pkg.mod", "a"], {}).worker_argv("py") == ["py", "-m", "pkg.mod", "a"]
    assert parse_args(["--no-python", "bin", "a"], {}).worker_argv("py") == ["bin", "a"]
    argv = parse_args(["--run-path", "s.py", "a"], {}).worker_argv("py")
    assert argv[:2] == ["py", "-c"] and argv[-2:] == ["s.py", "a"]
    with pytest.raises(UsageError, match="cannot be combined"):
        parse_args(["-m", "--no-python", "x"], {})


def test_std_spec():
    assert parse_std_spec("3", "--tee", 2) == {0: 3, 1: 3}
    assert parse_std_spec("0:1,1:2", "--redirects", 3) == {0: 1, 1: 2, 2: 0}
    with pytest.raises(UsageError, match="--tee must be 0-3"):
        parse_std_spec("4", "--tee", 1)
    with pytest.raises(UsageError, match="LOCAL_RANK:MODE"):
        parse_std_spec("1,2", "--redirects", 2)


def test_missing_secret_file_is_named():
    with pytest.raises(UsageError, match="--job-secret-file '/nonexistent/s' does not exist"):
        parse_args(["--job-secret-file", "/nonexistent/s", "x.py"], {})


def test_slurm_fills_layout():
    env = {"SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_NNODES": "2",
           "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "4242"}
    cfg = parse_args(["--nproc-per-node", "4", "x.py"], env)
    assert (cfg.min_nodes, cfg.max_nodes, cfg.node_rank) == (2, 2, 1)
    assert cfg.rdzv_endpoint == "gpu07:29400"
    assert cfg.rdzv_id == "slurm-4242"
    # explicit flags win over the scheduler
    cfg = parse_args(["--rdzv-endpoint", "other:5", "x.py"], env)
    assert cfg.rdzv_endpoint == "other:5"


@pytest.mark.parametrize("flag,value", [("--local-ranks-filter", "2"), ("--redirects", "2:1"),
                                        ("--tee", "0:1,2:3")])
def test_a_local_rank_this_node_does_not_have_is_refused(flag, value):
    """A filter or a per-rank redirect that names no worker would silently show (or log)
    nothing for it: refused, naming the local ranks there are."""
    with pytest.raises(UsageError, match=rf"{flag}: .*local rank 2 .*--nproc-per-node 2 \(local ranks 0-1\)"):
        parse_args(["--nproc-per-node", "2", flag, value, "x.py"], {})


def test_restarts_with_the_fail_policy_are_refused():
    """``--on-failure fail`` never restarts: a restart count beside it was ignored without a word."""
    with pytest.raises(UsageError, match=r"--max-restarts 2 has no effect with --on-failure fail"):
        parse_args(["--on-failure", "fail", "--max-restarts", "2", "x.py"], {})
    assert parse_args(["--on-failure", "fail", "--max-restarts", "0", "x.py"], {}).on_failure == "fail"


def test_help_names_the_defaults_of_the_timing_flags():
    import re

    from launcher.parser import build_parser

    text = " ".join(build_parser().format_help().split())
    for flag, default in (("--monitor-interval", "0.1"), ("--grace-period", "10"), ("--hung-timeout", "30"),
                          ("--stopped-timeout", "2")):
        entry = re.search(rf"{flag} \S+, --\S+ \S+ (.*?)(?= --[a-z]|$)", text)
        assert entry and f"(default {default})" in entry.group(1), (flag, entry and entry.group(1))


def test_a_monitor_interval_of_0_is_refused():
    """0 made every wait of the agent's monitor loop return at once: the agent spun on a CPU."""
    with pytest.raises(UsageError, match=r"--monitor-interval must be > 0, got 0"):
        parse_args(["--monitor-interval", "0", "x.py"], {})
    assert parse_args(["--monitor-interval", "0.5", "x.py"], {}).monitor_interval == 0.5


def test_fork_server_from_the_flag_or_the_variable():
    assert not parse_args(["x.py"], {}).fork_server
    assert parse_args(["--fork-server", "x.py"], {}).fork_server
    assert parse_args(["x.py"], {"TORCHCOMM_FORK_SERVER": "1"}).fork_server
    assert parse_args(["-m", "pkg.mod", "a"], {"TORCHCOMM_FORK_SERVER": "on"}).worker_entry() == ("module", "pkg.mod",
                                                                                               ("a",))
    assert parse_args(["--run-path", "x.py"], {}).worker_entry() == ("run_path", "x.py", ())
    # a --no-python job's executables start as they are: the variable is ignored there, the flag refused
    assert not parse_args(["--no-python", "prog"], {"TORCHCOMM_FORK_SERVER": "1"}).fork_server
    with pytest.raises(UsageError, match="--fork-server forks Python workers"):
        parse_args(["--fork-server", "--no-python", "prog"], {})
    with pytest.raises(UsageError, match="TORCHCOMM_FORK_SERVER must be 0/1/true/false, got 'maybe'"):
        parse_args(["x.py"], {"TORCHCOMM_FORK_SERVER": "maybe"})
