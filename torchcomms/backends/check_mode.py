"""The collective check's mode as an engine reads it, and the refusal of ranks that disagree on it.

Every rank of a communicator must run the check (``torchcomms.recovery.collective_check``) alike:
with it on at some ranks only, the checking ranks wait for the others at the check's side engine,
and the others in the op, until the first op's deadline. So engines compare the ranks' modes
while the communicator is made, in an exchange they make anyway.
"""
from __future__ import annotations

from torchcomms.config import settings
from torchcomms.core.errors import CommValueError, format_ranks

HINT = "torchcomms.check_collectives"
ENV = "TORCHCOMM_CHECK_COLLECTIVES"


def enabled(hints: dict[str, str]) -> bool:
    """Whether a communicator created with ``hints`` checks its collectives (the hint wins over
    ``TORCHCOMM_CHECK_COLLECTIVES``)."""
    raw = hints.get(HINT)
    if raw is None:
        return settings().check_collectives
    return raw.strip().lower() in ("1", "true", "yes", "on")


def disagreement(checks: list[bool], comm: str) -> CommValueError | None:
    """The error every rank raises when the ranks' modes (``checks``, by rank) differ, else ``None``."""
    on = [r for r, c in enumerate(checks) if c]
    if not 0 < len(on) < len(checks):
        return None
    off = [r for r, c in enumerate(checks) if not c]
    return CommValueError(
        f"the ranks disagree on the collective check: on at {_ranks(on)}, off at {_ranks(off)}; every rank "
        f"must pass the same hint {HINT} (or none, and the same {ENV})", comm=comm,
        ranks=on if len(on) <= len(off) else off)


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {format_ranks(ranks)}"
