"""End of job: the root cause, the launcher's exit code and the summary table.

Root cause: the failed worker that failed first (ties broken by rank): when it ended, or when
it was reported failed while alive (a stopped rank ends only when the job is stopped). The launcher exits
with its code (exit code, 128 + signal, or 1 for a worker lost with its node or given up as
unreapable: still alive after SIGKILL, its "end" is when the agent gave it up).

Under ``--on-failure shrink`` a failure is *tolerated* when at least one other worker of the
job was still running when it happened (the survivors can shrink and carry on). The job
exits 0 when every failure was tolerated (so the last workers to finish all exited 0), and
otherwise exits with the root cause's code. With ``fail`` or ``restart`` any failure of the
final attempt fails the job.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence

from .errors import WorkerError, read_error_file
from .supervisor import WorkerResult

__all__ = ["root_cause", "job_exit_code", "render_table", "describe_end", "render_root_cause"]


def root_cause(results: Sequence[WorkerResult]) -> WorkerResult | None:
    """The first worker to fail, or ``None`` when none failed."""
    failed = [r for r in results if r.failed]
    if not failed:
        return None
    return min(failed, key=lambda r: (r.failure_time, r.rank))


def _tolerated(failure: WorkerResult, results: Sequence[WorkerResult]) -> bool:
    end = failure.failure_time
    return any(
        other is not failure and (other.ended is None or other.ended > end)
        for other in results
    )


def job_exit_code(results: Sequence[WorkerResult], policy: str) -> int:
    """The launcher's exit code for a finished job (see the module docstring)."""
    cause = root_cause(results)
    if cause is None:
        return 0
    if policy == "shrink" and all(_tolerated(r, results) for r in results if r.failed):
        return 0
    return cause.code


def stuck_hint(state: str, lead: str) -> str:
    """For a process state in uninterruptible sleep (``D ...``), why SIGKILL cannot end it,
    after ``lead``; else nothing."""
    return f"{lead}stuck in the kernel (a hung driver or file system call?)" if state.startswith("D") else ""


def describe_end(r: WorkerResult) -> str:
    """``exit 0``, ``exit 3``, ``SIGKILL``, ``hung, SIGKILL`` (killed as hung), ``node lost``,
    ``unreapable, state D`` or ``running``."""
    if r.lost:
        return "node lost"
    if r.unreapable:
        return f"unreapable, state {r.state.split(' ', 1)[0] if r.state else 'unknown'}"
    if r.signal is not None:
        try:
            name = signal.Signals(r.signal).name
        except ValueError:
            name = f"signal {r.signal}"
        return f"hung, {name}" if r.hung else name
    if r.exit_code is not None:
        return f"exit {r.exit_code}"
    return "running"


def render_table(results: Sequence[WorkerResult], *, title: str = "",
                 mark_cause: bool = True) -> str:
    """A plain-text table: rank, host, local rank, pid, how it ended, duration; the root
    cause marked unless ``mark_cause`` is false (a job stopped by a signal the agent got)."""
    cause = root_cause(results) if mark_cause else None
    head = ("rank", "host", "local", "pid", "result", "duration")
    rows = []
    for r in sorted(results, key=lambda r: r.rank):
        dur = (r.ended if r.ended is not None else time.time()) - r.started
        mark = "  <- root cause" if r is cause else ""
        rows.append((str(r.rank), r.host, str(r.local_rank), str(r.pid or "-"),
                     describe_end(r) + mark, f"{dur:.2f}s"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()
    out = [title] if title else []
    out.append(line)
    out.append("-" * len(line))
    out.extend("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
    return "\n".join(out) + "\n"


def render_root_cause(cause: WorkerResult, error: WorkerError | None = None) -> str:
    """The root-cause paragraph: who failed, how, and its recorded exception if any."""
    if error is None and cause.error_message is not None:
        error = WorkerError(cause.error_message, cause.error_traceback or "", None)
    if error is None and cause.error_file:
        error = read_error_file(cause.error_file)
    text = f"root cause: rank {cause.rank} on {cause.host} ({describe_end(cause)})\n"
    if error is not None:
        text += f"  {error.message}\n"
        if error.traceback:
            text += "".join(f"  | {ln}\n" for ln in error.traceback.rstrip().splitlines())
    elif cause.unreapable:
        state = cause.state or "unknown"
        text += f"  pid {cause.pid} was still alive after SIGKILL (process state {state}){stuck_hint(state, ': ')}\n"
    elif not cause.lost:
        text += ("  (no error file: decorate the entry point with launcher.record to get "
                 "the exception here)\n")
    return text
