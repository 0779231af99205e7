"""Peak of torch-allocated CPU bytes in a region: the CPU analogue of
``torch.cuda.max_memory_allocated`` (what FSDP users track on GPU).

c10's CPU allocator keeps a count of the bytes it has handed out and not taken back when
``FLAGS_caffe2_report_cpu_memory_usage`` is set (:func:`count_allocations`; set it before the
tensors to count are made): every allocation and free on any thread, an engine's included.
torch.profiler's memory events (``profile_memory=True``) carry that count at each allocation
and free of the thread that entered the profiled region (and of autograd's, which runs CPU
backward on that thread). :class:`AllocationTrace` profiles a region; :meth:`AllocationTrace.peak`
returns the largest count seen in it, the count at its start and end, and the region's own
blocks alive at the moment of the peak with the ops (and FSDP's ``record_function`` ranges)
they were allocated in.

Deterministic for a deterministic program (the same code and sizes give the same bytes on every
run), unlike the resident high-water mark (VmHWM), which adds malloc's caching and the
interpreter's own memory. Not counted: memory an engine allocates outside c10's allocator
(gloo's own buffers); an allocation on another thread between two of the region's events is
seen only in the count at the next event.
"""
from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch.profiler import ProfilerActivity, profile


def count_allocations() -> None:
    """Make c10's CPU allocator count every allocation and free, on every thread (a process-wide
    flag of libc10, set once; the count starts now)."""
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage").value = True


class Event(NamedTuple):
    """One allocation (``nbytes`` > 0) or free (< 0) the profiler recorded; ``total``: the
    allocator's count right after it; ``path``: the enclosing op names, outermost first."""

    time_ns: int
    ptr: int
    nbytes: int
    total: int
    path: tuple[str, ...]


@dataclass(frozen=True)
class Block:
    """One allocation alive at the peak: its bytes and the ops enclosing its allocation."""

    nbytes: int
    path: tuple[str, ...]

    def site(self) -> str:
        """Where it was allocated, in a word: the outermost FSDP range (fqn dropped) or the
        autograd function, and the innermost op, e.g. ``FSDP::all_gather / aten::empty``."""
        fsdp = next((p.split(" (")[0] for p in self.path if p.startswith("FSDP::")), None)
        grad = next((p.split(": ", 1)[1] for p in self.path if p.startswith("autograd::engine::evaluate_function")),
                    None)
        inner = self.path[-1] if self.path else "(no op)"
        head = fsdp or (f"backward {grad}" if grad else None)
        return f"{head} / {inner}" if head else inner


@dataclass
class Peak:
    """``peak``, ``start``, ``end``: the allocator's count at its largest, before the region's
    first event and after its last one (bytes); ``live``: the region's own blocks alive at the
    peak (the rest of ``peak - start`` was allocated on other threads, or freed there unseen);
    ``at``: the ops enclosing the event that reached the peak."""

    peak: int
    start: int
    end: int
    live: list[Block] = field(default_factory=list)
    at: tuple[str, ...] = ()

    @staticmethod
    def by_site(blocks: list[Block]) -> dict[str, int]:
        """Bytes of ``blocks`` per allocation site, largest first."""
        out: dict[str, int] = {}
        for b in blocks:
            site = b.site()
            out[site] = out.get(site, 0) + b.nbytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def allocation_events(tree: Iterable[Any]) -> list[Event]:
    """Every CPU allocation event in the profiler's event tree, in time order."""
    alloc = torch._C._profiler._EventType.Allocation
    out: list[Event] = []
    stack: list[tuple[Any, tuple[str, ...]]] = [(e, ()) for e in tree]
    while stack:
        e, path = stack.pop()
        if e.tag == alloc:
            f = e.typed[1]
            if f.device.type == "cpu" and f.alloc_size:
                out.append(Event(e.start_time_ns, f.ptr, f.alloc_size, f.total_allocated, path))
        else:
            stack.extend((c, path + (e.name,)) for c in e.children)
    out.sort(key=lambda x: x.time_ns)
    return out


def peak_of(events: list[Event]) -> Peak:
    """The largest allocator count among ``events`` and the region's blocks alive then. A block
    whose address is handed out again was freed (on a thread the profiler does not follow)."""
    if not events:
        return Peak(0, 0, 0)
    best_i = max(range(len(events)), key=lambda i: events[i].total)
    live: dict[int, Block] = {}
    at_peak: list[Block] = []
    for i, ev in enumerate(events):
        if ev.nbytes > 0:
            live[ev.ptr] = Block(ev.nbytes, ev.path)
        else:
            live.pop(ev.ptr, None)
        if i == best_i:
            at_peak = sorted(live.values(), key=lambda b: -b.nbytes)
    first, last = events[0], events[-1]
    return Peak(events[best_i].total, first.total - first.nbytes, last.total, at_peak, events[best_i].path)


class AllocationTrace:
    """Profiles a region's CPU allocations: ``with AllocationTrace() as t: ...``, then ``t.peak()``."""

    def __init__(self) -> None:
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)

    def __enter__(self) -> AllocationTrace:
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._prof.__exit__(*exc)

    def peak(self) -> Peak:
        return peak_of(allocation_events(self._prof.profiler.kineto_results.experimental_event_tree()))


def allocated_now() -> int:
    """The allocator's count now (bytes; with :func:`count_allocations` set: since then)."""
    with AllocationTrace() as t:
        torch.empty(1)
    return t.peak().start


def allocated_after(region: Peak, timeout_s: float = 2.0) -> int:
    """The allocator's count once every thread has let go of what ``region`` freed: polled until
    it is back at the region's start, or ``timeout_s`` passed (then what is still allocated, which
    a leak leaves there). An engine's worker thread frees an op's own buffers (gloo's copy of a
    reduce-scatter's input) when it lets go of the finished op, which can be just after the
    thread that waited for it went on: the region's last event may not have seen that free yet."""
    import time

    deadline = time.monotonic() + timeout_s
    while (now := allocated_now()) > region.start and time.monotonic() < deadline:
        time.sleep(0.01)
    return now
