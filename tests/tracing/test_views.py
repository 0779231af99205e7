"""Perfetto export (fields, nesting, flows) and the HTML timeline rendered in headless Chromium."""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

from torchcomms.tracing.viewer.analyze import analyze
from torchcomms.tracing.viewer.cli import run
from torchcomms.tracing.viewer.html_view import render_html
from torchcomms.tracing.viewer.load import load_dumps

from tests.tracing._support import Rec, write_job

RANKS = (0, 1, 2)


def _job(tmp_path: Path) -> Path:
    """3 ranks, 2 comms; rank 2 never enters all_reduce #3 of 'dp' (still waiting at the dump,
    which comes 3 ms after the last op, so the timeline spans tens of ms)."""
    T0 = time.time_ns() - 12_000_000
    per_rank = {}
    for r in RANKS:
        recs = [
            Rec("dp", RANKS, r, "all_reduce", 1, t0=T0 + r * 100_000).complete(3_000_000),
            Rec("dp", RANKS, r, "broadcast", 2, root=0, t0=T0 + 5_000_000 + r * 50_000).complete(1_000_000),
            Rec("tp", RANKS, r, "all_gather_single", 1, sizes=[[16]], t0=T0 + 6_000_000).complete(500_000),
        ]
        if r != 2:
            recs.append(Rec("dp", RANKS, r, "all_reduce", 3, t0=T0 + 9_000_000 + r).start())
        per_rank[r] = recs
    # dumped 12 ms after T0 whatever the host's load (the bars' widths scale with the span: a
    # dump written seconds later on a loaded suite run squeezed the 3 ms all_reduce under 20 px)
    write_job(tmp_path, per_rank, dumped_at_ns=T0 + 12_000_000)
    return tmp_path


def test_perfetto_export_fields_nesting_and_flows(tmp_path: Path) -> None:
    dumps = _job(tmp_path / "d")
    out = tmp_path / "trace.json"
    assert run(["export", str(dumps), "--perfetto", str(out)]) == 0
    trace = json.loads(out.read_text())
    ev = trace["traceEvents"]
    meta = [e for e in ev if e["ph"] == "M"]
    host = __import__("socket").gethostname()
    assert {e["args"]["name"] for e in meta if e["name"] == "process_name"} == {f"rank {r} ({host})" for r in RANKS}
    assert {e["args"]["name"] for e in meta if e["name"] == "thread_name"} == {"comm dp", "comm tp"}
    for e in ev:
        assert {"ph", "pid", "name"} <= set(e)
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0 and "tid" in e and "cat" in e
    # Async slices: balanced b/e per id, children nested inside their parent.
    stacks: dict[tuple[int, str], list[dict]] = defaultdict(list)
    spans: dict[tuple[int, str], list[tuple[str, float, float]]] = defaultdict(list)
    for e in sorted((e for e in ev if e["ph"] in "be"), key=lambda e: (e["ts"], e["ph"] == "b")):
        key = (e["pid"], e["id2"]["local"])
        if e["ph"] == "b":
            stacks[key].append(e)
        else:
            top = stacks[key].pop()
            assert top["name"] == e["name"] and e["ts"] >= top["ts"]
            spans[key].append((e["name"], top["ts"], e["ts"]))
    assert all(not s for s in stacks.values())
    ops = [s for v in spans.values() for s in v if s[0] != "running"]
    assert len(ops) == 3 * 3 + 2
    for key, v in spans.items():
        outer = [s for s in v if s[0] != "running"]
        inner = [s for s in v if s[0] == "running"]
        assert len(outer) == 1
        for s in inner:
            assert outer[0][1] <= s[1] <= s[2] <= outer[0][2]
    ar1 = [s for s in ops if s[0] == "all_reduce #1"]
    assert len(ar1) == 3 and all(s[2] - s[1] == pytest.approx(3000 + 1, abs=0.01) for s in ar1)
    # The in-flight all_reduce #3 carries the culprit flag.
    b3 = [e for e in ev if e["ph"] == "b" and e["name"] == "all_reduce #3"]
    assert len(b3) == 2 and all(e["args"]["culprit"] for e in b3)
    # Flows: one per collective, s -> t -> f across distinct ranks, in arrival order, bound to markers.
    flows: dict[int, list[dict]] = defaultdict(list)
    for e in ev:
        if e["ph"] in "stf":
            flows[e["id"]].append(e)
    assert len(flows) == 4  # dp #1, #2, #3 (2 ranks), tp #1
    markers = {(e["pid"], e["tid"], e["ts"]) for e in ev if e["ph"] == "X"}
    for chain in flows.values():
        phases = [e["ph"] for e in chain]
        assert phases[0] == "s" and phases[-1] == "f" and set(phases[1:-1]) <= {"t"}
        assert len({e["pid"] for e in chain}) == len(chain)
        assert [e["ts"] for e in chain] == sorted(e["ts"] for e in chain)
        for e in chain:
            assert (e["pid"], e["tid"], e["ts"] - 0.5) in markers
            if e["ph"] != "s":
                assert e["bp"] == "e"


def test_html_is_self_contained(tmp_path: Path) -> None:
    ts = load_dumps([_job(tmp_path / "d")])
    page = render_html(ts, analyze(ts))
    assert "http://" not in page and "https://" not in page and "<link" not in page and "src=" not in page
    data = page.split('<script id="trace-data" type="application/json">')[1].split("</script>")[0]
    parsed = json.loads(data)
    assert parsed["culprit_ranks"] == [2] and len(parsed["ops"]) == 11


def _chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        return None
    try:
        import selenium  # noqa: F401
    except ImportError:
        return None
    return browser, driver


@pytest.mark.skipif(_chromium() is None, reason="needs chromium, chromedriver and selenium (scripts/setup.sh installs them)")
def test_html_timeline_renders_in_headless_chromium(tmp_path: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    found = _chromium()
    assert found is not None
    browser, driver_path = found
    page = tmp_path / "view.html"
    assert run(["view", str(_job(tmp_path / "d")), "-o", str(page)]) == 0
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    profile = tempfile.mkdtemp(prefix="tc-chromium-", dir=tmp_path)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", f"--user-data-dir={profile}", "--window-size=1400,700"):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        drv.get(page.as_uri())
        WebDriverWait(drv, 30).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        lanes = drv.find_elements(By.CSS_SELECTOR, ".lane")
        assert [ln.get_attribute("data-rank") for ln in lanes] == ["0", "1", "2"]
        assert [ln.get_attribute("data-rank") for ln in drv.find_elements(By.CSS_SELECTOR, ".lane.culprit")] == ["2"]
        bars = drv.find_elements(By.CSS_SELECTOR, ".op")
        assert len(bars) == 11
        assert {b.get_attribute("data-op") for b in bars} == {"all_reduce", "broadcast", "all_gather_single"}
        culprit = drv.find_elements(By.CSS_SELECTOR, ".op.culprit")
        assert sorted(b.get_attribute("data-rank") for b in culprit) == ["0", "1"]
        assert all(b.get_attribute("data-seq") == "3" for b in culprit)
        colors = {b.get_attribute("data-op"): b.value_of_css_property("background-color") for b in bars}
        assert len(set(colors.values())) == 3  # one colour per op type
        widths = [b.size["width"] for b in bars if b.get_attribute("data-op") == "all_reduce" and b.get_attribute("data-seq") == "1"]
        assert all(w > 20 for w in widths)
        finding = drv.find_element(By.CSS_SELECTOR, "#findings li.missing_rank").text
        assert "rank 2 never entered all_reduce #3" in finding
        # One row per communicator inside each lane.
        tops = {b.get_attribute("data-comm"): b.location["y"] - lanes[int(b.get_attribute("data-rank"))].location["y"] for b in bars}
        assert tops["tp"] > tops["dp"]
        png = tmp_path / "timeline.png"
        assert drv.save_screenshot(str(png))
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        # Zoom in: bars get wider.
        drv.find_element(By.ID, "zoom-in").click()
        wider = [b.size["width"] for b in bars if b.get_attribute("data-op") == "all_reduce" and b.get_attribute("data-seq") == "1"]
        assert all(w2 > w1 * 1.5 for w1, w2 in zip(widths, wider))
        # Hover shows the details tooltip.
        webdriver.ActionChains(drv).move_to_element(culprit[0]).perform()
        tip = drv.find_element(By.ID, "tip")
        assert tip.is_displayed() and "all_reduce #3" in tip.text
        assert drv.save_screenshot(str(tmp_path / "timeline-zoomed.png"))
    finally:
        drv.quit()
