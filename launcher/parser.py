"""``torchcomms-run``'s argument parser: torchrun's flags in both spellings (``--nproc-per-node``
and ``--nproc_per_node``) plus its own, and the check that names the closest known flag for an
unknown one. Turning the parsed strings into a :class:`~launcher.launch_config.LaunchConfig` is
:func:`launcher.args.parse_args`'s job."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

from .exceptions import UsageError
from .launch_config import DEFAULT_HUNG_TIMEOUT_S, DEFAULT_STOPPED_TIMEOUT_S

__all__ = ["build_parser", "check_unknown_flags"]


#: how argparse words a missing positional; ``entrypoint_args`` (the script's own arguments,
#: possibly none) is never what is missing from a command line
_REQUIRED = "the following arguments are required:"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith(_REQUIRED) and "entrypoint" in message:
            raise UsageError("no entry point: torchcomms-run [options] SCRIPT [SCRIPT ARGS...] "
                             "(or -m MODULE, or --no-python PROGRAM)")
        raise UsageError(message)


def _flag(parser: argparse.ArgumentParser, name: str, *extra: str, **kwargs: object) -> None:
    """Add ``--name-with-dashes`` and its ``--name_with_underscores`` twin."""
    spellings = [f"--{name}"]
    if "-" in name:
        spellings.append(f"--{name.replace('-', '_')}")
    parser.add_argument(*extra, *spellings, **kwargs)  # type: ignore[arg-type]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for ``--help`` and for tests)."""
    p = _Parser(
        prog="torchcomms-run",
        description="Launch and supervise a distributed PyTorch job (torchrun-compatible).",
        allow_abbrev=False,
    )
    _flag(p, "nnodes", default=None, help="number of nodes, N or MIN:MAX (default 1)")
    _flag(p, "nproc-per-node", default=None, help="workers per node: N, cpu, gpu or auto (default 1)")
    _flag(p, "node-rank", default=None, help="this node's rank (default: order of arrival)")
    _flag(p, "rdzv-backend", default="c10d",
          help="c10d or torchcomms (default): the agent on the rendezvous host hosts the store "
          "and nodes join in any order, MIN:MAX of them; static: a fixed --nnodes N, and "
          "every node of a multi-node job names its --node-rank (as with torchrun)")
    _flag(p, "rdzv-endpoint", default=None, help="HOST[:PORT] of the rendezvous agent")
    _flag(p, "rdzv-id", default=None, help="job id shared by all nodes (default: a fresh one)")
    _flag(p, "rdzv-conf", default="", help="KEY=VALUE,...: join_timeout, last_call_timeout, "
          "heartbeat_interval, heartbeat_timeout, is_host")
    p.add_argument("--standalone", action="store_true", help="single node, local rendezvous")
    _flag(p, "master-addr", default=None, help="rendezvous host when no --rdzv-endpoint")
    _flag(p, "master-port", default=None, help="rendezvous port when no --rdzv-endpoint")
    _flag(p, "max-restarts", default="0", help="restarts of the worker group (default 0)")
    _flag(p, "monitor-interval", default="0.1", help="seconds between health checks (default 0.1)")
    _flag(p, "log-dir", default=None, help="directory for per-rank logs and error files")
    _flag(p, "redirects", "-r", default="0", help="0-3 or LOCAL_RANK:0-3,...: streams to files only")
    _flag(p, "tee", "-t", default="0", help="0-3 or LOCAL_RANK:0-3,...: streams to files too")
    _flag(p, "local-ranks-filter", default="", help="show only these local ranks on the console")
    p.add_argument("--role", default="default", help="worker role name (ROLE_NAME)")
    _flag(p, "local-addr", default=None, help="address other nodes reach this node at")
    p.add_argument("-m", "--module", action="store_true", help="run the entry point as a module")
    _flag(p, "no-python", action="store_true", help="run the entry point as an executable")
    _flag(p, "run-path", action="store_true", help="run the entry point with runpy.run_path")
    _flag(p, "signals-to-handle", default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
          help="signals forwarded to the workers")
    _flag(p, "start-method", default="spawn",
          help="spawn only: every worker is a fresh process running the entry point, as "
          "torchrun does for a script (fork/forkserver apply to function entry points)")
    _flag(p, "fork-server", action="store_true",
          help="fork every worker from one process per node that imported torch and torchcomms once "
          "(starts and restarts without an import of torch each; also TORCHCOMM_FORK_SERVER=1)")
    _flag(p, "backend", default=None,
          help="mpi: run as one rank of an Open MPI job, one torchcomms-run per rank started by "
          "mpiexec (mpiexec -n N [--with-ft ulfm] torchcomms-run --backend mpi train.py); each "
          "runs its rank's one worker, supervised as usual; --on-failure fail or shrink")
    _flag(p, "on-failure", default=None, help="restart, shrink or fail "
          "(default: restart when --max-restarts > 0, else fail)")
    _flag(p, "job-secret-file", default=None, help="file with the job's hex secret")
    _flag(p, "json-logs", action="store_true", help="print worker output and events as JSON lines")
    _flag(p, "grace-period", default="10", help="seconds between SIGTERM and SIGKILL (default 10)")
    _flag(p, "hung-timeout", default=str(DEFAULT_HUNG_TIMEOUT_S),
          help="seconds a live rank may go without heartbeats AND without using CPU before it "
          f"is hung (dumped, then killed); a slow or starved rank is never hung (default {DEFAULT_HUNG_TIMEOUT_S:g})")
    _flag(p, "stopped-timeout", default=str(DEFAULT_STOPPED_TIMEOUT_S),
          help="seconds a rank may stay stopped (SIGSTOP, a debugger) before it is reported "
          f"as failed with reason stopped; it is not killed (default {DEFAULT_STOPPED_TIMEOUT_S:g})")
    _flag(p, "line-prefix", default="[{host}:{rank}]",
          help="console prefix template: {host} {rank} {local_rank} {node_rank} {role}; '' for none")
    _flag(p, "no-summary", action="store_true", help="do not print the end-of-job table")
    p.add_argument("entrypoint", help="the training script (or module / executable)")
    p.add_argument("entrypoint_args", nargs=argparse.REMAINDER)
    return p


def check_unknown_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Reject unknown options before the entry point, suggesting the closest known one."""
    known = parser._option_string_actions  # noqa: SLF001 - argparse has no public accessor
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--" or not tok.startswith("-") or tok == "-":
            return
        name, has_value = (tok.split("=", 1)[0], True) if "=" in tok else (tok, False)
        action = known.get(name)
        if action is None:
            close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise UsageError(f"unknown option {name}{hint}")
        i += 1 if (has_value or action.nargs == 0) else 2
