"""Launching a Triton kernel with less host work per call.

``kernel[grid](*args)`` binds the arguments, computes their specialization (dtypes, 16-byte
alignment, integers equal to 1 or divisible by 16) and looks the compiled kernel up on every
call: 30–57 µs of host time per launch of the window forward on an H200's host, against
15–20 µs for launching its compiled handle directly (``benchmarks/diagnostics/window_profile.py``).
A sub-millisecond attention call makes four launches, so on small problems the
host, not the GPU, sets the pace.

:class:`Launcher` keys its own cache on a superset of what Triton specializes on (every integer
and bool by value, every tensor by dtype, device and alignment, every tensor descriptor by its
block shape, shape, strides and base), so a hit can only be a kernel Triton would have picked;
a miss launches through Triton, which compiles or finds the kernel, and keeps the handle.
The direct launch uses ``CompiledKernel.run`` with the arguments Triton 3.6 passes it; other
Triton versions, the interpreter, and launches with pre-run hooks take the ordinary path.
"""
from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from typing import Any, ContextManager

import torch

try:
    import triton
    from triton import knobs
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - exercised where triton is missing
    triton = None  # type: ignore[assignment]
    knobs = None  # type: ignore[assignment]
    TensorDescriptor = None  # type: ignore[assignment,misc]

#: the Triton releases whose ``CompiledKernel.run`` signature the direct launch was written for
DIRECT_LAUNCH_VERSIONS = ("3.6.",)


def direct_launch_supported() -> bool:
    """Whether this Triton install takes direct launches (a GPU build of a known release)."""
    return (triton is not None and triton.__version__.startswith(DIRECT_LAUNCH_VERSIONS)
            and os.environ.get("TRITON_INTERPRET") != "1")


def on_device(device: torch.device) -> ContextManager[object]:
    """A context in which ``device`` is CUDA's current device, for a Triton launch: Triton (and
    :class:`Launcher`) launch on the current device and its stream, not the tensors' device."""
    if device.type != "cuda" or device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def specialization_key(value: Any) -> Any:
    """What of one argument can change the kernel Triton compiles for it (a superset)."""
    if isinstance(value, torch.Tensor):
        return ("t", value.dtype, value.device.index, value.data_ptr() % 16 == 0)
    if TensorDescriptor is not None and isinstance(value, TensorDescriptor):
        base = value.base
        return ("d", base.dtype, base.device.index, base.data_ptr() % 16 == 0, tuple(value.shape),
                tuple(value.strides), tuple(value.block_shape), value.padding)
    if isinstance(value, float):
        return float
    # ints and bools by value (Triton specializes on ==1, %16 and on the integer width), None,
    # constexpr values: all hashable
    return (type(value), value)


class Launcher:
    """``Launcher(kernel)(grid, *args, num_warps=4, num_stages=2, **constexprs)`` launches
    ``kernel`` as ``kernel[grid](*args, **constexprs, ...)`` would, through its compiled handle
    when it has launched with arguments of the same specialization before.

    ``args`` are the kernel's leading parameters in order, ``constexprs`` the rest by name.
    Launch options past ``num_warps`` and ``num_stages`` are refused (they would not be in the
    handle cache's key), and Triton options read from the environment (debug mode,
    instrumentation) are those of each specialization's first launch.
    Safe to call from several threads at once (autograd runs each GPU's backward on a thread
    of its own); the handle cache is bounded, least recently used first out."""

    def __init__(self, kernel: Any, max_entries: int = 256) -> None:
        self.kernel = kernel
        self.max_entries = max_entries
        self._names: tuple[str, ...] = tuple(getattr(kernel, "arg_names", ()))
        self._handles: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()
        # Triton's version and TRITON_INTERPRET (read when kernels are defined) do not change
        # while the process runs: asked once, not on every launch
        self._direct = direct_launch_supported()
        self.direct_launches = 0  # for tests and benchmarks: how many calls skipped Triton's binding

    def __call__(self, grid: tuple[int, ...], *args: Any, num_warps: int | None = None,
                 num_stages: int | None = None, **constexprs: Any) -> None:
        if len(args) + len(constexprs) != len(self._names):
            raise TypeError(f"{getattr(self.kernel, '__name__', 'kernel')} takes {len(self._names)} arguments "
                            f"({', '.join(self._names)}), got {len(args)} positional and {sorted(constexprs)} by name; "
                            "launch options other than num_warps and num_stages are not taken")
        options = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
        if not self._direct or getattr(self.kernel, "pre_run_hooks", None):
            self.kernel[grid](*args, **constexprs, **options)
            return
        values = (*args, *(constexprs[name] for name in self._names[len(args):]))
        device = torch.cuda.current_device()
        key = (device, num_warps, num_stages, *map(specialization_key, values))
        try:
            with self._lock:
                handle = self._handles.get(key)
                if handle is not None:
                    self._handles.move_to_end(key)
                    self.direct_launches += 1
        except TypeError:  # an unhashable constexpr (a list, say): Triton's own path, every time
            self.kernel[grid](*args, **constexprs, **options)
            return
        if handle is None:
            handle = self.kernel[grid](*args, **constexprs, **options)
            if all(hasattr(handle, a) for a in ("run", "function", "packed_metadata", "launch_metadata")):
                with self._lock:
                    self._handles[key] = handle
                    if len(self._handles) > self.max_entries:
                        self._handles.popitem(last=False)
            return
        stream = triton.runtime.driver.active.get_current_stream(device)
        grid3 = (*grid, 1, 1)[:3]
        handle.run(grid3[0], grid3[1], grid3[2], stream, handle.function, handle.packed_metadata,
                   handle.launch_metadata(grid3, stream, *values), knobs.runtime.launch_enter_hook,
                   knobs.runtime.launch_exit_hook, *values)
