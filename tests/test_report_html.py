"""The HTML report: data block, span budget, escaping, and the page in headless chromium."""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from dsprof.analysis.analyze import analyze
from dsprof.analysis.outputs.html_report import REPORT_NAME, _script_json, _swimlane_data, render_html, report_from_dir, write_html_report
from dsprof.errors import InputError
from dsprof.profiler.synthetic import SyntheticRun

RANKS = 4
STEPS = 24
# rank 2 waits 20 ms longer on its fence at step 7, 12 ms at step 15: the two worst runner-end skews
TAILS = {7: 20_000_000, 15: 12_000_000}
LATE_RANK = 2
XSS = "<img src=x onerror=alert(1)>"
XSS_CAT = "</script><b>cat"


def _fence_plan() -> np.ndarray:
    fence = np.full((RANKS, STEPS), 9_000_000, dtype=np.int64)
    for step, extra in TAILS.items():
        fence[LATE_RANK, step] += extra
    return fence


def _write_run(directory: Path) -> Path:
    """A synthetic artifact dir with two tail steps and hostile text in the serving trace and workload."""
    SyntheticRun(ranks=RANKS, steps=STEPS, fence_wait_ns=_fence_plan()).write(directory)
    merged = directory / "serving-trace" / "trace.json"
    doc = json.loads(merged.read_text())
    first = min(e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X")
    doc["traceEvents"].append({"name": XSS, "cat": XSS_CAT, "ph": "X", "ts": first + 100, "dur": 50, "pid": 7, "tid": 7, "args": {}})
    merged.write_text(json.dumps(doc))
    performance = directory / "performance_summary.json"
    summary = json.loads(performance.read_text())
    summary["workload"]["preset"] = XSS
    performance.write_text(json.dumps(summary))
    return directory


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return _write_run(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def analysed(run_dir):
    return analyze([run_dir])


@pytest.fixture(scope="module")
def swimlane(analysed):
    return analysed.swimlane


@pytest.fixture(scope="module")
def summary(analysed):
    return analysed.summary


def test_script_json_cannot_end_the_script_block():
    value = {"name": "</script><script>alert(1)</script>", "sep": "a\u2028b\u2029c", "amp": "&lt;"}
    text = _script_json(value)
    assert not set("<>&\u2028\u2029") & set(text)
    assert json.loads(text) == value


def test_every_span_is_drawn_once_without_a_budget(swimlane):
    data = _swimlane_data(swimlane, span_budget=10**9)
    total = len(swimlane.runtime) + int((swimlane.serving["ph"] == "X").sum())
    assert data["budget"] == {"total_spans": total, "span_budget": 10**9, "limited": False, "shown_spans": total,
                              "detailed_steps": None, "bucket_steps": 0, "aggregated_spans": 0}
    assert len(data["spans"]["row"]) == total and data["aggregate"]["row"] == []
    device_ticks = [t["text"] for t in data["ticks"] if t["kind"] == "device"]
    assert device_ticks == [f"npu:{r}" for r in range(RANKS)]
    # one sub-lane per pipeline-slot lane: the pipelined run overlaps consecutive roots (two lanes), and
    # rank 2's 29 ms step-7 root overlaps two successors (a third lane)
    rows = data["rows"]
    subs = {}
    for kind, label, sub in zip(rows["kind"], rows["label"], rows["sub"]):
        if kind == "device":
            subs.setdefault(label, []).append(sub)
    assert subs == {f"npu:{r}": [0, 1, 2] if r == LATE_RANK else [0, 1] for r in range(RANKS)}
    # the tail shows in the data: rank 2's fence wait at step 7 is 29 ms long
    phase = data["phases"]["name"].index("native_fence_wait")
    names = data["names"]
    fence = [
        d for p, st, r, d in zip(data["spans"]["phase"], data["spans"]["step"], data["spans"]["row"], data["spans"]["dur_us"])
        if p == phase and st == 7 and rows["rank"][r] == LATE_RANK
    ]
    assert fence == [29_000.0]
    assert XSS in names


def test_over_budget_keeps_the_worst_steps_in_detail(swimlane, summary):
    per_step = len(swimlane.runtime[swimlane.runtime["step"] == 0])
    budget = 2 * per_step + 200  # room for two steps in detail (the aggregate part takes 1/10)
    data = _swimlane_data(swimlane, span_budget=budget)
    info = data["budget"]
    assert info["limited"] and info["detailed_steps"] >= 1
    detailed = set(data["spans"]["step"]) - {-1}
    # the detailed steps are those with the largest runner-end skews
    skew = {s: TAILS.get(s, 0) for s in range(STEPS)}
    assert {7, 15} <= detailed and len(detailed) == info["detailed_steps"] < STEPS
    assert max(skew[s] for s in set(range(STEPS)) - detailed) <= min(skew[s] for s in detailed)
    assert info["shown_spans"] + info["aggregated_spans"] == info["total_spans"]
    assert sum(data["aggregate"]["spans"]) == info["aggregated_spans"]
    assert info["shown_spans"] + info["aggregate_bars"] <= budget
    # aggregated bars never cover a detailed step's spans
    agg = data["aggregate"]
    covered = set()
    for lo, hi in zip(agg["step_lo"], agg["step_hi"]):
        covered.update(range(lo, hi + 1))
    assert set(range(STEPS)) - detailed <= covered
    page = render_html(swimlane, summary, span_budget=budget)
    assert "over the span budget" in page


def test_page_is_one_offline_file_with_escaped_text(swimlane, summary, tmp_path):
    from plotly.offline import get_plotlyjs

    path = write_html_report(swimlane, summary, tmp_path / "report.html")
    page = path.read_text()
    assert page.count(get_plotlyjs()[:500]) == 1
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page)
    assert XSS not in page and XSS_CAT not in page
    assert html.escape(XSS) in page  # the workload preset, rendered as text


# ---------------------------------------------------------------- headless chromium

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0", "--virtual-time-budget=30000",
]
# Before the page's own scripts: record errors; after them: wait for the plots, act, and write results into the DOM.
ERROR_HOOK = """<script>window.__errors=[];addEventListener('error',function(e){__errors.push(String(e.message))});
var __ce=console.error;console.error=function(){__errors.push(Array.from(arguments).join(' '));__ce.apply(console,arguments)};</script>"""
CHECK = """<script>
dsprofReport.ready.then(function () {
  var gd = document.getElementById('swimlane'), r = dsprofReport, out = {};
  out.rendered = document.body.dataset.rendered;
  out.ticks = Array.from(gd.querySelectorAll('.ytick text')).map(function (t) { return t.textContent; });
  out.injected = document.querySelectorAll('img[src=x], b').length;
  // hover the hostile span for real: a mouse move over its bar fills the tooltip
  var sw = r.data.swimlane, item = sw.spans.name.indexOf(sw.names.indexOf(%(xss)s)), at = r.itemCenter(item);
  gd.dispatchEvent(new MouseEvent('mousemove', {clientX: at.x, clientY: at.y, bubbles: true}));
  out.hover = document.getElementById('tooltip').textContent.split('\\n');
  out.hoverItem = r.itemAt(at.x - gd.querySelector('canvas.spans').getBoundingClientRect().left, at.y - gd.querySelector('canvas.spans').getBoundingClientRect().top) === item;
  document.querySelector('button.zoom[data-step="7"]').click();
  out.range = gd.layout.xaxis.range;
  var st = r.data.swimlane.steps, i = st.step.indexOf(7);
  out.step7 = [st.start_ms[i], st.end_ms[i]];
  out.errors = __errors;
  var pre = document.createElement('pre'); pre.id = 'check'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"headless chromium is required for the browser tests and {CHROMIUM} is missing (apt-get install chromium)")
    profile = tmp_path / "chromium-profile"
    return subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120)


def _png_pixels(data: bytes) -> np.ndarray:
    """Decode an 8-bit RGB/RGBA PNG (what chromium writes) into an (h, w, channels) array."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert depth == 8 and color in (2, 6)
    channels = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, 1 + width * channels)
    out = np.zeros((height, width * channels), dtype=np.int32)
    prev = np.zeros(width * channels, dtype=np.int32)
    for y in range(height):
        kind, row = raw[y, 0], raw[y, 1:].astype(np.int32)
        if kind == 0:
            cur = row
        elif kind == 1:
            cur = _undo_left(row, np.zeros_like(row), channels, lambda a, b, c: a)
        elif kind == 2:
            cur = (row + prev) % 256
        elif kind == 3:
            cur = _undo_left(row, prev, channels, lambda a, b, c: (a + b) // 2)
        else:
            cur = _undo_left(row, prev, channels, _paeth)
        out[y] = cur
        prev = cur
    return out.reshape(height, width, channels)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def _undo_left(row: np.ndarray, prev: np.ndarray, bpp: int, predict) -> np.ndarray:
    cur = row.tolist()
    up = prev.tolist()
    for x in range(len(cur)):
        left = cur[x - bpp] if x >= bpp else 0
        upper_left = up[x - bpp] if x >= bpp else 0
        cur[x] = (cur[x] + predict(left, up[x], upper_left)) % 256
    return np.array(cur, dtype=np.int32)


@pytest.mark.browser
def test_report_renders_in_headless_chromium(swimlane, summary, tmp_path):
    page = render_html(swimlane, summary)
    page = page.replace("<head>", "<head>" + ERROR_HOOK, 1).replace("</body>", CHECK % {"xss": json.dumps(XSS)} + "</body>", 1)
    path = tmp_path / "report.html"
    path.write_text(page)
    result = _chromium(["--dump-dom", path.as_uri()], tmp_path)
    found = re.search(r'<pre id="check">(.*?)</pre>', result.stdout, re.S)
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line and ("Uncaught" in line or "Refused" in line)]
    assert found, f"the report did not finish rendering; console: {console}"
    check = json.loads(found.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&").replace("&quot;", '"'))
    assert check["errors"] == [] and console == []
    assert check["rendered"] == "true"
    # serving lanes on top (request, serving, scheduler, worker, kernel, then the hostile category), then one lane per device
    assert check["ticks"] == ["request", "serving", "scheduler", "worker", "kernel", XSS_CAT] + [f"npu:{r}" for r in range(RANKS)]
    assert check["injected"] == 0
    assert check["hover"][0] == XSS and "phase: serving · " + XSS_CAT in check["hover"] and check["hoverItem"]
    # clicking the tail entry zooms the time axis onto step 7
    lo, hi = check["range"]
    start, end = check["step7"]
    assert lo < start < end < hi and hi - lo < 2 * (end - start) + 1


@pytest.mark.browser
def test_screenshot_is_not_blank(swimlane, summary, tmp_path):
    path = write_html_report(swimlane, summary, tmp_path / "report.html")
    shot = tmp_path / "shot.png"
    _chromium(["--window-size=800,900", f"--screenshot={shot}", path.as_uri()], tmp_path)
    assert shot.exists(), "chromium wrote no screenshot"
    pixels = _png_pixels(shot.read_bytes())
    assert pixels.shape[:2] == (900, 800)
    gray = pixels[..., :3].mean(axis=2)
    assert gray.std() > 20  # text, bars and axes on white
    colors = {tuple(p) for p in pixels[::4, ::4, :3].reshape(-1, 3).tolist()}
    assert len(colors) > 50


def test_report_from_dir_lists_the_tail_steps_the_analysis_found(run_dir, summary, tmp_path):
    progress: list[str] = []
    path = report_from_dir(run_dir, tmp_path / "out.html", progress=progress.append)
    page = path.read_text()
    # the analysis finds the two injected tails on rank 2; each entry zooms to its step
    assert re.findall(r'<ol class="tail-steps">(.*?)</ol>', page, re.S)
    buttons = re.findall(r'<button type="button" class="zoom" data-step="(\d+)">', page)
    assert sorted(map(int, buttons)) == sorted(TAILS)
    assert "late rank 2 (npu:2)" in page and "native_fence_wait" in page
    # the percentile table carries the analysis' figures: the worst end skew is the 20 ms injected at step 7
    row = re.search(r"<tr><td>runner_end_skew_ms</td>(.*?)</tr>", page).group(1)
    assert re.findall(r"<td>(.*?)</td>", row)[3:5] == ["20.000", str(STEPS)]
    assert html.escape(summary["pipeline"]["diagnosis"]) in page
    assert progress and progress[-1].startswith("writing ")


def test_report_from_dir_defaults_into_the_directory_and_rejects_a_file(run_dir, tmp_path):
    assert report_from_dir(run_dir) == run_dir / REPORT_NAME
    assert (run_dir / REPORT_NAME).stat().st_size > 1_000_000
    with pytest.raises(InputError, match="not a directory"):
        report_from_dir(run_dir / "server.log")
