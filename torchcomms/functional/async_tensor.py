"""``TorchCommsAsyncTensor``: the result of a functional collective called with ``async_op=True``."""
from __future__ import annotations

import torch


class TorchCommsAsyncTensor(torch.Tensor):
    """A tensor whose :meth:`wait` returns the collective's result as a plain tensor.

    The functional ops complete before they return (the communicator's deadline bounds them),
    so ``wait()`` never blocks; it exists for code written against the reference's async API.
    """

    @staticmethod
    def __new__(cls, result: torch.Tensor) -> "TorchCommsAsyncTensor":
        return result.as_subclass(cls)

    def wait(self) -> torch.Tensor:
        return self.as_subclass(torch.Tensor)
