"""torchcomms.config: every TORCHCOMM_* variable declared once, validated, printable, and the
docs' environment table generated from it."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from torchcomms import config
from torchcomms.config import ConfigError, Settings, settings
from torchcomms.core.errors import CommValueError


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name,raw,fragment", [
    ("TORCHCOMM_TIMEOUT_SECONDS", "soon", "must be a number"),
    ("TORCHCOMM_TIMEOUT_SECONDS", "0", "must be > 0"),
    ("TORCHCOMM_HEARTBEAT_LIMIT_S", "-1", "must be > 0"),
    ("TORCHCOMM_FR_MAX_ENTRIES", "1.5", "must be an integer"),
    ("TORCHCOMM_FR_STACK_DEPTH", "-2", "must be >= 0"),
    ("TORCHCOMM_ABORT_ON_ERROR", "maybe", "must be 0/1/true/false"),
    ("TORCHCOMM_LOG_LEVEL", "loud", "expected one of debug, info"),
    ("TORCHCOMM_OTEL", "jaeger", "must be 'console' or 'file:<path>'"),
    ("TORCHCOMM_RANK", "x", "must be an integer"),
])
def test_a_bad_value_raises_a_typed_error_naming_the_variable_and_the_value(name: str, raw: str,
                                                                             fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.load({name: raw})
    err = info.value
    assert isinstance(err, CommValueError) and isinstance(err, ValueError)
    assert err.variable == name and err.value == raw
    assert str(err).startswith(name) and fragment in str(err) and repr(raw) in str(err)


def test_the_secret_is_never_printed() -> None:
    s = Settings.load({"TORCHCOMM_CONTROL_SECRET": "ab" * 32})
    assert s.control_secret == "ab" * 32 and "ab" * 32 not in repr(s)
    assert "ab" * 32 not in config.text_table({"TORCHCOMM_CONTROL_SECRET": "ab" * 32})


def test_defaults_types_and_parsing() -> None:
    s = Settings.load({})
    assert (s.timeout_s, s.heartbeat_s, s.heartbeat_limit_s, s.failure_attribution_s) == (600.0, 0.25, 2.0, 1.0)
    assert (s.fr_max_entries, s.fr_stack_depth, s.otel_queue) == (2048, 1, 65536)
    assert (s.abort_on_error, s.check_collectives, s.tracing_disable, s.log_events) == (False, False, False, True)
    assert s.rank is None and s.otel is None and s.job_id == "local"
    s = Settings.load({"TORCHCOMM_TIMEOUT_SECONDS": "2.5", "TORCHCOMM_ABORT_ON_ERROR": "Yes",
                       "TORCHCOMM_LOG_LEVEL": "INFO", "TORCHCOMM_OTEL": "file:/tmp/s.jsonl", "TORCHCOMM_RANK": "3",
                       "TORCHELASTIC_RUN_ID": "te", "TORCHCOMM_FR_MAX_ENTRIES": ""})
    assert (s.timeout_s, s.abort_on_error, s.log_level, s.otel, s.rank) == (2.5, True, "info", ("file", "/tmp/s.jsonl"), 3)
    assert s.fr_max_entries == 2048  # empty means the default
    assert s.job_id == "te"
    assert Settings.load({"TORCHCOMM_RUN_ID": "tc", "TORCHELASTIC_RUN_ID": "te"}).job_id == "tc"


def test_settings_are_read_again_when_the_environment_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHCOMM_HEARTBEAT_LIMIT_S", "7")
    first = settings()
    assert first.heartbeat_limit_s == 7.0
    assert settings() is first  # unchanged: not read again
    monkeypatch.setenv("TORCHCOMM_HEARTBEAT_LIMIT_S", "9")
    assert settings().heartbeat_limit_s == 9.0
    monkeypatch.setenv("TORCHCOMM_HEARTBEAT_LIMIT_S", "nine")
    with pytest.raises(ConfigError, match="TORCHCOMM_HEARTBEAT_LIMIT_S must be a number, got 'nine'"):
        settings()


def test_every_variable_is_declared_once_with_help() -> None:
    names = [v.name for v in config.VARIABLES]
    attrs = [v.attr for v in config.VARIABLES]
    assert len(set(names)) == len(names) and len(set(attrs)) == len(attrs)
    assert all(v.help and v.kind in ("bool", "int", "float", "str", "choice") for v in config.VARIABLES)


def test_every_variable_the_project_reads_is_declared() -> None:
    """A TORCHCOMM_* name in the library, the launcher or the tests that config does not declare
    would be read outside the one settings object."""
    declared = {v.name for v in config.VARIABLES}
    used: set[str] = set()
    for folder in ("torchcomms", "launcher", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            used |= set(re.findall(r"\bTORCHCOMM_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    prefixes = {u for u in used if any(d.startswith(u + "_") for d in declared)}  # startswith() filters
    assert used - declared - prefixes == set()


def test_python_m_torchcomms_config_prints_the_table_without_importing_torch() -> None:
    code = "import sys, torchcomms.config as c; c.main([]); assert 'torch' not in sys.modules, 'torch imported'"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "TORCHCOMM_LOG_LEVEL": "debug"}, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["variable", "default", "current", "meaning"]
    assert {line.split()[0] for line in lines[1:]} == {v.name for v in config.VARIABLES}
    level = next(line for line in lines if line.startswith("TORCHCOMM_LOG_LEVEL"))
    assert level.split()[1:3] == ["warning", "debug"]
    md = subprocess.run([sys.executable, "-m", "torchcomms.config", "--markdown"], capture_output=True, text=True,
                        cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, timeout=60)
    assert md.returncode == 0 and md.stdout.strip() == config.markdown_table()


@pytest.mark.parametrize("doc", config.DOCS)
def test_the_docs_environment_table_is_the_generated_one(doc: str) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert config.with_table(text) == text, (
        f"{doc}'s environment table differs from torchcomms/config.py: run "
        "`python -m torchcomms.config --write-docs .`")
