"""Run comparison: verdicts first, known deltas with better/worse, noise bands from repeated runs, the CLI."""

from __future__ import annotations

import copy
import json
import re
import statistics

import pytest
from click.testing import CliRunner
from hostile_summaries import any_summary
from hypothesis import given, settings
from hypothesis import strategies as st

from dsprof.analysis.policy.diff import HIGHER, LOWER, diff_summaries, figure_direction, flatten_figures, format_diff
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
        "tail_steps": {
            "threshold_ms": 5.0,
            "count": 1,
            "straggler": {"verdict": "rank 1 (npu:1)", "rank": 1, "share": 0.25, "mechanism": "device"},
        },
        "pipeline": {"serialized": serialized, "cadence_p50_ms": cadence, "achieved_depth": {"0": 1.8}},
        "serving": {"tokens_returned": tokens, "tokens_expected": 640},
    }


def _by_name(result):
    return {f.figure: f for f in result.figures}


def _rows(text: str) -> dict[str, list[str]]:
    """Table rows by figure name, split on runs of two or more spaces."""
    return {cells[0]: cells[1:] for line in text.splitlines() if line.startswith("  ") for cells in [re.split(r"\s{2,}", line.strip())]}


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


def test_directions_per_figure_family():
    assert figure_direction("runner_start_skew_ms.p95") == LOWER
    assert figure_direction("pipeline.cadence_p50_ms") == LOWER
    assert figure_direction("serving.batch_elapsed_s") == LOWER
    assert figure_direction("tail_cost.total_ms") == LOWER
    assert figure_direction("tail_cost.share_of_decode_wall") == LOWER
    assert figure_direction("late_starts.count") == LOWER
    assert figure_direction("pipeline.violations") == LOWER
    assert figure_direction("serving.throughput_tok_s") == HIGHER
    assert figure_direction("serving.tokens_returned") == HIGHER
    assert figure_direction("pipeline.achieved_depth.3") == HIGHER
    assert figure_direction("pipeline.overlap_share") == HIGHER
    assert figure_direction("validation.decode_steps") == ""
    assert figure_direction("serving.tokens_expected") == ""
    assert figure_direction("pipeline.pairs_checked") == ""


def test_single_runs_list_every_change_with_better_or_worse_and_fold_the_rest():
    result = diff_summaries(_summary(0.3, 12.0), _summary(0.45, 24.0, tokens=600))
    figures = _by_name(result)
    assert figures["runner_start_skew_ms.p95"].change == pytest.approx(0.15)
    assert figures["runner_start_skew_ms.p95"].relative == pytest.approx(0.5)
    assert figures["runner_start_skew_ms.p95"].assessment == "worse"
    assert figures["pipeline.cadence_p50_ms"].relative == pytest.approx(1.0)
    assert figures["serving.tokens_returned"].change == -40
    assert figures["serving.tokens_returned"].counted
    assert figures["serving.tokens_returned"].assessment == "worse"
    assert figures["runner_start_skew_ms.p50"].change == 0
    assert all(f.beyond_noise is None for f in result.figures)
    assert result.flagged == [] and not result.has_noise_estimate
    text = format_diff(result)
    rows = _rows(text)
    assert rows["runner_start_skew_ms.p95"] == ["0.300", "0.450", "+0.150", "+50.0%", "1/1", "worse"]
    assert rows["serving.tokens_returned"] == ["640", "600", "-40", "-6.2%", "1/1", "worse"]
    assert "runner_start_skew_ms.p50" not in rows  # unchanged: folded
    assert text.splitlines()[-1] == (
        "one run per side: changes are shown without a noise estimate (give A1,A2,A3 to get one); folded: 8 unchanged (--all lists them)"
    )
    everything = _rows(format_diff(result, show_all=True))
    assert everything["runner_start_skew_ms.p50"] == ["0.100", "0.100", "+0.000", "+0.0%", "1/1", "unchanged"]
    assert len(everything) == 1 + len(result.figures)  # the header and every figure


def test_the_diff_starts_with_verdict_changes():
    a = _summary(0.3, 12.0)
    b = _summary(0.3, 24.0, serialized=True)
    b["validation"]["valid"] = False
    b["tail_steps"]["straggler"].update(verdict="none", mechanism=None)
    b["exit_status"] = 1
    text = format_diff(diff_summaries(a, b))
    lines = text.splitlines()
    start = lines.index("verdicts that changed (A -> B):")
    assert start < lines.index("figures that changed (one run per side: no noise estimate):")
    assert lines[start + 1 : start + 6] == [
        "  exit_status: 0 -> 1  [worse]",
        "  validation.valid: true -> false  [worse]",
        "  pipeline.serialized: false -> true  [worse]",
        "  tail_steps.straggler.verdict: rank 1 (npu:1) -> none",  # B failed (exit 1): nothing of it is better
        "  tail_steps.straggler.mechanism: device -> null",
    ]
    assert "verdicts: none changed" in format_diff(diff_summaries(a, copy.deepcopy(a)))


def test_single_runs_lead_with_the_headline_and_fold_per_step_changes_within_their_noise_floor():
    a, b = _summary(0.3, 12.0), _summary(3.3, 12.5)
    for summary, floor, status in ((a, 4.0, "healthy"), (b, 5.0, "degraded")):
        summary["noise"] = {"floor_ms": floor}
        summary["verdict"] = {"status": status}
        summary["what_if"] = {"share_of_decode_wall": 0.01 if status == "healthy" else 0.2, "decode_wall_ms": 900.0}
    b["what_if"]["decode_wall_ms"] = 990.0
    result = diff_summaries(a, b)
    figures = _by_name(result)
    # a per-step time figure that moved by less than the larger floor (5 ms) is within noise, one that moved more is not
    assert figures["runner_start_skew_ms.p95"].state == "within noise" and figures["pipeline.cadence_p50_ms"].state == "within noise"
    assert figures["what_if.decode_wall_ms"].state == "changed"  # a whole-run total: no single-run noise estimate
    text = format_diff(result)
    lines = text.splitlines()
    assert (
        lines.index("verdicts that changed (A -> B):")
        < lines.index("headline figures:")
        < lines.index("figures that changed (one run per side: no noise estimate):")
    )
    assert "  verdict.status: healthy -> degraded  [worse]" in lines
    headline = lines[lines.index("headline figures:") + 2 : lines.index("headline figures:") + 5]
    shown = ["what_if.share_of_decode_wall", "tail_steps.straggler.share", "pipeline.cadence_p50_ms"]  # HEADLINE's order
    assert [re.split(r"\s{2,}", row.strip())[0] for row in headline] == shown
    assert _rows(text)["what_if.share_of_decode_wall"][-1] == "changed, worse"
    assert _rows(text)["pipeline.cadence_p50_ms"][-1] == "within noise"
    assert "runner_start_skew_ms.p95" not in _rows(text)
    assert lines[-1].endswith("folded: 2 within the runs' noise floor, 9 unchanged (--all lists them)")  # the skew and the floor itself


def test_repeated_runs_list_only_changes_beyond_the_noise_band():
    a_runs = [_summary(p95, cadence) for p95, cadence in [(0.30, 12.0), (0.32, 12.5), (0.34, 11.5)]]
    # p95 moves inside A's spread; cadence doubles (the serialization regression).
    b_runs = [_summary(p95, cadence, serialized=True) for p95, cadence in [(0.33, 24.0), (0.32, 25.0)]]
    result = diff_summaries(a_runs, b_runs)
    figures = _by_name(result)
    cadence = figures["pipeline.cadence_p50_ms"]
    assert cadence.a_mean == pytest.approx(12.0) and cadence.b_mean == pytest.approx(24.5)
    assert cadence.a_stdev == pytest.approx(statistics.stdev([12.0, 12.5, 11.5]))
    assert (cadence.a_runs, cadence.b_runs) == (3, 2)
    assert cadence.beyond_noise is True and cadence.assessment == "worse"
    skew = figures["runner_start_skew_ms.p95"]
    assert skew.change == pytest.approx(0.325 - 0.32)
    assert skew.beyond_noise is False
    assert [f.figure for f in result.flagged] == ["pipeline.cadence_p50_ms"]
    assert [(label.figure, label.a_values, label.b_values, label.assessment) for label in result.labels] == [
        ("pipeline.serialized", [False, False, False], [True, True], "worse")
    ]
    assert [r.figure for r in result.regressions] == ["pipeline.serialized", "pipeline.cadence_p50_ms"]
    text = format_diff(result)
    rows = _rows(text)
    assert rows["pipeline.cadence_p50_ms"] == ["12.000 ± 0.500", "24.500 ± 0.707", "+12.500", "+104.2%", "3/2", "beyond noise, worse"]
    assert "runner_start_skew_ms.p95" not in rows  # within noise: folded
    assert "  pipeline.serialized: false -> true  [worse]" in text
    assert text.splitlines()[-1] == (
        "1 figure(s) beyond run-to-run noise, 1 of them worse (band: mean ± 2·stdev, widened to "
        "min..max); folded: 1 within noise, 9 unchanged (--all lists them)"
    )


def test_band_widens_to_min_max_and_single_side_repeats():
    # A has repeats with spread 2.0 around 10; a single B at 13.9 is inside mean + 2·stdev.
    a_runs = [_summary(0.3, c) for c in (8.0, 10.0, 12.0)]
    inside = _by_name(diff_summaries(a_runs, _summary(0.3, 13.9)))["pipeline.cadence_p50_ms"]
    assert inside.beyond_noise is False
    outside = _by_name(diff_summaries(a_runs, _summary(0.3, 14.1)))["pipeline.cadence_p50_ms"]
    assert outside.beyond_noise is True


def test_a_tiny_baseline_shows_the_absolute_change_not_a_huge_percentage():
    a, b = _summary(0.001, 12.0), _summary(19.153, 12.0)
    a["figures"]["runner_start_skew_ms"]["p99"] = 0.2
    b["figures"]["runner_start_skew_ms"]["p99"] = 20.2  # +10000%: beyond ±1000% the ratio says nothing more
    figures = _by_name(diff_summaries(a, b))
    assert figures["runner_start_skew_ms.p95"].relative is None
    assert figures["runner_start_skew_ms.p99"].relative is None
    text = format_diff(diff_summaries(a, b))
    assert _rows(text)["runner_start_skew_ms.p95"] == ["0.001", "19.153", "+19.152", "-", "1/1", "worse"]
    assert "%" not in "".join(_rows(text)["runner_start_skew_ms.p99"])
    c = _summary(0.05, 12.0)  # 0.05 ms is no longer tiny: 0.05 -> 0.5 is +900%
    assert _by_name(diff_summaries(c, _summary(0.5, 12.0)))["runner_start_skew_ms.p95"].relative == pytest.approx(9.0)


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


def test_an_older_summary_without_a_verdict_compares_it_as_null():
    older = _summary(0.3, 12.0)
    del older["tail_steps"]["straggler"]["mechanism"]
    (label,) = diff_summaries(older, _summary(0.3, 12.0)).labels
    assert (label.figure, label.a_values, label.b_values) == ("tail_steps.straggler.mechanism", [None], ["device"])


def test_terminal_output_never_carries_escape_sequences_from_summaries():
    a, b = _summary(0.3, 12.0), _summary(0.3, 12.0)
    for summary, count in ((a, 1), (b, 3)):
        summary["tail_steps"]["devices"] = {"npu:1\x1b]52;c;cHduZWQ=\x07\x1b[2J": count}
    b["tail_steps"]["straggler"]["verdict"] = "rank 1 (\x1b[31mnpu:1\u202e)"
    b["workload"]["metadata"] = "\x1b]0;title\x07"
    text = format_diff(diff_summaries(a, b), show_all=True)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "tail_steps.devices.npu:1\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J" in text
    assert "rank 1 (\\x1b[31mnpu:1\\u202e)" in text


def test_numbers_beyond_the_float_range_do_not_crash():
    a = _summary(0.3, 12.0)
    b = _summary(0.3, 12.0)
    b["serving"]["tokens_returned"] = 10**400  # a dict from Python: the figure cannot be compared, it is left out
    b["pipeline"]["cadence_p50_ms"] = 1.7e308
    result = diff_summaries([a, copy.deepcopy(a)], [b, copy.deepcopy(b)])
    figures = _by_name(result)
    assert figures["serving.tokens_returned"].state == "only in A"
    assert figures["pipeline.cadence_p50_ms"].b_mean == pytest.approx(1.7e308)
    assert "+1.7e+308" in format_diff(result)


def test_cli_diff_of_artifact_dirs_and_comma_separated_repeats(tmp_path):
    paths = {}
    for name, summary in {
        "a1": _summary(0.30, 12.0),
        "a2": _summary(0.34, 12.4),
        "b1": _summary(0.31, 30.0),
        "b2": _summary(0.33, 31.0),
    }.items():
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "summary.json").write_text(json.dumps(summary))
        paths[name] = str(run_dir)
    runner = CliRunner()
    result = runner.invoke(cli, ["diff", f"{paths['a1']},{paths['a2']}", f"{paths['b1']},{paths['b2']}"])
    assert result.exit_code == 0, result.output
    rows = _rows(result.output)
    assert rows["pipeline.cadence_p50_ms"][2:] == ["+18.300", "+150.0%", "2/2", "beyond noise, worse"]  # a headline figure
    assert "runner_start_skew_ms.p50" not in rows  # unchanged, folded
    missing = runner.invoke(cli, ["diff", paths["a1"], str(tmp_path / "nope")])
    assert missing.exit_code == 2
    assert missing.output.startswith("dsprof: error: ") and "nope" in missing.output


def test_fail_on_regression(tmp_path):
    def write(name: str, summary: dict) -> str:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(summary))
        return str(path)

    base = ",".join(write(f"a{i}", _summary(0.30 + i / 100, 12.0 + i / 10)) for i in range(3))
    slower = ",".join(write(f"b{i}", _summary(0.30 + i / 100, 24.0 + i / 10)) for i in range(2))
    faster = ",".join(write(f"c{i}", _summary(0.30 + i / 100, 6.0 + i / 10)) for i in range(2))
    runner = CliRunner()
    worse = runner.invoke(cli, ["diff", base, slower, "--fail-on-regression"])
    assert worse.exit_code == 1, worse.output
    assert worse.output.splitlines()[-1] == "regression: 1 verdict(s) or figure(s) worse beyond noise"
    better = runner.invoke(cli, ["diff", base, faster, "--fail-on-regression"])
    assert better.exit_code == 0, better.output
    assert _rows(better.output)["pipeline.cadence_p50_ms"][-1] == "beyond noise, better"
    serialized = write("s", _summary(0.30, 12.0, serialized=True))
    verdict_only = runner.invoke(cli, ["diff", base, serialized, "--fail-on-regression"])
    assert verdict_only.exit_code == 1  # pipeline.serialized false -> true, noise band from A's three runs
    single = runner.invoke(cli, ["diff", write("x", _summary(0.3, 12.0)), write("y", _summary(0.3, 24.0)), "--fail-on-regression"])
    assert single.exit_code == 2 and single.output.count("\n") == 1
    assert "needs repeated runs on at least one side" in single.output


def test_cli_diff_of_a_summary_holding_a_huge_integer_is_one_line(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_summary(0.3, 12.0)))
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps(_summary(0.3, 12.0)).replace('"tokens_returned": 640', '"tokens_returned": 1' + "0" * 400))
    result = CliRunner().invoke(cli, ["diff", str(good), str(huge)])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "Traceback" not in result.output
    assert result.output.startswith(f"dsprof: error: {huge}: an integer of 401 digits is beyond the range of a figure")


def test_help_shows_every_default_and_points_at_the_projects_docs():
    text = " ".join(CliRunner().invoke(cli, ["diff", "--help"]).output.split())
    assert "docs/GATE_RULES.md" in text and "../shared" not in text
    for default in ("[default: no-per-rank]", "[default: folded]", "[default: no-fail-on-regression]"):
        assert default in text


def test_diff_does_not_mutate_inputs():
    a = _summary(0.3, 12.0)
    before = copy.deepcopy(a)
    diff_summaries(a, _summary(0.4, 13.0))
    assert a == before


SUMMARY_KEYS = [
    "figures",
    "pipeline",
    "serialized",
    "validation",
    "valid",
    "tail_steps",
    "straggler",
    "verdict",
    "mechanism",
    "serving",
    "throughput_tok_s",
    "exit_status",
    "workload",
    "p50",
    "count",
    "0",
    "rank",
]
ANY_SUMMARY = any_summary(SUMMARY_KEYS)


@settings(deadline=None)
@given(st.lists(ANY_SUMMARY, min_size=1, max_size=3), st.lists(ANY_SUMMARY, min_size=1, max_size=3), st.booleans())
def test_any_summaries_diff_without_crashing(a_runs, b_runs, show_all):
    result = diff_summaries(a_runs, b_runs, per_rank=True)
    text = format_diff(result, show_all=show_all)
    assert "\x1b" not in text and text.startswith("A: ")
    assert all(isinstance(r, object) for r in result.regressions)
