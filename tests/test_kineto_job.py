"""A real torch.distributed job (4 ranks on gloo, CPU) profiled by torch.profiler, analysed from its Kineto traces alone.

The job (dsprof.testing.kineto_job) is written by the test: each step computes, then meets every rank at an
all-to-all; at known steps one rank sleeps before the all-to-all (it arrives
late) and another computes longer. The figures are checked against the
ProfilerStep spans read straight from the files, the faults against the slow
steps' culprits, and the same again with one rank's file moved to another
host's clock.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.ingest import read_paths
from dsprof.testing.kineto_job import run_job

pytestmark = pytest.mark.runtime

RANKS = 4
STEPS = 14
SLEEP_STEP, SLEEP_RANK = 4, 1
COMPUTE_STEP, COMPUTE_RANK = 9, 2
HOST_SHIFT_US = 7_345_678.125  # the moved rank's clock, seconds off the others'


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """The job's four per-rank traces, written by the job itself."""
    out = tmp_path_factory.mktemp("kineto_job") / "traces"
    faults = {f"{SLEEP_STEP}:{SLEEP_RANK}": "sleep", f"{COMPUTE_STEP}:{COMPUTE_RANK}": "compute"}
    run_job(out, ranks=RANKS, steps=STEPS, faults=faults)
    return out


def _steps_from_files(directory: Path) -> dict[int, dict[int, tuple[int, int]]]:
    """step -> rank -> (start, end) ns of its ProfilerStep span, read straight from the files (exact decimals)."""
    steps: dict[int, dict[int, tuple[int, int]]] = {}
    for path in sorted(directory.glob("rank*.json")):
        document = json.loads(path.read_text(), parse_float=Decimal)
        base, rank = int(document.get("baseTimeNanoseconds", 0)), int(document["distributedInfo"]["rank"])
        for event in document["traceEvents"]:
            name = str(event.get("name", ""))
            if event.get("ph") == "X" and name.startswith("ProfilerStep#"):
                start = base + int((Decimal(event["ts"]) * 1000).to_integral_value())
                end = start + int((Decimal(event["dur"]) * 1000).to_integral_value())
                steps.setdefault(int(name.split("#")[1]), {})[rank] = (start, end)
    return steps


def _percentiles_ms(values_ns: list[int]) -> dict[str, float]:
    q = np.quantile(np.array(values_ns, dtype=np.float64), [0.5, 0.95, 0.99, 1.0])
    return dict(zip(("p50", "p95", "p99", "max"), (round(v / 1e6, 3) for v in q), strict=True))


def _expected(directory: Path) -> dict[str, dict[str, float]]:
    steps = _steps_from_files(directory)
    order = sorted(steps)
    starts = [[steps[s][r][0] for r in sorted(steps[s])] for s in order]
    ends = [[steps[s][r][1] for r in sorted(steps[s])] for s in order]
    tokens = [max(e) for e in ends]
    return {
        "runner_start_skew_ms": _percentiles_ms([max(s) - min(s) for s in starts]),
        "runner_end_skew_ms": _percentiles_ms([max(e) - min(e) for e in ends]),
        "step_interval_ms": _percentiles_ms([b - a for a, b in zip(tokens, tokens[1:], strict=False)]),
    }


def _culprits(summary: dict) -> dict[int, tuple[int, str]]:
    return {item["step"]: (item["rank"], item["critical_path"]["via"]) for item in summary["slow_steps"]["items"]}


def _check_faults(summary: dict) -> None:
    culprits = _culprits(summary)
    for step, rank in ((SLEEP_STEP, SLEEP_RANK), (COMPUTE_STEP, COMPUTE_RANK)):
        assert step in culprits, f"fault step {step} not slow: {culprits}"
        assert culprits[step][0] == rank
        assert "gloo:all_to_all" in culprits[step][1]


def test_kineto_job_figures_and_culprits(job):
    summary = analyze_trace(read_paths([job])).summary
    assert summary["validation"]["valid"], summary["validation"]
    expected = _expected(job)
    for figure, values in expected.items():
        got = summary["figures"][figure]
        for key, value in values.items():
            assert abs(got[key] - value) <= 0.001, (figure, key, got, values)
    assert summary["figures"]["validate_ms"]["count"] == 0  # the source has no validate: absent, not zero
    _check_faults(summary)
    by_step = {item["step"]: item for item in summary["slow_steps"]["items"]}
    assert by_step[SLEEP_STEP]["phase"] == "device_wall.host_gap"
    assert by_step[COMPUTE_STEP]["phase"] == "device_wall.compute"


def test_kineto_job_on_two_hosts(job, tmp_path):
    moved = tmp_path / "two_hosts"
    moved.mkdir()
    for path in sorted(job.glob("rank*.json")):
        document = json.loads(path.read_text())
        if document["distributedInfo"]["rank"] == RANKS - 1:
            document["host_name"] = "other-host"
            for event in document["traceEvents"]:
                if "ts" in event:
                    event["ts"] = float(event["ts"]) + HOST_SHIFT_US
        (moved / path.name).write_text(json.dumps(document))
    summary = analyze_trace(read_paths([moved])).summary
    original = analyze_trace(read_paths([job])).summary
    assert summary["validation"]["valid"]
    _check_faults(summary)
    notes = [n for n in summary["inputs"]["notes"] if "other-host" in n]
    assert notes and "aligned" in notes[0], summary["inputs"]["notes"]
    for figure in ("step_interval_ms", "runner_end_skew_ms"):
        for key in ("p50", "p95", "max"):
            assert abs(summary["figures"][figure][key] - original["figures"][figure][key]) <= 0.25, (figure, key)
