"""Every ``torchcomms-run`` command line in README.md's code blocks (and each ``docker run`` of the
project's images, whose entry point is ``torchcomms-run``) is one the launcher's own parser takes,
in the environment it is written for (a Slurm step, an ``mpiexec`` rank, a node with GPUs); and every
``examples/*.py`` script named there takes the flags written after it. Nothing is run but the
scripts' ``--help``."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from launcher.args import parse_args
from tests.helpers.paths import REPO, child_pythonpath

README = REPO / "README.md"
#: where a command line ends (what follows it in the same shell line is another command)
SEPARATORS = {"&&", "||", ";", "|"}
IMAGE = re.compile(r"torchcomms:[\w.-]+")
#: a node with 8 GPUs, for ``--nproc-per-node gpu``
GPU_NODE = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


def code_lines() -> list[str]:
    """The lines of README.md's fenced code blocks, shell continuations joined."""
    lines, block = [], False
    for line in README.read_text().replace("\\\n", " ").splitlines():
        if line.startswith("```"):
            block = not block
        elif block:
            lines.append(line)
    return lines


def launcher_commands() -> list[tuple[list[str], list[str]]]:
    """Each launcher command of the README's code blocks: ``(what starts it, the launcher's arguments)``."""
    found = []
    for line in code_lines():
        if "torchcomms-run" not in line and not ("docker run" in line and IMAGE.search(line)):
            continue
        words = shlex.split(line, comments=True)
        at = next(i for i, w in enumerate(words) if w == "torchcomms-run" or IMAGE.fullmatch(w))
        end = next((i for i, w in enumerate(words) if i > at and w in SEPARATORS), len(words))
        before = next((i + 1 for i in range(at - 1, -1, -1) if words[i] in SEPARATORS), 0)
        found.append((words[before:at], words[at + 1:end]))
    return found


COMMANDS = launcher_commands()


def example_runs() -> list[list[str]]:
    """Each ``examples/*.py`` script the README's commands run, with the arguments written after it."""
    runs = []
    for _, args in COMMANDS:
        at = next((i for i, a in enumerate(args) if a.startswith("examples/")), None)
        if at is not None:
            runs.append(args[at:])
    return runs

def environment(started_by: list[str], secret: str) -> tuple[dict[str, str], dict[str, str]]:
    """The environment a command is written for, from what starts it (``srun``, ``mpiexec -n N``),
    and the values of the shell variables it uses."""
    env = dict(GPU_NODE)
    variables = {"SECRET": secret, "SLURM_JOB_ID": "4242"}
    if started_by[:1] == ["srun"]:  # the README's sbatch script: 4 nodes, one launcher each
        env.update(SLURM_PROCID="0", SLURM_STEP_ID="0", SLURM_NTASKS="4", SLURM_NNODES="4", SLURM_NODEID="0",
                   SLURM_STEP_NODELIST="node[0-3]", SLURM_JOB_ID="4242")
    elif started_by[:1] == ["mpiexec"]:  # one launcher per rank, every rank on this host
        size = started_by[started_by.index("-n") + 1]
        env.update(OMPI_COMM_WORLD_SIZE=size, OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_LOCAL_SIZE=size,
                   OMPI_COMM_WORLD_LOCAL_RANK="0", PMIX_NAMESPACE="prterun-node0-4242@1")
    else:
        assert started_by in ([], ["docker", "run", "--rm"], ["docker", "run", "--rm", "--gpus", "all",
                                                                 "--ipc=host"]), \
            f"README starts torchcomms-run with {started_by}: say here what environment that gives it"
    return env, variables


def expand(word: str, variables: dict[str, str]) -> str:
    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in variables, f"README's command uses ${name}: give it a value in this test"
        return variables[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, word)


def test_the_readme_names_its_jobs():
    assert {"examples/train_ddp.py", "examples/elastic_train.py", "examples/train_elastic_fsdp.py"} <= \
        {run[0] for run in example_runs()}

@pytest.mark.parametrize(("started_by", "args"), COMMANDS, ids=[" ".join(a) for _, a in COMMANDS])
def test_command_parses(tmp_path, started_by, args):
    secret = tmp_path / "job.secret"
    secret.write_text("ab" * 32)
    env, variables = environment(started_by, str(secret))
    cfg = parse_args([expand(a, variables) for a in args], env)
    if "/" in cfg.entrypoint:  # a script of this repository (``train.py`` stands for the reader's own)
        assert (REPO / cfg.entrypoint).is_file(), cfg.entrypoint


#: runs each example with the README's arguments and ``--help`` last (argparse converts and checks
#: the values of the flags before it, then prints the help and exits), in one interpreter
_HELP_RUNNER = """
import contextlib, io, json, runpy, sys
results = []
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    sys.argv = [*argv, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(argv[0], run_name="__main__")
        code = None  # the script ran instead of printing its help
    except SystemExit as exc:
        code = exc.code
    results.append([code, out.getvalue()])
print(json.dumps(results))
"""


def test_examples_take_the_readme_flags():
    runs = example_runs()
    proc = subprocess.run([sys.executable, "-c", _HELP_RUNNER, json.dumps(runs)], capture_output=True, text=True,
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=child_pythonpath()), timeout=300)
    assert proc.returncode == 0, proc.stderr
    for argv, (code, said) in zip(runs, json.loads(proc.stdout.splitlines()[-1])):
        assert code == 0, f"{' '.join(argv)} --help exited {code}:\n{said}"
        for flag in (a.split("=")[0] for a in argv[1:] if re.match(r"--?[A-Za-z]", a)):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", said), \
                f"README runs {argv[0]} with {flag}, which its --help does not list:\n{said}"
