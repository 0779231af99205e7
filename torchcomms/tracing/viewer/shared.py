"""Values that many flight-recorder entries repeat, parsed once and shared."""
from __future__ import annotations

from typing import Any

__all__ = ["SharedValues"]


class SharedValues:
    """Equal sizes, dtype lists and call stacks parsed once and shared by every op that has
    them: a job's ranks repeat the same few thousand, and 2 million ops holding copies of
    their own would need gigabytes (the analysis never modifies them)."""

    def __init__(self) -> None:
        self._cache: dict[Any, Any] = {}

    def get(self, kind: str, value: Any, parse: Any) -> Any:
        try:
            if kind == "frames":
                key: Any = (kind, tuple(tuple(f.items()) for f in value))
            elif kind == "sizes":
                key = (kind, tuple(map(tuple, value)))
            else:
                key = (kind, tuple(value))
            hit = self._cache.get(key)
        except (TypeError, AttributeError):  # unhashable or unexpected shapes: parse it alone
            return parse(value)
        if hit is None:
            hit = self._cache[key] = parse(value)
        return hit
