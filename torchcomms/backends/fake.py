"""A backend with no engine, for unit tests and for measuring the dispatch path alone.

It behaves as if every rank held exactly the data this rank holds, and computes each result
under that assumption (``all_reduce(SUM)`` multiplies by the world size, ``all_gather`` copies,
...), completing inside the call. Hints inject faults for tests:
``fake.hang_ops`` (comma-separated op names that never complete) and ``fake.fail_ops``
(op names that fail with a peer error).
"""
from __future__ import annotations

import torch

from torchcomms.backends.base import BackendCapabilities, EngineHandle, TorchCommBackend
from torchcomms.types import RedOpType, ReduceOp


class FakePeerError(RuntimeError):
    """The error ``fake.fail_ops`` injects."""


class FakeBackend(TorchCommBackend):
    backend_name = "fake"
    capabilities = BackendCapabilities(devices=("cpu", "cuda", "meta"), abort=True, shrink=True)

    @classmethod
    def needs_store(cls, size: int) -> bool:
        return False

    def init(self) -> None:
        h = self.ctx.hints
        self._hang = {s for s in h.get("fake.hang_ops", "").split(",") if s}
        self._fail = {s for s in h.get("fake.fail_ops", "").split(",") if s}
        self._pending: list[torch.futures.Future] = []

    def version(self) -> str:
        return "fake-1"

    def classify_error(self, error: BaseException) -> str:
        return "peer" if isinstance(error, FakePeerError) else "other"

    def _done(self, op: str, finish=None) -> EngineHandle:  # type: ignore[no-untyped-def]
        if op in self._fail:
            return EngineHandle.failed(FakePeerError(f"injected failure of {op}"))
        if op in self._hang:
            fut: torch.futures.Future = torch.futures.Future()
            self._pending.append(fut)  # never completed
            return EngineHandle([fut])
        if finish is not None:
            finish()
        return EngineHandle.completed()

    def _reduce_value(self, t: torch.Tensor, op: ReduceOp) -> torch.Tensor:
        n = self.ctx.size
        k = op.type
        if k is RedOpType.SUM:
            return t * n
        if k is RedOpType.PRODUCT:
            return t**n
        if k in (RedOpType.MIN, RedOpType.MAX, RedOpType.AVG, RedOpType.BAND, RedOpType.BOR):
            return t.clone()
        if k is RedOpType.BXOR:
            return t.clone() if n % 2 else torch.zeros_like(t)
        if k is RedOpType.PREMUL_SUM:
            return t * op.factor * n  # type: ignore[operator]
        raise NotImplementedError(op)

    def abort(self) -> None:
        self._pending.clear()

    # ops -------------------------------------------------------------------------------------
    def send(self, tensor, dst, tag):  # type: ignore[no-untyped-def]
        return self._done("send")

    def recv(self, tensor, src, tag):  # type: ignore[no-untyped-def]
        return self._done("recv")

    def batch_p2p(self, ops, tag):  # type: ignore[no-untyped-def]
        return self._done("batch_p2p")

    def broadcast(self, tensor, root):  # type: ignore[no-untyped-def]
        return self._done("broadcast")

    def all_reduce(self, tensor, op):  # type: ignore[no-untyped-def]
        return self._done("all_reduce", lambda: tensor.copy_(self._reduce_value(tensor, op)))

    def reduce(self, tensor, root, op):  # type: ignore[no-untyped-def]
        def fin() -> None:
            if self.ctx.rank == root:
                tensor.copy_(self._reduce_value(tensor, op))

        return self._done("reduce", fin)

    def all_gather(self, tensor_list, tensor):  # type: ignore[no-untyped-def]
        return self._done("all_gather", lambda: [t.copy_(tensor) for t in tensor_list])

    def all_gather_v(self, tensor_list, tensor):  # type: ignore[no-untyped-def]
        def fin() -> None:
            for t in tensor_list:
                t.copy_(tensor.reshape(-1)[: t.numel()].reshape(t.shape) if t.numel() <= tensor.numel() else t)

        return self._done("all_gather_v", fin)

    def all_gather_single(self, output, input):  # type: ignore[no-untyped-def]
        return self._done("all_gather_single", lambda: output.view(self.ctx.size, -1).copy_(input.reshape(1, -1)))

    def reduce_scatter(self, output, input_list, op):  # type: ignore[no-untyped-def]
        r = self.ctx.rank
        return self._done("reduce_scatter", lambda: output.copy_(self._reduce_value(input_list[r], op)))

    def reduce_scatter_v(self, output, input_list, op):  # type: ignore[no-untyped-def]
        r = self.ctx.rank
        return self._done("reduce_scatter_v", lambda: output.copy_(self._reduce_value(input_list[r], op)))

    def reduce_scatter_single(self, output, input, op):  # type: ignore[no-untyped-def]
        r = self.ctx.rank

        def fin() -> None:
            chunk = input.reshape(self.ctx.size, -1)[r].reshape(output.shape)
            output.copy_(self._reduce_value(chunk, op))

        return self._done("reduce_scatter_single", fin)

    def all_to_all_single(self, output, input):  # type: ignore[no-untyped-def]
        n, r = self.ctx.size, self.ctx.rank

        def fin() -> None:
            chunk = input.reshape(n, -1)[r]
            output.view(n, -1).copy_(chunk.reshape(1, -1))

        return self._done("all_to_all_single", fin)

    def all_to_all_v_single(self, output, input, output_split_sizes, input_split_sizes):  # type: ignore[no-untyped-def]
        return self._done("all_to_all_v_single")

    def all_to_all(self, output_list, input_list):  # type: ignore[no-untyped-def]
        r = self.ctx.rank
        return self._done("all_to_all", lambda: [o.copy_(input_list[r]) for o in output_list])

    def barrier(self):  # type: ignore[no-untyped-def]
        return self._done("barrier")

    def scatter(self, output, input_list, root):  # type: ignore[no-untyped-def]
        def fin() -> None:
            if input_list is not None:
                output.copy_(input_list[self.ctx.rank])

        return self._done("scatter", fin)

    def gather(self, output_list, input, root):  # type: ignore[no-untyped-def]
        return self._done("gather", lambda: [o.copy_(input) for o in (output_list or [])])

    def gather_single(self, output, input, root):  # type: ignore[no-untyped-def]
        def fin() -> None:
            if output is not None:
                output.view(self.ctx.size, -1).copy_(input.reshape(1, -1))

        return self._done("gather_single", fin)
