"""A self-contained HTML timeline of flight-recorder dumps (inline CSS/JS, no network).

A lane per rank (past 64 ranks, per group of ranks: see :mod:`.aggregate`), ops as bars coloured by op type, the culprit ranks and ops highlighted,
hover details, wheel/button zoom and drag to pan. The data travel as JSON inside the page.
"""
from __future__ import annotations

import html
import json
import re
from typing import Any

from torchcomms.errors import format_ranks
from torchcomms.tracing.viewer.aggregate import LANE_LIMIT, merge_runs, rank_groups, ranks_label
from torchcomms.tracing.viewer.analyze import Report, describe_call
from torchcomms.tracing.viewer.lanes import group_bars, span_bounds
from torchcomms.tracing.viewer.load import Op, TraceSet

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>__TITLE__</title>
<style>
body{font:13px system-ui,sans-serif;margin:0;background:#fafafa;color:#222}
header{padding:8px 12px;background:#263238;color:#fff;display:flex;gap:12px;align-items:center}
header h1{font-size:15px;margin:0;font-weight:600}
header button{background:#455a64;color:#fff;border:0;padding:3px 9px;border-radius:3px;cursor:pointer}
#findings{margin:8px 12px;padding:0;list-style:none}
#findings li{padding:4px 8px;margin:2px 0;background:#ffebee;border-left:4px solid #c62828}
#findings li.ok{background:#e8f5e9;border-color:#2e7d32}
#timeline{position:relative;margin:8px 12px;border:1px solid #ccc;background:#fff;overflow:hidden;user-select:none}
.lane{display:flex;border-bottom:1px solid #eee}
.lane.culprit .lane-label{background:#ffcdd2;color:#b71c1c;font-weight:700}
.lane-label{width:110px;font-size:12px;flex:none;padding:7px 8px;box-sizing:border-box;background:#eceff1;border-right:1px solid #ccc;white-space:nowrap;overflow:hidden}
.track{position:relative;flex:1;overflow:hidden}
.op{position:absolute;height:18px;min-width:2px;border-radius:2px;opacity:.9;box-sizing:border-box;cursor:pointer}
.op.inflight{background-image:repeating-linear-gradient(45deg,rgba(255,255,255,.35) 0 4px,transparent 4px 8px)}
.op.culprit{outline:2px solid #d50000;outline-offset:1px;z-index:2}
.op:hover{opacity:1;filter:brightness(1.15)}
#axis{position:relative;height:18px;margin:0 12px 0 122px;font-size:11px;color:#555;overflow:hidden}
#axis span{position:absolute;top:2px;transform:translateX(-50%);white-space:nowrap}
#axis span.first{transform:none}
#axis span.last{transform:translateX(-100%)}
.comm-label{position:absolute;left:2px;font-size:10px;color:#90a4ae;pointer-events:none}
#tip{position:fixed;display:none;pointer-events:none;background:#263238;color:#fff;padding:6px 8px;border-radius:4px;font-size:12px;max-width:520px;white-space:pre-wrap;z-index:10}
#legend{margin:4px 12px;display:flex;gap:10px;flex-wrap:wrap}
#legend span{display:inline-flex;align-items:center;gap:4px}
#legend i{display:inline-block;width:12px;height:12px;border-radius:2px}
</style></head>
<body>
<header><h1>__TITLE__</h1>
<button id="zoom-in" title="zoom in">+</button><button id="zoom-out" title="zoom out">&minus;</button><button id="zoom-reset">reset</button>
<span id="range"></span></header>
<ul id="findings"></ul>
<div id="legend"></div>
<div id="axis"></div>
<div id="timeline"></div>
<div id="tip"></div>
<script id="trace-data" type="application/json">__DATA__</script>
<script>
(function(){
"use strict";
var D = JSON.parse(document.getElementById("trace-data").textContent);
var PALETTE = ["#1e88e5","#43a047","#fb8c00","#8e24aa","#00acc1","#f4511e","#3949ab","#7cb342","#6d4c41","#c0ca33","#5e35b1","#00897b"];
var ROW = 22;
var colors = {};
D.op_types.forEach(function(t, i){ colors[t] = PALETTE[i % PALETTE.length]; });
var view = {t0: D.t_min, t1: D.t_max > D.t_min ? D.t_max : D.t_min + 1};
var full = {t0: view.t0, t1: view.t1};
var tl = document.getElementById("timeline"), tip = document.getElementById("tip");
function el(tag, cls, text){ var e = document.createElement(tag); if (cls) e.className = cls; if (text != null) e.textContent = text; return e; }
var fl = document.getElementById("findings");
if (D.findings.length === 0) { fl.appendChild(el("li", "ok", "No problems found")); }
D.findings.forEach(function(f){ var li = el("li", "finding " + f.kind, f.message); li.dataset.kind = f.kind; fl.appendChild(li); });
var lg = document.getElementById("legend");
D.op_types.forEach(function(t){ var s = el("span", null, null); var i = el("i"); i.style.background = colors[t]; s.appendChild(i); s.appendChild(document.createTextNode(t)); lg.appendChild(s); });
var bars = [];
var byLane = D.lanes.map(function(){ return []; });
D.ops.forEach(function(o){ byLane[o.lane].push(o); });
D.lanes.forEach(function(ln, li){
  var lane = el("div", "lane"); lane.dataset.ranks = ln.ranks;
  if (ln.rank !== null) lane.dataset.rank = ln.rank;
  if (ln.culprit) lane.classList.add("culprit");
  lane.appendChild(el("div", "lane-label", ln.label));
  lane.title = ln.label;
  var track = el("div", "track"); lane.appendChild(track); tl.appendChild(lane);
  lane.style.height = (D.comms.length * ROW + 8) + "px";
  if (D.comms.length > 1 && D.comms.length <= 8) D.comms.forEach(function(c, i){ var l = el("div", "comm-label", c); l.style.top = (4 + i * ROW + 3) + "px"; track.appendChild(l); });
  byLane[li].forEach(function(o){
    var b = el("div", "op op-" + o.op); b.style.background = colors[o.op];
    b.style.top = (4 + D.comms.indexOf(o.comm) * ROW) + "px";
    b.dataset.op = o.op; b.dataset.seq = o.seq; b.dataset.comm = o.comm; b.dataset.state = o.state;
    if (ln.rank !== null) b.dataset.rank = ln.rank; else b.dataset.ranks = ln.ranks;
    if (o.culprit) b.classList.add("culprit");
    if (o.inflight) b.classList.add("inflight");
    b.addEventListener("mousemove", function(ev){
      tip.textContent = (ln.rank !== null ? "rank " + ln.rank : ln.label) + " · comm " + o.comm + "\\n" + o.op + " #" + o.seq + " (" + o.state + ")\\n" + o.call +
        "\\nstart +" + o.start.toFixed(3) + " ms, " + (o.inflight ? "still running at dump" : "took " + (o.end - o.start).toFixed(3) + " ms") + (o.error ? "\\nerror: " + o.error : "");
      tip.style.display = "block"; tip.style.left = (ev.clientX + 12) + "px"; tip.style.top = (ev.clientY + 12) + "px";
    });
    b.addEventListener("mouseleave", function(){ tip.style.display = "none"; });
    track.appendChild(b); bars.push([b, o]);
  });
});
function layout(){
  var span = view.t1 - view.t0;
  bars.forEach(function(p){
    var o = p[1], b = p[0];
    b.style.left = ((o.start - view.t0) / span * 100) + "%";
    b.style.width = (Math.max(o.end - o.start, 0) / span * 100) + "%";
  });
  var ax = document.getElementById("axis"); ax.textContent = "";
  for (var i = 0; i <= 5; i++) {
    var s = el("span", i === 0 ? "first" : (i === 5 ? "last" : null), (view.t0 + span * i / 5).toFixed(2) + " ms");
    s.style.left = (i * 20) + "%"; ax.appendChild(s);
  }
  document.getElementById("range").textContent = span.toFixed(3) + " ms shown";
}
function zoom(f, center){
  var span = view.t1 - view.t0, c = center == null ? view.t0 + span / 2 : center;
  var ns = Math.max(span * f, 1e-6);
  view.t0 = c - (c - view.t0) * ns / span; view.t1 = view.t0 + ns; layout();
}
document.getElementById("zoom-in").onclick = function(){ zoom(0.5); };
document.getElementById("zoom-out").onclick = function(){ zoom(2); };
document.getElementById("zoom-reset").onclick = function(){ view.t0 = full.t0; view.t1 = full.t1; layout(); };
tl.addEventListener("wheel", function(ev){
  ev.preventDefault(); var rect = tl.getBoundingClientRect(); var x = (ev.clientX - rect.left - 110) / (rect.width - 110);
  zoom(ev.deltaY < 0 ? 0.8 : 1.25, view.t0 + x * (view.t1 - view.t0));
}, {passive: false});
var drag = null;
tl.addEventListener("mousedown", function(ev){ drag = {x: ev.clientX, t0: view.t0, t1: view.t1}; });
window.addEventListener("mouseup", function(){ drag = null; });
window.addEventListener("mousemove", function(ev){
  if (!drag) return; var w = tl.getBoundingClientRect().width - 110; var dt = (ev.clientX - drag.x) / w * (drag.t1 - drag.t0);
  view.t0 = drag.t0 - dt; view.t1 = drag.t1 - dt; layout();
});
layout();
document.body.dataset.ready = "1";
})();
</script>
</body></html>
"""


def _span(o: Op, origin: int, horizon: int) -> tuple[float, float, bool]:
    assert o.created_ns is not None
    inflight = not o.finished or (o.state != "completed" and not o.completed_ns)
    end = o.completed_ns or (o.created_ns + int(o.duration_ms * 1e6) if o.duration_ms is not None else horizon)
    return (o.created_ns - origin) / 1e6, (max(end, o.created_ns) - origin) / 1e6, inflight


def _rank_rows(ops: list[Op], lane_of: dict[int, int], culprit_ops: set[tuple[str, int]], origin: int,
               horizon: int) -> list[dict[str, Any]]:
    rows = []
    for o in ops:
        start, end, inflight = _span(o, origin, horizon)
        rows.append({
            "lane": lane_of[o.rank], "rank": o.rank, "comm": o.comm, "op": o.op, "seq": o.display_seq,
            "state": o.state, "start": start, "end": end, "call": describe_call(o), "error": o.error,
            "inflight": inflight, "culprit": (not o.is_p2p) and (o.comm, o.display_seq) in culprit_ops,
        })
    return rows


def _group_rows(ops: list[Op], lane_of: dict[int, int], culprit_ops: set[tuple[str, int]], origin: int,
                horizon: int, lanes: int) -> list[dict[str, Any]]:
    """One bar per (lane, comm, op, seq): the group's first start to its last finish."""
    spans: dict[tuple[int, str, str, int, bool], list[Any]] = {}
    for o in ops:
        start, end, inflight = _span(o, origin, horizon)
        key = (lane_of[o.rank], o.comm, o.op, o.display_seq, o.is_p2p)
        cur = spans.get(key)
        if cur is None:
            spans[key] = [start, end, inflight, o, 1]
            continue
        cur[0], cur[2], cur[4] = min(cur[0], start), cur[2] or inflight, cur[4] + 1
        if end > cur[1]:
            cur[1], cur[3] = end, o
    per_lane: list[list[dict[str, Any]]] = [[] for _ in range(lanes)]
    for (lane, comm, op, seq, is_p2p), (start, end, inflight, last, count) in spans.items():
        per_lane[lane].append({
            "lane": lane, "comm": comm, "op": op, "seq": seq, "state": last.state, "start": start, "end": end,
            "call": f"{count} ranks; last to finish: rank {last.rank}, {describe_call(last)}", "error": last.error,
            "inflight": inflight, "culprit": (not is_p2p) and (comm, seq) in culprit_ops,
        })
    return [row for rows in per_lane for row in merge_runs(rows)]


def view_data(ts: TraceSet, report: Report) -> dict[str, Any]:
    """The JSON the page renders: a lane per rank, or per group of ranks (culprit ranks alone)
    past :data:`~torchcomms.tracing.viewer.aggregate.LANE_LIMIT` ranks."""
    table = ts.table()
    origin, horizon = span_bounds(table, [d.dumped_at_ns or 0 for d in ts.dumps.values()])
    culprits = report.culprit_ranks
    groups = [[r] for r in ts.ranks] if len(ts.ranks) <= LANE_LIMIT else rank_groups(ts.ranks, culprits)
    lane_of = {r: i for i, group in enumerate(groups) for r in group}
    lanes = []
    for group in groups:
        single = group[0] if len(group) == 1 else None
        host = ts.dumps[single].host if single is not None else None
        lanes.append({"rank": single, "ranks": format_ranks(group), "culprit": bool(culprits & set(group)),
                      "label": f"rank {single}" + (f" · {host}" if host else "") if single is not None else ranks_label(group)})
    rows: list[dict[str, Any]] | None = None
    if len(groups) < len(ts.ranks):
        rows = group_bars(table, lane_of, len(groups), report.culprit_ops, origin, horizon, describe_call)
    if rows is None:
        ops = [o for o in ts.all_ops() if o.created_ns]
        if len(groups) == len(ts.ranks):
            rows = _rank_rows(ops, lane_of, report.culprit_ops, origin, horizon)
        else:
            rows = _group_rows(ops, lane_of, report.culprit_ops, origin, horizon, len(groups))
    t_max = max((r["end"] for r in rows), default=1.0)
    return {
        "ranks": ts.ranks,
        "lanes": lanes,
        "hosts": {r: ts.dumps[r].host or "" for r in ts.ranks} if len(groups) == len(ts.ranks) else {},
        "ops": rows,
        "op_types": sorted({r["op"] for r in rows}),
        "comms": sorted({r["comm"] for r in rows}),
        "culprit_ranks": sorted(culprits),
        "findings": [{"kind": f.kind, "message": f.message} for f in report.findings],
        "t_min": 0.0,
        "t_max": t_max if t_max > 0 else 1.0,
    }


def render_html(ts: TraceSet, report: Report, title: str | None = None) -> str:
    """The page as a string."""
    data = json.dumps(view_data(ts, report), separators=(",", ":"))
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    t = title or f"torchcomms trace — {len(ts.ranks)} ranks" + (f", run {ts.run_id}" if ts.run_id else "")
    fill = {"__TITLE__": html.escape(t), "__DATA__": data}
    # one pass: a title holding "__DATA__" (a run id is the dump writer's) stays a title
    return re.sub("__TITLE__|__DATA__", lambda m: fill[m.group()], _TEMPLATE)
