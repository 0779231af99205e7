"""``FlightRecorderHook``: the public face of the flight recorder (``torchcomms.hooks``).

The recorder module is imported when a hook is made, not with this module: torch imports
``FlightRecorderHook`` on every ``import torch``."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchcomms.tracing.flight_recorder import FlightRecorder


class FlightRecorderHook:
    """Record every op of the communicators it is registered with.

    Args:
        max_entries: ring capacity; ``0`` disables the hook (PyTorch passes 0 by default).
        isolated: keep a private ring instead of sharing the process-wide one (which the
            default tracing and every other non-isolated hook write to).
    """

    def __init__(self, max_entries: int = 2048, isolated: bool = False) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int):
            raise TypeError(f"FlightRecorderHook max_entries must be an int, got {type(max_entries).__name__}")
        if max_entries < 0:
            raise ValueError(f"FlightRecorderHook max_entries must be >= 0, got {max_entries}")
        if not isinstance(isolated, bool):
            raise TypeError(f"FlightRecorderHook isolated must be a bool, got {type(isolated).__name__}")
        from torchcomms.tracing.flight_recorder import FlightRecorder, process_recorder

        self._enabled = max_entries > 0
        self._isolated = isolated
        if isolated or not self._enabled:
            self._recorder = FlightRecorder(max_entries)
        else:
            self._recorder = process_recorder()
            self._recorder.ensure_capacity(max_entries)

    @property
    def recorder(self) -> FlightRecorder:
        """The ring this hook writes to."""
        return self._recorder

    def register_with_comm(self, comm: Any) -> None:
        """Record ``comm``'s ops, and those of communicators later split from it."""
        if comm is None:
            raise TypeError("FlightRecorderHook.register_with_comm needs a communicator, got None")
        for attr in ("register_pre_hook", "register_post_hook", "get_name"):
            if not callable(getattr(comm, attr, None)):
                raise TypeError(f"FlightRecorderHook.register_with_comm: {type(comm).__name__} is not a communicator (no {attr}())")
        if self._enabled:
            self._recorder.attach(comm)

    def unregister_from_comm(self, comm: Any) -> None:
        """Stop recording ``comm``'s ops (what was recorded stays)."""
        self._recorder.detach(comm)

    def dump_json(self, include_completed: bool = True) -> str:
        """The ring as PyTorch flight-recorder "2.10" JSON."""
        return self._recorder.dump_json(include_completed)

    def dump_file(self, rank: int, include_completed: bool = True) -> Path:
        """Write the ring as a pickle to ``<TORCHCOMM_FR_DUMP_TEMP_FILE><rank>`` (atomically)."""
        return self._recorder.dump_file(rank, include_completed)

    def reset(self) -> None:
        """Forget every record."""
        self._recorder.reset()

    def is_enabled(self) -> bool:
        return self._enabled

    def size(self) -> int:
        """Records currently held."""
        return self._recorder.size()
