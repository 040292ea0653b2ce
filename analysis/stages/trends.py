"""Trends: the run's figures per window of consecutive steps, so that drift and a bad hour are seen at a glance.

A long job's percentiles over the whole run hide the hour in which latency
went bad. The steps are cut into windows of :func:`window_steps` consecutive
decode steps (1,000 on a long run; about twenty windows on a short one), and
each window gets its step-interval and skew percentiles, its slow steps and
what its causes cost in the what-if replay (the sum of their items).
"""

from __future__ import annotations

import bisect
import math

from dsprof.analysis.stages.runner import stage
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.summary_schema import Trends, TrendWindow, WhatIf, WhatIfItem
from dsprof.analysis.units import ns_to_ms

LONG_RUN_WINDOW = 1_000
SHORT_RUN_WINDOWS = 20
MIN_WINDOW = 10
WORST_WINDOWS = 3


def window_steps(steps: int) -> int:
    """Steps per window: 1,000 where that gives twenty windows or more, else about twenty windows of at least ten."""
    if steps >= LONG_RUN_WINDOW * SHORT_RUN_WINDOWS:
        return LONG_RUN_WINDOW
    return max(MIN_WINDOW, math.ceil(steps / SHORT_RUN_WINDOWS))


@stage("trends", reads=("decode", "steps", "step_intervals"), in_summary=True)
def trends_section(engine: Engine, what_if: WhatIf) -> Trends:
    """The ``trends`` block of summary.json: per window, its span of steps and time and its figures; the worst windows."""
    steps = int(engine.scalar("SELECT count(*) FROM step_intervals") or 0)
    if not steps:
        return {"window_steps": None, "windows": [], "worst": []}
    size = window_steps(steps)
    rows = engine.rows(f"""
        WITH numbered AS (SELECT i.step, i.interval_ns, i.slow, s.runner_start_skew_ns, s.runner_end_skew_ns,
                                 (row_number() OVER (ORDER BY i.step) - 1) // {size} AS window
                          FROM step_intervals i LEFT JOIN steps s USING (step)),
             starts AS (SELECT step, min(root_ts_ns) AS start_ns FROM decode GROUP BY step)
        SELECT n.window, min(n.step), max(n.step), count(*),
               (min(t.start_ns) - (SELECT min(root_ts_ns) FROM decode)) / 1e9,
               quantile_cont(n.interval_ns, 0.5), quantile_cont(n.interval_ns, 0.99),
               quantile_cont(n.runner_start_skew_ns, 0.99), quantile_cont(n.runner_end_skew_ns, 0.99),
               count(*) FILTER (WHERE n.slow)
        FROM numbered n LEFT JOIN starts t USING (step) GROUP BY n.window ORDER BY n.window""")
    windows: list[TrendWindow] = [
        {
            "window": int(w),
            "first_step": int(first),
            "last_step": int(last),
            "steps": int(count),
            "start_s": None if start is None else round(float(start), 3),
            "step_interval_p50_ms": _ms(p50),
            "step_interval_p99_ms": _ms(p99),
            "runner_start_skew_p99_ms": _ms(start_skew),
            "runner_end_skew_p99_ms": _ms(end_skew),
            "slow_steps": int(slow),
            "what_if_saved_ms": 0.0,
        }
        for w, first, last, count, start, p50, p99, start_skew, end_skew, slow in rows  # one row per window
    ]
    _add_savings(windows, what_if["items"])
    return {"window_steps": size, "windows": windows, "worst": _worst(windows)}


def _worst(windows: list[TrendWindow]) -> list[int]:
    """The windows that lost the most: what-if saving, then slow steps, then the step interval's p99."""
    ranked = sorted(windows, key=lambda w: (-w["what_if_saved_ms"], -w["slow_steps"], -(w["step_interval_p99_ms"] or 0.0), w["window"]))
    return [w["window"] for w in ranked[:WORST_WINDOWS] if w["what_if_saved_ms"] > 0 or w["slow_steps"] > 0]


def _add_savings(windows: list[TrendWindow], items: list[WhatIfItem]) -> None:
    """Each window's what-if saving: the sum of its causes' own savings."""
    firsts = [w["first_step"] for w in windows]
    for item in items:  # one per cause
        index = _window_of(firsts, item["step"])
        if index is not None:
            windows[index]["what_if_saved_ms"] = round(windows[index]["what_if_saved_ms"] + item["saved_ms"], 3)


def _window_of(firsts: list[int], step: int) -> int | None:
    """The window whose first step is the last one at or before ``step`` (steps rise from window to window)."""
    index = bisect.bisect_right(firsts, step) - 1
    return index if index >= 0 else None


def _ms(value: float | None) -> float | None:
    return None if value is None else ns_to_ms(value)
