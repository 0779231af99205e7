"""BENCHMARKS.md holds one row per claim, and everything it cites exists in the tree."""
from __future__ import annotations

import re

from tests.helpers.paths import REPO

PAGE = REPO / "BENCHMARKS.md"
COLUMNS = ["claim", "ours", "anchor", "ratio (ours / anchor)", "command", "machine", "date", "history"]


def table_rows() -> list[list[str]]:
    lines = [line for line in PAGE.read_text().splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == COLUMNS, header
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_every_cited_benchmark_path_exists() -> None:
    cited = set(re.findall(r"benchmarks/[\w./-]+\.(?:py|sh)", PAGE.read_text()))
    assert cited, "BENCHMARKS.md cites no script"
    missing = sorted(p for p in cited if not (REPO / p).is_file())
    assert not missing, f"BENCHMARKS.md cites scripts that do not exist: {missing}"


def test_every_history_link_exists() -> None:
    links = set(re.findall(r"\]\((docs/bench/[\w.-]+\.md)[^)]*\)", PAGE.read_text()))
    assert links
    missing = sorted(p for p in links if not (REPO / p).is_file())
    assert not missing, f"BENCHMARKS.md links history pages that do not exist: {missing}"


def test_one_row_per_claim_with_a_command_machine_and_date() -> None:
    rows = table_rows()
    claims = [r[0] for r in rows]
    assert len(claims) == len(set(claims)), claims
    for row in rows:
        assert len(row) == len(COLUMNS), row
        claim, command, machine, date = row[0], row[4], row[5], row[6]
        assert re.search(r"`(?:python3|bash) benchmarks/[\w/]+\.(?:py|sh)", command), (claim, command)
        assert machine, claim
        assert re.match(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}", date), (claim, date)


def test_every_runner_in_benchmarks_gpu_sources_the_prelude() -> None:
    runners = sorted((REPO / "benchmarks" / "gpu").glob("*.sh"))
    assert runners
    for path in runners:
        if path.name != "prelude.sh":
            assert 'source "$(dirname "$0")/prelude.sh"' in path.read_text(), path.name


def test_scripts_cited_by_the_kernels_and_benchmarks_exist() -> None:
    """Docstrings and comments of ``kernels/`` and ``benchmarks/`` name scripts that are in the tree."""
    missing = []
    for folder in ("kernels", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")) + sorted((REPO / folder).rglob("*.sh")):
            for cited in set(re.findall(r"benchmarks/[\w./-]+\.(?:py|sh)", path.read_text())):
                if not (REPO / cited).is_file():
                    missing.append(f"{path.relative_to(REPO)}: {cited}")
    assert not missing, missing
