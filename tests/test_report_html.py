"""The HTML report: findings first, the swimlane's data (bands, device phases, budget), and the page in headless chromium.

The run is the hand-built log of ``test_causes_known_answers`` (every mechanism, a carry-over chain, and at
step 29 a culprit — rank 0, slow device work before the all-to-all — with a victim, rank 3, waiting for it),
plus a serving trace with per-rank scheduler, worker and kernel spans and hostile text.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_causes_known_answers import RANKS, STEPS, plan, simulate, write_log
from test_ingest_kineto import write_rank

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.ingest import read_paths
from dsprof.analysis.outputs.findings import item_line, worst_first
from dsprof.analysis.outputs.html_report import REPORT_NAME, render_html, script_json, swimlane_data, write_html_report
from dsprof.analysis.outputs.perfetto_tracks import serving_span_count
from dsprof.commands.analysis_job import analyze_paths
from dsprof.commands.report import report_from_dir
from dsprof.errors import InputError
from dsprof.profiler import artifacts
from dsprof.testing.coupled import Shape, scenario_for, write_scenario
from dsprof.testing.synthetic import SyntheticRun

MS = 1_000_000
XSS = "<img src=x onerror=alert(1)>"
XSS_CAT = "</script><b>cat"
# rank 0's device, as its chip_process line names it: quotes, markup and an entity, which plotly must show as text
HOSTILE_DEVICE = 'npu:"0"<b>x</b>&amp;'
CULPRIT_STEP, CULPRIT, VICTIM = 29, 0, 3


def _serving_trace(runs: dict, path: Path) -> None:
    """SA_PROFILE-shaped spans in each rank process: a scheduler step, a worker span and a kernel span per run."""
    events = [{"ph": "M", "name": "process_name", "pid": 400, "tid": 0, "args": {"name": "serving"}}]
    first = min(run.times["root"] for run in runs.values()) // 1000
    last = max(run.times["root_end"] for run in runs.values()) // 1000
    events.append(
        {
            "name": "request",
            "cat": "request",
            "ph": "X",
            "ts": first - 500,
            "dur": last - first + 1000,
            "pid": 400,
            "tid": 1,
            "args": {"request_id": "r0"},
        }
    )
    for (rank, step), run in runs.items():
        pid, t = 500 + rank, run.times
        events += [
            {
                "name": "scheduler.step",
                "cat": "scheduler",
                "ph": "X",
                "ts": t["root"] // 1000,
                "dur": 40,
                "pid": pid,
                "tid": pid,
                "args": {"step": step, "rank": rank},
            },
            {
                "name": "worker.execute",
                "cat": "worker",
                "ph": "X",
                "ts": t["bind_end"] // 1000,
                "dur": 60,
                "pid": pid,
                "tid": pid,
                "args": {"step": step},
            },
            {
                "name": "kernel.decode_fwd",
                "cat": "kernel",
                "ph": "X",
                "ts": t["fence"] // 1000,
                "dur": 2000,
                "pid": pid,
                "tid": pid + 50,
                "args": {"step": step},
            },
            {
                "name": "kernel.verify",
                "cat": "kernel",
                "ph": "X",
                "ts": t["fence"] // 1000 + 2000,
                "dur": 1500,
                "pid": pid,
                "tid": pid + 50,
                "args": {"step": step},
            },
        ]
    events.append({"name": XSS, "cat": XSS_CAT, "ph": "X", "ts": first + 100, "dur": 50, "pid": 400, "tid": 7, "args": {}})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": events}))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("known")
    runs = plan()
    simulate(runs)
    write_log(runs, directory / artifacts.SERVER_LOG)
    log = directory / artifacts.SERVER_LOG
    log.write_text(log.read_text().replace("dev=npu:0]", "dev=" + HOSTILE_DEVICE.replace('"', "%22").replace("<", "%3C") + "]"))
    _serving_trace(runs, directory / artifacts.SERVING_TRACE_DIR / artifacts.MERGED_TRACE)
    (directory / artifacts.PERFORMANCE_SUMMARY).write_text(
        json.dumps(
            {
                "schema": artifacts.PERFORMANCE_SUMMARY_SCHEMA,
                "exit_status": 0,
                "message": "done",
                "workload": {"preset": XSS, "ranks": RANKS, "device_phases": True, "inject": ["gc", "straggler"], "rounds": None},
            }
        )
    )
    analyze_paths([directory], directory)
    return directory


@pytest.fixture(scope="module")
def result(run_dir):
    return analyze_paths([run_dir], None).result


@pytest.fixture(scope="module")
def page(run_dir) -> str:
    return (run_dir / REPORT_NAME).read_text()


# ---------------------------------------------------------------- server side


def test_script_json_cannot_end_the_script_block():
    value = {"name": "</script><script>alert(1)</script>", "sep": "a\u2028b\u2029c", "amp": "&lt;"}
    text = script_json(value)
    assert not set("<>&\u2028\u2029") & set(text)
    assert json.loads(text) == value


def test_findings_come_first_and_configuration_last_folded(page, result):
    body = page[page.index("<main>") :]
    order = [
        body.index(marker)
        for marker in (
            'id="findings"',
            'id="swimlane-section"',
            'id="step-charts"',
            'id="list-tail_steps"',
            'id="pipeline"',
            'id="percentiles"',
            '<details id="configuration">',
        )
    ]
    assert order == sorted(order)
    summary = result.summary
    worst = worst_first(summary["tail_steps"]["items"])[:5]
    findings = body[: order[1]]
    for item in worst:
        assert html.escape(item_line(item)) in findings
    assert "exit status 0" in findings and "tail cost" in findings and "pipeline" in findings
    assert html.escape(summary["pipeline"]["diagnosis"]) in findings


def test_a_failed_run_says_which_rank_failed_and_why_in_red(result):
    summary = dict(
        result.summary,
        exit_status=1,
        run={"exit_status": 1, "failed_rank": 2, "failed_device": "npu:2", "message": "rank 2 crashed at step 11"},
    )
    page = render_html(dataclasses.replace(result, summary=summary), span_budget=1000)
    verdict = re.search(r'<div class="verdict (\w+)" data-label="run"><dt>run</dt><dd>(.*?)</dd>', page)
    assert verdict and verdict.groups() == ("bad", "exit status 1: rank 2 crashed at step 11")
    assert re.search(r'<div class="verdict ok" data-label="swimlane">', page)


def test_no_python_literals_on_the_page(page):
    text = re.sub(r"<script.*?</script>", " ", page, flags=re.DOTALL)
    text = re.sub(r"<[^>]+>", " ", text)
    assert not re.findall(r"\b(True|False|None)\b|\{'|\['", html.unescape(text))
    assert "<td>gc, straggler</td>" in page and "<td>n/a</td>" in page and "<td>yes</td>" in page


_MISSING_RENDERED = re.compile(r"\b(None|nan|NaN|null|undefined)\b")


def _strings(value: object) -> list[str]:
    """Every string inside a JSON value: the text the page's script puts on screen."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _rendered_text(directory: Path) -> tuple[dict, str]:
    """report.html's data (what its script shows) and summary.md of an analysed directory."""
    page = (directory / REPORT_NAME).read_text()
    data = json.loads(re.search(r'<script type="application/json" id="dsprof-data">(.*?)</script>', page, re.DOTALL).group(1))
    return data, (directory / artifacts.SUMMARY_MD).read_text()


def test_no_missing_value_is_rendered_as_a_word(run_dir, tmp_path):
    """Slow steps with victims, tails, late starts, trends, serving: no rendered line reads ``rank None``."""
    coupled = tmp_path / "coupled"
    answers = write_scenario(scenario_for(Shape(ranks=4, steps=60, layers=2, seed=11, peer=True)), coupled)
    analyze_paths([coupled / artifacts.SERVER_LOG], coupled, threshold_ms=answers["threshold_ms"])
    for directory in (run_dir, coupled):
        data, text = _rendered_text(directory)
        assert all(data["lists"][key] for key in ("slow_steps", "tail_steps", "late_starts"))
        assert not [s for s in _strings(data) if _MISSING_RENDERED.search(s)]
        assert "Slow steps" in text and not _MISSING_RENDERED.findall(text)
    slow = json.loads((coupled / artifacts.SUMMARY_JSON).read_text())["slow_steps"]["items"]
    held = next(i for i in slow if any(c["role"] == "victim" for c in i["ranks"]))
    victims = sorted(c["rank"] for c in held["ranks"] if c["role"] == "victim")
    listed = next(i for i in data["lists"]["slow_steps"] if i["step"] == held["step"])
    assert listed["victims"] == victims
    assert f"rank {victims[0]}: peer wait: rank {victims[0]} waited" in " ".join(listed["also"])


def test_page_is_one_offline_file_with_escaped_text(page):
    from plotly.offline import get_plotlyjs

    assert page.count(get_plotlyjs()[:500]) == 1
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page)
    assert XSS not in page and XSS_CAT not in page and HOSTILE_DEVICE not in page
    assert html.escape(XSS) in page  # the workload preset, rendered as text


def test_bands_put_each_ranks_serving_lanes_with_its_pipeline_lanes(result):
    data = swimlane_data(result, span_budget=10**9)
    bands, rows = data["bands"], data["rows"]
    ranked = [(i, r) for i, r in enumerate(bands["rank"]) if r is not None]
    assert [r for _, r in ranked] == list(range(RANKS))
    for band, _ in ranked:
        first, count = bands["first_row"][band], bands["rows"][band]
        labels = rows["label"][first : first + count]
        # serving lanes in SPEC order (kernel spans of runs in flight together overlap: they get lanes), then pipeline lanes
        gc = [label for label in labels if label.endswith("garbage collections")]  # the rank's collections, beside its lanes
        labels = [label for label in labels if label not in gc]
        assert labels[:2] == ["scheduler", "worker"] and all(label.startswith("kernel") for label in labels[2:-2])
        assert labels[-2:] == ["lane 0", "lane 1"]
    # kernel spans stay separate spans on their rank's kernel rows: one per span, none merged
    kernel_rows = {i for i, label in enumerate(rows["label"]) if label.startswith("kernel")}
    kernels = [i for i, r in enumerate(data["spans"]["row"]) if r in kernel_rows]
    assert len(kernels) == 2 * RANKS * STEPS


def test_device_phases_sit_under_their_runner_run_at_launch_plus_offset(result, run_dir):
    data = swimlane_data(result, span_budget=10**9)
    spans, phases = data["spans"], data["phases"]
    runs = plan()
    simulate(runs)
    runner = {}
    for i, p in enumerate(spans["phase"]):
        if phases[p] == "runner_run":
            runner[(spans["row"][i], spans["step"][i])] = spans["start_us"][i]
    device = [i for i, d in enumerate(spans["device"]) if d]
    assert len(device) == 5 * RANKS * STEPS  # device_wall and forward, a2a_wait, verify, mtp per run
    for i in device:
        name = phases[spans["phase"][i]]
        assert name.startswith("device_wall")
        # device_wall at depth 2 -> level 3 (below the fence wait), sub-phases deeper
        assert spans["level"][i] == 3 + name.count(".")
        launch = runner[(spans["row"][i], spans["step"][i])]
        offset = spans["start_us"][i] - launch
        assert offset >= 1.0 - 1e-6  # the log's device spans start 1 µs after launch, later ones further in
    fwd = [i for i in device if phases[spans["phase"][i]] == "device_wall.forward" and spans["step"][i] == CULPRIT_STEP]
    lengths = sorted(spans["dur_us"][i] for i in fwd)
    assert lengths[-2:] == [23_000.0, 23_000.0]  # ranks 0 and 3 at step 29: 5 ms + the injected 18 ms


def test_over_budget_keeps_the_worst_steps_in_detail_and_aggregates_the_rest(result):
    total = swimlane_data(result, span_budget=10**9)["budget"]["total_spans"]
    budget = total // 4
    data = swimlane_data(result, span_budget=budget)
    info = data["budget"]
    # serving spans past the budget (the earliest that many are laid out, as in the combined swimlane) are counted as left out
    assert info["serving_spans_left_out"] == max(0, serving_span_count(result.engine) - budget) > 0
    assert info["limited"] and info["shown_spans"] + info["aggregated_spans"] + info["serving_spans_left_out"] == total
    assert len(data["spans"]["row"]) == info["shown_spans"] and sum(data["aggregate"]["spans"]) == info["aggregated_spans"]
    assert info["shown_spans"] + info["aggregate_bars"] <= budget
    detailed = set(data["spans"]["step"]) - {-1}
    assert len(detailed) == info["detailed_steps"] < STEPS
    skew = {row["step"]: row["runner_end_skew_ms"] for row in result.summary["per_step"]}
    assert min(skew[s] for s in detailed) >= max(skew[s] for s in set(skew) - detailed)
    covered = set()
    for lo, hi in zip(data["aggregate"]["step_lo"], data["aggregate"]["step_hi"], strict=True):
        covered.update(range(lo, hi + 1))
    assert set(skew) - detailed <= covered
    page = render_html(result, span_budget=budget)
    assert "over the span budget" in page and f"The {info['serving_spans_left_out']:,} serving spans after the first" in page


def test_report_from_dir_defaults_into_the_directory_and_rejects_a_file(run_dir, tmp_path):
    progress: list[str] = []
    assert report_from_dir(run_dir, tmp_path / "r.html", progress=progress.append) == tmp_path / "r.html"
    assert progress[-1].startswith("writing ")
    assert report_from_dir(run_dir) == run_dir / REPORT_NAME
    with pytest.raises(InputError, match="not a directory"):
        report_from_dir(run_dir / artifacts.SERVER_LOG)


# ---------------------------------------------------------------- headless chromium

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=30000",
    "--window-size=1400,1000",
]
# Before the page's own scripts: record errors; after them: act like a reader and write what happened into the DOM.
ERROR_HOOK = """<script>window.__errors=[];addEventListener('error',function(e){__errors.push(String(e.message))});
var __ce=console.error;console.error=function(){__errors.push(Array.from(arguments).join(' '));__ce.apply(console,arguments)};</script>"""


def _browse(page: str, check: str, tmp_path: Path) -> dict:
    """Load ``page`` with ``check`` (JS filling ``out``, run once the plots are drawn) in headless chromium; return ``out``."""
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"headless chromium is required for the browser tests and {CHROMIUM} is missing (make browser)")
    script = (
        "<script>dsprofReport.ready.then(function () { var r = dsprofReport, out = {};"
        + check
        + " out.errors = __errors; var pre = document.createElement('pre'); pre.id = 'check';"
        " pre.textContent = JSON.stringify(out); document.body.appendChild(pre); });</script>"
    )
    return browse_page(page, script, tmp_path)


def browse_page(page: str, script: str, tmp_path: Path, name: str = "report.html") -> dict:
    """Load ``page`` with :data:`ERROR_HOOK` and ``script`` (which writes JSON into ``<pre id="check">``) in headless chromium."""
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"headless chromium is required for the browser tests and {CHROMIUM} is missing (make browser)")
    path = tmp_path / name
    path.write_text(page.replace("<head>", "<head>" + ERROR_HOOK, 1).replace("</body>", script + "</body>", 1))
    result = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", path.as_uri()],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
    )
    found = re.search(r'<pre id="check">(.*?)</pre>', result.stdout, re.DOTALL)
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line and ("Uncaught" in line or "Refused" in line)]
    assert found, f"the report did not finish rendering; console: {console}"
    out = json.loads(html.unescape(found.group(1)))
    assert out["errors"] == [] and console == []
    return out


READER = """
var sw = r.data.swimlane;
out.rendered = document.body.dataset.rendered;
out.findingsTop = document.getElementById('findings').getBoundingClientRect().top;
out.firstWorstBottom = document.querySelector('#findings .worst li').getBoundingClientRect().bottom;
out.viewport = window.innerHeight;
out.view = [r.state.t0, r.state.t1]; out.decode = r.decodeWindow; out.extent = r.extent;
out.injected = document.querySelectorAll('img[src=x], main b, #lanes ~ b').length;
// the tail list: default order, then each sort
var tails = document.getElementById('list-tail_steps');
function column(name) { return Array.from(tails.querySelectorAll('ol.items li')).map(function (li) { return li.dataset[name]; }); }
out.byExcess = column('excess').map(Number);
tails.querySelector('[data-sort=rank]').click(); out.byRank = column('rank').map(Number);
tails.querySelector('[data-sort=step]').click(); out.byStep = column('step').map(Number);
tails.querySelector('[data-sort=mechanism]').click(); out.byMechanism = column('mechanism');
// zoom to the step where rank 3 waited for rank 0, from its list entry
tails.querySelector('[data-sort=step]').click();
Array.from(tails.querySelectorAll('ol.items li')).filter(function (li) { return li.dataset.step === '%(step)d'; })[0]
  .querySelector('button').click();
var h = r.state.highlight;
out.highlight = {step: h.step, rank: h.rank, victims: h.victims, phase: h.phase};
out.culprit = Array.from(h.spans).map(function (s) {
  return {band: sw.bands.label[sw.rows.band[sw.spans.row[s]]], phase: sw.phases[sw.spans.phase[s]], device: sw.spans.device[s],
          center: r.spanCenter(s)}; });
out.victims = Array.from(h.victimSpans).map(function (s) { return sw.bands.label[sw.rows.band[sw.spans.row[s]]]; });
out.viewAfterZoom = [r.state.t0, r.state.t1];
var i = sw.steps.step.indexOf(%(step)d); out.stepWindow = [sw.steps.start_ms[i], sw.steps.end_ms[i]];
// the culprit's device span is drawn, with its name, and hovering it says so
var c = out.culprit[0].center, box = document.getElementById('lanes').getBoundingClientRect();
out.culpritUnderPointer = r.spanAt(c.x - box.left, c.y - box.top) === Array.from(h.spans)[0];
document.getElementById('lanes').dispatchEvent(new MouseEvent('mousemove', {clientX: c.x, clientY: c.y, bubbles: true}));
out.hover = document.getElementById('tooltip').textContent.split('\\n');
out.labels = r.state.lastPaint.labels;
// filter and search
r.setFilter('rank 2');
out.filtered = Array.from(new Set(r.visibleLanes().map(function (l) { return sw.bands.label[l.band]; })));
r.setFilter('');
r.setSearch('a2a_wait'); out.searchCount = document.getElementById('search-count').textContent;
var hit = r.nextMatch(); out.searchHit = sw.names[sw.spans.name[hit]]; out.viewAfterSearch = [r.state.t0, r.state.t1];
out.searchHitStart = sw.spans.start_us[hit] / 1000;
r.setSearch('');
// hostile text: the span named like markup hovers as that text
var x = sw.names.indexOf(%(xss)s), xs = sw.spans.name.indexOf(x), b = sw.rows.band[sw.spans.row[xs]];
r.state.collapsed[b] = false; r.setFilter('');
var sx = sw.spans.start_us[xs] / 1000; r.state.t0 = sx - 1; r.state.t1 = sx + 1; r.setFilter('');
var at = r.spanCenter(xs);
document.getElementById('lanes').dispatchEvent(new MouseEvent('mousemove', {clientX: at.x, clientY: at.y, bubbles: true}));
out.hostileHover = document.getElementById('tooltip').textContent.split('\\n')[0];
// plotly: the marker of the culprit's step, hovered, names the hostile device as text
var plot = document.getElementById('end-skew'), k = plot.data[1].x.indexOf(%(step)d);
Plotly.Fx.hover(plot, [{curveNumber: 1, pointNumber: k}]);
var layer = plot.querySelector('.hoverlayer');
out.plotlyHover = layer.textContent; out.plotlyMarkup = layer.querySelectorAll('b, img').length;
"""


@pytest.mark.browser
def test_the_page_reads_findings_first_and_zooms_to_the_culprit(page, result, tmp_path):
    out = _browse(page, READER % {"step": CULPRIT_STEP, "xss": json.dumps(XSS)}, tmp_path)
    assert out["rendered"] == "true" and out["injected"] == 0
    assert 0 <= out["findingsTop"] and out["firstWorstBottom"] < out["viewport"]  # findings above the fold
    # the first view is the decode window, not the process start-up before it
    lo, hi = out["view"]
    assert lo <= out["decode"][0] and hi >= out["decode"][1] and hi - lo < 1.1 * (out["decode"][1] - out["decode"][0])
    # every tail step listed; sorts by excess (default), rank, step, mechanism
    items = result.summary["tail_steps"]["items"]
    assert out["byExcess"] == sorted((i["excess_ms"] for i in items), reverse=True)
    assert out["byRank"] == sorted(i["rank"] for i in items) and out["byStep"] == sorted(i["step"] for i in items)
    assert out["byMechanism"] == sorted(i["mechanism"] for i in items)
    # zoom to step 29: rank 0's slow forward pass is the culprit, rank 3 waited
    assert out["highlight"] == {"step": CULPRIT_STEP, "rank": CULPRIT, "victims": [VICTIM], "phase": "device_wall.forward"}
    assert [(c["band"].split(" (pid")[0], c["phase"], c["device"]) for c in out["culprit"]] == [
        (f"rank 0 · {HOSTILE_DEVICE}", "device_wall.forward", 1)
    ]
    assert [v.split(" ·")[0] for v in out["victims"]] == [f"rank {VICTIM}"]
    start, end = out["stepWindow"]
    assert out["viewAfterZoom"][0] < start < end < out["viewAfterZoom"][1] < end + (end - start)
    assert out["culpritUnderPointer"]
    assert out["hover"][0] == "chip.run.runner_run.device_wall.forward" and "culprit of the selected step" in out["hover"]
    assert "device clock: placed at runner_run start + its offset (approximate)" in out["hover"]
    # bars wide enough carry their names: the run's phases and, under runner_run, its device phases
    assert {"root", "runner_run", "native_fence_wait", "device_wall", "device_wall.forward", "verify"} <= set(out["labels"])
    # the lane filter keeps rank 2's band only; the search finds every a2a_wait and jumps to the first
    assert [b.split(" (pid")[0] for b in out["filtered"]] == ["rank 2 · npu:2"]
    assert out["searchCount"] == f"{RANKS * STEPS} matching spans" and out["searchHit"].endswith("a2a_wait")
    assert out["viewAfterSearch"][0] <= out["searchHitStart"] <= out["viewAfterSearch"][1]
    # hostile text stays text, in the tooltip and in plotly's labels (no &quot; shown, no markup made)
    assert out["hostileHover"] == XSS
    assert HOSTILE_DEVICE in out["plotlyHover"] and "&quot;" not in out["plotlyHover"] and out["plotlyMarkup"] == 0


PAGER = """
var late = document.getElementById('list-tail_steps'), seen = [];
out.pages = late.querySelector('.page').textContent;
for (var p = 0, label = null; p < 10 && late.querySelector('.page').textContent !== label; p++) {  // until "next" stays put
  label = late.querySelector('.page').textContent;
  Array.from(late.querySelectorAll('ol.items li')).forEach(function (li) { seen.push(Number(li.dataset.step)); });
  late.querySelector('[data-page="1"]').click();
}
out.seen = seen;
out.bands = r.visibleLanes().filter(function (l) { return l.kind !== 'band'; }).map(function (l) { return l.kind; });
out.budget = r.data.swimlane.budget;
"""


@pytest.mark.browser
def test_long_lists_page_through_every_item_and_many_ranks_open_folded(tmp_path):
    ranks, steps = 20, 240
    fence = np.full((ranks, steps), 9 * MS, dtype=np.int64)
    fence[np.arange(steps) % ranks, np.arange(steps)] += 8 * MS  # a tail on a different rank every step
    SyntheticRun(ranks=ranks, steps=steps, fence_wait_ns=fence, sa_worker_spans=False).write(tmp_path / "run")
    outcome = analyze_paths([tmp_path / "run"], None)
    tails = outcome.summary["tail_steps"]["items"]
    assert len(tails) == steps
    out = _browse(render_html(outcome.result, span_budget=20_000), PAGER, tmp_path)
    assert out["pages"] == f"page 1 of 3 ({steps} items)"
    assert sorted(out["seen"]) == sorted(i["step"] for i in tails)  # every item reachable, each once
    assert set(out["bands"]) == {"summary"} and len(out["bands"]) == ranks + 1  # folded: one row per band
    assert out["budget"]["limited"]


def test_write_html_report_refuses_a_zero_budget(result, tmp_path):
    with pytest.raises(ValueError):
        write_html_report(result, tmp_path / "r.html", span_budget=0)


TRENDS = """
var t = document.getElementById('trends'), i = document.getElementById('step-interval');
out.trendTraces = t.data.map(function (d) { return d.name; });
out.windows = t.data[0].x.length;
out.saved = t.data[3].y;
out.drawn = t.querySelectorAll('.main-svg .scatterlayer .trace').length;
out.intervalPoints = i.data[0].y.length;
out.slowMarkers = i.data[1].x;
"""


@pytest.mark.browser
def test_the_trends_and_the_step_interval_are_drawn(page, result, tmp_path):
    out = _browse(page, TRENDS, tmp_path)
    trends = result.summary["trends"]
    assert out["trendTraces"] == ["step interval p50", "step interval p99", "runner-end skew p99", "what-if saving"]
    assert out["windows"] == len(trends["windows"]) > 1 and out["drawn"] == 3
    assert out["saved"] == [w["what_if_saved_ms"] for w in trends["windows"]]
    assert out["intervalPoints"] == len(result.summary["per_step"])
    findings = {i["step"] for i in result.summary["slow_steps"]["items"] if not i.get("noise")}  # noise is not marked
    assert sorted(out["slowMarkers"]) == sorted(findings) and findings


DEVICE_TIME = """
var plot = document.getElementById('device-time');
out.traces = plot.data.map(function (t) { return t.name; });
out.compute = plot.data[0].y; out.idle = plot.data[2].y; out.x = plot.data[0].x;
out.table = Array.from(document.querySelectorAll('table.device-time tbody tr')).map(function (tr) { return tr.textContent; });
"""


@pytest.mark.browser
def test_a_kineto_report_draws_the_device_time_beside_the_per_step_charts(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    for rank in (0, 1):
        write_rank(traces, rank)
    result = analyze_trace(read_paths([traces]))
    out = _browse(render_html(result), DEVICE_TIME, tmp_path)
    rows = result.summary["device_time"]["per_step"]
    assert out["traces"] == ["compute", "non-compute", "idle"]
    assert out["compute"] == [row["compute_ms"] for row in rows] and out["idle"] == [row["idle_ms"] for row in rows]
    assert out["x"] == [[str(row["step"]) for row in rows], [f"rank {row['rank']}" for row in rows]]
    assert out["table"][0] == "00.1800.1400.0400.0600.080"
