"""Endpoints for PyTorch's debug server (``torch.distributed.debug``).

Registered through torch's handler registry (``torch._C._distributed_c10d._register_handler``)
where this torch has it:

* ``torchcomms_fr_trace_json`` — the flight recorder as "2.10" JSON (``onlyactive=true``
  leaves completed ops out);
* ``torchcomms_health_check`` — ``{"healthy": bool, ...}``: unhealthy when an op failed or
  timed out, a communicator is broken/aborted, or an op is in flight past its timeout;
* ``torchcomms_fr_dump_file`` — write the dump file (the health-check page calls it when a
  rank is unhealthy) and answer with its path.
"""
from __future__ import annotations

import json
import time
from typing import Any

from torchcomms.tracing.flight_recorder import FlightRecorder, process_recorder

HANDLER_NAMES = ("torchcomms_fr_trace_json", "torchcomms_health_check", "torchcomms_fr_dump_file")
_registered = False


def _param(req: Any, name: str) -> str:
    try:
        return str(req.get_param(name) or "")
    except Exception:  # noqa: BLE001
        return ""


def _reply(resp: Any, status: int, body: str, content_type: str = "application/json") -> None:
    resp.set_content(body.encode("utf-8"), content_type)
    resp.set_status(status)


def health(recorder: FlightRecorder | None = None) -> dict[str, Any]:
    """This process's health as the ``torchcomms_health_check`` endpoint reports it."""
    rec = recorder or process_recorder()
    now = time.time_ns()
    problems: list[str] = []
    comms: list[dict[str, Any]] = []
    for ref, _handles, _obs in list(rec._attached.values()):
        comm = ref()
        if comm is None:
            continue
        state = "active"
        for attr, label in (("is_aborted", "aborted"), ("is_broken", "broken")):
            fn = getattr(comm, attr, None)
            try:
                if fn is not None and fn():
                    state = label
            except Exception:  # noqa: BLE001
                pass
        name = str(comm.get_name())
        comms.append({"name": name, "state": state})
        if state != "active":
            problems.append(f"comm '{name}' is {state}")
    overdue = failed = 0
    for e in rec.entries():
        if e.state in ("failed", "timed_out"):
            failed += 1
        elif e.state in ("scheduled", "started") and e.timeout_s:
            if now - e.time_created_ns > e.timeout_s * 1e9:
                overdue += 1
    if failed:
        problems.append(f"{failed} op(s) failed or timed out")
    if overdue:
        problems.append(f"{overdue} op(s) in flight past their timeout")
    return {
        "healthy": not problems,
        "rank": rec.global_rank,
        "problems": problems,
        "comms": comms,
        "entries": rec.size(),
    }


def _fr_trace_json(req: Any, resp: Any) -> None:
    try:
        only_active = _param(req, "onlyactive").lower() in ("1", "true", "yes")
        _reply(resp, 200, process_recorder().dump_json(include_completed=not only_active, reason="debug_server"))
    except Exception as exc:  # noqa: BLE001
        _reply(resp, 500, json.dumps({"error": f"{type(exc).__name__}: {exc}"}))


def _health_check(req: Any, resp: Any) -> None:
    try:
        _reply(resp, 200, json.dumps(health()))
    except Exception as exc:  # noqa: BLE001
        _reply(resp, 500, json.dumps({"error": f"{type(exc).__name__}: {exc}"}))


def _fr_dump_file(req: Any, resp: Any) -> None:
    try:
        path = process_recorder().dump_file(reason="debug_server")
        _reply(resp, 200, json.dumps({"path": str(path)}))
    except Exception as exc:  # noqa: BLE001
        _reply(resp, 500, json.dumps({"error": f"{type(exc).__name__}: {exc}"}))


def register_debug_handlers() -> bool:
    """Register the endpoints once; False where this torch has no handler registry."""
    global _registered
    if _registered:
        return True
    try:
        from torch._C._distributed_c10d import _get_handler_names, _register_handler
    except ImportError:
        return False
    import ctypes

    existing = set(_get_handler_names())
    for name, fn in zip(HANDLER_NAMES, (_fr_trace_json, _health_check, _fr_dump_file)):
        if name not in existing:
            # torch's registry is a C++ static that outlives the interpreter: if it held the
            # last reference, destroying it at exit frees a Python object without a thread
            # state and aborts the process (seen on torch 2.13). One leaked reference per
            # handler keeps them alive past that point.
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(fn))
            _register_handler(name, fn)
    _registered = True
    return True
