"""The processes of this host as Linux ``/proc`` shows them now (best effort: a process may
come or go while it is read)."""
from __future__ import annotations

import os

__all__ = ["processes_where"]

#: fields of ``/proc/<pid>/stat`` after the command name, by index
_FIELDS = {"ppid": 1, "pgrp": 2}


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
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > index and fields[index] == want:
            found.append(int(name))
    return found
