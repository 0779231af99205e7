"""Every ``TORCHCOMM_*`` environment variable, declared once: name, type, default, one line of help.

(One variable of torchrun's, ``TORCHELASTIC_RUN_ID``, is declared here too, as the job id's
fallback; the rank/size/address variables of torchrun, MPI and Slurm, and torchrun's store
variables, are read by ``torchcomms.setup.bootstrap``.)

    from torchcomms.config import settings
    settings().heartbeat_limit_s          # validated, typed; read from os.environ

``settings()`` reads and validates every declared variable together, and reads them again only
when one of them changed in ``os.environ`` (tests set variables per process and per test);
``settings(env)`` reads a given mapping instead. A bad value raises :class:`ConfigError`
(a ``ValueError``) naming the variable and the value. ``python -m torchcomms.config`` prints
the table (``--markdown``: the table of the README and docs/INTERNALS.md).

This module never imports torch: the launcher and the control plane import it and must start
fast.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torchcomms.core.errors import CommValueError

__all__ = ["VARIABLES", "ConfigError", "Settings", "Var", "markdown_table", "settings", "text_table", "var",
           "with_table"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class ConfigError(CommValueError):
    """A ``TORCHCOMM_*`` variable holds a value that cannot be used; ``variable`` names it and
    ``value`` is what it held."""

    def __init__(self, variable: str, value: str, why: str) -> None:
        self.variable = variable
        self.value = value
        super().__init__(f"{variable} {why}, got {value!r}")


@dataclass(frozen=True)
class Var:
    """One declared variable. ``kind`` is ``bool``, ``int``, ``float``, ``str`` or ``choice``;
    ``minimum`` bounds numbers (``positive``: strictly above it); unset or empty means
    ``default``."""

    name: str
    attr: str
    kind: str
    default: Any
    help: str
    set_by: str = "user"
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    positive: bool = False
    check: Callable[[str, str], Any] | None = None  # (name, raw) -> value, for special formats

    def parse(self, raw: str | None) -> Any:
        """The typed value of ``raw`` (the variable's text), or :class:`ConfigError`."""
        if raw is None or raw.strip() == "":
            return self.default
        text = raw.strip()
        if self.check is not None:
            return self.check(self.name, raw)
        if self.kind == "bool":
            low = text.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ConfigError(self.name, raw, "must be 0/1/true/false")
        if self.kind == "choice":
            low = text.lower()
            if low not in self.choices:
                raise ConfigError(self.name, raw, f"expected one of {', '.join(self.choices)}")
            return low
        if self.kind in ("int", "float"):
            try:
                value: float = int(text) if self.kind == "int" else float(text)
            except ValueError:
                raise ConfigError(self.name, raw, f"must be {'an integer' if self.kind == 'int' else 'a number'}") from None
            if self.minimum is not None and (value <= self.minimum if self.positive else value < self.minimum):
                raise ConfigError(self.name, raw, f"must be {'>' if self.positive else '>='} {self.minimum:g}")
            return value
        return text

    def default_text(self) -> str:
        if self.default is None:
            return "unset"
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)


def _otel(name: str, raw: str) -> tuple[str, str | None] | None:
    """``off``/``0``/``none`` → None; ``console`` → ("console", None); ``file:<p>`` → ("file", p)."""
    v = raw.strip()
    if v.lower() in ("0", "off", "none"):
        return None
    if v.lower() == "console":
        return ("console", None)
    if v.lower().startswith("file:"):
        if not v[5:]:
            raise ConfigError(name, raw, "needs a path after file:")
        return ("file", v[5:])
    raise ConfigError(name, raw, "must be 'console' or 'file:<path>'")


VARIABLES: tuple[Var, ...] = (
    # --- the job (set by torchcomms-run; torchrun, MPI and Slurm variables are read too) ---
    Var("TORCHCOMM_RANK", "rank", "int", None, "global rank of this process", "launcher", minimum=0),
    Var("TORCHCOMM_SIZE", "size", "int", None, "world size of the job", "launcher", minimum=1),
    Var("TORCHCOMM_RUN_ID", "run_id", "str", None,
        "job id and store key namespace (`TORCHELASTIC_RUN_ID` is its torchrun twin)", "launcher"),
    Var("TORCHELASTIC_RUN_ID", "torchelastic_run_id", "str", None,
        "torchrun's job id, used when `TORCHCOMM_RUN_ID` is unset", "torchrun"),
    Var("TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD", "rank_size_method", "choice", "auto",
        "where rank/size come from", choices=("auto", "torchrun", "mpi", "slurm", "torchcomm")),
    Var("TORCHCOMM_CONTROL_ADDR", "control_addr", "str", None,
        "`tcp://host:port` of the control-plane store server", "launcher"),
    Var("TORCHCOMM_CONTROL_SECRET_FILE", "control_secret_file", "str", None,
        "file holding the per-job secret (hex, 64 chars)", "launcher"),
    Var("TORCHCOMM_CONTROL_SECRET", "control_secret", "str", None,
        "the secret itself (hex); the file wins when both are set"),
    Var("TORCHCOMM_CONTROL_PID", "control_pid", "int", None,
        "the process hosting the control plane, when it runs on this host: while it is running, an "
        "unanswered control plane is slow, not lost (a starved node); stopped or gone, it is lost",
        "launcher", minimum=1),
    Var("TORCHCOMM_AGENT_MARK", "agent_mark", "str", None,
        "marks the processes of one agent's workers (what they start inherits it): should the agent be "
        "SIGKILLed, its watcher kills every process that carries it", "launcher"),
    Var("TORCHCOMM_FORK_SERVER", "fork_server", "bool", False,
        "torchcomms-run forks every worker from one process per node that imported torch once "
        "(`--fork-server`)"),
    # --- communicators ---
    Var("TORCHCOMM_TIMEOUT_SECONDS", "timeout_s", "float", 600.0, "default op timeout (s)",
        minimum=0, positive=True),
    Var("TORCHCOMM_ABORT_ON_ERROR", "abort_on_error", "bool", False,
        "default of `abort_process_on_timeout_or_error`: exit the process after a failure"),
    Var("TORCHCOMM_CHECK_COLLECTIVES", "check_collectives", "bool", False,
        "compare every collective's signature across ranks first (hint `torchcomms.check_collectives`)"),
    # --- failure detection ---
    Var("TORCHCOMM_HEARTBEAT_S", "heartbeat_s", "float", 0.25, "worker heartbeat interval (s); 0: none",
        minimum=0),
    Var("TORCHCOMM_HEARTBEAT_LIMIT_S", "heartbeat_limit_s", "float", 2.0,
        "heartbeats missing this long: `rank_failed` (reason `heartbeat`); under torchcomms-run only "
        "`rank_silent`, a suspicion the rank's agent judges from its process", minimum=0, positive=True),
    Var("TORCHCOMM_CONTROL_MAX_BEAT_RATE", "control_max_beat_rate", "float", 1000.0,
        "heartbeats a second the control server takes from all members together; past it, members "
        "are asked to beat less often and their silence limits stretch alike", minimum=0, positive=True),
    Var("TORCHCOMM_CONTROL_LOST_S", "control_lost_s", "float", 8.0,
        "an event subscription unanswered this long after a first unanswered poll takes the control "
        "plane for lost (never while `TORCHCOMM_CONTROL_PID`'s process runs)", minimum=0, positive=True),
    Var("TORCHCOMM_STORE_WATCH", "store_watch", "bool", False,
        "without torchcomms-run: find dead peers on this host from /proc and publish them through the store "
        "(opt-in: a rank that leaves by `os._exit` without finalizing is taken for dead; see INTERNALS)"),
    Var("TORCHCOMM_FAILURE_ATTRIBUTION_S", "failure_attribution_s", "float", 1.0,
        "how long an engine's connection loss waits for the control plane to name the failed rank",
        minimum=0),
    # --- tracing ---
    Var("TORCHCOMM_TRACING_DISABLE", "tracing_disable", "bool", False, "new_comm attaches no default tracing"),
    Var("TORCHCOMM_FR_MAX_ENTRIES", "fr_max_entries", "int", 2048, "flight-recorder ring size; 0: off",
        minimum=0),
    Var("TORCHCOMM_FR_STACK_DEPTH", "fr_stack_depth", "int", 1, "call-site frames kept per op; 0: none",
        minimum=0),
    Var("TORCHCOMM_FR_DUMP_TEMP_FILE", "fr_dump_prefix", "str", None,
        "flight-recorder dump path prefix (the rank is appended); unset: "
        "`~/.cache/torch/comm_lib_trace/<run id>/rank_`, one folder per job"),
    Var("TORCHCOMM_FR_DUMP_ON_EXIT", "fr_dump_on_exit", "bool", False, "dump the flight recorder at exit too"),
    Var("TORCHCOMM_LOG_EVENTS", "log_events", "bool", True, "structured log events of every communicator"),
    Var("TORCHCOMM_LOG_LEVEL", "log_level", "choice", "warning", "log level",
        choices=("debug", "info", "warning", "error", "critical")),
    Var("TORCHCOMM_LOG_FORMAT", "log_format", "choice", "auto", "log format", choices=("json", "console", "auto")),
    Var("TORCHCOMM_LOG_DIR", "log_dir", "str", None, "folder of per-rank JSON-lines log files"),
    Var("TORCHCOMM_OTEL", "otel", "str", None,
        "OpenTelemetry spans: `console` or `file:<path>` (`{rank}` in the path: the rank)", check=_otel),
    Var("TORCHCOMM_OTEL_QUEUE", "otel_queue", "int", 65536, "spans queued before new ones are dropped",
        minimum=1),
    # --- the C++ extension (torch.distributed's route) ---
    Var("TORCHCOMM_EXTENSION_BUILD_TIMEOUT_S", "extension_build_timeout_s", "float", 900.0,
        "how long a process waits for another one building the C++ extension before it raises "
        "`ExtensionBuildTimeout`", minimum=0, positive=True),
)
_BY_NAME = {v.name: v for v in VARIABLES}


class Settings:
    """The validated values of every declared variable, as attributes named by ``Var.attr``
    (``settings().timeout_s``)."""

    def __init__(self, values: dict[str, Any], raw: dict[str, str | None], master_port: str | None = None) -> None:
        self.__dict__.update(values)
        self._raw = raw
        self._master_port = (master_port or "").strip() or None

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read and validate every variable of ``env`` (default ``os.environ``)."""
        env = os.environ if env is None else env
        raw = {v.name: env.get(v.name) for v in VARIABLES}
        return cls({v.attr: v.parse(raw[v.name]) for v in VARIABLES}, raw, env.get("MASTER_PORT"))

    @property
    def job_id(self) -> str:
        """``TORCHCOMM_RUN_ID``, else ``TORCHELASTIC_RUN_ID``; a job with neither is
        ``local-<MASTER_PORT>`` (``local`` without MASTER_PORT either), which tells apart
        concurrent jobs on one machine that rendezvous on different ports."""
        if self.run_id or self.torchelastic_run_id:
            return self.run_id or self.torchelastic_run_id
        return f"local-{self._master_port}" if self._master_port else "local"

    def source(self, name: str) -> str | None:
        """The raw text of variable ``name`` (``None`` when unset)."""
        return self._raw[_BY_NAME[name].name]

    def __repr__(self) -> str:
        return "Settings(" + ", ".join(f"{v.attr}={getattr(self, v.attr)!r}" for v in VARIABLES
                                       if v.attr != "control_secret") + ")"


_lock = threading.Lock()
_cached: tuple[tuple[str | None, ...], Settings] | None = None


def settings(env: Mapping[str, str] | None = None) -> Settings:
    """The settings of ``env``; of ``os.environ`` by default, read again only when one of the
    declared variables changed there since the last call."""
    global _cached
    if env is not None:
        return Settings.load(env)
    key = tuple(os.environ.get(v.name) for v in VARIABLES)
    with _lock:
        if _cached is None or _cached[0] != key:
            _cached = (key, Settings.load())
        return _cached[1]


def var(name: str) -> Var:
    """The declaration of ``name``."""
    return _BY_NAME[name]


def _rows(env: Mapping[str, str] | None) -> list[tuple[str, str, str, str]]:
    env = os.environ if env is None else env
    rows = []
    for v in VARIABLES:
        cur = env.get(v.name)
        shown = "" if cur is None else ("<set>" if v.attr == "control_secret" else cur)
        rows.append((v.name, v.default_text(), shown, v.help))
    return rows


def text_table(env: Mapping[str, str] | None = None) -> str:
    """Every variable with its default, its current value and its help, as aligned text."""
    rows = [("variable", "default", "current", "meaning"), *_rows(env)]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows)


def markdown_table() -> str:
    """The environment table of the README and docs/INTERNALS.md (generated from here)."""
    lines = ["| variable | default | set by | meaning |", "| --- | --- | --- | --- |"]
    for v in VARIABLES:
        choices = f" (`{'`, `'.join(v.choices)}`)" if v.choices else ""
        lines.append(f"| `{v.name}` | `{v.default_text()}` | {v.set_by} | {v.help}{choices} |")
    return "\n".join(lines)


DOCS_BEGIN = ("<!-- generated by `python -m torchcomms.config --markdown`: edit torchcomms/config.py, "
              "not this table -->")
DOCS_END = "<!-- end of generated table -->"
#: The documents that carry the generated table (relative to the repository root).
DOCS = ("README.md", "docs/INTERNALS.md")


def with_table(document: str) -> str:
    """``document`` with the text between its table markers replaced by :func:`markdown_table`."""
    start = document.index(DOCS_BEGIN) + len(DOCS_BEGIN)
    end = document.index(DOCS_END, start)
    return f"{document[:start]}\n{markdown_table()}\n{document[end:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchcomms.config",
                                     description="Print every TORCHCOMM_* variable torchcomms reads.")
    parser.add_argument("--markdown", action="store_true", help="print the docs' Markdown table")
    parser.add_argument("--write-docs", metavar="REPO", help="regenerate the table in REPO's README and INTERNALS")
    parser.add_argument("--check", action="store_true", help="validate the current environment (exit 2 if bad)")
    args = parser.parse_args(argv)
    if args.write_docs:
        for rel in DOCS:
            path = os.path.join(args.write_docs, rel)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            with open(path, "w", encoding="utf-8") as f:
                f.write(with_table(text))
        return 0
    if args.markdown:
        print(markdown_table())
        return 0
    print(text_table())
    if args.check:
        try:
            Settings.load()
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
