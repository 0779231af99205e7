"""``agree``: survivors decide together whether something (a training step) happened.

A collective cut short by a failure can complete on some members and fail on others; each then
knows only its own outcome. ``agree`` turns those local outcomes into one decision that every
member who returns shares: the AND of the flags of the members not known to have failed,
decided by compare-and-set on the communicator's store (``agreement.agree_on_flag``), so it
works on a broken communicator as on a healthy one and cannot itself diverge. An engine with a
fault-tolerant agreement of its own (``capabilities.agree``: MPI under ULFM, ``MPI_Comm_iagree``)
decides it instead, without the store.
"""
from __future__ import annotations

import time

from torchcomms.core import error_map
from torchcomms.core.comm_core import CommCore
from torchcomms.core.errors import BackendError, CommAbortedError, CommError, CommTimeoutError
from torchcomms.core.state import CommState
from torchcomms.recovery.agreement import RoundClosed, agree_on_flag

_AGREE = "agree"


def agree(core: CommCore, flag: bool, secs: float) -> bool:
    """See ``TorchComm.agree``."""
    if flag is not True and flag is not False:
        raise core.checker.type_error(_AGREE, f"flag must be a bool, got {type(flag).__name__}")
    if core.state not in (CommState.ACTIVE, CommState.BROKEN):
        raise core.refusal(_AGREE)
    prefix = core.ctx.store_prefix
    n = core.agree_rounds.get(prefix, 0) + 1
    core.agree_rounds[prefix] = n
    me = core.global_ranks[core.rank]
    where = dict(comm=core.name, op=_AGREE, seq=n)

    def declared_failed() -> CommAbortedError:
        return CommAbortedError(f"this rank ({me}) was declared failed; the survivors decided without it", **where)

    if core.backend.capabilities.agree:
        return _agree_in_engine(core, flag, secs, where)
    if core.ctx.store is None:
        raise BackendError(
            f"agree needs a store or an engine with an agreement of its own, and this {core.backend_name} "
            "communicator has neither (mpi: launch with 'mpiexec --with-ft ulfm' for MPI's agreement, or run "
            "under torchcomms-run, or pass store= to new_comm)", **where)
    try:
        decided = agree_on_flag(core.ctx.store, prefix, n, me, list(core.global_ranks), flag,
                                lambda: set(core.known_failures()), time.monotonic() + secs)
    except RoundClosed:
        raise declared_failed() from None
    except Exception as e:  # noqa: BLE001 - a store may raise anything
        raise core.agreement_error(e, secs, where) from e
    if decided and not flag or core.state is CommState.EXPELLED:
        # decided without this rank: the others hold it failed
        raise declared_failed()
    return decided


def _agree_in_engine(core: CommCore, flag: bool, secs: float, where: dict) -> bool:
    """The engine's own agreement (every live member's flag counts; no store involved)."""
    try:
        return core.backend.agree(flag, time.monotonic() + secs)
    except TimeoutError:
        raise CommTimeoutError(f"the members did not agree within {secs:g} s", timeout_s=secs, **where) from None
    except BaseException as e:  # noqa: BLE001 - the engine may throw anything
        kind = "" if isinstance(e, CommError) else core.backend.classify_error(e)
        raise error_map.translate_engine_error(e, kind, secs, where, core.global_ranks, core.monitor) from None
