"""Run comparison: known deltas, noise bands from repeated runs, the CLI table."""

from __future__ import annotations

import copy
import json
import statistics

import pytest
from click.testing import CliRunner

from dsprof.analysis.diff import diff_summaries, flatten_figures, format_diff
from dsprof.cli.main import cli


def _summary(start_p95: float, cadence: float, tokens: int = 640, serialized: bool = False) -> dict:
    return {
        "schema": "dsprof.summary/1",
        "dsprof_version": "0.1.0",
        "inputs": {"records_read": 1234, "spans": 999, "dropped": {}},
        "workload": {"preset": "demo", "ranks": 4, "metadata": "host-shared"},
        "exit_status": 0,
        "validation": {"valid": True, "decode_steps": 10, "rank_roots": 40},
        "figures": {
            "runner_start_skew_ms": {"p50": 0.1, "p95": start_p95, "p99": 0.5, "max": 0.6, "count": 10},
            "per_rank": {"0": {"root_ms": {"p50": 20.0, "p95": 21.0, "p99": 22.0, "max": 23.0, "count": 10}}},
        },
        "per_step": [{"step": 0, "runner_start_skew_ms": 0.1}],
        "late_starts": {"threshold_ms": 5.0, "count": 0, "items": []},
        "tail_steps": {"threshold_ms": 5.0, "count": 1, "straggler": {"verdict": "rank 1 (npu:1)", "rank": 1,
                                                                     "share": 0.25}},
        "pipeline": {"serialized": serialized, "cadence_p50_ms": cadence, "achieved_depth": {"0": 1.8}},
        "serving": {"tokens_returned": tokens, "tokens_expected": 640},
    }


def _by_name(result):
    return {f.figure: f for f in result.figures}


def test_flatten_keeps_figures_and_drops_settings_and_inputs():
    flat = flatten_figures(_summary(0.3, 12.0))
    assert flat == {
        "validation.decode_steps": 10,
        "validation.rank_roots": 40,
        "runner_start_skew_ms.p50": 0.1,
        "runner_start_skew_ms.p95": 0.3,
        "runner_start_skew_ms.p99": 0.5,
        "runner_start_skew_ms.max": 0.6,
        "late_starts.count": 0,
        "tail_steps.count": 1,
        "tail_steps.straggler.share": 0.25,
        "pipeline.cadence_p50_ms": 12.0,
        "serving.tokens_returned": 640,
        "serving.tokens_expected": 640,
    }
    with_ranks = flatten_figures(_summary(0.3, 12.0), per_rank=True)
    assert with_ranks["per_rank.0.root_ms.p95"] == 21.0
    assert with_ranks["pipeline.achieved_depth.0"] == 1.8


def test_single_runs_give_absolute_and_relative_change_without_noise_flag():
    result = diff_summaries(_summary(0.3, 12.0), _summary(0.45, 24.0, tokens=600))
    figures = _by_name(result)
    assert figures["runner_start_skew_ms.p95"].change == pytest.approx(0.15)
    assert figures["runner_start_skew_ms.p95"].relative == pytest.approx(0.5)
    assert figures["pipeline.cadence_p50_ms"].relative == pytest.approx(1.0)
    assert figures["serving.tokens_returned"].change == -40
    assert figures["serving.tokens_returned"].counted
    assert figures["runner_start_skew_ms.p50"].change == 0
    assert all(f.beyond_noise is None for f in result.figures)
    assert result.flagged == []
    text = format_diff(result)
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.strip()}
    assert rows["runner_start_skew_ms.p95"] == ["0.300", "0.450", "+0.150", "+50.0%"]
    assert rows["serving.tokens_returned"] == ["640", "600", "-40", "-6.2%"]
    assert "no repeated runs" in text


def test_repeated_runs_flag_only_changes_beyond_the_noise_band():
    a_runs = [_summary(p95, cadence) for p95, cadence in [(0.30, 12.0), (0.32, 12.5), (0.34, 11.5)]]
    # p95 moves inside A's spread; cadence doubles (the serialization regression).
    b_runs = [_summary(p95, cadence, serialized=True) for p95, cadence in [(0.33, 24.0), (0.31, 25.0)]]
    result = diff_summaries(a_runs, b_runs)
    figures = _by_name(result)
    cadence = figures["pipeline.cadence_p50_ms"]
    assert cadence.a_mean == pytest.approx(12.0) and cadence.b_mean == pytest.approx(24.5)
    assert cadence.a_stdev == pytest.approx(statistics.stdev([12.0, 12.5, 11.5]))
    assert (cadence.a_runs, cadence.b_runs) == (3, 2)
    assert cadence.beyond_noise is True
    skew = figures["runner_start_skew_ms.p95"]
    assert skew.change == pytest.approx(0.32 - 0.32)
    assert skew.beyond_noise is False
    assert [f.figure for f in result.flagged] == ["pipeline.cadence_p50_ms"]
    assert [(label.figure, label.a_values, label.b_values) for label in result.labels] == [
        ("pipeline.serialized", [False, False, False], [True, True])
    ]
    text = format_diff(result)
    assert "1 figure(s) changed beyond run-to-run noise" in text
    assert "12.000 ± 0.500 (n=3)" in text
    assert "pipeline.serialized: A=False B=True" in text


def test_band_widens_to_min_max_and_single_side_repeats():
    # A has repeats with spread 2.0 around 10; a single B at 13.9 is inside mean + 2·stdev.
    a_runs = [_summary(0.3, c) for c in (8.0, 10.0, 12.0)]
    inside = _by_name(diff_summaries(a_runs, _summary(0.3, 13.9)))["pipeline.cadence_p50_ms"]
    assert inside.beyond_noise is False
    outside = _by_name(diff_summaries(a_runs, _summary(0.3, 14.1)))["pipeline.cadence_p50_ms"]
    assert outside.beyond_noise is True


def test_workload_differences_are_noted():
    b = _summary(0.3, 12.0)
    b["workload"]["metadata"] = "device-resident"
    result = diff_summaries(_summary(0.3, 12.0), b)
    assert result.workload_differences == {"metadata": ("host-shared", "device-resident")}
    assert "note: workload metadata differs: A='host-shared' B='device-resident'" in format_diff(result)


def test_a_workload_that_is_not_a_table_counts_as_absent():
    b = _summary(0.3, 12.0)
    b["workload"] = ["not", "a", "table"]  # another producer's summary
    result = diff_summaries(_summary(0.3, 12.0), b)
    assert result.workload_differences["metadata"] == ("host-shared", None)


def test_cli_diff_of_artifact_dirs_and_comma_separated_repeats(tmp_path):
    paths = {}
    for name, summary in {"a1": _summary(0.30, 12.0), "a2": _summary(0.34, 12.4),
                          "b1": _summary(0.31, 30.0), "b2": _summary(0.33, 31.0)}.items():
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "summary.json").write_text(json.dumps(summary))
        paths[name] = str(run_dir)
    runner = CliRunner()
    result = runner.invoke(cli, ["diff", f"{paths['a1']},{paths['a2']}", f"{paths['b1']},{paths['b2']}",
                                 "--changed-only"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    cadence = next(line for line in lines if line.startswith("pipeline.cadence_p50_ms"))
    assert "BEYOND NOISE" in cadence and "+18.300" in cadence
    assert not any(line.startswith("runner_start_skew_ms.p50") for line in lines)  # unchanged, left out
    missing = runner.invoke(cli, ["diff", paths["a1"], str(tmp_path / "nope")])
    assert missing.exit_code == 2
    assert missing.output.startswith("dsprof: error: ") and "nope" in missing.output


def test_diff_does_not_mutate_inputs():
    a = _summary(0.3, 12.0)
    before = copy.deepcopy(a)
    diff_summaries(a, _summary(0.4, 13.0))
    assert a == before
