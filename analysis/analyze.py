"""``analyze_trace``: every figure of a trace, as one summary (no files written).

A facade over one analysis per question, in the manner of Holistic Trace
Analysis: the swimlane's structure (:mod:`~dsprof.analysis.stages.swimlane`), its
validity (:mod:`~dsprof.analysis.stages.validation`), skew (:mod:`~dsprof.analysis.stages.skew`),
causes of late steps (:mod:`~dsprof.analysis.stages.causes`), pipeline health
(:mod:`~dsprof.analysis.stages.pipeline`) and serving figures
(:mod:`~dsprof.analysis.stages.serving`), each a set of queries on one engine.
"""

from __future__ import annotations

import importlib
import math
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa

from dsprof.analysis import stages as stages_package
from dsprof.analysis.stages.causes import tail_block
from dsprof.analysis.stages.noise import Findings
from dsprof.analysis.stages.runner import STAGES, Stage, run_stages
from dsprof.analysis.stages.slow_steps import StepIntervals
from dsprof.analysis.stages.swimlane import Swimlane
from dsprof.analysis.store.engine import Engine, open_engine
from dsprof.analysis.store.spans import Trace
from dsprof.analysis.summary import Summary, build_summary
from dsprof.analysis.summary_schema import Figures, Inputs, LateStarts, SlowSteps, StepRow
from dsprof.analysis.units import ns_to_ms
from dsprof.analysis.window import Window
from dsprof.errors import DsprofError

DEFAULT_THRESHOLD_MS = 5.0


def _declare_stages() -> None:
    """Import every module of analysis/stages/: each declares its stages, so a new analysis needs no line here."""
    for module in pkgutil.iter_modules(stages_package.__path__):
        importlib.import_module(f"{stages_package.__name__}.{module.name}")


_declare_stages()


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
    known_invocations: pa.Table | None = None,
    window: Window | None = None,
    progress: Callable[[str], None] | None = None,
    stage_workers: int = 1,
) -> AnalysisResult:
    """Every figure of an already-read trace: run the stages, build the summary.

    ``invocations`` may come precomputed (cluster engine), or some of them
    (``known_invocations``: a live view's earlier window); ``window``: the trace
    was cut to it (:mod:`~dsprof.analysis.window_cut`); the summary states it.
    ``stage_workers``: stages run at once (:func:`~dsprof.analysis.stages.runner.run_stages`), sharing the cores:
    each query of theirs has a share of them.
    """
    threshold_ms = check_threshold(threshold_ms)
    engine = open_engine(trace, memory_limit=memory_limit, threads=max(1, (os.cpu_count() or 1) // stage_workers))
    inputs = {
        "trace": trace,
        "performance_summary": trace.performance_summary,
        "threshold_ms": threshold_ms,
        "expect_ranks": expect_ranks,
        "invocations": invocations,
        "known_invocations": known_invocations,
        "steps": _positional_steps(window),
    }
    wanted = [s.name for s in STAGES.values() if s.in_summary]
    results = run_stages(engine, inputs, wanted, announce=_announcer(progress), workers=stage_workers)
    summary = _summary(results, engine, _inputs_block(trace, window), threshold_ms)
    return AnalysisResult(summary=summary, swimlane=cast(Swimlane, results["swimlane"]), engine=engine, window=window)


def _announcer(progress: Callable[[str], None] | None) -> Callable[[Stage], None] | None:
    """Progress lines: one before the swimlane, one before the figures after it."""
    if progress is None:
        return None
    said: set[str] = set()

    def announce(next_stage: Stage) -> None:
        line = PROGRESS_SWIMLANE if next_stage.name == "swimlane" else PROGRESS_FIGURES
        if line not in said:
            said.add(line)
            progress(line)

    return announce


PROGRESS_SWIMLANE = "swimlane: invocations, ranks, decode steps"
PROGRESS_FIGURES = "figures: skew, step intervals, causes, what-if replay, pipeline, serving"


def _inputs_block(trace: Trace, window: Window | None) -> Inputs:
    """The ``inputs`` block: what was read, what was dropped, the window analysed."""
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
    return inputs


def _summary(results: dict[str, Any], engine: Engine, inputs: Inputs, threshold_ms: float) -> Summary:
    """summary.json from the stages' results (output only: no stage reads it)."""
    figures: Figures
    figures, per_step = results["skew"]
    figures = Figures(**figures, step_interval_ms=results["intervals"]["step_interval_ms"])
    intervals: StepIntervals = results["intervals"]
    findings: Findings = results["findings"]
    blocks = {s.name: results[s.name] for s in STAGES.values() if s.in_summary}
    composed = {
        "inputs": inputs,
        "figures": figures,
        "per_step": _with_intervals(per_step, engine),
        "noise": results["noise_floor"].block(),
        "late_starts": LateStarts(threshold_ms=threshold_ms, count=len(findings.late_starts), items=findings.late_starts),
        "tail_steps": tail_block(findings.tail_steps, threshold_ms, results["straggler"]),
        "slow_steps": SlowSteps(
            threshold_ms=threshold_ms,
            median_interval_ms=intervals["median_interval_ms"],
            count=len(findings.slow_steps),
            items=findings.slow_steps,
        ),
    }
    return build_summary(engine.trace.performance_summary, {**blocks, **composed})


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
    # the swimlane, and the per-step table the span budget ranks steps by
    results = run_stages(engine, {"steps": _positional_steps(window)}, ("swimlane", "skew"))
    return AnalysisResult(summary=summary, swimlane=cast(Swimlane, results["swimlane"]), engine=engine, window=window)
