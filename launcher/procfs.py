"""The processes of this host as Linux ``/proc`` shows them now (best effort: a process may
come or go while it is read)."""
from __future__ import annotations

import os

__all__ = ["processes_where", "parent_of"]

#: fields of ``/proc/<pid>/stat`` after the command name, by index
_FIELDS = {"ppid": 1, "pgrp": 2}


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def parent_of(pid: int) -> int | None:
    """The parent of ``pid`` now; None when it is gone."""
    fields = _stat_fields(pid)
    return int(fields[_FIELDS["ppid"]]) if fields else None


def processes_where(field: str, value: int) -> list[int]:
    """The pids whose ``/proc/<pid>/stat`` field ``field`` (``"ppid"`` or ``"pgrp"``) is ``value``."""
    index, want, found = _FIELDS[field], str(value), []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        fields = _stat_fields(name)
        if fields is not None and len(fields) > index and fields[index] == want:
            found.append(int(name))
    return found
