"""``torchcomms-trace``: analyze, export and view flight-recorder dumps.

Exit codes: 0 clean, 1 problems found (analyze), 2 unusable input or usage error — always
with one clear line, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_CLEAN, EXIT_PROBLEMS, EXIT_UNUSABLE = 0, 1, 2

# C0 and C1 controls, DEL, and the bidirectional overrides and isolates (which reorder what a
# terminal shows: "Trojan Source")
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """``text`` with every control character written as its escape (``\\x1b``): names in a
    dump are the dump writer's, and an escape sequence printed raw would drive the reader's
    terminal (clear it, retitle it, hide a line)."""
    return _UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], str(text))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"torchcomms-trace: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_UNUSABLE)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="torchcomms-trace", description="Analyse, export and view torchcomms / PyTorch flight-recorder dumps.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    a = sub.add_parser("analyze", help="merge per-rank dumps and report hangs, mismatches, stragglers, bandwidth")
    a.add_argument("dumps", nargs="+", help="dump files or folders of them (one per rank)")
    a.add_argument("--json", action="store_true", help="print the report as JSON")
    a.add_argument("--top", type=int, default=10, help="how many of the slowest ops and stragglers to list (default 10)")
    e = sub.add_parser("export", help="convert dumps to another trace format")
    e.add_argument("dumps", nargs="+")
    e.add_argument("--perfetto", metavar="OUT.json", required=True, help="write Chrome/Perfetto trace-event JSON here")
    v = sub.add_parser("view", help="write a self-contained HTML timeline")
    v.add_argument("dumps", nargs="+")
    v.add_argument("-o", "--output", metavar="OUT.html", required=True)
    v.add_argument("--title", default=None)
    for cmd in (a, e, v):
        cmd.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                         help="show a progress bar while loading dumps (default: when stderr is a terminal)")
        cmd.add_argument("--workers", type=int, default=None, metavar="N",
                         help="processes that parse the dumps, each bounded in CPU time and memory (default: one per "
                              "usable CPU, at most 8)")
        cmd.add_argument("--dump-cpu-s", type=int, default=None, metavar="S",
                         help="CPU seconds reading one dump may take before it is refused as hostile (default: 10, "
                              "and 1 more per MiB of the file)")
    return p


def _load(args: argparse.Namespace) -> Any:
    """Load the dumps, with a progress bar on stderr when asked for (or stderr is a terminal)."""
    from torchcomms.tracing.viewer.load import load_dumps

    show = sys.stderr.isatty() if args.progress is None else args.progress
    if not show:
        return load_dumps(args.dumps, workers=args.workers, cpu_s=args.dump_cpu_s)
    import time

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("loading dumps"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    # no refresh thread: the parse workers are forked, which is safe only without other threads
    with Progress(*columns, console=Console(file=sys.stderr, force_terminal=args.progress or None),
                  transient=True, auto_refresh=False) as bar:
        task = bar.add_task("load", total=None)
        shown = [0.0]

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
            now = time.monotonic()
            if done == total or now - shown[0] >= 0.1:
                shown[0] = now
                bar.refresh()

        return load_dumps(args.dumps, progress=update, workers=args.workers, cpu_s=args.dump_cpu_s)


def _render_report(report: Any, out: Any, top: int = 10) -> None:
    from rich.console import Console
    from rich.markup import escape as escape_markup
    from rich.table import Table

    from torchcomms.tracing.viewer.aggregate import group_ranks
    from torchcomms.tracing.viewer.analyze import fmt_ranks

    def escape(text: object) -> str:  # what a dump wrote, shown as text only
        return escape_markup(printable(text))

    con = Console(file=out, width=max(100, Console(file=out).width), highlight=False)
    head = f"[bold]{len(report.ranks)} ranks[/] ({fmt_ranks(report.ranks)}), {report.op_count} ops, {len(report.comms)} comms"
    if report.run_id:
        head += f", run {escape(report.run_id)}"
    con.print(head)
    for note in report.notes:
        con.print(f"[dim]note: {escape(note)}[/]")
    if not report.findings:
        con.print("[bold green]No problems found.[/]")
    for f in report.findings:
        con.print(f"[bold red]PROBLEM[/] ({f.kind}) {escape(f.message)}", soft_wrap=True)
        if f.calls:
            t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
            t.add_column("ranks", justify="right")
            t.add_column("call")
            for ranks, call in group_ranks(f.calls):  # ranks with the same call share a row
                t.add_row(fmt_ranks(ranks), escape(call))
            con.print(t)
    if report.stragglers:
        t = Table(title="Arrival lag per rank (ms behind the first rank to arrive)", title_justify="left")
        for col in ("rank", "collectives", "mean", "p50", "max", "last to arrive"):
            t.add_column(col, justify="right")
        for s in report.stragglers[:top]:
            t.add_row(str(s["rank"]), str(s["collectives"]), f"{s['mean_lag_ms']:.3f}", f"{s['p50_lag_ms']:.3f}", f"{s['max_lag_ms']:.3f}", str(s["times_last"]))
        con.print(t)
        rest = report.stragglers[top:]
        if rest:
            con.print(f"[dim]... and {len(rest)} more ranks, mean lag {min(s['mean_lag_ms'] for s in rest):.3f}"
                      f" to {max(s['mean_lag_ms'] for s in rest):.3f} ms (--json lists every rank)[/]")
    if report.slowest:
        t = Table(title="Slowest ops", title_justify="left")
        for col in ("comm", "op", "seq", "ms", "bytes/rank"):
            t.add_column(col, justify="right")
        for s in report.slowest:
            t.add_row(escape(s["comm"]), escape(s["op"]), str(s["seq"]), f"{s['duration_ms']:.3f}", str(s["bytes"]))
        con.print(t)
    if report.bandwidth:
        t = Table(title="Bandwidth", title_justify="left")
        for col in ("comm", "op", "bytes/rank", "count", "mean ms", "algbw GB/s", "busbw GB/s"):
            t.add_column(col, justify="right")
        for b in report.bandwidth:
            t.add_row(
                escape(b["comm"]), escape(b["op"]), str(b["bytes"]), str(b["count"]), f"{b['mean_ms']:.3f}",
                f"{b['algbw_gbps']:.3f}" if b["algbw_gbps"] is not None else "-",
                f"{b['busbw_gbps']:.3f}" if b["busbw_gbps"] is not None else "-",
            )
        con.print(t)


def _write(path: str, text: str) -> None:
    from torchcomms.tracing.fr_format import write_atomic

    write_atomic(Path(path), text.encode("utf-8"), create_parents=False)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    from torchcomms.tracing.viewer.analyze import analyze
    from torchcomms.tracing.viewer.load import TraceInputError

    args = _parser().parse_args(argv)
    for flag, value in (("--workers", args.workers), ("--dump-cpu-s", args.dump_cpu_s)):
        if value is not None and value < 1:
            print(f"torchcomms-trace: error: {flag} must be >= 1, got {value}", file=sys.stderr)
            return EXIT_UNUSABLE
    try:
        ts = _load(args)
    except TraceInputError as exc:
        print(f"torchcomms-trace: unusable input: {printable(exc)}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.command == "analyze":
        if args.top < 0:
            print(f"torchcomms-trace: error: --top must be >= 0, got {args.top}", file=sys.stderr)
            return EXIT_UNUSABLE
        report = analyze(ts, top=args.top)
        if args.json:
            print(json.dumps(report.as_dict(), indent=2, default=str))
        else:
            _render_report(report, sys.stdout, args.top)
        return report.exit_code
    report = analyze(ts)
    try:
        if args.command == "export":
            from torchcomms.tracing.viewer.perfetto import to_perfetto

            _write(args.perfetto, json.dumps(to_perfetto(ts, report)))
            print(f"wrote {args.perfetto}")
        else:
            from torchcomms.tracing.viewer.html_view import render_html

            _write(args.output, render_html(ts, report, args.title))
            print(f"wrote {args.output}")
    except OSError as exc:
        print(f"torchcomms-trace: cannot write output: {exc.strerror or exc} ({exc.filename or ''})", file=sys.stderr)
        return EXIT_UNUSABLE
    return EXIT_CLEAN


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        code = run(argv)
    except KeyboardInterrupt:
        code = 130
    except SystemExit as exc:
        code = int(exc.code) if isinstance(exc.code, int) else EXIT_UNUSABLE
    except Exception as exc:  # noqa: BLE001 - the contract is one line, never a traceback
        print(f"torchcomms-trace: internal error: {type(exc).__name__}: {printable(exc)}", file=sys.stderr)
        code = EXIT_UNUSABLE
    sys.exit(code)


if __name__ == "__main__":
    main()
