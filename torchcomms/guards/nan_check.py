"""``NanCheckHook``: refuse to send a tensor holding NaN.

The pre-hook looks for the op's input tensors in ``record.extra["inputs"]`` — the dispatch
path has to put them there for the duration of the pre-hooks — and raises
:class:`torchcomms.errors.CommValueError` naming the communicator, op, sequence number and the
offending input before anything leaves the process. Where the dispatch path does not expose
them, the hook logs ``nan_check_inactive`` once instead of pretending to check.
"""
from __future__ import annotations

from typing import Any


class NanCheckHook:
    """Check every floating-point input of every op for NaN before it is dispatched."""

    def __init__(self) -> None:
        self._handles: list[Any] = []
        self._warned = False

    def register_with_comm(self, comm: Any) -> None:
        """Check the inputs of ``comm``'s ops (and of comms later split from it)."""
        if comm is None or not callable(getattr(comm, "register_pre_hook", None)):
            raise TypeError(f"NanCheckHook.register_with_comm needs a communicator, got {type(comm).__name__}")
        self._handles.append(comm.register_pre_hook(self))
        add_observer = getattr(comm, "add_observer", None)
        if add_observer is not None:
            add_observer(self)

    def on_new_comm(self, child: Any) -> None:
        self.register_with_comm(child)

    def remove(self) -> None:
        """Stop checking."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __call__(self, name: Any, op_id: int, record: Any) -> None:
        extra = getattr(record, "extra", None)
        inputs = extra.get("inputs") if extra else None
        if inputs is None:
            if not self._warned:
                self._warned = True
                from torchcomms.tracing.logging import get_logger

                get_logger(comm=getattr(record, "comm_name", None)).warning(
                    "nan_check_inactive",
                    message="the dispatch path does not expose input tensors (record.extra['inputs']); NaN checks are off",
                )
            return
        import torch

        from torchcomms.errors import CommValueError

        for i, t in enumerate(inputs):
            if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) and t.numel():
                if bool(torch.isnan(t).any()):
                    raise CommValueError(
                        f"input {i} (shape {list(t.shape)}, {t.dtype}) contains NaN",
                        comm=getattr(record, "comm_name", None),
                        op=str(name),
                        seq=getattr(record, "seq", None),
                    )
