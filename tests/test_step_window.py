"""analyze --steps A:B: a window of the run gives the figures of the same steps cut out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from dsprof.analysis.window import parse_steps
from dsprof.commands.analysis_job import analyze_paths
from dsprof.errors import DsprofError
from dsprof.testing.synthetic import SyntheticRun


def test_step_windows_parse_and_refuse():
    assert parse_steps("10:19") == (10, 19) and parse_steps(" 5: ")[0] == 5 and parse_steps(":7") == (0, 7)
    for bad in ("", "7", ":", "a:b", "9:3", "-1:4"):
        with pytest.raises(DsprofError, match="bad step window"):
            parse_steps(bad)


def test_a_window_has_the_figures_of_its_steps(tmp_path):
    fence = np.full((3, 60), 2_000_000, dtype=np.int64)
    fence[1, [12, 25, 47]] += 9_000_000  # tails inside and outside the window
    SyntheticRun(ranks=3, steps=60, fence_wait_ns=fence).write(tmp_path / "run")
    whole = analyze_paths([tmp_path / "run"], None).summary
    window = analyze_paths([tmp_path / "run"], None, steps=(20, 39)).summary
    assert window["inputs"]["steps"] == [20, 39] and "steps" not in whole["inputs"]
    assert [r["step"] for r in window["per_step"]] == list(range(20, 40))
    inside = [r for r in whole["per_step"] if 20 <= r["step"] <= 39]
    assert [(r["runner_start_skew_ms"], r["runner_end_skew_ms"]) for r in window["per_step"]] == [
        (r["runner_start_skew_ms"], r["runner_end_skew_ms"]) for r in inside
    ]
    assert [t["step"] for t in window["tail_steps"]["items"]] == [25]
    assert window["validation"]["decode_steps"] == 20 and window["validation"]["valid"]
