"""``shrink``: survivors agree on who is left and carry on in a new communicator."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from torchcomms.backends.base import BackendContext, TorchCommBackend
from torchcomms.core import error_map
from torchcomms.core.comm_core import CommCore
from torchcomms.core.errors import CommAbortedError, CommError, CommTimeoutError
from torchcomms.core.state import CommState
from torchcomms.core.store_calls import or_store_silent
from torchcomms.core.types import OpName
from torchcomms.recovery.agreement import RoundClosed, agree_on_flag_for, agree_on_survivors
from torchcomms.recovery.engines import build_error, build_until, derived_context

#: Makes the ``TorchComm`` facade of a core (recovery never imports the facade).
MakeComm = Callable[[CommCore], Any]


def shrink(core: CommCore, secs: float, make_comm: MakeComm) -> Any:
    """See ``TorchComm.shrink``: returns the new communicator, retires ``core``."""
    deadline = time.monotonic() + secs
    if core.state not in (CommState.ACTIVE, CommState.BROKEN):
        raise core.refusal(OpName.shrink)
    # nothing may run on the old engine any more
    with core.lock:
        if core.state is CommState.ACTIVE:
            core.life.move(CommState.BROKEN)
            core.broken = CommAbortedError("communicator is being shrunk", comm=core.name, op="shrink")
        pending = core.in_flight_locked()
    core.fail_works(pending, lambda rec: CommAbortedError("communicator is being shrunk", **core.where(rec)))
    in_engine = getattr(core.backend, "shrink_survivors", None)
    if in_engine is not None:  # the engine agrees on the survivors itself (MPI's ULFM): no store
        backend, survivors = _shrink_in_engine(core, in_engine, secs, deadline)
        return _become(core, backend, survivors, core.epoch + 1, make_comm)
    me = core.global_ranks[core.rank]
    epoch = core.epoch
    while True:
        epoch += 1
        try:
            survivors = agree_on_survivors(
                core.ctx.store, f"{core.ctx.store_prefix}/shrink{epoch}", me, list(core.global_ranks),
                lambda: set(core.known_failures()), deadline,
            )
        except Exception as e:  # noqa: BLE001 - a store may raise anything
            raise core.agreement_error(e, secs, core.where(op="shrink")) from e
        if me not in survivors:
            core.expel("excluded from the survivor set")
            raise CommAbortedError(f"this rank ({me}) is not in the survivor set {survivors} agreed at epoch {epoch}",
                                   comm=core.name, op="shrink")
        backend = _build_engine(core, survivors, epoch, deadline, secs)
        if _all_built(core, survivors, epoch, backend, deadline, secs):
            break
        if time.monotonic() >= deadline:
            raise CommTimeoutError(
                f"could not rebuild the engine over the survivors {survivors} within {secs:g} s (a survivor never "
                f"joined its rendezvous{or_store_silent(core.ctx.store)}){_unseen_failures(core)}",
                timeout_s=secs, comm=core.name, op="shrink")
    return _become(core, backend, survivors, epoch, make_comm)


def _unseen_failures(core: CommCore) -> str:
    """What a shrink's timeout adds when nothing reports failures to this communicator (no
    control plane, no store watch): the survivors wait for a dead rank until the deadline."""
    if core.monitor is not None:
        return ""
    return ("; nothing reports failed ranks to this communicator, so survivors wait for a dead rank's "
            "part until the deadline: run under torchcomms-run, or set TORCHCOMM_STORE_WATCH=1 with a store "
            "that outlives the ranks")


def _shrink_in_engine(core: CommCore, shrink_survivors: Callable[[float], tuple[TorchCommBackend, list[int]]],
                      secs: float, deadline: float) -> tuple[TorchCommBackend, list[int]]:
    """The survivors' engine and global ranks from an engine that agrees on them itself
    (``backend.shrink_survivors(deadline)``, which raises ``TimeoutError`` at the deadline)."""
    try:
        return shrink_survivors(deadline)
    except TimeoutError:
        raise CommTimeoutError(f"the survivors did not agree on a communicator within {secs:g} s",
                               timeout_s=secs, comm=core.name, op="shrink") from None
    except BaseException as e:  # noqa: BLE001 - the engine may throw anything
        kind = "" if isinstance(e, CommError) else core.backend.classify_error(e)
        raise error_map.translate_engine_error(e, kind, secs, core.where(op="shrink"), core.global_ranks,
                                               core.monitor) from None


def engine_context(core: CommCore, survivors: list[int], epoch: int, deadline: float) -> BackendContext:
    """The context of the epoch's engine over ``survivors``. Its rendezvous goes through a store
    client of its own: one abandoned at the deadline (or when a survivor failed) stays in its
    store wait until its timeout, and on the communicator's client (a TCPStore's serves one call
    at a time) the agreement on the outcome and the next epoch's build would wait behind it."""
    return derived_context(core, survivors, f"{core.ctx.store_prefix}/e{epoch}",
                           max(1.0, deadline - time.monotonic()), own_store_client=True)


def _build_engine(core: CommCore, survivors: list[int], epoch: int, deadline: float,
                  secs: float) -> TorchCommBackend | None:
    """A fresh engine over ``survivors`` under the epoch's store prefix; ``None`` when a
    survivor failed meanwhile or the build lost a connection to one (the survivors agree on
    that, then again on who is left, at the next epoch). Raises other build errors, after
    telling the other survivors (they do not wait out their deadline for this one)."""
    ctx = engine_context(core, survivors, epoch, deadline)
    try:
        return build_until(core, ctx, deadline)
    except BaseException as e:  # noqa: BLE001 - the engine may throw anything
        if core.known_failures().keys() & set(survivors) or (
                not isinstance(e, CommError) and core.backend.classify_error(e) == "peer"):
            return None
        _all_built(core, survivors, epoch, None, deadline, secs)
        raise build_error(core, e, secs, str(OpName.shrink), None) from None


def _all_built(core: CommCore, survivors: list[int], epoch: int, backend: TorchCommBackend | None,
               deadline: float, secs: float) -> bool:
    """Whether every survivor built the epoch's engine and none is known to have failed since,
    agreed on the store (the AND of each one's outcome, decided for all of ``survivors``).

    A build is not atomic across ranks: a survivor that dies while the others connect can
    leave some with a working engine and some with an error, and those must not part ways (one
    side in the new communicator, the other agreeing again without it). An engine the
    survivors did not agree on is aborted."""
    me = core.global_ranks[core.rank]
    mine = backend is not None and not core.known_failures().keys() & set(survivors)
    try:
        all_ok, decided_for = agree_on_flag_for(core.ctx.store, f"{core.ctx.store_prefix}/shrink{epoch}", 0, me,
                                                survivors, mine, lambda: set(core.known_failures()), deadline)
        # decided without a survivor that failed meanwhile: the engine has a dead member
        agreed = all_ok and decided_for == survivors
    except RoundClosed:
        agreed = False  # decided without this rank: the next epoch's agreement leaves it out
    except Exception as e:  # noqa: BLE001 - a store may raise anything
        if backend is not None:
            backend.abort()
        raise core.agreement_error(e, secs, core.where(op="shrink")) from e
    if not agreed and backend is not None:
        backend.abort()
    return agreed


def _publish_quietly(client: Any, topic: str, payload: dict[str, Any]) -> None:
    """Publish an informative event that nobody waits for; a failure to publish is ignored."""
    try:
        client.publish(topic, payload)
    except Exception:  # noqa: BLE001 - the event is informative only
        pass


def _become(core: CommCore, backend: TorchCommBackend, survivors: list[int], epoch: int, make_comm: MakeComm) -> Any:
    """Retire ``core`` in favour of a communicator over ``survivors``."""
    core.close_engines(abort=True)
    core.retire(CommState.SHRUNK)
    core.release()
    new_core = CommCore(backend, core.derived_options(core.hints), core.store)
    new_core.epoch = epoch
    new_core.failed_global = dict(core.failed_global)
    for table, new_table in ((core.pre_hooks, new_core.pre_hooks), (core.post_hooks, new_core.post_hooks),
                             (core.abort_hooks, new_core.abort_hooks)):
        new_table.update(table)
    new = make_comm(new_core)
    monitor = core.monitor
    if monitor is not None:
        monitor.watch(new_core)
        if new_core.rank == 0:
            # informative only, so published on a thread of its own: a control plane that
            # stops answering now must not hold the shrink past its deadline
            threading.Thread(target=_publish_quietly, name=f"torchcomms-membership-{core.name}", daemon=True,
                             args=(monitor.client, "membership",
                                   {"comm": core.name, "epoch": epoch, "ranks": survivors})).start()
    core.adopt(new, new_core)
    return new
