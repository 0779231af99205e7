"""``reconfigure``: the reference API's fault-tolerance path (re-form a communicator over the
ranks whose init handles are listed), on the same machinery as shrink."""
from __future__ import annotations

import hashlib
import os
import secrets
import threading
import time
from typing import Any

from torchcomms.backends.base import TorchCommBackend
from torchcomms.config import settings
from torchcomms.core.comm_core import CommCore
from torchcomms.core.dispatch import OP_IDS
from torchcomms.core.errors import CommAbortedError
from torchcomms.core.op import OpRecord
from torchcomms.core.state import CommState
from torchcomms.core.store_calls import StoreNotAnswering, call_until
from torchcomms.core.types import OpName, WorkStatus
from torchcomms.core.work import TorchWork
from torchcomms.recovery.engines import build_error, derived_context, signature_check


def init_handle(core: CommCore) -> str:
    """This rank's handle for ``reconfigure`` (made once; as in the reference, also without
    ``enable_reconfigure``, which only ``reconfigure`` itself needs)."""
    if core.init_handle is None:
        me = core.global_ranks[core.rank]
        run = settings().job_id
        core.init_handle = f"torchcomms://{run}/{core.name}/{me}/{os.getpid()}/{secrets.token_hex(4)}"
    return core.init_handle


def _members(core: CommCore, uuid: Any, init_handles: Any, hints: Any) -> list[int]:
    """The global ranks the handles name, after checking the arguments."""
    c = core.checker
    if not core.options.enable_reconfigure:
        raise c.value_error("reconfigure", "this communicator was not created with enable_reconfigure=True")
    if not isinstance(uuid, (str, int)) or isinstance(uuid, bool) or str(uuid) == "":
        raise c.type_error("reconfigure", f"uuid must be a non-empty str or an int, got {uuid!r}")
    if not isinstance(init_handles, (list, tuple)) or not all(isinstance(h, str) for h in init_handles):
        raise c.type_error("reconfigure", "init_handles must be a list of str (from get_init_handle())")
    if len(set(init_handles)) != len(init_handles):
        raise c.value_error("reconfigure", "init_handles has duplicates")
    if init_handle(core) not in init_handles:
        raise c.value_error("reconfigure", "init_handles does not contain this rank's handle")
    members: list[int] = []
    for h in init_handles:
        parts = h.split("/")
        if not h.startswith("torchcomms://") or len(parts) != 7 or not parts[4].isdigit():
            raise c.value_error("reconfigure", f"malformed init handle {h!r}")
        members.append(int(parts[4]))
    c.hints("reconfigure", hints)
    return members


def reconfigure(core: CommCore, uuid: Any, init_handles: list[str], timeout: Any,
                hints: dict[str, str] | None) -> TorchWork:
    """See ``TorchComm.reconfigure``."""
    members = _members(core, uuid, init_handles, hints)
    secs = core.checker.timeout("reconfigure", timeout) or core.timeout_s
    key = hashlib.sha1("\n".join(init_handles).encode()).hexdigest()[:12]
    # keyed by name, uuid and handles only (the handles are unique to their processes), so a
    # communicator made afresh in a replacement process meets one that was shrunk since
    ctx = derived_context(core, members, f"torchcomms/{core.name}/reconf/{uuid}/{key}", secs,
                          rank=init_handles.index(init_handle(core)), hints=hints)
    rec = OpRecord(core.name, tuple(members), ctx.rank, ctx.size, core.backend_name, OpName.reconfigure,
                   0, next(OP_IDS), secs, True, time.time_ns())
    rec.state = "started"
    rec.time_started_ns = rec.time_created_ns
    work = TorchWork(core, rec, time.monotonic() + secs)
    with core.lock:
        if not core.life.can(CommState.RECONFIGURING):
            raise CommAbortedError(f"communicator is {core.state}", comm=core.name, op="reconfigure")
        pending = core.in_flight_locked()
        earlier, core.reconf_work = core.reconf_work, work  # only the latest may rebind
        old = core.backend
        core.life.move(CommState.RECONFIGURING)
    core.fail_works(pending, lambda r: CommAbortedError("communicator is being reconfigured", **core.where(r)),
                    state="aborted")
    if earlier is not None:
        earlier.finish(WorkStatus.ERROR, CommAbortedError(
            f"superseded by reconfigure({uuid!r})", comm=core.name, op="reconfigure"), state="aborted")

    def build() -> None:
        try:
            # waited for until the deadline, or until the reconfigure ends otherwise
            # (superseded, aborted): then abandoned, its store calls cancelled
            backend = call_until(
                "the reconfigured engine's rendezvous", lambda: old.split(ctx), work.deadline,
                thread_name=f"torchcomms-reconfigure-{core.name}", store=ctx.store,
                give_up=lambda: work.status is not WorkStatus.INPROGRESS, on_late=lambda b: b.abort(),
                limit_s=ctx.timeout.total_seconds())
        except StoreNotAnswering:
            core.expire(work)  # its deadline passed (or it ended already: nothing to do)
            return
        except BaseException as e:  # noqa: BLE001
            work.engine_done(build_error(core, e, rec.timeout_s, str(rec.name), rec.seq or None))
            return
        if not _rebind(core, backend, work):
            # The reconfigure ended before its engine was ready (timed out, superseded, the
            # communicator aborted): that engine is never used, and the communicator keeps
            # the state the caller was told about.
            backend.abort()
            work.finish(WorkStatus.ERROR, CommAbortedError(
                f"communicator became {core.state} before the reconfigured engine was ready",
                comm=core.name, op="reconfigure"), state="aborted")
            return
        old.abort()
        work.engine_done(None)

    threading.Thread(target=build, name=f"torchcomms-reconfigure-{core.name}", daemon=True).start()
    return work


def _rebind(core: CommCore, backend: TorchCommBackend, work: TorchWork) -> bool:
    """Point ``core`` at the engine ``work``'s reconfigure built, if that reconfigure is still
    the one in progress (not timed out, superseded or aborted); returns whether it did. Checked
    under the lock that breaking takes: a timeout that lands after the check breaks the
    communicator on the new engine, one before it leaves the new engine unused."""
    with core.lock:
        if (core.reconf_work is not work or work.status is not WorkStatus.INPROGRESS
                or core.state not in (CommState.RECONFIGURING, CommState.BROKEN)):
            return False
        core.reconf_work = None
        core.bind_engine(backend)
        core.broken = None
        core.epoch += 1
        core.life.move(CommState.ACTIVE)
        old_check, core.signatures = core.signatures, signature_check(core)
        # every member just joined the new engine's rendezvous: a failure known of one of
        # those job ranks was its previous process's (a replacement took its place)
        for g in core.global_ranks:
            core.failed_global.pop(g, None)
    if core.monitor is not None:
        core.monitor.revive(list(core.global_ranks))
    if old_check is not None:
        old_check.close(abort=True)
    return True
