"""``ordered_map`` (the viewer's parallel parse): results in input order, the first bad input in
order raised, and an error that ends the map early never kills a worker in the middle of an
item (a killed worker can leave a result half-written into the pool's pipe or a pipe lock held:
the viewer's load once stalled 131 s stopping its pool after a bad dump). With limits, an input
that runs for ever inside C, or kills its worker, is reported at its turn, after those before it."""
from __future__ import annotations

import ctypes
import gc
import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from torchcomms.tracing.viewer.parallel import AnswerTooLarge, Limits, WorkerDied, ordered_map

ITEMS = 16
SLOW_ITEM_S = 0.5
HANG_S = 60  # a map of four trivial inputs not done by then hangs


def _square(i: int) -> int:
    return i * i


def _bad_at(i: int) -> int:
    if i in (5, 9):
        raise ValueError(f"bad input {i}")
    return i


def _hash_for_ever_at_5(i: int) -> int:
    if i == 5:
        t: tuple[object, ...] = ()
        for _ in range(60):
            t = (t, t)
        hash(t)  # tuples do not cache their hash: 2**60 steps inside C, deaf to Python's signals
    return i


def _killed_at_3(i: int) -> int:
    if i == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return i


def _crash_at_2(i: int) -> int:
    if i == 2:
        ctypes.memset(0, 0, 1)  # a write to address 0, inside C
    return i


def _collect(i: int) -> int:
    gc.collect()
    return i


class _Cycle:
    """Garbage holding ``x`` that only the cyclic collector frees."""

    def __init__(self, x: object) -> None:
        self.x, self.cycle = x, self


class _MadeHereOnly:
    """Garbage (a cycle: only the collector frees it) whose finalizer works only in the process
    that made it, as a native handle whose threads a forked child lacks: elsewhere it crashes."""

    def __init__(self) -> None:
        self.pid, self.cycle = os.getpid(), self

    def __del__(self) -> None:
        if os.getpid() != self.pid:
            ctypes.memset(0, 0, 1)


def _one_cpu_second(i: int) -> Limits:
    return Limits(cpu_s=1)


def _bytes(i: int) -> bytes:
    return b"x" * i


def _answers_of_a_kilobyte(i: int) -> Limits:
    return Limits(cpu_s=1, answer_bytes=1024)


def _slow_after_a_bad_first(item: tuple[str, int]) -> int:
    folder, i = item
    if i == 0:
        # fail only once the other worker runs an item: raised at once, the error could reach the
        # caller (on a loaded host) before any item had been handed over, and nothing would be
        # left to check
        deadline = time.monotonic() + 60
        while not Path(folder, "started-1").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        raise ValueError("bad input 0")
    Path(folder, f"started-{i}").write_text(str(os.getpid()))
    time.sleep(SLOW_ITEM_S)
    Path(folder, f"done-{i}").write_text("")
    return i


def test_results_come_in_input_order() -> None:
    assert list(ordered_map(_square, list(range(40)), workers=3)) == [i * i for i in range(40)]


def test_the_first_bad_input_in_order_is_raised_after_the_good_ones_before_it() -> None:
    got: list[int] = []
    with pytest.raises(ValueError, match="bad input 5"):
        for r in ordered_map(_bad_at, list(range(ITEMS)), workers=3):
            got.append(r)
    assert got == [0, 1, 2, 3, 4]


def test_an_early_error_lets_every_started_item_finish(tmp_path: Path) -> None:
    items = [(str(tmp_path), i) for i in range(ITEMS)]
    with pytest.raises(ValueError, match="bad input 0"):
        list(ordered_map(_slow_after_a_bad_first, items, workers=2))
    started = {p.name.split("-")[1] for p in tmp_path.glob("started-*")}
    done = {p.name.split("-")[1] for p in tmp_path.glob("done-*")}
    assert started, "no item had started when the error came"
    assert done == started, f"items {sorted(started - done)} were killed while they ran"
    assert len(started) < ITEMS - 1, "the map went on with items after its error"


def test_an_input_past_its_cpu_limit_is_reported_at_its_turn_after_those_before_it() -> None:
    got: list[int] = []
    with pytest.raises(WorkerDied) as info:
        for r in ordered_map(_hash_for_ever_at_5, list(range(ITEMS)), workers=2, limits=_one_cpu_second):
            got.append(r)
    assert got == [0, 1, 2, 3, 4]
    assert info.value.item == 5 and info.value.out_of_cpu, info.value


def test_a_worker_that_dies_is_reported_at_its_input_s_turn_and_a_single_input_runs_in_one() -> None:
    got: list[int] = []
    with pytest.raises(WorkerDied) as info:
        for r in ordered_map(_killed_at_3, list(range(5)), workers=1, limits=_one_cpu_second):
            got.append(r)
    assert got == [0, 1, 2]
    assert info.value.item == 3 and info.value.exitcode == -signal.SIGKILL and not info.value.out_of_cpu
    assert "killed by SIGKILL" in str(info.value)
    assert list(ordered_map(lambda _: os.getpid(), [0], limits=_one_cpu_second)) != [os.getpid()]


def _pid_then_killed_at_3(item: tuple[str, int]) -> int:
    folder, i = item
    (Path(folder) / f"pid-{os.getpid()}").touch()
    return _killed_at_3(i)


def test_answers_already_sent_by_a_worker_that_died_are_kept_when_handing_it_more_fails(tmp_path: Path) -> None:
    """The worker answers 1 and 2 and dies at 3 while the caller still reads 0; handing it input
    4 then fails (its pipe is closed), and the answers in the pipe still come first: 3 is the
    input reported, not 1."""
    got: list[int] = []
    with pytest.raises(WorkerDied) as info:
        for r in ordered_map(_pid_then_killed_at_3, [(str(tmp_path), i) for i in range(8)], workers=1,
                             limits=_one_cpu_second):
            got.append(r)
            if r == 0:  # let the worker answer 1 and 2 and die at 3 before the next input is handed out
                pid = int(next(tmp_path.glob("pid-*")).name[4:])
                while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
                    time.sleep(0.01)
    assert got == [0, 1, 2]
    assert info.value.item == (str(tmp_path), 3) and info.value.exitcode == -signal.SIGKILL


def test_an_answer_past_its_bound_is_not_sent_and_is_reported_at_its_turn() -> None:
    got: list[bytes] = []
    with pytest.raises(AnswerTooLarge) as info:
        for r in ordered_map(_bytes, [1, 10, 100, 1 << 20, 5], workers=1, limits=_answers_of_a_kilobyte):
            got.append(r)
    assert got == [b"x", b"x" * 10, b"x" * 100]
    assert info.value.item == 1 << 20 and info.value.size > 1 << 20


def test_a_crash_in_a_worker_is_reported_with_the_function_it_crashed_in() -> None:
    got: list[int] = []
    with pytest.raises(WorkerDied) as info:
        for r in ordered_map(_crash_at_2, list(range(4)), workers=1, limits=_one_cpu_second):
            got.append(r)
    assert got == [0, 1]
    assert info.value.item == 2 and info.value.exitcode == -signal.SIGSEGV, info.value
    assert "killed by SIGSEGV in _crash_at_2 (test_parallel_map.py:" in str(info.value), info.value
    assert "Fatal Python error: Segmentation fault" in info.value.fault


def test_a_worker_never_finalizes_garbage_it_inherited() -> None:
    """A worker's full collection (here asked for; in a suite run, the first one the collector
    made on its own) once finalized the caller's garbage and died of SIGSEGV."""
    collecting = gc.isenabled()
    gc.disable()  # the garbage is still there when the pool forks
    try:
        _MadeHereOnly()
        assert list(ordered_map(_collect, list(range(4)), workers=2, limits=_one_cpu_second)) == [0, 1, 2, 3]
    finally:
        if collecting:
            gc.enable()
        gc.collect()  # finalized here, where it was made


def test_a_worker_never_finalizes_a_gloo_process_group_it_inherited() -> None:
    """Finalized in a forked child, torch's gloo process group waits for ever on a condition
    variable of its threads, which the child lacks: the workers, and the map, hung."""
    import torch.distributed as dist

    got: list[int] = []
    collecting = gc.isenabled()
    gc.disable()  # the garbage is still there when the pool forks
    try:
        _Cycle(dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=60)))
        runner = threading.Thread(target=lambda: got.extend(
            ordered_map(_collect, list(range(4)), workers=2, limits=_one_cpu_second)), daemon=True)
        runner.start()
        runner.join(HANG_S)
        assert not runner.is_alive(), "the map hangs: a worker finalizes the caller's process group"
        assert got == [0, 1, 2, 3]
    finally:
        if collecting:
            gc.enable()
        gc.collect()  # finalized here, where its threads run
