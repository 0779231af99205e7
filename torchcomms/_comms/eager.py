"""The route's calls from C++ into Python, run with dynamo's frame evaluation off.

c10d calls the backend from C++, also where it runs inside a ``torch.compile``'d function (a
graph break run eagerly: DDP's forward rebuilding its buckets, an async collective's ``wait()``).
Dynamo then intercepts every Python frame entered, ours included, and compiled the forwarder's
methods and the communicator's dispatch path as user code: ``torch.compile(DDP(model))`` raised
dynamo's ``AssertionError`` ("DictGetItemSource index must be a ConstDictKeySource or literal, got
<OpName.broadcast ...>"), where c10d's own backends, all C++, enter no Python frame. Once
``torch._dynamo`` is imported (it is before anything compiles) the C++ side calls
:func:`disabled_call`'s function, which runs ``getattr(obj, method)(*args)`` and everything below
it eagerly (``torch._dynamo.disable(..., recursive=True)``); before that it calls the method itself,
so a program that never compiles never imports dynamo for it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

_DISABLED: Callable[..., Any] | None = None


def _call(obj: Any, method: str, *args: Any) -> Any:
    return getattr(obj, method)(*args)


def disabled_call() -> Callable[..., Any]:
    """``_call`` wrapped so that dynamo compiles none of the frames it runs (made once)."""
    global _DISABLED
    if _DISABLED is None:
        import torch._dynamo

        _DISABLED = torch._dynamo.disable(_call, recursive=True)
    return _DISABLED
