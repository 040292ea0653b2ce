"""The interactive HTML report: findings first, then a swimlane in which every lane can be read.

One offline file: plotly.js embedded once, the page's own ``report.js`` and
``report.css`` beside this module, and one JSON data block. Every figure comes
from the summary. Span data are computed in the engine (SQL) and travel as
compact columns; beyond ``span_budget`` the rest is drawn as grey bars, so a run
of any size fetches at most the budget of spans into Python. Every string from
a trace is escaped (:func:`script_json` for the data block). Sections, the
swimlane, the budget and untrusted text: docs/REPORTS.md, "report.html".
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from collections import Counter, defaultdict
from importlib import resources
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from plotly.offline import get_plotlyjs

from dsprof.analysis.analyze import AnalysisResult
from dsprof.analysis.outputs.drawing import collection_row, device_spans_sql, drawn_runs_sql, runtime_spans_sql
from dsprof.analysis.outputs.findings import LATE_LISTS, value, verdict_lines, window_text, worst_first
from dsprof.analysis.outputs.perfetto_tracks import TrackLayout, build_track_layout, lane_name, serving_lanes_sql, serving_span_count
from dsprof.analysis.outputs.report_charts import chart_data, list_items
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.summary import Summary
from dsprof.analysis.units import PERCENTILES
from dsprof.fileio import atomic_write_text
from dsprof.profiler import artifacts, sa_profile

REPORT_NAME = artifacts.REPORT_HTML
DEFAULT_SPAN_BUDGET = 200_000
# Over the span budget, the aggregate bars may take 1/AGGREGATE_SHARE of it; detailed steps the rest.
AGGREGATE_SHARE = 10
# Serving categories in the order their lanes appear in a band (docs/FORMATS.md "SA_PROFILE"); others follow alphabetically.
SERVING_LANE_ORDER = sa_profile.CATEGORIES
SERVING_PHASE_PREFIX = "serving · "
# Worst items of each list shown with the verdicts; the full lists are further down.
FINDINGS_ITEMS = 5
PERCENTILE_KEYS = (*(name for name, _ in PERCENTILES), "count")
# Bands start folded (one summary row) when the run has more ranks than this (a 64-rank run opens as one
# row per rank), and a band with more lanes than FOLDED_LANES (e.g. a batch's request lanes) always does.
EXPANDED_RANKS = 16
FOLDED_LANES = 8
# Verdict labels whose text says something is wrong when it starts so (findings.verdict_lines' wording);
# the figures-only lines (tail cost, counts) are information, neither good nor bad.
_BAD_PREFIXES = {"swimlane": "NOT", "pipeline": "SERIALIZED"}
_INFO_LABELS = ("what-if", "tail cost", "late")

_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:"


def script_json(data: object) -> str:
    """JSON that is safe inside <script>: no ``<``, ``>``, ``&`` or line separators survive literally."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


# ---------------------------------------------------------------- swimlane data (engine -> compact columns)


def _lane_rows(layout: TrackLayout) -> tuple[dict, pa.Table, pa.Table]:
    """Bands and rows of the swimlane (one row per track of the layout), and the row of each track.

    Returns the ``bands``/``rows`` data for the page, ``runtime_rows`` (pid, tid, lane, row) and
    ``serving_rows`` (pid, tid, cat, lane, row) for the engine.
    """
    order = {cat: i for i, cat in enumerate(SERVING_LANE_ORDER)}
    processes = sorted(layout.processes, key=lambda p: (p.sort_index, p.pid))
    bands: dict[str, list] = {"label": [], "rank": [], "first_row": [], "rows": []}
    rows: dict[str, list] = {"band": [], "label": [], "track": [], "kind": []}
    runtime_keys, serving_keys = [], []
    serving_of: dict[int, list] = defaultdict(list)
    runtime_of: dict[int, list] = defaultdict(list)
    for key, track in layout.serving.items():  # one per serving track
        serving_of[key[0]].append((key, track))
    for rkey, track in layout.runtime.items():  # one per pipeline-slot lane
        runtime_of[rkey[0]].append((rkey, track))
    lanes = Counter(key[:3] for key in layout.serving)
    for band, process in enumerate(processes):  # one per process
        bands["label"].append(process.name)
        bands["rank"].append(process.rank)
        bands["first_row"].append(len(rows["band"]))
        serving = sorted(serving_of[process.pid], key=lambda kt: (order.get(kt[0][2], len(order)), kt[0][2], kt[0][1], kt[0][3]))
        runtime = sorted(runtime_of[process.pid])
        threads = {key[1] for key, _ in runtime}
        for (pid, tid, cat, lane), track in serving:  # one per serving track
            rows["label"].append((cat or "serving") + (f" · lane {lane}" if lanes[(pid, tid, cat)] > 1 else ""))
            rows["track"].append(track.name)
            rows["kind"].append("serving")
            rows["band"].append(band)
            serving_keys.append((pid, tid, cat, lane, len(rows["band"]) - 1))
        for (pid, tid, lane), track in runtime:  # one per pipeline-slot lane
            rows["label"].append((f"thread {tid} · " if len(threads) > 1 else "") + lane_name(lane))
            rows["track"].append(track.name)
            rows["kind"].append("runtime")
            rows["band"].append(band)
            runtime_keys.append((pid, tid, lane, len(rows["band"]) - 1))
        bands["rows"].append(len(rows["band"]) - bands["first_row"][-1])
    runtime_rows = pa.table(
        {name: pa.array([k[i] for k in runtime_keys], pa.int64()) for i, name in enumerate(("pid", "tid", "lane", "row"))}
    )
    serving_rows = pa.table(
        {
            "pid": pa.array([k[0] for k in serving_keys], pa.int64()),
            "tid": pa.array([k[1] for k in serving_keys], pa.int64()),
            "cat": pa.array([k[2] for k in serving_keys], pa.string()),
            "lane": pa.array([k[3] for k in serving_keys], pa.int64()),
            "row": pa.array([k[4] for k in serving_keys], pa.int64()),
        }
    )
    return {"bands": bands, "rows": rows}, runtime_rows, serving_rows


def _register_run_rows(engine: Engine, runtime_rows: pa.Table, serving_rows: pa.Table) -> None:
    """Tables ``step_windows`` (each decode step's span of time and position) and ``run_rows`` (each run's row and step).

    A run belongs to its decode step; another run (prefill) to the last step
    that started at or before its root (null before the first). ``run_rows``
    is sized by runs, not spans: the budget is counted, and the steps left out
    are aggregated, from it (each run's spans as one bar from its root's start
    to its end on the row of its root's thread), so only the spans drawn in
    detail are ever read.
    """
    engine.con.register("runtime_rows", runtime_rows)
    engine.con.register("serving_rows", serving_rows)
    engine.run("""CREATE OR REPLACE TEMP TABLE step_windows AS
                  SELECT step, min(root_ts_ns) AS start_ns, max(root_end_ns) AS end_ns,
                         row_number() OVER (ORDER BY min(root_ts_ns), step) - 1 AS position
                  FROM decode GROUP BY step""")
    engine.run("""CREATE OR REPLACE TEMP TABLE run_rows AS
        SELECT r.pid, r.inv, rr.row, coalesce(d.step, w.step) AS step, r.root_ts_ns AS start_ns,
               coalesce(r.root_end_ns, r.root_ts_ns) AS end_ns, r.n_spans
        FROM runs r JOIN lanes l ON l.pid = r.pid AND l.inv = r.inv
        JOIN runtime_rows rr ON rr.pid = r.pid AND rr.tid = r.tid AND rr.lane = l.lane
        LEFT JOIN decode d ON d.pid = r.pid AND d.inv = r.inv
        ASOF LEFT JOIN step_windows w ON r.root_ts_ns >= w.start_ns
        WHERE r.root_ts_ns IS NOT NULL""")
    engine.run(f"""CREATE OR REPLACE TEMP TABLE serving_report_spans AS
        SELECT r.row, 0 AS level, s.ts_ns, s.dur_ns, '{SERVING_PHASE_PREFIX}' || coalesce(s.cat, '') AS phase, s.name, w.step, 0 AS device
        FROM ({serving_lanes_sql()}) s JOIN serving_rows r USING (pid, tid, cat, lane)
        ASOF LEFT JOIN step_windows w ON s.ts_ns >= w.start_ns""")


def _report_spans(engine: Engine, kept_sql: str) -> pa.Table:
    """The spans drawn in detail, with row, level, step, phase and whether they are on the device clock.

    Runtime spans sit at their depth, device spans one level deeper (below the
    host phases of runner_run); serving spans at level 0 of their lane.
    """
    engine.run(f"""CREATE OR REPLACE TEMP TABLE report_runs AS
        SELECT d.* REPLACE (k.step AS step) FROM ({drawn_runs_sql()}) d
        JOIN (SELECT pid, inv, step FROM run_rows s WHERE {kept_sql}) k ON k.pid = d.pid AND k.inv = d.inv""")
    return engine.arrow(f"""
        SELECT r.row, s.depth AS level, s.ts_ns, s.dur_ns, s.phase, s.name, s.step, 0 AS device, s.os_rq_ns
        FROM ({runtime_spans_sql("report_runs")}) s JOIN runtime_rows r ON r.pid = s.pid AND r.tid = s.tid AND r.lane = s.lane
        UNION ALL
        SELECT r.row, s.depth + 1, s.ts_ns, s.dur_ns, s.phase, s.name, s.step, 1, s.os_rq_ns
        FROM ({device_spans_sql("report_runs")}) s JOIN runtime_rows r ON r.pid = s.pid AND r.tid = s.tid AND r.lane = s.lane
        UNION ALL
        SELECT *, NULL FROM serving_report_spans s WHERE {kept_sql}
        ORDER BY row, level, ts_ns, dur_ns, step, device, phase, name""")


def _budget_steps(engine: Engine, span_budget: int, n_rows: int) -> tuple[list[int | None] | None, dict]:
    """The steps drawn in full (None: all of them) and the budget's account.

    Steps go in order of runner-end skew, largest first, while their spans fit
    in the detail budget; spans before the first step count as one more group,
    ranked last.
    """
    counts = engine.rows("""SELECT c.step, sum(c.n) AS n FROM (
                                SELECT step, n_spans AS n FROM run_rows UNION ALL SELECT step, 1 FROM serving_report_spans) c
                            LEFT JOIN steps s USING (step) GROUP BY c.step
                            ORDER BY any_value(s.runner_end_skew_ns) DESC NULLS LAST, c.step NULLS LAST""")
    # the garbage collections are evidence: always drawn in detail, so they come off the budget first
    collections = int(engine.scalar(f"SELECT count(*) FROM spans g JOIN processes p USING (pid) WHERE {collection_row('g')}") or 0)
    total = sum(n for _, n in counts) + collections
    budget = {"total_spans": total, "span_budget": span_budget, "limited": total > span_budget}
    if total <= span_budget:
        return None, budget
    n_aggregate = max(span_budget // AGGREGATE_SHARE, n_rows)
    fits = np.cumsum([n for _, n in counts]) <= span_budget - n_aggregate - collections
    kept = [step for (step, _), ok in zip(counts, fits, strict=True) if ok]
    n_steps = int(engine.scalar("SELECT count(*) FROM step_windows") or 0)
    bucket_steps = max(1, math.ceil(max(n_steps, 1) * n_rows / n_aggregate))
    return kept, budget | {"detailed_steps": sum(s is not None for s in kept), "bucket_steps": bucket_steps}


def _columns(table: pa.Table, origin_ns: int) -> tuple[dict, list[str], list[str]]:
    """Span rows as the page's columns: times in µs from the origin (0.1 µs), names and phases as codes."""
    names = pc.dictionary_encode(table.column("name").combine_chunks().fill_null(""))
    phases = pc.dictionary_encode(table.column("phase").combine_chunks().fill_null(""))
    start = (table.column("ts_ns").to_numpy() - origin_ns) / 1000.0
    return (
        {
            "row": table.column("row").to_numpy().tolist(),
            "level": table.column("level").to_numpy().tolist(),
            "start_us": np.round(start, 1).tolist(),
            "dur_us": np.round(table.column("dur_ns").to_numpy() / 1000.0, 1).tolist(),
            "step": table.column("step").fill_null(-1).to_numpy().tolist(),
            "device": table.column("device").to_numpy().tolist(),
            # host evidence: the thread's run-queue wait during the span (µs; -1 where the span carries none)
            "rq_us": np.round(table.column("os_rq_ns").cast(pa.float64()).fill_null(-1000.0).to_numpy() / 1000.0, 1).tolist(),
            "name": names.indices.to_numpy().tolist(),
            "phase": phases.indices.to_numpy().tolist(),
        },
        names.dictionary.to_pylist(),
        phases.dictionary.to_pylist(),
    )


def swimlane_data(result: AnalysisResult, span_budget: int = DEFAULT_SPAN_BUDGET) -> dict:
    """The data block the browser draws the swimlane from (at most ``span_budget`` spans plus aggregate bars)."""
    engine = result.engine
    layout = build_track_layout(result, serving_budget=span_budget)  # no more serving spans laid out than can be drawn
    lanes, runtime_rows, serving_rows = _lane_rows(layout)
    _register_run_rows(engine, runtime_rows, serving_rows)
    kept, budget = _budget_steps(engine, span_budget, len(lanes["rows"]["band"]))
    budget["serving_spans_left_out"] = max(0, serving_span_count(engine) - span_budget)
    origin_ns = int(engine.scalar("SELECT least((SELECT min(start_ns) FROM run_rows), (SELECT min(ts_ns) FROM serving_report_spans))") or 0)
    if kept is None:
        detailed = _report_spans(engine, "TRUE")
        aggregate = None
        budget |= {"shown_spans": detailed.num_rows, "aggregated_spans": 0}
    else:
        engine.con.register("kept_steps", pa.table({"step": pa.array([s for s in kept if s is not None], pa.int64())}))
        kept_sql = f"(coalesce(s.step IN (SELECT step FROM kept_steps), FALSE) OR (s.step IS NULL AND {None in kept}))"
        detailed = _report_spans(engine, kept_sql)
        aggregate = engine.arrow(f"""
            SELECT s.row, min(s.start_ns) AS start_ns, max(s.end_ns) AS end_ns, min(s.step) AS step_lo, max(s.step) AS step_hi,
                   sum(s.n)::BIGINT AS spans
            FROM (SELECT row, start_ns, end_ns, step, n_spans AS n FROM run_rows
                  UNION ALL SELECT row, ts_ns, ts_ns + dur_ns, step, 1 FROM serving_report_spans) s
            LEFT JOIN step_windows w USING (step)
            WHERE NOT {kept_sql}
            GROUP BY s.row, coalesce(w.position // {budget["bucket_steps"]}, -1) ORDER BY s.row, start_ns, end_ns, step_lo""")
        aggregated = int(pc.sum(aggregate.column("spans")).as_py() or 0)
        budget |= {"shown_spans": detailed.num_rows, "aggregated_spans": aggregated, "aggregate_bars": aggregate.num_rows}
        budget["total_spans"] = detailed.num_rows + aggregated
    spans, names, phases = _columns(detailed, origin_ns)
    windows = engine.arrow("SELECT step, start_ns, end_ns FROM step_windows ORDER BY position")
    data: dict[str, object] = {
        "origin_mono_ns": str(origin_ns),
        "origin_wall": _origin_wall(engine, origin_ns),
        **lanes,
        "folded": _folded(lanes["bands"]),
        "names": names,
        "phases": phases,
        "spans": spans,
        "aggregate": None
        if aggregate is None
        else {
            "row": aggregate.column("row").to_numpy().tolist(),
            "start_us": np.round((aggregate.column("start_ns").to_numpy() - origin_ns) / 1000.0, 1).tolist(),
            "dur_us": np.round((aggregate.column("end_ns").to_numpy() - aggregate.column("start_ns").to_numpy()) / 1000.0, 1).tolist(),
            "step_lo": aggregate.column("step_lo").fill_null(-1).to_numpy().tolist(),
            "step_hi": aggregate.column("step_hi").fill_null(-1).to_numpy().tolist(),
            "spans": aggregate.column("spans").to_numpy().tolist(),
        },
        "steps": {
            "step": windows.column("step").to_numpy().tolist(),
            "start_ms": np.round((windows.column("start_ns").to_numpy() - origin_ns) / 1e6, 4).tolist(),
            "end_ms": np.round((windows.column("end_ns").to_numpy() - origin_ns) / 1e6, 4).tolist(),
        },
        "budget": budget,
    }
    return data


def _folded(bands: dict) -> list[bool]:
    """Which bands open folded: all of them beyond EXPANDED_RANKS ranks, and any with more than FOLDED_LANES lanes."""
    many_ranks = sum(rank is not None for rank in bands["rank"]) > EXPANDED_RANKS
    return [many_ranks or rows > FOLDED_LANES for rows in bands["rows"]]


def _origin_wall(engine: Engine, origin_ns: int) -> str | None:
    """The wall-clock time of t = 0, from the first anchored process (CLOCK_ANCHOR), as text."""
    offset = engine.scalar("SELECT min(offset_ns) FROM anchor_offsets")
    if offset is None:
        return None
    wall = origin_ns + int(offset)
    stamp = _dt.datetime.fromtimestamp(wall // 1_000_000_000, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp}.{wall % 1_000_000_000:09d} UTC"


# ---------------------------------------------------------------- server-rendered HTML


def _block(summary: Summary, key: str) -> dict[str, Any]:
    """A block of the summary by name (``late_starts``, ``tail_steps``), empty when absent."""
    block = cast(dict, summary).get(key)
    return block if isinstance(block, dict) else {}


def _e(text: object) -> str:
    """A value as escaped text for people: yes/no, n/a, numbers, lists and mappings spelled out (never a Python literal)."""
    return html.escape(_plain(text))


def _plain(item: object) -> str:
    if isinstance(item, float):
        return "n/a" if math.isnan(item) else f"{item:,.3f}"
    if isinstance(item, (list, tuple)):
        return ", ".join(_plain(v) for v in item) or "none"
    if isinstance(item, dict):
        return "; ".join(f"{k}: {_plain(v)}" for k, v in item.items()) or "none"
    return value(item)


def _table(header: list[str], rows: list[list[object]], css: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _run_verdict_status(summary: Summary) -> str | None:
    """The run verdict's status, None for a summary written before verdicts."""
    verdict = summary.get("verdict")
    return None if verdict is None else verdict["status"]


def _findings_section(summary: Summary) -> str:
    """The verdicts and the worst late steps: what a reader acts on, above the fold."""
    verdicts = []
    for label, text in verdict_lines(summary):  # a handful of lines
        bad = (
            text.startswith(_BAD_PREFIXES.get(label, "\0"))
            or (label == "run" and _run_failed(summary))
            or (label == "straggler" and (_block(summary, "tail_steps").get("straggler") or {}).get("rank") is not None)
            or (label == "verdict" and _run_verdict_status(summary) != "healthy")
        )
        state = "info" if label in _INFO_LABELS else "bad" if bad else "ok"
        verdicts.append(
            f'<div class="verdict {state}" data-label="{html.escape(label)}">'
            f"<dt>{html.escape(label)}</dt><dd>{html.escape(text)}</dd></div>"
        )
    worst = []
    for key, title in ((key, f"Worst {title}") for key, title in LATE_LISTS):
        items = worst_first(_block(summary, key).get("items") or [])
        if items:
            entries = "".join(_findings_entry(item) for item in list_items(items[:FINDINGS_ITEMS]))
            more = f'<p class="more">{len(items) - FINDINGS_ITEMS:,} more in the lists below.</p>' if len(items) > FINDINGS_ITEMS else ""
            worst.append(f'<section class="worst"><h3>{title}</h3><ol>{entries}</ol>{more}</section>')
    return (
        f'<section id="findings"><h2>Findings</h2><dl class="verdicts">{"".join(verdicts)}</dl>'
        f'<div class="worst-lists">{"".join(worst) or "<p>No slow step, late start or tail step over the threshold.</p>"}</div></section>'
    )


def _findings_entry(item: dict) -> str:
    """One worst item: a button that zooms the swimlane to its step and marks the culprit and the ranks that waited."""
    victims = ",".join(str(int(v)) for v in item["victims"])
    rank = "" if item["rank"] is None else str(int(item["rank"]))
    return (
        f'<li><button type="button" class="zoom" data-step="{int(item["step"])}" data-rank="{rank}" '
        f'data-phase="{html.escape(str(item["phase"] or ""))}" data-victims="{victims}">step {int(item["step"])}</button> '
        f'<span class="line">{html.escape(item["text"])}</span></li>'
    )


def _run_failed(summary: Summary) -> bool:
    run: dict[str, Any] = dict(summary.get("run") or {})
    return run.get("exit_status") not in (None, 0) or run.get("failed_rank") is not None


def _budget_note(budget: dict) -> str:
    left_out = budget.get("serving_spans_left_out") or 0
    serving = f" The {left_out:,} serving spans after the first {budget['span_budget']:,} (by time) are not drawn." if left_out else ""
    if not budget.get("limited"):
        return f'<p class="budget" data-limited="false">All {budget["total_spans"]:,} spans drawn.{serving}</p>'
    return (
        f'<p class="budget" data-limited="true">This run has {budget["total_spans"]:,} spans, over the span budget of '
        f"{budget['span_budget']:,}: the {budget['detailed_steps']:,} steps with the largest runner-end skew are drawn in full "
        f"({budget['shown_spans']:,} spans); the other {budget['aggregated_spans']:,} spans are {budget['aggregate_bars']:,} grey "
        f"bars, one per lane per {budget['bucket_steps']:,} consecutive steps (hover for the steps).{serving}</p>"
    )


def _swimlane_section(swimlane: dict) -> str:
    origin = f"t = 0 at {swimlane['origin_wall']}" if swimlane["origin_wall"] else "t = 0 at the first span (no clock anchor)"
    return f"""
<section id="swimlane-section"><h2>Swimlane</h2>
<div class="toolbar">
  <label>lanes <input id="lane-filter" type="search" placeholder="filter: rank 3, npu:1, kernel"></label>
  <label>spans <input id="span-search" type="search" placeholder="search names"></label>
  <span id="search-count" class="count"></span>
  <button type="button" id="search-next">next match</button>
  <button type="button" id="expand-all">expand all</button>
  <button type="button" id="collapse-all">collapse all</button>
  <label>row height <input id="row-height" type="range" min="6" max="28" value="16"></label>
  <button type="button" id="view-decode">decode window</button>
  <button type="button" id="view-all">whole run</button>
</div>
<p class="axis-note">{html.escape(origin)}. Wheel or drag on the time axis to zoom, drag the lanes to pan; click a band's name
to fold it. Device spans (hatched) are on the device's clock and are placed under their own <code>runner_run</code> at
<code>runner_run</code> start + their offset from the launch: the alignment is approximate (early by the launch latency).</p>
{_budget_note(swimlane["budget"])}
<div id="swimlane" class="swimlane" tabindex="0"><canvas id="lanes"></canvas><div id="tooltip" class="tooltip" hidden></div></div>
<div id="legend" class="legend"></div>
</section>"""


def _lists_section(summary: Summary) -> str:
    parts = []
    for key, title in ((key, title.capitalize()) for key, title in LATE_LISTS):
        block = _block(summary, key)
        parts.append(f"""<section class="late-list" id="list-{key}" data-list="{key}">
<h2>{title} ({_e(block.get("count", 0))}, threshold {_e(block.get("threshold_ms"))} ms)</h2>
<div class="list-controls">sort by
  <button type="button" data-sort="excess" class="active">excess</button><button type="button" data-sort="step">step</button>
  <button type="button" data-sort="rank">rank</button><button type="button" data-sort="mechanism">mechanism</button>
  <span class="pager"><button type="button" data-page="-1">previous</button> <span class="page"></span>
  <button type="button" data-page="1">next</button></span></div>
<ol class="items"></ol></section>""")
    return f'<div class="cards">{"".join(parts)}</div>'


def _pipeline_section(summary: Summary) -> str:
    pipeline = summary.get("pipeline") or {}
    cadence = pipeline.get("cadence_ms") or {}
    depth = pipeline.get("achieved_depth") or {}
    runner = pipeline.get("runner_depth") or {}
    rows: list[list[object]] = [
        [rank, *((block or {}).get(k) for k in PERCENTILE_KEYS), depth.get(rank), runner.get(rank)] for rank, block in cadence.items()
    ]
    violations = "".join(
        f"<li>rank {_e(v.get('rank'))}, step {_e(v.get('step'))}: {_e(v.get('reason'))}</li>"
        for v in pipeline.get("first_violations") or []
    )
    return f"""<section id="pipeline"><h2>Pipeline health</h2>
<p>{_e(pipeline.get("diagnosis") or "not checked")} ({_e(pipeline.get("rule"))}).</p>
{f'<details><summary>First violations</summary><ul class="violations">{violations}</ul></details>' if violations else ""}
{_table(["rank"] + [f"cadence {k}" for k in PERCENTILE_KEYS] + ["achieved depth", "runner depth"], rows, "numbers")}
</section>"""


def _percentile_section(summary: Summary) -> str:
    figures = summary.get("figures") or {}
    rows: list[list[object]] = [
        [name, *(block.get(k) for k in PERCENTILE_KEYS)] for name, block in figures.items() if isinstance(block, dict) and "p50" in block
    ]
    per_rank: list[list[object]] = [
        [rank, blocks.get("device"), name, *(block.get(k) for k in PERCENTILE_KEYS)]
        for rank, blocks in (figures.get("per_rank") or {}).items()
        for name, block in blocks.items()
        if isinstance(block, dict) and "p50" in block
    ]
    return f"""<section id="percentiles"><h2>Percentiles (ms)</h2>
{_table(["figure"] + list(PERCENTILE_KEYS), rows, "numbers")}
<details><summary>Per rank</summary>{_table(["rank", "device", "figure"] + list(PERCENTILE_KEYS), per_rank, "numbers")}</details>
</section>"""


def _configuration_section(summary: Summary) -> str:
    """Workload, serving figures, inputs and validation checks: folded, at the bottom."""
    serving = summary.get("serving") or {}
    validation = summary.get("validation") or {}
    inputs = summary.get("inputs") or {}
    dropped = inputs.get("dropped") or {}
    workload: list[list[object]] = [[k, v] for k, v in (summary.get("workload") or {}).items()]
    serving_rows: list[list[object]] = [
        ["tokens returned / expected", f"{value(serving.get('tokens_returned'))} / {value(serving.get('tokens_expected'))}"],
        ["batch elapsed (s)", serving.get("batch_elapsed_s")],
        ["throughput (tok/s)", serving.get("throughput_tok_s")],
        ["effective TPOT (ms)", serving.get("effective_tpot_ms")],
        ["acceptance rate", serving.get("acceptance_rate")],
    ]
    checks: list[list[object]] = [[c.get("name"), c.get("ok"), c.get("detail")] for c in validation.get("checks") or []]
    input_rows: list[list[object]] = [
        ["files", len(inputs.get("files") or [])],
        ["records read", inputs.get("records_read")],
        ["spans", inputs.get("spans")],
        ["dropped", dropped or "none"],
        ["steps numbered by", validation.get("step_numbering")],
    ]
    files = "".join(f"<li>{_e(f)}</li>" for f in inputs.get("files") or [])
    notes = "".join(f"<li>{_e(n)}</li>" for n in inputs.get("notes") or [])
    return f"""<details id="configuration"><summary>Configuration: workload, serving figures, inputs, validation checks</summary>
<div class="cards">
<section><h3>Workload</h3>{_table(["field", "value"], workload) if workload else "<p>no workload in performance_summary.json</p>"}</section>
<section><h3>Serving</h3>{_table(["figure", "value"], serving_rows)}</section>
<section><h3>Validation checks</h3>{_table(["check", "ok", "detail"], checks)}</section>
<section><h3>Inputs</h3>{_table(["", ""], input_rows)}<ul class="files">{files}</ul>{f'<ul class="notes">{notes}</ul>' if notes else ""}</section>
</div></details>"""


def _asset(name: str) -> str:
    return resources.files("dsprof.analysis.outputs").joinpath(name).read_text(encoding="utf-8")


def _window_note(result: AnalysisResult) -> str:
    """Which window of the run the figures and the swimlane cover, when not the whole run."""
    analysed = window_text(result.summary)
    said = [f"Window: {analysed}."] if analysed else []
    if result.window is not None:
        said.append(f"Swimlane drawn for the window {result.window.describe()} only.")
    return f'<p class="window-note">{_e(" ".join(said))}</p>' if said else ""


def _device_time_section(summary: Summary) -> str:
    """The device-time breakdown: a table per rank and the per-step chart's place (only where the source has one)."""
    block = summary.get("device_time")
    if not block:
        return ""
    keys = ("span_ms", "busy_ms", "idle_ms", "compute_ms", "non_compute_ms")
    head = "".join(f"<th>{_e(k)}</th>" for k in ("rank", *keys))
    body = "".join(
        f"<tr><td>{_e(rank)}</td>" + "".join(f"<td>{figures[k]:.3f}</td>" for k in keys) + "</tr>"  # type: ignore[literal-required]
        for rank, figures in block["ranks"].items()
    )
    return (
        '<h3>Device time</h3><p class="axis-note">Per rank over the profiled window (docs/FIGURES.md "Device time"); '
        f'per step below.</p><table class="device-time"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        '<div id="device-time" class="plot"></div>'
    )


def render_html(result: AnalysisResult, *, span_budget: int = DEFAULT_SPAN_BUDGET) -> str:
    """The whole report page of ``result`` (figures from its summary) as text."""
    summary = result.summary
    swimlane = swimlane_data(result, span_budget)
    data = {
        "swimlane": swimlane,
        "chart": chart_data(summary),
        "lists": {key: list_items(_block(summary, key).get("items") or []) for key, _ in LATE_LISTS},
    }
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_CSP}">
<title>dsprof report</title>
<style>{_asset("report.css")}</style>
</head><body>
<header><h1>dsprof report</h1>{_window_note(result)}</header>
<main>
{_findings_section(summary)}
{_swimlane_section(swimlane)}
<section id="step-charts"><h2>Per step</h2><p class="axis-note">Click a point to zoom the swimlane to its step.</p>
<div id="step-interval" class="plot"></div><div id="start-skew" class="plot"></div><div id="end-skew" class="plot"></div>
{_device_time_section(summary)}</section>
<section id="trends-section"><h2>Trends</h2><p class="axis-note">The run in windows of consecutive steps: where it drifted,
and what each window lost (the what-if saving of its causes). Click a window to zoom the swimlane to its worst step.</p>
<div id="trends" class="plot"></div></section>
{_lists_section(summary)}
{_pipeline_section(summary)}
{_percentile_section(summary)}
{_configuration_section(summary)}
</main>
<script type="application/json" id="dsprof-data">{script_json(data)}</script>
<script>{get_plotlyjs()}</script>
<script>{_asset("report.js")}</script>
</body></html>
"""


def write_html_report(result: AnalysisResult, path: str | Path, *, span_budget: int = DEFAULT_SPAN_BUDGET) -> Path:
    """Write the report page of ``result`` to ``path`` and return it."""
    if span_budget < 1:
        raise ValueError("span_budget must be positive")
    return atomic_write_text(path, render_html(result, span_budget=span_budget))
