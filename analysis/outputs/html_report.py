"""The interactive HTML report: one offline file with the swimlane and the figures.

The page embeds plotly.js once, the report's own ``report.js``/``report.css``
(beside this module) and one JSON data block. Span data travel as compact
columns (lane row, phase, start, duration, step, name code) and the browser
builds one plotly trace per phase from them, so the page never holds one trace
or one DOM element per span. Beyond ``span_budget`` spans the swimlane keeps
the steps with the largest runner-end skew at full detail and draws the rest as
one grey bar per lane per bucket of steps (see docs/REPORTS.md).

Every string that came from a trace is escaped: ``html.escape`` for the
server-rendered HTML, ``_script_json`` for the data block (so ``</script>``
cannot end it), and the browser writes hover text with ``textContent`` and
escapes plotly tick labels.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from plotly.offline import get_plotlyjs
from pathlib import Path
import numpy as np
import pandas as pd

from dsprof.analysis.analyze import AnalysisResult
from dsprof.analysis.layout import build_lanes, runtime_spans_sql, serving_spans_sql
from dsprof.analysis.skew import PERCENTILES
from dsprof.fileio import atomic_write_text

REPORT_NAME = "report.html"

# Serving categories in the order their lanes appear (SPEC §1); others follow alphabetically.
SERVING_LANE_ORDER = ("request", "serving", "scheduler", "worker", "executor", "kernel")

# Phase colours; phases not listed take colours from OTHER_PHASE_COLORS in order.
PHASE_COLORS = {
    "root": "#9aa5b1",
    "bind": "#4c78a8",
    "bind.args": "#72b7b2",
    "bind.prebuilt": "#54a24b",
    "runner_run": "#f58518",
    "native_fence_wait": "#e45756",
    "device_wall": "#b279a2",
    "claim_release": "#eeca3b",
    "validate": "#9d755d",
}
OTHER_PHASE_COLORS = ("#ff9da6", "#bab0ac", "#8cd17d", "#d37295", "#86bcb6", "#fabfd2", "#79706e", "#d4a6c8")
SERVING_COLORS = {
    "request": "#c7d2dc",
    "serving": "#a0b3c4",
    "scheduler": "#2f6f9f",
    "worker": "#5aa0c8",
    "executor": "#7fb8d8",
    "kernel": "#1b4965",
}
# Over the span budget, the aggregate bars may take 1/AGGREGATE_SHARE of it; detailed steps the rest.
AGGREGATE_SHARE = 10
# Cap on server-rendered list entries (late starts, tail steps); the page says how many were left out.
LIST_LIMIT = 500

PERCENTILE_KEYS = (*(name for name, _ in PERCENTILES), "count")


@dataclass
class _Layout:
    """Lane rows of the swimlane: one per serving category, then one per device sub-lane."""

    rows: pd.DataFrame  # row, y, kind, label, rank, sub
    ticks: list[dict]


def _script_json(value: object) -> str:
    """JSON that is safe inside <script>: no ``<``, ``>``, ``&`` or line separators survive literally."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _device_labels(runtime: pd.DataFrame) -> pd.Series:
    """The lane label of each runtime span: its device, else ``rank N``, else ``pid N``."""
    device = runtime["device"].astype("string")
    device = device.mask(device == "")
    by_rank = "rank " + runtime["rank"].astype("string")
    by_pid = "pid " + runtime["pid"].astype("string")
    return device.fillna(by_rank).fillna(by_pid)


def _serving_labels(serving: pd.DataFrame) -> pd.Series:
    cat = serving["cat"].astype("string").fillna("")
    return cat.mask(cat == "", "serving")


def _layout(runtime: pd.DataFrame, serving: pd.DataFrame) -> tuple[_Layout, pd.Series, pd.Series]:
    """Rows for every lane, and the row of each runtime and serving span."""
    serving_label = _serving_labels(serving)
    present = set(serving_label.unique().tolist())
    serving_lanes = [c for c in SERVING_LANE_ORDER if c in present] + sorted(present - set(SERVING_LANE_ORDER))

    device_label = _device_labels(runtime)
    keys = pd.DataFrame(
        {
            "label": device_label,
            "rank": runtime["rank"].astype("Int64"),
            "tid": runtime["tid"].astype("int64"),
            "lane": runtime["lane"].astype("Int64").fillna(0),
        }
    )
    subs = keys.drop_duplicates(["label", "tid", "lane"]).copy()
    device_rank = subs.groupby("label")["rank"].min()
    subs["device_rank"] = subs["label"].map(device_rank)
    subs = subs.sort_values(["device_rank", "label", "tid", "lane"], na_position="last").reset_index(drop=True)
    subs["sub"] = subs.groupby("label", sort=False).cumcount()
    device_order = subs.drop_duplicates("label")["label"].tolist()
    device_index = {label: i for i, label in enumerate(device_order)}

    n_serving = len(serving_lanes)
    serving_gap = 0.6 if n_serving else 0.0
    subs["row"] = n_serving + np.arange(len(subs))
    # A gap between device bands, and between the serving lanes and the devices.
    subs["y"] = subs["row"] + serving_gap + 0.5 * subs["label"].map(device_index).astype(float)

    rows = pd.concat(
        [
            pd.DataFrame(
                {
                    "row": np.arange(n_serving),
                    "y": np.arange(n_serving, dtype=float),
                    "kind": "serving",
                    "label": serving_lanes,
                    "rank": pd.array([pd.NA] * n_serving, dtype="Int64"),
                    "sub": 0,
                }
            ),
            pd.DataFrame(
                {
                    "row": subs["row"],
                    "y": subs["y"],
                    "kind": "device",
                    "label": subs["label"].astype(object),
                    "rank": subs["device_rank"].astype("Int64"),
                    "sub": subs["sub"],
                }
            ),
        ],
        ignore_index=True,
    )
    ticks = [{"y": float(i), "text": label, "kind": "serving"} for i, label in enumerate(serving_lanes)]
    band = subs.groupby("label", sort=False)["y"].mean()
    ticks += [{"y": float(band[label]), "text": label, "kind": "device"} for label in device_order]

    serving_row = serving_label.map({label: i for i, label in enumerate(serving_lanes)}).astype("int64")
    runtime_row = keys.merge(subs[["label", "tid", "lane", "row"]], on=["label", "tid", "lane"], how="left")["row"]
    runtime_row.index = runtime.index
    return _Layout(rows=rows, ticks=ticks), runtime_row.astype("int64"), serving_row


def _phase_table(runtime: pd.DataFrame, serving_labels: list[str]) -> pd.DataFrame:
    """One row per drawn phase: name, colour, depth (line width class) and kind."""
    depth = runtime.groupby(runtime["phase"].astype(object), sort=False)["depth"].min()
    known = [p for p in PHASE_COLORS if p in depth.index]
    others = sorted(set(depth.index) - set(PHASE_COLORS))
    phases = known + others
    colors = [PHASE_COLORS.get(p) or OTHER_PHASE_COLORS[i % len(OTHER_PHASE_COLORS)] for i, p in enumerate(phases)]
    runtime_part = pd.DataFrame(
        {
            "name": phases,
            "color": colors,
            "depth": [int(depth[p]) if pd.notna(depth[p]) else 0 for p in phases],
            "kind": "runtime",
        }
    )
    serving_part = pd.DataFrame(
        {
            "name": ["serving · " + s for s in serving_labels],
            "color": [SERVING_COLORS.get(s, "#8da0b3") for s in serving_labels],
            "depth": 0,
            "kind": "serving",
        }
    )
    return pd.concat([runtime_part, serving_part], ignore_index=True)


def _step_windows(roots: pd.DataFrame) -> pd.DataFrame:
    """Per decode step: first root start, last root end, and runner-end skew (ns)."""
    valid = roots.dropna(subset=["step"])
    grouped = valid.groupby(valid["step"].astype("int64"))
    windows = pd.DataFrame(
        {
            "start_ns": grouped["root_ts_ns"].min(),
            "end_ns": grouped["root_end_ns"].max(),
            "end_skew_ns": grouped["runner_end_ns"].max() - grouped["runner_end_ns"].min(),
        }
    )
    windows.index.name = "step"
    return windows.sort_values("start_ns")


def _span_steps(spans: pd.DataFrame, windows: pd.DataFrame) -> np.ndarray:
    """Each span's step: its own where known, else the last step that started before it."""
    step = spans["step"].astype("Int64")
    if windows.empty:
        return np.zeros(len(spans), dtype=np.int64)
    starts = windows["start_ns"].to_numpy(dtype=np.int64)
    position = np.clip(np.searchsorted(starts, spans["ts_ns"].to_numpy(dtype=np.int64), side="right") - 1, 0, len(starts) - 1)
    by_time = windows.index.to_numpy(dtype=np.int64)[position]
    return step.fillna(pd.Series(by_time, index=spans.index)).to_numpy(dtype=np.int64)


def _apply_budget(spans: pd.DataFrame, windows: pd.DataFrame, span_budget: int, n_rows: int) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Split the spans into the detailed part and per-lane bucket aggregates.

    Steps are taken in order of runner-end skew, largest first, while their spans
    fit in the detail budget; every other span goes into a bar per (lane row,
    bucket of consecutive steps).
    """
    total = len(spans)
    budget = {"total_spans": total, "span_budget": span_budget, "limited": total > span_budget}
    empty_aggregate = pd.DataFrame({"row": [], "start_ns": [], "end_ns": [], "step_lo": [], "step_hi": [], "spans": []})
    if total <= span_budget:
        budget.update(shown_spans=total, detailed_steps=None, bucket_steps=0, aggregated_spans=0)
        return spans, empty_aggregate, budget
    if windows.empty:
        # Without decode steps there is no step to rank by: keep the earliest spans.
        kept = spans.nsmallest(span_budget, "ts_ns")
        budget.update(shown_spans=len(kept), detailed_steps=0, bucket_steps=0, aggregated_spans=0, dropped_spans=total - len(kept))
        return kept, empty_aggregate, budget

    span_step = _span_steps(spans, windows)
    n_aggregate = max(span_budget // AGGREGATE_SHARE, n_rows)
    n_steps = len(windows)
    bucket_steps = max(1, math.ceil(n_steps * n_rows / n_aggregate))
    detail_budget = span_budget - n_aggregate

    counts = pd.Series(span_step).value_counts()
    by_skew = windows.sort_values("end_skew_ns", ascending=False, kind="stable")
    step_counts = counts.reindex(by_skew.index, fill_value=0)
    detailed_steps = step_counts.index[(step_counts.cumsum() <= detail_budget).to_numpy()]
    detailed_mask = np.isin(span_step, detailed_steps.to_numpy())
    detailed = spans[detailed_mask]

    # Buckets of consecutive steps in time order.
    step_position = pd.Series(np.arange(n_steps), index=windows.index)
    rest = spans[~detailed_mask]
    rest_steps = span_step[~detailed_mask]
    bucket = step_position.reindex(rest_steps).to_numpy() // bucket_steps
    grouped = pd.DataFrame(
        {
            "row": rest["row"].to_numpy(),
            "bucket": bucket,
            "start_ns": rest["ts_ns"].to_numpy(),
            "end_ns": (rest["ts_ns"] + rest["dur_ns"]).to_numpy(),
            "step": rest_steps,
        }
    ).groupby(["row", "bucket"], sort=False)
    aggregate = grouped.agg(
        start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), step_lo=("step", "min"), step_hi=("step", "max"), spans=("step", "size")
    ).reset_index()
    budget.update(
        shown_spans=len(detailed),
        detailed_steps=len(detailed_steps),
        bucket_steps=bucket_steps,
        aggregated_spans=len(rest),
        aggregate_bars=len(aggregate),
    )
    return detailed, aggregate, budget


def _round_list(values: pd.Series | np.ndarray, digits: int) -> list:
    return np.round(np.asarray(values, dtype=np.float64), digits).tolist()


def _frames(result: AnalysisResult) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Runtime spans, serving spans and decode roots, as the swimlane draws them."""
    engine = result.engine
    build_lanes(engine)
    runtime = engine.arrow(runtime_spans_sql()).to_pandas()
    serving = engine.arrow(serving_spans_sql()).to_pandas()
    roots = engine.arrow("SELECT step, root_ts_ns, root_end_ns, runner_end_ns FROM decode").to_pandas()
    return runtime, serving, roots


def _swimlane_data(result: AnalysisResult, span_budget: int) -> dict:
    """The data block the browser turns into the swimlane plot."""
    runtime, serving, roots = _frames(result)
    serving = serving[serving["ph"].astype("string") == "X"]
    layout, runtime_row, serving_row = _layout(runtime, serving)
    serving_labels = layout.rows.loc[layout.rows["kind"] == "serving", "label"].tolist()
    phases = _phase_table(runtime, serving_labels)
    phase_code = {name: i for i, name in enumerate(phases["name"])}

    combined = pd.concat(
        [
            pd.DataFrame(
                {
                    "row": runtime_row.to_numpy(),
                    "phase": runtime["phase"].astype(object).map(phase_code).to_numpy(),
                    "ts_ns": runtime["ts_ns"].to_numpy(dtype=np.int64),
                    "dur_ns": runtime["dur_ns"].to_numpy(dtype=np.int64),
                    "step": runtime["step"].astype("Int64").to_numpy(),
                    "name": runtime["name"].astype(object).to_numpy(),
                }
            ),
            pd.DataFrame(
                {
                    "row": serving_row.to_numpy(),
                    "phase": ("serving · " + _serving_labels(serving)).astype(object).map(phase_code).to_numpy(),
                    "ts_ns": serving["ts_ns"].to_numpy(dtype=np.int64),
                    "dur_ns": serving["dur_ns"].to_numpy(dtype=np.int64),
                    "step": pd.array([pd.NA] * len(serving), dtype="Int64"),
                    "name": serving["name"].astype(object).to_numpy(),
                }
            ),
        ],
        ignore_index=True,
    )
    combined["step"] = combined["step"].astype("Int64")
    windows = _step_windows(roots)
    detailed, aggregate, budget = _apply_budget(combined, windows, span_budget, len(layout.rows))

    origin_ns = int(combined["ts_ns"].min()) if len(combined) else 0
    detailed = detailed.sort_values(["phase", "ts_ns"], kind="stable")
    name_code, names = pd.factorize(detailed["name"])

    origin_wall = None
    wall = runtime["wall_ns"].astype("Int64")
    anchored = wall.notna()
    if anchored.any():
        first = anchored.to_numpy().nonzero()[0][0]
        origin_wall_ns = int(wall.iloc[first]) - int(runtime["ts_ns"].iloc[first]) + origin_ns
        origin_wall = {
            "ns": str(origin_wall_ns),
            "iso": _dt.datetime.fromtimestamp(origin_wall_ns // 1_000_000_000, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
            + f".{origin_wall_ns % 1_000_000_000:09d} UTC",
        }

    rows = layout.rows
    return {
        "origin_mono_ns": str(origin_ns),
        "origin_wall": origin_wall,
        "rows": {
            "y": rows["y"].astype(float).tolist(),
            "kind": rows["kind"].tolist(),
            "label": rows["label"].tolist(),
            "rank": [None if pd.isna(r) else int(r) for r in rows["rank"]],
            "sub": rows["sub"].astype(int).tolist(),
        },
        "ticks": layout.ticks,
        "phases": phases.to_dict(orient="list"),
        "names": [str(n) for n in names],
        "spans": {
            "row": detailed["row"].astype(np.int64).tolist(),
            "phase": detailed["phase"].astype(np.int64).tolist(),
            "start_us": _round_list((detailed["ts_ns"] - origin_ns) / 1000.0, 1),
            "dur_us": _round_list(detailed["dur_ns"] / 1000.0, 1),
            "step": detailed["step"].fillna(-1).astype(np.int64).tolist(),
            "name": name_code.astype(np.int64).tolist(),
        },
        "aggregate": {
            "row": aggregate["row"].astype(np.int64).tolist(),
            "start_us": _round_list((aggregate["start_ns"] - origin_ns) / 1000.0, 1),
            "dur_us": _round_list((aggregate["end_ns"] - aggregate["start_ns"]) / 1000.0, 1),
            "step_lo": aggregate["step_lo"].astype(np.int64).tolist(),
            "step_hi": aggregate["step_hi"].astype(np.int64).tolist(),
            "spans": aggregate["spans"].astype(np.int64).tolist(),
        },
        "steps": {
            "step": windows.index.to_numpy(dtype=np.int64).tolist(),
            "start_ms": _round_list((windows["start_ns"] - origin_ns) / 1e6, 4),
            "end_ms": _round_list((windows["end_ns"] - origin_ns) / 1e6, 4),
        },
        "budget": budget,
    }


def _step_chart_data(summary: dict) -> dict:
    per_step = pd.DataFrame(summary.get("per_step") or [], columns=["step", "runner_start_skew_ms", "runner_end_skew_ms"])
    late = summary.get("late_starts") or {}
    tails = summary.get("tail_steps") or {}
    return {
        "step": per_step["step"].astype("int64").tolist(),
        "start_skew_ms": per_step["runner_start_skew_ms"].astype(float).replace({np.nan: None}).tolist(),
        "end_skew_ms": per_step["runner_end_skew_ms"].astype(float).replace({np.nan: None}).tolist(),
        "late_threshold_ms": late.get("threshold_ms"),
        "tail_threshold_ms": tails.get("threshold_ms"),
        "late_steps": sorted({int(i["step"]) for i in late.get("items") or []}),
        "tail_steps": sorted({int(i["step"]) for i in tails.get("items") or []}),
    }


# ---------------------------------------------------------------- server-rendered HTML


def _e(value: object) -> str:
    """Escaped text of a value; ``—`` for missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float):
        return html.escape(f"{value:,.3f}")
    if isinstance(value, (dict, list)):
        return html.escape(json.dumps(value, ensure_ascii=False))
    return html.escape(str(value))


def _table(header: list[str], rows: list[list[object]], css: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _header_section(summary: dict) -> str:
    validation = summary.get("validation") or {}
    serving = summary.get("serving") or {}
    workload = summary.get("workload") or {}
    valid = validation.get("valid")
    verdict = "valid" if valid else "invalid"
    problems = "".join(f"<li>{_e(p)}</li>" for p in validation.get("problems") or [])
    checks = _table(
        ["check", "ok", "detail"],
        [[c.get("name"), "yes" if c.get("ok") else "no", c.get("detail")] for c in validation.get("checks") or []],
        "checks",
    )
    workload_rows = [[k, v] for k, v in workload.items()]
    serving_rows = [
        ["tokens returned / expected", f"{_plain(serving.get('tokens_returned'))} / {_plain(serving.get('tokens_expected'))}"],
        ["batch elapsed (s)", serving.get("batch_elapsed_s")],
        ["throughput (tok/s)", serving.get("throughput_tok_s")],
        ["effective TPOT (ms)", serving.get("effective_tpot_ms")],
        ["acceptance rate", serving.get("acceptance_rate")],
        ["source", serving.get("source")],
    ]
    inputs = summary.get("inputs") or {}
    dropped = inputs.get("dropped") or {}
    return f"""
<header>
  <h1>dsprof report</h1>
  <p class="verdict verdict-{verdict}" data-valid="{'true' if valid else 'false'}">swimlane {verdict}:
     {_e(validation.get('rank_roots'))} rank roots, {_e(validation.get('decode_steps'))} decode steps × {_e(validation.get('ranks'))} ranks;
     exit status {_e(summary.get('exit_status'))}</p>
  {f'<ul class="problems">{problems}</ul>' if problems else ''}
  <div class="cards">
    <section><h2>Workload</h2>{_table(['field', 'value'], workload_rows) if workload_rows else '<p>no performance_summary.json workload</p>'}</section>
    <section><h2>Serving</h2>{_table(['figure', 'value'], serving_rows)}</section>
    <section><h2>Validation</h2>{checks}</section>
    <section><h2>Inputs</h2>
      <p>{_e(len(inputs.get('files') or []))} files, {_e(inputs.get('records_read'))} records read, {_e(inputs.get('spans'))} spans,
         {_e(sum(dropped.values()))} dropped{(' (' + _e(', '.join(f'{k}: {v}' for k, v in dropped.items())) + ')') if dropped else ''}</p>
      <ul class="files">{''.join(f'<li>{_e(f)}</li>' for f in inputs.get('files') or [])}</ul>
    </section>
  </div>
</header>"""


def _plain(value: object) -> str:
    return "—" if value is None else str(value)


def _budget_note(budget: dict) -> str:
    if not budget.get("limited"):
        return f'<p class="budget" data-limited="false">All {budget["total_spans"]:,} spans shown.</p>'
    if budget.get("dropped_spans"):
        return (
            f'<p class="budget" data-limited="true">This run has {budget["total_spans"]:,} spans, over the span budget of '
            f'{budget["span_budget"]:,}, and no decode steps to rank: the earliest {budget["shown_spans"]:,} are shown, '
            f'{budget["dropped_spans"]:,} are left out.</p>'
        )
    return (
        f'<p class="budget" data-limited="true">This run has {budget["total_spans"]:,} spans, over the span budget of '
        f'{budget["span_budget"]:,}. The {budget["detailed_steps"]:,} steps with the largest runner-end skew are shown in '
        f'full detail ({budget["shown_spans"]:,} spans); the other {budget["aggregated_spans"]:,} spans are drawn as '
        f'{budget["aggregate_bars"]:,} grey bars, one per lane per bucket of up to {budget["bucket_steps"]:,} consecutive steps '
        f'(first start to last end of that lane\'s spans in the bucket; hover for the step range).</p>'
    )


def _percentile_section(summary: dict) -> str:
    figures = summary.get("figures") or {}
    rows = [
        [name] + [block.get(k) for k in PERCENTILE_KEYS]
        for name, block in figures.items()
        if isinstance(block, dict) and "p50" in block
    ]
    per_rank = figures.get("per_rank") or {}
    rank_rows = []
    for rank, blocks in per_rank.items():
        for name, block in blocks.items():
            if isinstance(block, dict) and "p50" in block:
                rank_rows.append([rank, blocks.get("device"), name] + [block.get(k) for k in PERCENTILE_KEYS])
    per_rank_html = (
        f"<details><summary>Per rank</summary>{_table(['rank', 'device', 'figure'] + list(PERCENTILE_KEYS), rank_rows, 'percentiles')}</details>"
        if rank_rows
        else ""
    )
    return f"""
<section id="percentiles"><h2>Percentiles (ms)</h2>
{_table(['figure'] + list(PERCENTILE_KEYS), rows, 'percentiles')}
{per_rank_html}
</section>"""


def _zoom_list(items: list[dict], describe: Callable[[dict], str], css: str) -> str:
    shown = items[:LIST_LIMIT]
    entries = "".join(
        f'<li><button type="button" class="zoom" data-step="{int(i["step"])}">step {int(i["step"])}</button> {describe(i)}</li>'
        for i in shown
    )
    more = f"<p>{len(items) - len(shown):,} more not listed.</p>" if len(items) > len(shown) else ""
    return f'<ol class="{css}">{entries}</ol>{more}' if shown else "<p>none</p>"


def _late_and_tail_section(summary: dict) -> str:
    late = summary.get("late_starts") or {}
    tails = summary.get("tail_steps") or {}
    straggler = tails.get("straggler") or {}
    late_html = _zoom_list(
        late.get("items") or [],
        lambda i: f"rank {_e(i.get('rank'))} ({_e(i.get('device'))}) started {_e(i.get('excess_ms'))} ms after the first rank; phase {_e(i.get('phase'))}",
        "late-starts",
    )
    tail_html = _zoom_list(
        tails.get("items") or [],
        lambda i: (
            f"runner-end skew {_e(i.get('runner_end_skew_ms'))} ms; late rank {_e(i.get('rank'))} ({_e(i.get('device'))}); "
            f"phase {_e(i.get('phase'))} (+{_e(i.get('phase_excess_ms'))} ms)"
        ),
        "tail-steps",
    )
    return f"""
<div class="cards">
<section id="late-starts"><h2>Late starts ({_e(late.get('count', 0))}, threshold {_e(late.get('threshold_ms'))} ms)</h2>{late_html}</section>
<section id="tail-steps"><h2>Tail steps ({_e(tails.get('count', 0))}, threshold {_e(tails.get('threshold_ms'))} ms)</h2>
<p>straggler: {_e(straggler.get('verdict'))}{f" — late in {100 * straggler['share']:.1f}% of steps" if straggler.get('share') else ''};
 every tail on one device: {_e(tails.get('same_device'))}</p>{tail_html}</section>
</div>"""


def _pipeline_section(summary: dict) -> str:
    pipeline = summary.get("pipeline") or {}
    serialized = pipeline.get("serialized")
    verdict = "serialized" if serialized else ("pipelined" if serialized is False else "unknown")
    cadence = pipeline.get("cadence_ms") or {}
    depth = pipeline.get("achieved_depth") or {}
    cadence_rows = [[rank] + [(block or {}).get(k) for k in PERCENTILE_KEYS] + [depth.get(rank)] for rank, block in cadence.items()]
    violations = "".join(
        f"<li>rank {_e(v.get('rank'))}, run_epoch {_e(v.get('run_epoch'))}: {_e(v.get('reason'))}</li>" for v in pipeline.get("first_violations") or []
    )
    return f"""
<section id="pipeline"><h2>Pipeline health</h2>
<p class="pipeline-verdict verdict-{verdict}" data-serialized="{_e(serialized)}">{_e(pipeline.get('diagnosis') or verdict)}</p>
<p>{_e(pipeline.get('pairs_overlapped'))} of {_e(pipeline.get('pairs_checked'))} adjacent run pairs overlapped;
 {_e(pipeline.get('violations'))} violations; median cadence {_e(pipeline.get('cadence_p50_ms'))} ms.</p>
{f'<ul class="violations">{violations}</ul>' if violations else ''}
{_table(['rank'] + [f'cadence {k}' for k in PERCENTILE_KEYS] + ['achieved depth'], cadence_rows, 'percentiles')}
</section>"""


def _asset(name: str) -> str:
    return resources.files("dsprof.analysis.outputs").joinpath(name).read_text(encoding="utf-8")


def render_html(result: AnalysisResult, summary: dict, *, span_budget: int = 200_000) -> str:
    """The whole report page as text."""
    data = {
        "swimlane": _swimlane_data(result, span_budget),
        "steps": _step_chart_data(summary),
    }
    budget = data["swimlane"]["budget"]
    wall = data["swimlane"]["origin_wall"]
    origin = f"t = 0 at {wall['iso']}" if wall else "t = 0 at the first span (no clock anchor)"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:">
<title>dsprof report</title>
<style>{_asset('report.css')}</style>
</head><body>
{_header_section(summary)}
<main>
<section id="swimlane-section"><h2>Swimlane</h2>
<p class="axis-note">{_e(origin)}. Drag to zoom the time axis, double-click to reset; hover a span for its step, rank, device, phase, start and duration.</p>
{_budget_note(budget)}
<div id="swimlane" class="plot"></div>
<div id="tooltip" class="tooltip" hidden></div>
</section>
<section id="step-charts"><h2>Per-step skew</h2>
<div id="start-skew" class="plot"></div>
<div id="end-skew" class="plot"></div>
</section>
{_percentile_section(summary)}
{_late_and_tail_section(summary)}
{_pipeline_section(summary)}
</main>
<script type="application/json" id="dsprof-data">{_script_json(data)}</script>
<script>{get_plotlyjs()}</script>
<script>{_asset('report.js')}</script>
</body></html>
"""


def write_html_report(result: AnalysisResult, path: str | Path, *, span_budget: int = 200_000) -> Path:
    """Write the report page of ``result`` (figures from its summary) to ``path`` and return it."""
    if span_budget < 1:
        raise ValueError("span_budget must be positive")
    return atomic_write_text(path, render_html(result, dict(result.summary), span_budget=span_budget))
