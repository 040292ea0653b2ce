"""Pipeline overlap check, cadence and achieved depth on pipelined and serialized generated runs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dsprof.analysis.ingest import read_paths
from dsprof.commands.analysis_job import analyze_paths
from dsprof.testing.synthetic import SyntheticRun


def analyze(paths):
    return analyze_paths(paths, None)


def test_pipelined_run_overlaps_on_every_pair(tmp_path):
    run = SyntheticRun(ranks=4, steps=25, pipelined=True)
    run.write(tmp_path / "run")
    pipeline = analyze([tmp_path / "run"]).summary["pipeline"]
    assert pipeline["pairs_checked"] == 4 * 24
    assert pipeline["pairs_overlapped"] == 4 * 24
    assert pipeline["violations"] == 0 and pipeline["first_violations"] == []
    assert pipeline["serialized"] is False
    assert pipeline["diagnosis"].startswith("pipelined: bind(N+1) overlaps runner_run(N) on every pair")
    assert pipeline["overlap_share"] == 1.0 and pipeline["native_overlap_verified"]["verified"] is True
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
    assert pipeline["runner_depth"] == {str(r): 1.0 for r in range(4)}
    assert pipeline["overlap_share"] == 0.0 and pipeline["native_overlap_verified"]["verified"] is False


def test_runner_overrunning_the_next_launch_is_a_claim_order_violation(tmp_path):
    fence = np.full((3, 12), 9_000_000, dtype=np.int64)
    fence[1, 6] += 3_000_000  # runner_run(6) on rank 1 ends after runner_run(7) starts
    SyntheticRun(ranks=3, steps=12, fence_wait_ns=fence).write(tmp_path / "run")
    result = analyze([tmp_path / "run"])
    pipeline = result.summary["pipeline"]
    epoch = result.result.engine.scalar("SELECT run_epoch FROM decode WHERE rank = 1 AND step = 7")
    assert pipeline["violations"] == 1 and pipeline["claim_order_violations"] == 1
    assert pipeline["first_violations"] == [
        {
            "rank": 1,
            "pid": 41001,
            "run_epoch": epoch,
            "step": 7,
            "sequence": epoch,
            "reason": "runner_run(N+1) starts before claim_release(N)",
        }
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


# -- the serving stack's rule (SPEC §2/§3), rebuilt here from the text, not from either tool's code ------------


def stack_rule_verdict(log_dir) -> tuple[bool, int]:
    """(verified, pairs checked) as SPEC describes the stack's --assert-native-overlap.

    Runs whose roots carry all five identity attributes, per pid ordered by
    runner_run start, skipping sequence 0 (sequence: dispatch_id, or run_epoch
    where dispatch_id is 0); each adjacent pair needs bind(N+1) to intersect
    runner_run(N), runner_run(N+1) not before claim_release(N), and a rising
    sequence; at least one pair.
    """
    rows = read_paths([log_dir]).spans.to_pylist()
    runs: dict = {}
    for row in rows:  # a test oracle: plain Python over a small log
        if row["inv"] is None:
            continue
        run = runs.setdefault((row["pid"], row["inv"]), {})
        if row["name"] not in run or row["ts_ns"] < run[row["name"]]["ts_ns"]:
            run[row["name"]] = row
    lanes: dict = {}
    for (pid, _), run in runs.items():
        root = run.get("chip.run")
        identity = [root and root[k] for k in ("run_id", "dispatch_id", "run_epoch", "slot_id", "generation")]
        if root is None or any(v is None for v in identity):
            continue
        sequence = root["dispatch_id"] or root["run_epoch"]
        if sequence:
            lanes.setdefault(pid, []).append((run["chip.run.runner_run"]["ts_ns"], sequence, run))
    checked, ok = 0, True
    for lane in lanes.values():
        lane.sort(key=lambda item: item[0])
        for (_, seq_a, a), (_, seq_b, b) in itertools.pairwise(lane):
            checked += 1
            runner, bind = a["chip.run.runner_run"], b["chip.run.bind"]
            overlap = bind["ts_ns"] < runner["ts_ns"] + runner["dur_ns"] and bind["ts_ns"] + bind["dur_ns"] > runner["ts_ns"]
            ordered = b["chip.run.runner_run"]["ts_ns"] >= a["chip.run.claim_release"]["ts_ns"]
            ok = ok and overlap and ordered and seq_b > seq_a
    return ok and checked > 0, checked


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        {},  # healthy: prefill has sequence 0 and is skipped
        {"pipelined": False},  # serialized
        {"fence_wait_ns": 11_500_000},  # launches before claim_release
        {"dispatch_ids": True},  # the prefill is checked, and its successor cannot overlap it
    ],
)
def test_native_overlap_rule_matches_the_stack(tmp_path, options):
    SyntheticRun(ranks=2, steps=8, **options).write(tmp_path / "run")
    pipeline = analyze([tmp_path / "run"]).summary["pipeline"]
    verified, checked = stack_rule_verdict(tmp_path / "run")
    assert (pipeline["native_overlap_verified"]["verified"], pipeline["pairs_checked"]) == (verified, checked)


def test_the_prefill_pair_is_reported_on_its_own(tmp_path):
    SyntheticRun(ranks=2, steps=8, dispatch_ids=True).write(tmp_path / "run")
    pipeline = analyze([tmp_path / "run"]).summary["pipeline"]
    assert [(p["rank"], p["overlapped"]) for p in pipeline["prefill_pairs"]] == [(0, False), (1, False)]
    assert "does not overlap" in pipeline["native_overlap_verified"]["reason"]
