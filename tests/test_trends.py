"""Trends: per-window figures, and a degraded stretch in the middle of a run is its worst window."""

from __future__ import annotations

import numpy as np

from dsprof.analysis.stages.trends import LONG_RUN_WINDOW, window_steps
from dsprof.commands.analysis_job import analyze_paths
from dsprof.testing.synthetic import SyntheticRun


def test_window_sizes():
    assert window_steps(100) == 10 and window_steps(148) == 10 and window_steps(5_000) == 250
    assert window_steps(20_000) == LONG_RUN_WINDOW and window_steps(100_000) == LONG_RUN_WINDOW


def test_a_degraded_stretch_is_the_worst_window(tmp_path):
    fence = np.full((4, 200), 2_000_000, dtype=np.int64)
    fence[2, 120:130:2] += 12_000_000  # rank 2 slow every other step for ten steps in the middle of the run
    SyntheticRun(ranks=4, steps=200, fence_wait_ns=fence).write(tmp_path / "run")
    outcome = analyze_paths([tmp_path / "run"], tmp_path / "out")
    trends = outcome.summary["trends"]
    assert trends["window_steps"] == 10 and len(trends["windows"]) == 20
    assert [(w["first_step"], w["last_step"]) for w in trends["windows"][:2]] == [(0, 9), (10, 19)]
    worst = trends["windows"][trends["worst"][0]]
    assert (worst["first_step"], worst["last_step"]) == (120, 129)
    assert worst["slow_steps"] == 5  # steps paced by the clock: each late token is one slow interval
    quiet = trends["windows"][0]
    assert worst["step_interval_p99_ms"] > quiet["step_interval_p99_ms"] + 10
    assert sum(w["steps"] for w in trends["windows"]) == 200
    text = outcome.outputs["summary.md"].read_text()
    assert "Worst windows (10 steps each):\n- steps 120–129" in text
