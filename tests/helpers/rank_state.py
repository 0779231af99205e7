"""A pooled MPI rank's process state between targets (see :mod:`tests.helpers.mpi_pool`).

A rank of the pool runs one target after another in one process, so that each target must find
the process as a fresh rank would after ``import torch, torchcomms`` and MPI's initialisation,
and a target that leaves something behind must not run beside the next one.
:class:`RankState` captures that state once, at the rank's start, and then

* :meth:`RankState.restore` puts it back before each target: the working directory,
  ``os.environ`` (the job's, plus the request's per-target variables), ``sys.argv``,
  ``sys.path``, ``sys.std*``, the test modules the last target imported (dropped, so that each
  target imports its worker module afresh), the Python-level signal handlers, the warning
  filters, the root logger, torch's default dtype and device, grad mode, intra-op threads and
  random generator (seeded afresh where a fresh process seeds it at random; Python's and
  numpy's generators, seeded at random in a fresh process, simply go on), and the library's
  process-wide state (:data:`LIBRARY_STATE`: each entry says what happens to it);
* :meth:`RankState.leftovers` names what a target left that the next one would see: a
  communicator it did not finalize (whether dropped or still referenced), a thread still
  running, an exit handler it registered, an MPI request still pending or abandoned, an
  aborted communicator still blocked in MPI (the MPI backend would end the job over it at
  exit), an engine, store, store watch or failure monitor still held. Any of them ends the job after that target, through the
  ranks' normal exit (``sys.exit(0)``: the exit handlers, then ``MPI_Finalize``), as a fresh
  job of that target would end, and its exit status is checked as a fresh job's is. A target
  that left nothing has no exit of its own: nothing of it is left for one to run.

Communicators are found through the library's name registry: ``NAMES.bind`` (every
communicator's creation calls it) is wrapped to keep each communicator a target creates until
that target ended, so that one the target dropped without ``finalize()`` is seen too. (Keeping
it changes nothing MPI sees: nothing of the library frees an MPI communicator when its object
is collected.)

MPI itself is initialised once per job, at the rank's start, through the library's own
``_runtime()`` (as the first communicator of a fresh rank would do it): a target that depends
on what happens at MPI's initialisation (it sets MPI's variables itself) needs a job of its own
(``run_mpi_ranks(..., pool=False)``).
"""
from __future__ import annotations

import ast
import atexit
import enum
import gc
import importlib
import itertools
import logging
import os
import pkgutil
import re
import signal
import sys
import threading
import time
import types
import typing
import warnings
from datetime import timedelta
from pathlib import Path, PurePath
from typing import Any

#: how long a thread a target started (a communicator's watchdog, woken by ``finalize``) may
#: take to end before it counts as left behind
THREADS_END_S = 2.0

#: The library's module-level state and what the pool does with it between targets. Every
#: module-level name of ``torchcomms`` that holds mutable state is listed (a test,
#: ``tests/mpi/test_rank_pool.py``, compares this with :func:`library_globals`): "reset" is
#: put back as a fresh process has it before each target; "checked" must be empty after a
#: target or the job ends (see :meth:`RankState.leftovers`); "kept" stays, for the reason given.
LIBRARY_STATE: dict[str, str] = {
    "torchcomms.core.names.NAMES": "reset: no name alive (checked), no incarnation counted",
    "torchcomms.core.dispatch.OP_IDS": "reset: op ids count from 1 again (rebound in every module holding it)",
    "torchcomms.core.dispatch._DTYPE_NAMES": "kept: a cache of dtype names",
    "torchcomms.core.store_calls.PARKED": "checked: no parked call still running",
    "torchcomms.setup.bootstrap.STORES": "checked: no store made or being made",
    "torchcomms.recovery.store_watch.WATCHES": "checked: no store watch",
    "torchcomms.recovery.failure_monitor.MONITORS": "checked: no failure monitor",
    "torchcomms.backends.exit_release._LIVE": "checked: no gloo/nccl engine alive",
    "torchcomms.backends.gloo._ABANDONED": "checked: no abandoned gloo engine",
    "torchcomms.backends.nccl._ABANDONED": "checked: no abandoned nccl engine",
    "torchcomms.csrc.gloo_guard._lib": "kept: gloo's size-mismatch guard, installed once per process (a parked "
                                       "thread's engine is abandoned, which is checked)",
    "torchcomms.csrc.gloo_guard._tried": "kept: whether the guard was installed, once per process",
    "torchcomms.backends.mpi.backend._RUNTIME": (
        "kept: MPI, its user-defined reduce ops and the progress thread (made once per process, as at "
        "a fresh rank's first communicator) and the all-reduce pace found from the job's own MPI settings; "
        "checked: no pending or abandoned request, no aborted communicator that exit would end the job over"),
    "torchcomms.backends.registry._registered": "kept: backend classes found (the same for every target)",
    "torchcomms._comms.eager._DISABLED": "kept: the route's call with dynamo off, made once per process (stateless)",
    "torchcomms.config._cached": "reset: settings are read from the environment again",
    "torchcomms.tracing.flight_recorder._PROCESS_RECORDER": "reset: a fresh process recorder (no records, no comms)",
    "torchcomms.tracing.attach._attached": "reset",
    "torchcomms.tracing.attach._last_failure": "reset",
    "torchcomms.tracing.attach._process_hooks_installed": "reset: installed again on the fresh recorder (SIGUSR1 "
                                                          "handler restored first)",
    "torchcomms.tracing.attach._previous_sigusr1": "reset",
    "torchcomms.tracing.attach._FOLLOWER": "kept: stateless",
    "torchcomms.tracing.logging._config": "reset: configured from the environment again on first use",
    "torchcomms.tracing.logging._attached": "reset",
    "torchcomms.tracing.spans._recorder": "checked: none made (its exporter thread and exit handler are checked too)",
    "torchcomms.tracing.spans._attached": "reset",
    "torchcomms.tracing.debug_handlers._registered": "kept: torch's handler registry is per process; the handlers "
                                                     "read the current recorder",
    "torchcomms.functional.ops.COMMS": "reset: names of dropped communicators",
    "torchcomms.functional._REGISTRY": "reset: the same mapping as torchcomms.functional.ops.COMMS",
}

_TORCH_DEFAULT_SEED = 67280421310721  # c10's default_rng_seed_val

_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, tuple, frozenset, range, type, types.ModuleType,
              types.FunctionType, types.BuiltinFunctionType, enum.Enum, re.Pattern, typing.TypeVar, timedelta,
              types.UnionType, types.GenericAlias, typing._GenericAlias, PurePath,  # type: ignore[attr-defined]
              logging.Logger, type(threading.Lock()), type(threading.RLock()))
_MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "remove", "discard",
             "clear", "appendleft", "__setitem__"}


def library_globals() -> set[str]:
    """Every module-level name of ``torchcomms`` (``module.name``) that holds mutable state:
    rebound by a ``global`` statement, or bound to an object that is not immutable (a plain
    dict, list or set only when the module changes it: the others are constant tables)."""
    import torchcomms

    found = set()
    for info in pkgutil.walk_packages(torchcomms.__path__, "torchcomms."):
        if ".viewer" in info.name or info.name.endswith(".__main__"):
            continue  # the trace viewer (never loaded by the library, ARCHITECTURE.md); command lines
        try:
            module = importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - an engine this machine lacks (triton, CUDA)
            continue
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        assigned, rebound, changed = set(), set(), set()
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            assigned |= {t.id for t in targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                rebound |= set(node.names)
            elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and not isinstance(
                    node.ctx, ast.Load):
                changed.add(node.value.id)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and isinstance(node.func.value, ast.Name) and node.func.attr in _MUTATORS):
                changed.add(node.func.value.id)
        for name in assigned | rebound:
            if name.startswith("__") or name not in vars(module):
                continue
            value = vars(module)[name]
            if name in rebound:
                found.add(f"{module.__name__}.{name}")
            elif isinstance(value, (dict, list, set)) and type(value) in (dict, list, set):
                if name in changed:
                    found.add(f"{module.__name__}.{name}")
            elif not isinstance(value, _IMMUTABLE) and type(value) is not object:  # object(): a sentinel
                found.add(f"{module.__name__}.{name}")
    return found


class RankState:
    """This rank's process state as captured at its start (see the module's docstring)."""

    def __init__(self) -> None:
        import torch

        from torchcomms.backends.mpi import backend as mpi_backend
        from torchcomms.core import names

        self.cwd = os.getcwd()
        self.environ = dict(os.environ)
        self.path = list(sys.path)
        self.modules = set(sys.modules)
        self.signals = {s: h for s in signal.valid_signals() if _settable(s) and (h := signal.getsignal(s)) is not None}
        self.streams = (sys.stdin, sys.stdout, sys.stderr)
        self.warning_filters = list(warnings.filters)
        root = logging.getLogger()
        self.root_logging = (root.level, list(root.handlers))
        self.torch = (torch.get_default_dtype(), torch.get_default_device(), torch.is_grad_enabled(),
                      torch.get_num_threads(), torch.get_rng_state())
        #: whether a fresh process's generator starts from a seed of its own (torch 2.13 seeds it
        #: at random), not from the fixed default of older torch versions
        self.random_seed = torch.initial_seed() != _TORCH_DEFAULT_SEED
        self.threads = set(threading.enumerate())
        self.exit_handlers = atexit._ncallbacks()
        self.runtime = mpi_backend._RUNTIME
        self.created: list[Any] = []  # the communicators (their cores) the current target created
        bind = names.NAMES.bind

        def recording_bind(name: str, owner: Any) -> None:
            self.created.append(owner)
            bind(name, owner)

        names.NAMES.bind = recording_bind  # type: ignore[method-assign]

    # ------------------------------------------------------------------------------ restore
    def restore(self, per_target_env: dict[str, str], argv: list[str]) -> None:
        """The process as it was at the rank's start, with ``per_target_env`` set."""
        import torch

        self.created.clear()
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.environ)
        os.environ.update(per_target_env)
        sys.argv[:] = argv
        sys.path[:] = self.path
        sys.stdin, sys.stdout, sys.stderr = self.streams
        for name in [m for m in sys.modules if m not in self.modules and (m == "tests" or m.startswith("tests."))]:
            del sys.modules[name]
        for s, handler in self.signals.items():
            if signal.getsignal(s) is not handler:
                signal.signal(s, handler)
        warnings.filters[:] = self.warning_filters
        warnings._filters_mutated()  # type: ignore[attr-defined] - forgets which warnings were shown once
        root = logging.getLogger()
        root.setLevel(self.root_logging[0])
        root.handlers[:] = self.root_logging[1]
        dtype, device, grad, threads, rng = self.torch
        torch.set_default_dtype(dtype)
        if torch.get_default_device() != device:
            torch.set_default_device(device)
        torch.set_grad_enabled(grad)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if self.random_seed:
            torch.seed()  # a seed of its own, as each fresh process has
        else:
            torch.set_rng_state(rng)
        _reset_library()

    # ---------------------------------------------------------------------------- leftovers
    def leftovers(self) -> list[str]:
        """What the target that just ended left behind (empty: the next target may run here)."""
        from torchcomms.core.state import CommState

        gc.collect()
        found = [f"communicator {c.name!r} is {c.state}, not finalized" for c in self.created
                 if c.state is not CommState.FINALIZED]
        self.created.clear()
        progress = self.runtime.get("progress")
        if progress is not None and (progress._pending or progress.abandoned):
            found.append(f"{len(progress._pending)} MPI request(s) pending, {len(progress.abandoned)} abandoned")
        stuck = [name for name, busy in self.runtime.get("stuck", ()) if busy()]
        if stuck:  # one whose requests all ended is inert (the library's exit check reads it alike)
            found.append("aborted communicator(s) still blocked in MPI: " + ", ".join(stuck))
        found += _held_by_the_library()
        if atexit._ncallbacks() > self.exit_handlers:
            found.append(f"{atexit._ncallbacks() - self.exit_handlers} exit handler(s) registered")
        keep = set(self.threads)
        if progress is not None and progress._thread is not None:
            keep.add(progress._thread)  # the process's one progress thread (made by the first async op)
        deadline = time.monotonic() + THREADS_END_S
        while (extra := [t for t in threading.enumerate() if t not in keep]) and time.monotonic() < deadline:
            time.sleep(0.01)
        found += [f"thread {t.name!r} still running" for t in extra]
        return found


def _settable(s: signal.Signals) -> bool:
    try:
        signal.getsignal(s)
    except (ValueError, OSError):
        return False
    return s not in (signal.SIGKILL, signal.SIGSTOP)


def _module(name: str) -> Any:
    """``name`` if some target imported it already (nothing is imported for a reset)."""
    return sys.modules.get(name)


def _held_by_the_library() -> list[str]:
    """The "checked" entries of :data:`LIBRARY_STATE` that hold something."""
    found = []
    checks = {
        "torchcomms.core.store_calls": lambda m: m.PARKED.running() and "parked store call(s) still running",
        "torchcomms.setup.bootstrap": lambda m: (m.STORES._stores or m.STORES._connecting or m.STORES._control)
        and "store(s) made or being made",
        "torchcomms.recovery.store_watch": lambda m: m.WATCHES._watches and "store watch(es)",
        "torchcomms.recovery.failure_monitor": lambda m: m.MONITORS._monitors and "failure monitor(s)",
        "torchcomms.backends.exit_release": lambda m: len(m._LIVE) and "gloo/nccl engine(s) alive",
        "torchcomms.backends.gloo": lambda m: m._ABANDONED and "abandoned gloo engine(s)",
        "torchcomms.backends.nccl": lambda m: m._ABANDONED and "abandoned nccl engine(s)",
        "torchcomms.tracing.spans": lambda m: m._recorder is not None and "a span recorder",
    }
    for name, check in checks.items():
        module = _module(name)
        if module is not None and (what := check(module)):
            found.append(what)
    return found


def _reset_library() -> None:
    """The "reset" entries of :data:`LIBRARY_STATE` (after a target that left nothing behind)."""
    from torchcomms.core import dispatch, names

    with names.NAMES._lock:
        names.NAMES._live.clear()
        names.NAMES._incarnations.clear()
    old, fresh = dispatch.OP_IDS, itertools.count(1)
    for module in [m for n, m in list(sys.modules.items()) if n.startswith("torchcomms") and m is not None]:
        if vars(module).get("OP_IDS") is old:
            module.OP_IDS = fresh
    if (config := _module("torchcomms.config")) is not None:
        with config._lock:
            config._cached = None
    if (recorder := _module("torchcomms.tracing.flight_recorder")) is not None:
        with recorder._PROCESS_LOCK:
            recorder._PROCESS_RECORDER = None
    if (attach := _module("torchcomms.tracing.attach")) is not None:
        with attach._lock:
            attach._attached.clear()
            attach._last_failure.clear()
            attach._process_hooks_installed = False
            attach._previous_sigusr1 = None
    if (log := _module("torchcomms.tracing.logging")) is not None:
        with log._config_lock:
            if log._config is not None:
                log._config.sink.close()
            log._config = None
        log._attached.clear()
    if (spans := _module("torchcomms.tracing.spans")) is not None:
        spans._attached.clear()
    if (ops := _module("torchcomms.functional.ops")) is not None:
        ops.COMMS.clear()


__all__ = ["LIBRARY_STATE", "RankState", "library_globals"]
