"""A store's failure as the typed error of the step that called it.

Set-up steps (``new_comm``, a shrink's survivor agreement, an engine build's rendezvous) call
the communicator's store; when it fails, the user must learn that the store did (which one,
and whether it stopped answering or is gone), not a peer or the engine.
"""
from __future__ import annotations

from typing import Any

import torch.distributed as dist

from torchcomms.errors import CommAbortedError, CommError, CommTimeoutError
from torchcomms.store_calls import StoreNotAnswering


def store_error(error: BaseException, store_words: str, secs: float, where: dict[str, Any], *,
                step: str = "", control_lost: str | None = None) -> CommError | None:
    """The typed error of a step that failed because of its store (``store_words`` names it,
    ``step`` says where, e.g. ``" in the survivor agreement"``), else ``None``.

    Not answered by the step's deadline of ``secs`` → :class:`CommTimeoutError`; its connection
    lost (the host is gone) → :class:`CommAbortedError`. Where the store is the control plane
    and it is known lost (``control_lost``: the failure monitor's message), that is the error."""
    if not isinstance(error, (StoreNotAnswering, dist.DistNetworkError)):
        return None
    if control_lost is not None:
        return CommAbortedError(control_lost, **where)
    if isinstance(error, StoreNotAnswering):
        return CommTimeoutError(
            f"{store_words} did not answer {error.call}{step} within {secs:g} s (its host is stopped, overloaded "
            "or unreachable)", timeout_s=secs, **where)
    return CommAbortedError(f"{store_words} failed{step}: {error} (its host is gone or unreachable)", **where)
