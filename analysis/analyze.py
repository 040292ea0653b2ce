"""``analyze_trace``: every figure of a trace, as one summary (no files written).

A facade over one analysis per question, in the manner of Holistic Trace
Analysis: the swimlane's structure (:mod:`~dsprof.analysis.swimlane`), its
validity (:mod:`~dsprof.analysis.validation`), skew (:mod:`~dsprof.analysis.skew`),
causes of late steps (:mod:`~dsprof.analysis.causes`), pipeline health
(:mod:`~dsprof.analysis.pipeline`) and serving figures
(:mod:`~dsprof.analysis.serving`), each a set of queries on one engine.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from dsprof.analysis.causes import diagnose, tail_block
from dsprof.analysis.device_time import device_time_section
from dsprof.analysis.engine import Engine, open_engine
from dsprof.analysis.noise import judge_items, noise_floor
from dsprof.analysis.pipeline import pipeline_figures
from dsprof.analysis.serving import serving_figures
from dsprof.analysis.skew import ns_to_ms, skew_figures
from dsprof.analysis.slow_steps import critical_path, slow_step_items, step_intervals
from dsprof.analysis.spans import Trace
from dsprof.analysis.straggler import Flagged, straggler_verdict
from dsprof.analysis.summary import Summary, build_summary, run_info
from dsprof.analysis.summary_model import Inputs, LateStarts, SlowSteps, StepRow
from dsprof.analysis.swimlane import Swimlane, build_swimlane
from dsprof.analysis.trends import trends_section
from dsprof.analysis.validation import validate
from dsprof.analysis.verdict import run_verdict
from dsprof.analysis.what_if import own_causes, tail_cost, what_if_section
from dsprof.analysis.window import Window
from dsprof.errors import DsprofError

DEFAULT_THRESHOLD_MS = 5.0


@dataclass
class AnalysisResult:
    """The summary, plus the engine (and its tables) that outputs draw spans from."""

    summary: Summary
    swimlane: Swimlane
    engine: Engine
    window: Window | None = None  # the window of the run drawn or analysed (outputs say so)

    @property
    def trace(self) -> Trace:
        return self.engine.trace


def check_threshold(threshold_ms: float) -> float:
    """A late-start / tail threshold must be a finite number of ms >= 0."""
    if not isinstance(threshold_ms, (int, float)) or not math.isfinite(threshold_ms) or threshold_ms < 0:
        raise DsprofError(f"threshold must be a finite number of ms >= 0, got {threshold_ms!r}")
    return float(threshold_ms)


def analyze_trace(
    trace: Trace,
    *,
    threshold_ms: float = DEFAULT_THRESHOLD_MS,
    expect_ranks: int | None = None,
    memory_limit: int | None = None,
    invocations: pa.Table | None = None,
    window: Window | None = None,
    progress: Callable[[str], None] | None = None,
) -> AnalysisResult:
    """Every figure of an already-read trace; ``invocations`` may come precomputed (cluster engine).

    ``window``: the trace was cut to it (:mod:`~dsprof.analysis.window_read`); the summary states it.
    """
    threshold_ms = check_threshold(threshold_ms)
    engine = open_engine(trace, memory_limit=memory_limit)
    if progress:
        progress("swimlane: invocations, ranks, decode steps")
    swimlane = build_swimlane(engine, invocations, _positional_steps(window))
    if progress:
        progress("figures: skew, step intervals, causes, what-if replay, pipeline, serving")
    figures, per_step = skew_figures(engine)
    intervals = step_intervals(engine, threshold_ms)
    figures["step_interval_ms"] = intervals["step_interval_ms"]
    critical_path(engine, threshold_ms)
    diagnosis = diagnose(engine, threshold_ms)
    slow = slow_step_items(engine, threshold_ms)
    floor = noise_floor(engine)
    judge_items(diagnosis.late_starts, diagnosis.tail_steps, slow, floor)
    what_if = what_if_section(engine, own_causes(diagnosis.late_starts, diagnosis.tail_steps, slow))
    devices = {int(r): str(d) for r, d in engine.rows("SELECT rank, any_value(device) FROM decode GROUP BY rank")}
    tails = [t for t in diagnosis.tail_steps if not t.get("noise")]
    tail_steps = {t["step"] for t in tails}
    flagged: list[Flagged] = [*tails, *(item for item in slow if not item.get("noise") and item["step"] not in tail_steps)]
    straggler = straggler_verdict(what_if, flagged, [row["step"] for row in per_step], devices)
    inputs = Inputs(
        files=list(trace.files),
        records_read=int(trace.records_read),
        spans=int(trace.span_count),
        dropped={str(k): int(v) for k, v in sorted(trace.dropped.items())},
        notes=list(trace.notes),
    )
    if trace.drop_sites:
        inputs["dropped_at"] = {str(k): str(v) for k, v in sorted(trace.drop_sites.items())}
    if window is not None:
        inputs["window"] = window.block()
        if window.steps is not None:
            inputs["steps"] = [int(window.steps[0]), int(window.steps[1])]  # the window of decode steps analysed
    validation = validate(engine, swimlane, expect_ranks=expect_ranks)
    pipeline = pipeline_figures(engine, trace.performance_summary)
    serving = serving_figures(engine, trace)
    verdict = run_verdict(
        validation=validation,
        run=run_info(trace.performance_summary),
        pipeline=pipeline,
        serving=serving,
        straggler=straggler,
        what_if=what_if,
        floor=floor,
        items=[*diagnosis.late_starts, *diagnosis.tail_steps, *slow],
    )
    summary = build_summary(
        verdict=verdict,
        inputs=inputs,
        performance_summary=trace.performance_summary,
        validation=validation,
        figures=figures,
        per_step=_with_intervals(per_step, engine),
        noise=floor.block(),
        late_starts=LateStarts(threshold_ms=threshold_ms, count=len(diagnosis.late_starts), items=diagnosis.late_starts),
        tail_steps=tail_block(diagnosis.tail_steps, threshold_ms, straggler),
        slow_steps=SlowSteps(threshold_ms=threshold_ms, median_interval_ms=intervals["median_interval_ms"], count=len(slow), items=slow),
        what_if=what_if,
        trends=trends_section(engine, what_if["items"]),
        tail_cost=tail_cost(engine),
        pipeline=pipeline,
        serving=serving,
        device_time=device_time_section(engine),
    )
    return AnalysisResult(summary=summary, swimlane=swimlane, engine=engine, window=window)


def _positional_steps(window: Window | None) -> tuple[int, int] | None:
    """The steps the swimlane keeps by position: only where the cut could not (no root carries a step attribute)."""
    return window.steps if window is not None and window.steps_by_position else None


def _with_intervals(per_step: list[StepRow], engine: Engine) -> list[StepRow]:
    """Each per-step row with its step interval (ms; null for the first step), added in place (no second list of rows)."""
    intervals = dict(engine.rows("SELECT step, interval_ns FROM step_intervals"))
    for row in per_step:  # one per step: the rows are summary.json's own
        interval = intervals.get(row["step"])
        row["interval_ms"] = None if interval is None else ns_to_ms(interval)
    return per_step


def layout_only(trace: Trace, summary: Summary, *, memory_limit: int | None = None, window: Window | None = None) -> AnalysisResult:
    """The swimlane's structure of ``trace`` with an existing summary: what report and export draw from.

    The figures are the summary's, never recomputed; only where the spans go
    (runs, steps, lanes) is rebuilt from the spans themselves.
    """
    engine = open_engine(trace, memory_limit=memory_limit)
    swimlane = build_swimlane(engine, None, _positional_steps(window))
    skew_figures(engine)  # the per-step table the span budget ranks steps by
    return AnalysisResult(summary=summary, swimlane=swimlane, engine=engine, window=window)
