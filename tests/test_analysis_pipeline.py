"""Pipeline overlap check, cadence and achieved depth on pipelined and serialized generated runs."""

from __future__ import annotations

import numpy as np

from dsprof.analysis.analyze import analyze
from dsprof.profiler.synthetic import SyntheticRun


def test_pipelined_run_overlaps_on_every_pair(tmp_path):
    run = SyntheticRun(ranks=4, steps=25, pipelined=True)
    run.write(tmp_path / "run")
    pipeline = analyze([tmp_path / "run"]).summary["pipeline"]
    assert pipeline["pairs_checked"] == 4 * 24
    assert pipeline["pairs_overlapped"] == 4 * 24
    assert pipeline["violations"] == 0 and pipeline["first_violations"] == []
    assert pipeline["serialized"] is False
    assert pipeline["diagnosis"].startswith("pipelined: bind(N+1) overlaps runner_run(N) on every rank")
    # cadence = the grid period exactly; depth = sum of roots / union of their time
    assert pipeline["cadence_p50_ms"] == round(run.period_ns / 1e6, 3)
    assert pipeline["cadence_ms"]["0"]["count"] == 24
    t = run.timings()
    root = t.root_end_ns[0] - t.root_start_ns[0]
    union = t.root_end_ns[0, -1] - t.root_start_ns[0, 0]  # every root overlaps the next
    assert pipeline["achieved_depth"]["0"] == round(root.sum() / union, 3)
    assert 1.0 < pipeline["achieved_depth"]["0"] < 2.0


def test_serialized_run_is_diagnosed(tmp_path):
    run = SyntheticRun(ranks=4, steps=25, pipelined=False, fence_wait_ns=185_000_000, device_wall_ns=185_000_000)
    run.write(tmp_path / "run")
    pipeline = analyze([tmp_path / "run"]).summary["pipeline"]
    assert pipeline["serialized"] is True
    assert pipeline["pairs_overlapped"] == 0 and pipeline["violations"] == 4 * 24
    assert pipeline["first_violations"][0]["reason"] == "bind(N+1) does not overlap runner_run(N)"
    cadence = round(run.period_ns / 1e6, 3)
    assert pipeline["cadence_p50_ms"] == cadence
    assert pipeline["diagnosis"].startswith(
        f"serialized: bind(N+1) starts after runner_run(N) ends in 96 of 96 pairs on all ranks; cadence {cadence:.3f} ms"
    )
    assert pipeline["achieved_depth"] == {str(r): 1.0 for r in range(4)}


def test_runner_overrunning_the_next_launch_is_a_claim_order_violation(tmp_path):
    fence = np.full((3, 12), 9_000_000, dtype=np.int64)
    fence[1, 6] += 3_000_000  # runner_run(6) on rank 1 ends after runner_run(7) starts
    SyntheticRun(ranks=3, steps=12, fence_wait_ns=fence).write(tmp_path / "run")
    result = analyze([tmp_path / "run"])
    pipeline = result.summary["pipeline"]
    epoch = int(result.swimlane.roots.query("rank == 1 and step == 6")["run_epoch"].iloc[0])
    assert pipeline["violations"] == 1 and pipeline["claim_order_violations"] == 1
    assert pipeline["first_violations"] == [
        {"rank": 1, "run_epoch": epoch, "step": 6, "reason": "runner_run(N+1) starts before claim_release(N)"}
    ]
    assert pipeline["serialized"] is False


def test_pairs_fall_back_to_start_order_when_roots_lack_run_epoch(tmp_path):
    SyntheticRun(ranks=2, steps=10, root_attrs=False).write(tmp_path / "run")
    pipeline = analyze([tmp_path / "run"]).summary["pipeline"]
    assert pipeline["pairs_checked"] == 18 and pipeline["pairs_overlapped"] == 18


def test_launches_before_claim_release_are_not_called_serialized(tmp_path):
    # every other runner_run is longer than the step period, so on both ranks 10 of the 18 pairs
    # launch N+1 before claim_release(N): most pairs fail, but bind(N+1) still overlaps runner_run(N)
    fence = np.full((2, 10), 9_000_000, dtype=np.int64)
    fence[:, ::2] += 2_000_000
    SyntheticRun(ranks=2, steps=10, fence_wait_ns=fence).write(tmp_path / "run")
    pipeline = analyze([tmp_path / "run"]).summary["pipeline"]
    assert pipeline["claim_order_violations"] == 10 and pipeline["violations"] == 10
    assert pipeline["serialized"] is True
    assert pipeline["diagnosis"].startswith("unordered: runner_run(N+1) starts before claim_release(N) in 10 of 18 pairs")
