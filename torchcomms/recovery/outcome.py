"""``agree``: survivors decide together whether something (a training step) happened.

A collective cut short by a failure can complete on some members and fail on others; each then
knows only its own outcome. ``agree`` turns those local outcomes into one decision that every
member who returns shares: the AND of the flags of the members not known to have failed,
decided by compare-and-set on the communicator's store (``agreement.agree_on_flag``), so it
works on a broken communicator as on a healthy one and cannot itself diverge.
"""
from __future__ import annotations

import time

from torchcomms.core import error_map
from torchcomms.core.comm_core import CommCore
from torchcomms.core.errors import CommAbortedError
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

    try:
        decided = agree_on_flag(core.ctx.store, prefix, n, me, list(core.global_ranks), flag,
                                lambda: set(core.known_failures()), time.monotonic() + secs)
    except RoundClosed:
        raise declared_failed() from None
    except Exception as e:  # noqa: BLE001 - a store may raise anything
        raise error_map.agreement_error(e, core.ctx.store, secs, where,
                                        core.monitor.control_lost if core.monitor is not None else None) from e
    if decided and not flag or core.state is CommState.EXPELLED:
        # decided without this rank: the others hold it failed
        raise declared_failed()
    return decided
