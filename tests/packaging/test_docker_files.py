"""The Docker build files, read against the tree (no Docker daemon needed): every file they
copy exists, the project's packages are all in the image that installs it, and what the
containers run is a console script, a module or a script that the image holds."""
from __future__ import annotations

import glob
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath

import pytest
import yaml

from tests.helpers.paths import REPO
from tests.packaging._dockerfile import Dockerfile, parse
from tests.packaging.test_declared_imports import shipped_packages

DOCKER = REPO / "docker"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile*"))
COMPOSE_FILES = sorted([*DOCKER.glob("*compose*.yaml"), *DOCKER.glob("*compose*.yml")])
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CONSOLE_SCRIPTS = set(PYPROJECT["project"]["scripts"])
SCRIPT_PATH = re.compile(r"^(?!/)[\w./-]+\.(py|sh)$")
PIP_INSTALLS_PROJECT = re.compile(r"""pip3? install\b[^&|;]*\s["']?\.(\[[^\]]*\])?["']?(\s|$)""")


def _in_image(df: Dockerfile, path: str) -> bool:
    """Whether ``path`` (relative to the image's WORKDIR) was copied in from the context."""
    want = df.workdir() / path
    return any(want == PurePosixPath(t) or PurePosixPath(t) in want.parents for _, t, _ in df.copies())


def _module_in_tree(module: str) -> bool:
    base = REPO.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()


def _command_problems(df: Dockerfile, argv: list[str], what: str) -> list[str]:
    """What is wrong with the command ``argv`` the image runs (first word and script paths)."""
    problems = []
    if argv:
        first = argv[0]
        if first in ("python", "python3") and len(argv) > 2 and argv[1] == "-m":
            if not _module_in_tree(argv[2]):
                problems.append(f"{what} runs module {argv[2]}, which is not in the tree")
        elif first in ("python", "python3", "bash", "sh"):
            pass  # its script argument is checked below
        elif first not in CONSOLE_SCRIPTS and not SCRIPT_PATH.match(first):
            problems.append(f"{what} runs {first!r}: not a console script of pyproject.toml ({sorted(CONSOLE_SCRIPTS)})")
    for token in argv:
        if SCRIPT_PATH.match(token):
            if not (REPO / token).is_file():
                problems.append(f"{what} names {token}, which is not in the tree")
            elif not _in_image(df, token):
                problems.append(f"{what} names {token}, which the image does not copy")
    return problems


def test_there_are_files_to_check() -> None:
    assert len(DOCKERFILES) >= 2 and COMPOSE_FILES


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_copies_only_what_exists(path: Path) -> None:
    df = parse(path.read_text())
    missing = [f"line {line}: {src}" for src, _, line in df.copies() if not glob.glob(str(REPO / src))]
    assert missing == [], f"{path.name} copies what the tree does not have"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_that_installs_the_project_copies_all_of_it(path: Path) -> None:
    df = parse(path.read_text())
    runs = " ".join(" ".join(i.args) for i in df.of("RUN"))
    if not PIP_INSTALLS_PROJECT.search(runs):
        pytest.skip(f"{path.name} does not install the project")
    needed = ["pyproject.toml", PYPROJECT["project"]["readme"], *shipped_packages()]
    assert [n for n in needed if not _in_image(df, n)] == [], (
        f"{path.name} runs `pip install .` but does not copy these (pyproject.toml ships them)")


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_runs_what_the_image_has(path: Path) -> None:
    df = parse(path.read_text())
    entry = df.of("ENTRYPOINT")[-1].args if df.of("ENTRYPOINT") else []
    cmd = df.of("CMD")[-1].args if df.of("CMD") else []
    problems = _command_problems(df, entry + cmd, f"{path.name} ENTRYPOINT/CMD")
    for ins in df.of("RUN"):
        problems += [p for p in _command_problems(df, ins.args, f"{path.name} RUN (line {ins.line})")
                     if "runs" not in p]  # RUN's first word is a shell command, not ours
    assert problems == []


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_services_build_and_run_what_exists(path: Path) -> None:
    spec = yaml.safe_load(path.read_text())
    problems = []
    for name, svc in spec["services"].items():
        build = svc.get("build")
        assert build, f"service {name} has no build section: which image would it run?"
        context = (path.parent / (build if isinstance(build, str) else build.get("context", "."))).resolve()
        dockerfile = context / (build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile")
        if context != REPO:
            problems.append(f"{name}: build context {context} is not the repository root")
            continue
        if not dockerfile.is_file():
            problems.append(f"{name}: dockerfile {dockerfile} does not exist")
            continue
        df = parse(dockerfile.read_text())
        entry = svc.get("entrypoint")
        entry = shlex.split(entry) if isinstance(entry, str) else list(entry or [])
        if not entry and df.of("ENTRYPOINT"):
            entry = df.of("ENTRYPOINT")[-1].args
        command = svc.get("command")
        command = shlex.split(command) if isinstance(command, str) else list(command or [])
        problems += _command_problems(df, entry + command, f"{path.name} service {name}")
    assert problems == []


def test_the_reader_sees_copies_and_continuations() -> None:
    df = parse("FROM x\nWORKDIR /w\nCOPY a b ./\n# note\nRUN echo \\\n  hi\nCOPY --from=base /x /y\nCOPY c ./d\n")
    assert df.copies() == [("a", "/w/a", 3), ("b", "/w/b", 3), ("c", "/w/d", 8)]
    assert df.of("RUN")[0].args == ["echo", "hi"]
    assert PIP_INSTALLS_PROJECT.search('pip install --no-cache-dir ".[mpi]"') and PIP_INSTALLS_PROJECT.search("pip install .")
    assert not PIP_INSTALLS_PROJECT.search("pip install torch==2.13.0")
