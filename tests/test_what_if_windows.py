"""The what-if replay one window of steps at a time gives what it gives over the whole run in one window.

The replay holds a window of steps and its margins (analysis/stages/replay.py), so that its memory is sized by
the window, not by the run. Its answer must not depend on where the windows fall: each log below is analysed with
windows of 1, 5 and 16 steps and with the whole run in one, and the ``what_if`` sections must be equal, to the
last digit. The logs have late work to replay (the coupled loop's faults, a carry-over chain, late fences every
few steps) and a rank whose thread ends long before the others' (the rest of its thread is replayed when the
replay leaves its last window; where its last run ends after every other, that rest decides the end), and so do
the Kineto traces of a real gloo job (no validate: a run's token is its end). A window whose margins cannot hold what its steps depend on says so, and the stage replays the run in one.
"""

from __future__ import annotations

import numpy as np
import pytest

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.ingest import read_paths
from dsprof.analysis.stages import replay, what_if
from dsprof.testing.coupled import Shape, chain_scenario, scenario_for, write_scenario
from dsprof.testing.kineto_job import run_job
from dsprof.testing.synthetic import SyntheticRun

WINDOWS = (1, 5, 16)


def _coupled(directory, scenario) -> tuple:
    answers = write_scenario(scenario, directory)
    return read_paths([directory / "server.log"]), answers["threshold_ms"]


def _late_fences(directory, missing: dict[int, int], hang_ms: int = 0) -> tuple:
    """Three ranks, late fences every few steps; ``missing`` steps at the end of a rank, whose last run's fence
    waits ``hang_ms`` more (so that its end, steps before the others', is the run's last)."""
    steps = 60
    fence = np.full((3, steps), 9_000_000, dtype=np.int64)
    fence[1, ::7] += 15_000_000
    fence[2, 3::11] += 25_000_000
    for rank, count in missing.items():
        fence[rank, steps - count - 1] += hang_ms * 1_000_000
    run = SyntheticRun(ranks=3, steps=steps, fence_wait_ns=fence, device_wall_ns=fence + 100_000, host_evidence=True, missing_steps=missing)
    return read_paths([run.write(directory)]), 5.0


LOGS = {
    "coupled 8 ranks": lambda d: _coupled(d, scenario_for(Shape(ranks=8, steps=60, layers=3, seed=11, peer=True))),
    "coupled, no peer": lambda d: _coupled(d, scenario_for(Shape(ranks=8, steps=60, layers=2, seed=12, peer=False))),
    "carry-over chain": lambda d: _coupled(d, chain_scenario()),
    "late fences": lambda d: _late_fences(d, {}),
    "a rank stops 25 steps early": lambda d: _late_fences(d, {1: 25}),
    # the rest of that rank's thread decides the end: replayed when the replay leaves the rank's last window
    "a rank stops 25 steps early and ends last": lambda d: _late_fences(d, {1: 25}, hang_ms=900),
}


def _what_if(trace, threshold_ms: float, monkeypatch, window_steps: int, loads: list[tuple[int, int, int]]) -> dict:
    """The ``what_if`` section with windows of ``window_steps``; ``loads`` gets (first, end, run's steps) of each window built."""
    monkeypatch.setattr(what_if, "WINDOW_STEPS", window_steps)
    loaded = what_if.load_decode_runs

    def counted(engine, grid, lo, hi):
        loads.append((lo, hi, grid.steps))
        return loaded(engine, grid, lo, hi)

    monkeypatch.setattr(what_if, "load_decode_runs", counted)
    result = analyze_trace(trace, threshold_ms=threshold_ms)
    try:
        return result.summary["what_if"]
    finally:
        result.engine.close()


@pytest.mark.parametrize("log", list(LOGS))
def test_windows_of_any_size_replay_as_the_whole_run_does(log, tmp_path, monkeypatch):
    trace, threshold_ms = LOGS[log](tmp_path)
    whole = _what_if(trace, threshold_ms, monkeypatch, 100_000, [])
    assert whole["items"] and whole["total_saved_ms"] > 0  # there is late work to replay
    for window_steps in WINDOWS:
        loads: list[tuple[int, int, int]] = []
        assert _what_if(trace, threshold_ms, monkeypatch, window_steps, loads) == whole, window_steps
        assert len(loads) > 2 and all(hi - lo < steps for lo, hi, steps in loads)  # several windows, never the whole run


@pytest.mark.runtime
def test_a_pytorch_profiler_job_replays_alike_in_windows(tmp_path, monkeypatch):
    """Kineto traces of a real gloo job (no validate: a run's token is its end), late ranks at four steps."""
    traces = tmp_path / "traces"
    run_job(traces, ranks=4, steps=28, faults={"4:1": "sleep", "9:2": "compute", "15:0": "sleep", "22:3": "compute"})
    trace = read_paths(sorted(traces.glob("rank*.json")))
    whole = _what_if(trace, 5.0, monkeypatch, 100_000, [])
    assert whole["items"] and whole["total_saved_ms"] > 0
    for window_steps in (1, 5):
        assert _what_if(trace, 5.0, monkeypatch, window_steps, []) == whole, window_steps


@pytest.mark.parametrize(
    ("log", "margin", "why"),
    [
        # no margin: a window's first runs miss the thread events of the runs before them
        ("late fences", 0, "are not yet replayed"),
        # one step: the span a cause's removals scan reaches past the runs the window holds
        ("coupled 8 ranks", 1, "reaches past the window's runs"),
    ],
)
def test_a_margin_too_small_replays_the_run_in_one_window(log, margin, why, tmp_path, monkeypatch):
    trace, threshold_ms = LOGS[log](tmp_path)
    whole = _what_if(trace, threshold_ms, monkeypatch, 100_000, [])
    monkeypatch.setattr(replay, "MARGIN_STEPS", margin)
    monkeypatch.setattr(what_if, "MARGIN_STEPS", margin)
    raised: list[str] = []
    monkeypatch.setattr(replay.WindowTooSmall, "__init__", lambda self, said: raised.append(said))
    loads: list[tuple[int, int, int]] = []
    assert _what_if(trace, threshold_ms, monkeypatch, 5, loads) == whole
    first, end, steps = loads[-1]
    assert why in raised[0] and (first, end) == (0, steps)  # it said why, then replayed the run in one window
