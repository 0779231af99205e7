"""Pickles that make ``pickle.load`` itself run for ever, or that need far more memory than a
dump: each is refused with one line naming the file, alone or among many files, read serially
or in worker processes, on an idle or a saturated CPU; sound dumps still load on a saturated CPU.

Every load runs in a child process under a wall-clock guard (:data:`HANG_S`), so a viewer that
hangs fails the test instead of hanging the suite. The guard bounds a hang; it is no timing
claim (the refusals come from the CPU time a worker spends, which a busy machine does not shorten).
"""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tracing._support import REPO, Rec, write_job
from tests.helpers.cpu_load import oversubscribed
from tests.helpers.paths import child_pythonpath

#: the wall-clock guard of one child process: far past what a refusal takes on a loaded box
HANG_S = 240
#: the CPU budget of a dump in the children that lower it (the viewer's default is generous)
TEST_CPU_S = 1

# Loads the files in argv[3:] with argv[2] workers and prints the ranks or the one-line error;
# argv[1] is a CPU budget in seconds ("-": the viewer's own). A viewer without the budget module
# loads with no bound at all: a hanging pickle then hangs, and the guard fails the test.
_LOAD = textwrap.dedent("""
    import sys
    from torchcomms.tracing.viewer.load import TraceInputError, load_dumps
    if sys.argv[1] != "-":
        try:
            from torchcomms.tracing.viewer import budget
            budget.CPU_S = int(sys.argv[1])
        except ImportError:
            pass
    try:
        ts = load_dumps(sys.argv[3:], workers=int(sys.argv[2]))
    except TraceInputError as exc:
        print(exc)
        sys.exit(2)
    print("loaded", *ts.ranks)
""")


def _bin_str(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b  # BINUNICODE


def hash_bomb(where: str, depth: int = 60) -> bytes:
    """A dump-shaped pickle (version and entries present) holding a tuple ``t`` nested ``depth``
    deep, each level ``(t, t)`` of the level below (BINGET from the memo), as a dict key, in a
    set or in a frozenset. Inserting it hashes it; tuples do not cache their hash, so that costs
    ``2**depth`` steps inside C, where no Python signal handler runs."""
    chain = b"NN\x86q\x00" + b"".join(b"h" + bytes([i]) + b"\x86q" + bytes([i + 1]) for i in range(depth))
    item = {"dict key": chain + b"N",  # key, value (None)
            "set": _bin_str("bomb") + b"\x8f(" + chain + b"\x90",  # EMPTY_SET, MARK, ADDITEMS
            "frozenset": _bin_str("bomb") + b"(" + chain + b"\x91"}[where]  # MARK, FROZENSET
    return b"\x80\x04}(" + _bin_str("version") + _bin_str("2.10") + _bin_str("entries") + b"]" + item + b"u."


def _load(files: list[Path], workers: int, cpu_s: int | None = TEST_CPU_S,
          memory_cap: int | None = None) -> subprocess.CompletedProcess[str]:
    """``load_dumps(files)`` in a child process (``memory_cap``: its address space, a safety
    net for the box should the viewer's own bound fail)."""
    def cap() -> None:
        if memory_cap is not None:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (memory_cap, memory_cap))

    env = dict(os.environ, PYTHONPATH=child_pythonpath())
    try:
        return subprocess.run(
            [sys.executable, "-c", _LOAD, "-" if cpu_s is None else str(cpu_s), str(workers), *map(str, files)],
            capture_output=True, text=True, cwd=REPO, env=env, timeout=HANG_S, preexec_fn=cap)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the load of {[f.name for f in files]} did not end within {HANG_S} s: it hangs")


def _refused(res: subprocess.CompletedProcess[str], name: str, why: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and why in lines[0], res.stdout


@pytest.fixture(scope="module")
def sound_dumps(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """8 ranks' dumps of 2,048 entries each, as the recorder writes them."""
    out = tmp_path_factory.mktemp("sound")
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "trace_dumps_gen.py"), str(out), "--ranks", "8",
                    "--entries", "2048", "--procs", "1"], check=True, capture_output=True, cwd=REPO)
    return sorted(out.iterdir())


@pytest.mark.parametrize("where", ["dict key", "set", "frozenset"])
def test_a_pickle_whose_load_never_returns_is_refused(tmp_path: Path, where: str) -> None:
    bomb = tmp_path / "bomb_0"
    bomb.write_bytes(hash_bomb(where))
    assert bomb.stat().st_size < 400
    _refused(_load([bomb], workers=1), "bomb_0", "of CPU")


def test_among_many_files_the_hanging_one_is_refused_in_its_turn(tmp_path: Path, sound_dumps: list[Path]) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    for path in sound_dumps:
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "fr_rank_5").write_bytes(hash_bomb("set"))  # 6th of 9 by name
    (folder / "fr_rank_9").write_bytes(b"\x80\x04}(")  # truncated: the later error is not the one named
    _refused(_load([folder], workers=2), "fr_rank_5", "of CPU")
    _refused(_load([folder / "fr_rank_1", folder / "fr_rank_5"], workers=1), "fr_rank_5", "of CPU")


def test_the_cli_refuses_a_hanging_pickle_in_one_line_within_its_budget(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb_0"
    bomb.write_bytes(hash_bomb("dict key"))
    try:
        res = subprocess.run([sys.executable, "-m", "torchcomms.tracing.viewer", "analyze", str(bomb),
                              "--dump-cpu-s", str(TEST_CPU_S)],
                             capture_output=True, text=True, cwd=REPO, timeout=HANG_S,
                             env=dict(os.environ, PYTHONPATH=child_pythonpath()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchcomms-trace analyze did not end within {HANG_S} s: it hangs")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "bomb_0" in lines[0] and "of CPU" in lines[0], res.stderr


def test_a_pickle_that_crashes_the_interpreter_is_refused(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb_0"  # a dict key of a tuple nested a million deep: hashing it overflows the C stack
    bomb.write_bytes(b"\x80\x04}(" + _bin_str("version") + _bin_str("2.10") + _bin_str("entries") + b"]N"
                     + b"\x85" * 1_000_000 + b"Nu.")
    res = _load([bomb], workers=1)
    _refused(res, "bomb_0", "the process reading it was killed by SIG")
    assert " in _read_raw (load.py:" in res.stdout, res.stdout  # where it crashed, from the worker's faulthandler


def test_a_name_that_spells_out_past_the_memory_bound_is_refused(tmp_path: Path) -> None:
    import pickle

    dump = pickle.loads(write_job(tmp_path / "good", {0: [Rec("c0", (0,), 0, "all_reduce", 1).complete()]})[0]
                        .read_bytes())
    dump["entries"][0]["profiling_name"] = ["x" * (1 << 20)] * 100_000  # one MiB 100,000 times: 100 GiB as text
    bomb = tmp_path / "bomb_0"
    bomb.write_bytes(pickle.dumps(dump, protocol=4))
    assert bomb.stat().st_size < 2 << 20
    _refused(_load([bomb], workers=1, cpu_s=None, memory_cap=6 << 30), "bomb_0", "of memory")


def test_a_dump_whose_parse_is_far_larger_than_the_file_is_refused(tmp_path: Path) -> None:
    import pickle

    dump = pickle.loads(write_job(tmp_path / "good", {0: [Rec("c0", (0,), 0, "all_reduce", 1).complete()]})[0]
                        .read_bytes())
    laughs: list[object] = ["x" * 10]
    for _ in range(5):
        laughs = [laughs] * 10
    dump["torchcomms"]["host"] = laughs  # the host's name, spelled out: 1.4 MB from a file of 1.5 KB
    bomb = tmp_path / "bomb_0"
    bomb.write_bytes(pickle.dumps(dump, protocol=4))
    _refused(_load([bomb], workers=1), "bomb_0", "parsed, it takes")


@pytest.fixture
def saturated_cpu() -> Iterator[int]:
    """Eight busy loops on a CPU of this test's own, to which the test is confined meanwhile."""
    with oversubscribed(per_core=8, limit_s=HANG_S) as loops:
        yield loops


def test_sound_dumps_load_on_a_saturated_cpu_and_a_hanging_one_is_still_refused(
        tmp_path: Path, sound_dumps: list[Path], saturated_cpu: int) -> None:
    res = _load(sound_dumps, workers=2, cpu_s=None)  # the viewer's own budget, in parallel
    assert res.returncode == 0 and res.stdout.split() == ["loaded", *map(str, range(8))], res.stdout + res.stderr
    bomb = tmp_path / "bomb_0"
    bomb.write_bytes(hash_bomb("frozenset"))
    _refused(_load([sound_dumps[0], bomb], workers=1), "bomb_0", "of CPU")  # one worker: the sound one read first
