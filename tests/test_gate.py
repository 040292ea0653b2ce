"""The rule gate on hand-built summaries: every rule kind passing and failing, rules errors, outputs for people and CI."""

from __future__ import annotations

import copy
import json
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from hostile_summaries import any_summary
from hypothesis import given, settings

from dsprof.analysis.outputs.gate_outputs import (
    _github_data,
    _github_property,
    format_step_summary,
    format_verdict,
    github_annotations,
    write_junit,
)
from dsprof.analysis.policy.gate_rules import MAX_NESTING, load_rules
from dsprof.analysis.summary import UnknownFigure, figure_unit, resolve, summary_with_path
from dsprof.cli.main import cli
from dsprof.commands.gate import gate, gate_command
from dsprof.errors import InputError

REPO = Path(__file__).resolve().parents[1]
NOT_ON_GITHUB = {"GITHUB_ACTIONS": None, "GITHUB_STEP_SUMMARY": None}


def _block(p50, p95, p99, maximum, count=10):
    return {"p50": p50, "p95": p95, "p99": p99, "max": maximum, "count": count}


# Every block of docs/SUMMARY_SCHEMA.md, with the keys the lead is adding (mechanism, tail_cost).
HEALTHY = {
    "schema": "dsprof.summary/1",
    "dsprof_version": "0.1.0",
    "verdict": {"status": "healthy", "headline": "healthy within noise (noise floor 0.400 ms)", "noise_floor_ms": 0.4, "findings": 0},
    "inputs": {"files": ["server.log"], "records_read": 500, "spans": 400, "dropped": {}},
    "workload": {"preset": "demo", "ranks": 4, "depth": 2},
    "exit_status": 0,
    "validation": {
        "valid": True,
        "decode_steps": 10,
        "rank_roots": 40,
        "ranks": 4,
        "problems": [],
        "steps_per_rank": {"0": 10, "1": 10, "2": 10, "3": 10},
        "dropped": {},
    },
    "figures": {
        "runner_start_skew_ms": _block(0.1, 0.3, 0.45, 0.5),
        "runner_end_skew_ms": _block(0.2, 0.8, 1.0, 1.2),
        "runner_to_validate_gap_ms": _block(0.01, 0.02, 0.03, 0.04, count=40),
        "validate_ms": _block(0.3, 0.5, 0.6, 0.7, count=40),
        "bind_ms": _block(1.0, 1.2, 1.4, 1.5, count=40),
        "runner_run_ms": _block(18.0, 19.0, 19.5, 20.0, count=40),
        "root_ms": _block(20.0, 22.0, 23.0, 25.0, count=40),
        "per_rank": {"0": {"root_ms": _block(20.0, 21.0, 22.0, 23.0), "device": "npu:0"}},
    },
    "per_step": [{"step": 0, "ranks": 4, "runner_start_skew_ms": 0.1, "runner_end_skew_ms": 0.2}],
    "late_starts": {"threshold_ms": 5.0, "count": 0, "items": []},
    "tail_steps": {
        "threshold_ms": 5.0,
        "count": 0,
        "items": [],
        "same_device": None,
        "devices": {},
        "straggler": {"verdict": "none", "rank": None, "device": None, "share": 0.0, "p_value": None, "mechanism": None},
    },
    "tail_cost": {"total_ms": 0.0, "share_of_decode_wall": 0.0},
    "what_if": {
        "decode_wall_ms": 250.0,
        "replayed_wall_ms": 250.0,
        "total_saved_ms": 0.0,
        "share_of_decode_wall": 0.0,
        "by_mechanism": {},
        "by_rank": {},
        "items": [],
    },
    "pipeline": {
        "pairs_checked": 36,
        "pairs_overlapped": 36,
        "overlap_share": 1.0,
        "violations": 0,
        "claim_order_violations": 0,
        "serialized": False,
        "first_violations": [],
        "cadence_p50_ms": 12.0,
        "cadence_ms": {"0": _block(12.0, 12.5, 13.0, 13.5, count=9)},
        "achieved_depth": {"0": 1.8, "1": 1.7, "2": 1.75, "3": 1.6},
        "diagnosis": "pipelined: bind(N+1) overlaps runner_run(N) on every rank",
    },
    "serving": {
        "source": "performance_summary",
        "tokens_returned": 640,
        "tokens_expected": 640,
        "batch_elapsed_s": 1.6,
        "throughput_tok_s": 400.0,
        "effective_tpot_ms": 80.0,
        "acceptance_rate": 0.79,
        "requests": 16,
    },
}


def _serialized() -> dict:
    """HEALTHY with the device-resident regression: no pair overlaps, bind waits for the previous runner_run."""
    summary = copy.deepcopy(HEALTHY)
    summary["pipeline"].update(
        serialized=True,
        pairs_overlapped=0,
        overlap_share=0.0,
        violations=36,
        cadence_p50_ms=19.2,
        achieved_depth={"0": 1.65, "1": 1.65, "2": 1.64, "3": 1.66},
    )
    summary["verdict"].update(status="degraded", headline="the depth-2 pipeline is serialized: bind(N+1) waits for runner_run(N)")
    return summary


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _summary_file(tmp_path: Path, summary: dict, name: str = "summary.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(summary))
    return path


def _statuses(verdict):
    return {r.path: r.status for r in verdict.results}


def _details(verdict):
    return {r.path: r.detail for r in verdict.results}


# --------------------------------------------------------------------------- rules on values


def test_absolute_rules_pass_and_fail_with_details_for_people(tmp_path):
    rules = _write(
        tmp_path,
        "rules.toml",
        """
[[rule]]
name = "ranks start together"
check = "runner_start_skew_ms.p95 <= 0.5"
[[rule]]
check = "runner_end_skew_ms.max < 1.0"
[[rule]]
check = "figures.root_ms.p50 >= 20"
[[rule]]
check = "late_starts.count == 0"
[[rule]]
check = "tail_steps.straggler.verdict == 'none'"
[[rule]]
check = "serving.throughput_tok_s > 500"
[[rule]]
check = "serving.batch_elapsed_s < 2"
""",
    )
    verdict = gate(HEALTHY, rules)
    assert _statuses(verdict) == {
        "figures.runner_start_skew_ms.p95": "pass",  # 0.3 <= 0.5
        "figures.runner_end_skew_ms.max": "fail",  # 1.2 < 1.0 is false
        "figures.root_ms.p50": "pass",  # 20.0 >= 20 (boundary)
        "late_starts.count": "pass",
        "tail_steps.straggler.verdict": "pass",
        "serving.throughput_tok_s": "fail",
        "serving.batch_elapsed_s": "pass",
    }
    assert _details(verdict) == {
        "figures.runner_start_skew_ms.p95": "value 0.3 ms <= limit 0.5 ms",
        "figures.runner_end_skew_ms.max": "value 1.2 ms >= limit 1 ms",  # what holds instead of '<'
        "figures.root_ms.p50": "value 20 ms >= limit 20 ms",
        "late_starts.count": "value 0 == limit 0",
        "tail_steps.straggler.verdict": "value none == none",
        "serving.throughput_tok_s": "value 400 tok/s <= limit 500 tok/s",
        "serving.batch_elapsed_s": "value 1.6 s < limit 2 s",
    }
    assert not verdict.passed and verdict.exit_code == 1
    failed = next(r for r in verdict.results if r.status == "fail")
    assert failed.value == 1.2 and failed.limit == 1.0
    assert verdict.results[0].name == "ranks start together"
    assert verdict.results[1].name == "runner_end_skew_ms.max < 1.0"  # no name: the check text


def test_boolean_rules_and_path_on_right_side(tmp_path):
    rules = _write(
        tmp_path,
        "rules.toml",
        """
[[rule]]
check = "validation.valid == true"
[[rule]]
check = "pipeline.serialized == false"
[[rule]]
check = "serving.tokens_returned == serving.tokens_expected"
[[rule]]
name = "cadence below 0.9 x root"
check = "pipeline.cadence_p50_ms < 0.9 * root_ms.p50"
[[rule]]
check = "tail_steps.same_device == null"
""",
    )
    assert gate(HEALTHY, rules).passed
    broken = copy.deepcopy(HEALTHY)
    broken["validation"]["valid"] = False
    broken["pipeline"]["serialized"] = True
    broken["serving"]["tokens_returned"] = 600
    broken["pipeline"]["cadence_p50_ms"] = 19.0  # 0.9 * 20.0 = 18.0
    broken["tail_steps"]["same_device"] = True
    verdict = gate(broken, rules)
    assert [r.status for r in verdict.results] == ["fail"] * 5
    assert [r.detail for r in verdict.results] == [
        "value false, expected == true",
        "value true, expected == false",
        "value 600 != limit 640 (serving.tokens_expected)",
        "value 19 ms >= limit 18 ms (0.9 * root_ms.p50)",
        "value true, expected == null",
    ]
    assert verdict.results[3].name == "cadence below 0.9 x root"
    assert verdict.results[3].limit == pytest.approx(18.0)
    assert verdict.results[2].limit == 640


def test_sums_of_figures_and_negative_numbers(tmp_path):
    rules = _write(
        tmp_path,
        "rules.toml",
        """
[[rule]]
check = "pipeline.cadence_p50_ms < runner_run_ms.p50 + 0.5 * bind_ms.p50"
[[rule]]
check = "root_ms.p50 >= runner_run_ms.p50 + bind_ms.p50 * 1 - 0.5"
[[rule]]
check = "runner_start_skew_ms.p50 > -0.001"
[[rule]]
check = "runner_start_skew_ms.p50 <= -root_ms.p50 + 20.5"
""",
    )
    summary = copy.deepcopy(HEALTHY)
    summary["figures"]["bind_ms"] = _block(3.0, 4.0, 4.5, 5.0)
    verdict = gate(summary, rules)
    # limits: 18 + 1.5 = 19.5; 18 + 3 - 0.5 = 20.5; -0.001; -20 + 20.5 = 0.5
    assert [r.limit for r in verdict.results] == pytest.approx([19.5, 20.5, -0.001, 0.5])
    assert [r.status for r in verdict.results] == ["pass", "fail", "pass", "pass"]
    assert verdict.results[0].detail == "value 12 ms < limit 19.5 ms (runner_run_ms.p50 + 0.5 * bind_ms.p50)"
    assert verdict.results[2].detail == "value 0.1 ms > limit -0.001 ms"
    summary["pipeline"]["cadence_p50_ms"] = 19.5  # on the limit: < fails
    assert gate(summary, rules).results[0].status == "fail"
    summary["figures"]["bind_ms"]["p50"] = None  # not measured in this run: the rule cannot hold
    missing = gate(summary, rules).results[0]
    assert missing.status == "missing" and missing.detail == "no limit: figures.bind_ms.p50 is null in this run"


def test_numbers_are_shown_at_the_figures_precision_not_as_float_noise(tmp_path):
    rules = _write(
        tmp_path,
        "rules.toml",
        """
[[rule]]
check = "root_ms.p50 <= runner_run_ms.p50 + 0.5 * bind_ms.p50"
[[rule]]
check = "bind_ms.p50 < runner_run_ms.p50 + 0.5 * bind_ms.p50"
""",
    )
    summary = copy.deepcopy(HEALTHY)
    summary["figures"]["root_ms"]["p50"] = 58.5
    summary["figures"]["runner_run_ms"]["p50"] = 39.0
    summary["figures"]["bind_ms"]["p50"] = 1.234  # limit 39.0 + 0.617 = 39.617000000000004 in floats
    verdict = gate(summary, rules)
    assert verdict.results[0].detail == "value 58.5 ms > limit 39.6 ms (runner_run_ms.p50 + 0.5 * bind_ms.p50)"
    assert "39.617000000000004" not in format_verdict(verdict)
    # rounding to one decimal would show 39.6 on both sides of a '<' that holds: one more decimal is shown
    summary["figures"]["root_ms"]["p50"] = 39.6
    assert gate(summary, rules).results[0].detail.startswith("value 39.6 ms <= limit 39.62 ms")
    assert verdict.results[1].detail.startswith("value 1.234 ms < limit 39.617 ms")


def test_figure_units_come_from_the_name():
    assert figure_unit("figures.runner_start_skew_ms.p95") == "ms"
    assert figure_unit("pipeline.cadence_ms.3.p50") == "ms"
    assert figure_unit("serving.batch_elapsed_s") == "s"
    assert figure_unit("serving.throughput_tok_s") == "tok/s"
    assert figure_unit("tail_cost.total_ms") == "ms"
    assert figure_unit("serving.tokens_returned") == ""
    assert figure_unit("tail_cost.share_of_decode_wall") == ""
    assert figure_unit("validation.steps_per_rank.0") == ""


def test_wildcard_checks_every_rank_and_names_each(tmp_path):
    rules = _write(tmp_path, "rules.toml", '[[rule]]\nname = "depth"\ncheck = "pipeline.achieved_depth.* >= 1.65"\n')
    verdict = gate(HEALTHY, rules)
    assert _statuses(verdict) == {
        "pipeline.achieved_depth.0": "pass",
        "pipeline.achieved_depth.1": "pass",
        "pipeline.achieved_depth.2": "pass",
        "pipeline.achieved_depth.3": "fail",  # 1.6
    }
    assert [r.title for r in verdict.results][3] == "depth [pipeline.achieved_depth.3]"


# --------------------------------------------------------------------------- not produced vs not a figure


def test_a_figure_this_run_did_not_produce_fails_with_the_reason(tmp_path):
    rules = _write(
        tmp_path,
        "rules.toml",
        """
[[rule]]
check = "runner_start_skew_ms.p95 <= 0.5"
[[rule]]
check = "serving.throughput_tok_s >= 300"
[[rule]]
check = "pipeline.achieved_depth.7 >= 1.2"
[[rule]]
check = "workload.depth == 2"
[[rule]]
check = "late_starts.items.0.excess_ms < 20"
[[rule]]
check = "figures.per_rank.5.root_ms.p99 < 30"
""",
    )
    partial = copy.deepcopy(HEALTHY)
    partial["figures"]["runner_start_skew_ms"] = {"p50": None, "p95": None, "p99": None, "max": None, "count": 0}
    partial["serving"] = {key: None for key in partial["serving"]}  # a run without SA_PROFILE or performance_summary
    partial["workload"] = None
    verdict = gate(partial, rules)
    assert [r.status for r in verdict.results] == ["missing"] * 6
    assert _details(verdict) == {
        "figures.runner_start_skew_ms.p95": "no value: figures.runner_start_skew_ms.p95 is null in this run (not measured)",
        "serving.throughput_tok_s": "no value: serving.throughput_tok_s is null in this run (not measured)",
        "pipeline.achieved_depth.7": "no value: pipeline.achieved_depth has no 7 in this run",
        "workload.depth": "no value: workload is null in this run",
        "late_starts.items.0.excess_ms": "no value: late_starts.items has 0 item(s) in this run",
        "figures.per_rank.5.root_ms.p99": "no value: figures.per_rank has no 5 in this run",
    }
    assert verdict.exit_code == 1
    assert verdict.counts == {"pass": 0, "fail": 0, "missing": 6, "skipped": 0}


def test_wildcards_over_empty_blocks(tmp_path):
    rules = _write(
        tmp_path,
        "rules.toml",
        """
[[rule]]
check = "late_starts.items.*.excess_ms < 20"
[[rule]]
check = "pipeline.achieved_depth.* >= 1.2"
""",
    )
    summary = copy.deepcopy(HEALTHY)
    summary["pipeline"]["achieved_depth"] = {}
    verdict = gate(summary, rules)
    # no late starts: nothing to check, the rule holds; no rank with a depth: the run produced nothing to hold it
    assert [(r.status, r.detail) for r in verdict.results] == [
        ("pass", "no items to check"),
        ("missing", "no value: pipeline.achieved_depth is empty in this run"),
    ]
    summary["late_starts"]["items"] = [{"step": 3, "rank": 1, "excess_ms": 12.5}, {"step": 7, "rank": 2, "excess_ms": 25.0}]
    assert _statuses(gate(summary, rules)) == {
        "late_starts.items.0.excess_ms": "pass",
        "late_starts.items.1.excess_ms": "fail",
        "pipeline.achieved_depth.*": "missing",
    }


@pytest.mark.parametrize(
    "check, fragments",
    [
        (
            "runner_start_skew_ms.p96 <= 0.5",
            ["runner_start_skew_ms.p96 is not a figure of this summary", "did you mean ", " runner_start_skew_ms.p95 "],
        ),
        ("pipline.serialized == false", ["pipline.serialized is not a figure", "(it has no pipline)", "did you mean pipeline.serialized"]),
        ("pipeline.cadence_p50_ms < runner_run_ms.p50 + 0.5 * bnid_ms.p50", ["bnid_ms.p50 is not a figure", "did you mean bind_ms.p50"]),
        ("pipeline.achieved_depht.* >= 1.2", ["did you mean pipeline.achieved_depth.*"]),
        ("exit_status.code == 0", ["exit_status.code is not a figure"]),
        ("tail_steps.straggler.verdikt == 'none'", ["did you mean tail_steps.straggler.verdict"]),
        ("per_stpe.*.runner_start_skew_ms <= 1", ["did you mean per_step.*.runner_start_skew_ms?"]),
        ("per_step.*.runner_start_skew <= 1", ["per_step.*.runner_start_skew is not a figure", "(it has no per_step.0.runner_start_skew)"]),
    ],
)
def test_a_path_the_summary_does_not_have_is_a_rules_error_with_suggestions(tmp_path, check, fragments):
    rules = _write(tmp_path, "rules.toml", f'[[rule]]\nname = "typo"\ncheck = "{check}"\n')
    with pytest.raises(InputError) as excinfo:
        gate(HEALTHY, rules)
    message = str(excinfo.value)
    assert message.startswith(f"{rules}: [[rule]] #1 'typo': ")
    for fragment in fragments:
        assert fragment in message


def test_relative_rule_on_an_unknown_figure_is_a_rules_error_even_without_baseline(tmp_path):
    rules = _write(tmp_path, "rules.toml", '[[relative]]\nfigure = "serving.throughput_toks"\nmax_decrease = "10%"\n')
    with pytest.raises(InputError, match="did you mean serving.throughput_tok_s"):
        gate(HEALTHY, rules)


# --------------------------------------------------------------------------- relative rules


def test_relative_rules_against_baseline(tmp_path):
    rules = _write(
        tmp_path,
        "rules.toml",
        """
[[relative]]
figure = "runner_end_skew_ms.p99"
max_increase = "20%"
[[relative]]
figure = "serving.throughput_tok_s"
max_decrease = "10%"
[[relative]]
figure = "runner_start_skew_ms.p95"
max_increase = 0.1
slack = 0.05
""",
    )
    baseline = _summary_file(tmp_path, HEALTHY, "baseline.json")
    current = copy.deepcopy(HEALTHY)
    current["figures"]["runner_end_skew_ms"]["p99"] = 1.19  # limit 1.0 * 1.2 = 1.2 → pass
    current["serving"]["throughput_tok_s"] = 359.0  # limit 400 * 0.9 = 360 → fail
    current["figures"]["runner_start_skew_ms"]["p95"] = 0.46  # limit 0.3 + 0.1 + 0.05 = 0.45 → fail
    verdict = gate(current, rules, baseline=baseline)
    assert [r.status for r in verdict.results] == ["pass", "fail", "fail"]
    assert [r.limit for r in verdict.results] == pytest.approx([1.2, 360.0, 0.45])
    assert verdict.results[0].baseline == 1.0
    assert [r.detail for r in verdict.results] == [
        'value 1.19 ms <= limit 1.2 ms (baseline 1 ms, +19.0%; max_increase = "20%")',
        'value 359 tok/s < limit 360 tok/s (baseline 400 tok/s, -10.2%; max_decrease = "10%")',
        "value 0.46 ms > limit 0.45 ms (baseline 0.3 ms, +53.3%; max_increase = 0.1, slack = 0.05)",
    ]
    current["figures"]["runner_end_skew_ms"]["p99"] = 1.21
    current["serving"]["throughput_tok_s"] = 361.0
    current["figures"]["runner_start_skew_ms"]["p95"] = 0.44
    assert [r.status for r in gate(current, rules, baseline=baseline).results] == ["fail", "pass", "pass"]


def test_relative_rules_skip_without_baseline_and_fail_on_a_baseline_without_the_figure(tmp_path):
    rules = _write(
        tmp_path,
        "rules.toml",
        """
[[rule]]
check = "validation.valid == true"
[[relative]]
figure = "tail_cost.total_ms"
max_increase = "20%"
slack = 1.0
""",
    )
    verdict = gate(HEALTHY, rules)
    assert [r.status for r in verdict.results] == ["pass", "skipped"]
    assert verdict.passed
    older = copy.deepcopy(HEALTHY)
    del older["tail_cost"]  # a baseline written before the figure existed
    result = gate(HEALTHY, rules, baseline=older).results[1]
    assert (result.status, result.detail) == ("missing", "no baseline: the baseline has no tail_cost.total_ms")
    older["tail_cost"] = {"total_ms": None, "share_of_decode_wall": None}
    result = gate(HEALTHY, rules, baseline=older).results[1]
    assert (result.status, result.detail) == ("missing", "no baseline: tail_cost.total_ms is null in the baseline")


# --------------------------------------------------------------------------- errors in the rules


@pytest.mark.parametrize(
    "rules_text, message",
    [
        ('[[rule]]\ncheck = "runner_start_skew_ms.p95 0.5"\n', "exactly one comparison operator"),
        ('[[rule]]\ncheck = "runner_start_skew_ms.p95 <= 0.5 <= 1"\n', "exactly one comparison operator"),
        ("[[rule]]\ncheck = \"runner_start_skew_ms.p95 <= __import__('os')\"\n", "cannot read"),
        ('[[rule]]\ncheck = "0.5 >= runner_start_skew_ms.p95"\n', "left side"),
        ('[[rule]]\ncheck = "runner_start_skew_ms <= 0.5"\n', "is a block, not a value"),
        ('[[rule]]\ncheck = "validation.valid <= 1"\n', "compares validation.valid"),
        ('[[rule]]\ncheck = "pipeline.serialized > false"\n', "needs numbers"),
        ('[[rule]]\ncheck = "root_ms.p50 > null"\n', "needs numbers"),
        ('[[rule]]\nchek = "validation.valid == true"\n', "unknown key"),
        ('[[rule]]\ncheck = "root_ms.p50 <= bind_ms.p50 +"\n', "as a term"),
        ('[[rule]]\ncheck = "root_ms.p50 <= bind_ms.p50 * root_ms.p50"\n', "as a term"),
        ('[[rule]]\ncheck = "root_ms.p50 <= 2 * pipeline.achieved_depth.*"\n', "only allowed on the left"),
        ('[[rule]]\ncheck = "root_ms.p50 <= 1 + validation.valid"\n', "not a number"),
        ('[[rule]]\nname = 3\ncheck = "root_ms.p50 <= 1"\n', "name must be a non-empty string"),
        ('[[relative]]\nfigure = "root_ms.p50"\n', "exactly one of max_increase or max_decrease"),
        ('[[relative]]\nfigure = "root_ms.p50"\nmax_increase = "twenty"\n', "not a number or percentage"),
        ("[rules]\n", "unknown top-level key"),
        ("", "no rules"),
        ("[[rule]\n", "not valid TOML"),
        # digits of other scripts are not digits of a rule
        ('[[rule]]\ncheck = "exit_status == \u0665"\n', "cannot read '\u0665'"),  # ARABIC-INDIC DIGIT FIVE
        ('[[rule]]\ncheck = "root_ms.p50 <= \uff15"\n', "cannot read '\uff15'"),  # FULLWIDTH DIGIT FIVE
        ('[[rule]]\ncheck = "root_ms.p50 <= 1\u0660"\n', "cannot read '\u0660'"),  # 1 then ARABIC-INDIC ZERO: not 10
        ('[[rule]]\ncheck = "root_ms.p50 <= 2 * bind_ms.p\u0665\u0660"\n', "cannot read"),
        ('[[relative]]\nfigure = "root_ms.p50"\nmax_increase = "\u0665%"\n', "not a number or percentage"),
        ('[[relative]]\nfigure = "late_starts.items.\u0665.excess_ms"\nmax_increase = "5%"\n', "dotted figure path"),
    ],
)
def test_bad_rules_raise_input_error_naming_the_file(tmp_path, rules_text, message):
    rules = _write(tmp_path, "bad.toml", rules_text)
    with pytest.raises(InputError) as excinfo:
        gate(HEALTHY, rules)
    assert message in str(excinfo.value)
    assert str(excinfo.value).startswith(str(rules))


@pytest.mark.parametrize(
    "rules_text",
    [
        '[[rule]]\ncheck = "root_ms.p50 <= nan"\n',
        '[[rule]]\ncheck = "root_ms.p50 <= inf"\n',
        '[[rule]]\ncheck = "root_ms.p50 <= -Infinity"\n',
        '[[rule]]\ncheck = "root_ms.p50 <= 1e999"\n',
        '[[rule]]\ncheck = "root_ms.p50 <= bind_ms.p50 + 1e999"\n',
        '[[rule]]\ncheck = "root_ms.p50 <= 1' + "0" * 400 + '"\n',
        '[[rule]]\ncheck = "root_ms.p50 <= 1' + "0" * 5000 + '"\n',
        '[[relative]]\nfigure = "root_ms.p50"\nmax_increase = nan\n',
        '[[relative]]\nfigure = "root_ms.p50"\nmax_increase = inf\n',
        '[[relative]]\nfigure = "root_ms.p50"\nmax_decrease = 1e400\n',
        '[[relative]]\nfigure = "root_ms.p50"\nmax_increase = "10%"\nslack = nan\n',
        '[[relative]]\nfigure = "root_ms.p50"\nmax_increase = "10%"\nslack = -inf\n',
    ],
)
def test_nan_or_infinite_limits_and_tolerances_are_rules_errors(tmp_path, rules_text):
    rules = _write(tmp_path, "bad.toml", rules_text)
    with pytest.raises(InputError) as excinfo:
        load_rules(rules)
    assert "finite" in str(excinfo.value) and str(excinfo.value).startswith(str(rules))


@pytest.mark.parametrize(
    "value",
    ["[" * 500 + "]" * 500, "{a = " * 500 + "1" + "}" * 500, "[" * 100_000, "[{x = [" * 200 + "]}]" * 200],
    ids=["arrays", "inline-tables", "unclosed", "mixed"],
)
def test_rules_nested_deep_are_one_clear_error_not_a_recursion_error(tmp_path, value):
    rules = _write(tmp_path, "deep.toml", '[[rule]]\ncheck = "exit_status == 0"\n[[rule]]\ncheck = ' + value + "\n")
    with pytest.raises(InputError) as excinfo:
        load_rules(rules)
    assert str(excinfo.value) == f"{rules}:4: nested more than {MAX_NESTING} levels deep (expected a flat rules file)"
    result = CliRunner().invoke(cli, ["gate", str(_summary_file(tmp_path, HEALTHY)), "--rules", str(rules)], env=NOT_ON_GITHUB)
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "nested more than" in result.output
    assert "Traceback" not in result.output and "RecursionError" not in result.output


def test_brackets_in_strings_and_comments_are_not_nesting(tmp_path):
    deep = "[" * 200 + "{" * 200
    rules = _write(
        tmp_path,
        "rules.toml",
        f"# {deep}\n[[rule]]\nname = '{deep}'\ncheck = \"exit_status == 0\"  # {deep}\n"
        f'[[rule]]\nname = """{deep}\n{deep}"""\ncheck = "validation.valid == true"\n'
        f'[[rule]]\nname = "\\"{deep}"\ncheck = \'exit_status != 1\'\n',
    )
    assert [rule.name for rule in load_rules(rules)] == [deep, f"{deep}\n{deep}", f'"{deep}']
    assert gate(HEALTHY, rules).passed


def test_figure_lookup_reads_only_ascii_list_indexes():
    summary = copy.deepcopy(HEALTHY)
    summary["late_starts"]["items"] = [{"step": i, "excess_ms": float(i)} for i in range(6)]
    assert resolve(summary, "late_starts.items.5.excess_ms") == [("late_starts.items.5.excess_ms", 5.0)]
    for index in ("\u0665", "\uff15"):
        with pytest.raises(UnknownFigure):
            resolve(summary, f"late_starts.items.{index}.excess_ms")


# --------------------------------------------------------------------------- summaries that cannot be compared


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('{"schema": "dsprof.summary/1", "exit_status": ' + "1" + "0" * 400 + "}", "integer of 401 digits"),
        ('{"schema": "dsprof.summary/1", "exit_status": ' + "1" + "0" * 5000 + "}", "integer of 5001 digits"),
        ('{"schema": "dsprof.summary/1", "exit_status": 1e400}', "beyond the range"),
        ('{"schema": "dsprof.summary/1", "exit_status": NaN}', "NaN is not JSON"),
        ('{"schema": "dsprof.summary/1", "exit_status": -Infinity}', "-Infinity is not JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_summaries_with_numbers_beyond_comparison_are_one_clear_error(tmp_path, text, fragment):
    path = _write(tmp_path, "summary.json", text)
    with pytest.raises(InputError) as excinfo:
        summary_with_path(path)
    assert fragment in str(excinfo.value) and str(excinfo.value).startswith(str(path))
    rules = _write(tmp_path, "rules.toml", '[[rule]]\ncheck = "exit_status == 0"\n')
    result = CliRunner().invoke(cli, ["gate", str(path), "--rules", str(rules)], env=NOT_ON_GITHUB)
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "Traceback" not in result.output


def test_non_finite_values_in_a_summary_dict_fail_the_rule():
    summary = copy.deepcopy(HEALTHY)
    summary["figures"]["runner_run_ms"]["p50"] = float("nan")
    summary["exit_status"] = 10**400
    verdict = gate(summary, REPO / "examples" / "ci-rules.toml")
    by_path = {r.path: r for r in verdict.results}
    assert (by_path["exit_status"].status, by_path["exit_status"].detail) == ("missing", "no value: exit_status is not a finite number")
    assert (by_path["pipeline.cadence_p50_ms"].status, by_path["pipeline.cadence_p50_ms"].detail) == (
        "missing",
        "no limit: figures.runner_run_ms.p50 is not a finite number in this run",
    )
    json.dumps(verdict.to_json(), allow_nan=False)  # the verdict stays valid JSON


# --------------------------------------------------------------------------- outputs


def test_cli_exit_codes_verdict_and_junit(tmp_path):
    rules = _write(
        tmp_path,
        "rules.toml",
        """
[[rule]]
name = "ranks start together"
check = "runner_start_skew_ms.p95 <= 0.5"
[[rule]]
name = "depth-2 pipeline is not serialized"
check = "pipeline.serialized == false"
[[relative]]
figure = "runner_end_skew_ms.p99"
max_increase = "20%"
""",
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _summary_file(run_dir, HEALTHY)
    runner = CliRunner()

    ok = runner.invoke(cli, ["gate", str(run_dir), "--rules", str(rules)], env=NOT_ON_GITHUB)
    assert ok.exit_code == 0, ok.output
    assert ok.output.splitlines()[0] == "PASS    ranks start together [figures.runner_start_skew_ms.p95]: value 0.3 ms <= limit 0.5 ms"
    assert ok.output.splitlines()[-1] == f"gate PASSED: 2 passed, 0 failed, 0 missing, 1 skipped ({rules})"

    serialized = _serialized()
    serialized["figures"]["runner_end_skew_ms"]["p99"] = 2.0
    bad = _summary_file(tmp_path, serialized, "serialized.json")
    junit, verdict_path = tmp_path / "gate.xml", tmp_path / "verdict.json"
    verdict_path.write_text("previous verdict")
    failed = runner.invoke(
        cli,
        ["gate", str(bad), "--rules", str(rules), "--baseline", str(run_dir), "--junit", str(junit), "--verdict", str(verdict_path)],
        env=NOT_ON_GITHUB,
    )
    assert failed.exit_code == 1, failed.output
    assert failed.output.splitlines()[:3] == [
        "PASS    ranks start together [figures.runner_start_skew_ms.p95]: value 0.3 ms <= limit 0.5 ms",
        "FAIL    depth-2 pipeline is not serialized [pipeline.serialized]: value true, expected == false",
        (
            "FAIL    runner_end_skew_ms.p99 max_increase 20% [figures.runner_end_skew_ms.p99]: "
            'value 2 ms > limit 1.2 ms (baseline 1 ms, +100.0%; max_increase = "20%")'
        ),
    ]
    assert "::error" not in failed.output

    verdict = json.loads(verdict_path.read_text())  # replaced whole (written atomically)
    assert verdict["schema"] == "dsprof.gate_verdict/1"
    assert verdict["passed"] is False
    assert verdict["counts"] == {"pass": 1, "fail": 2, "missing": 0, "skipped": 0}
    assert [(r["name"], r["status"]) for r in verdict["results"]] == [
        ("ranks start together", "pass"),
        ("depth-2 pipeline is not serialized", "fail"),
        ("runner_end_skew_ms.p99 max_increase 20%", "fail"),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gate.xml",
        "rules.toml",
        "run",
        "serialized.json",
        "verdict.json",
    ]  # no temporary files left

    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "2"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [
        "ranks start together",
        "depth-2 pipeline is not serialized",
        "runner_end_skew_ms.p99 max_increase 20%",
    ]
    assert cases[0].find("failure") is None
    failure = cases[1].find("failure")
    assert failure.get("type") == "fail"
    assert failure.get("message") == "value true, expected == false"
    assert failure.text.splitlines() == [
        "value true, expected == false",
        "rule: pipeline.serialized == false",
        "figure: pipeline.serialized",
    ]
    body = cases[2].find("failure").text
    assert body.startswith("value 2 ms > limit 1.2 ms")
    assert "True" not in ET.tostring(suite, encoding="unicode") and "False" not in ET.tostring(suite, encoding="unicode")


def test_junit_of_rule_names_with_control_characters_is_well_formed_xml(tmp_path):
    hostile = "nul\x00 esc\x1b[31m bel\x07 vt\x0b \ufffe \u202e end"
    rules = _write(
        tmp_path,
        "rules.toml",
        '[[rule]]\nname = "{}"\ncheck = "pipeline.serialized == false"\n'.format(
            hostile.encode("unicode_escape").decode().replace("\\x", "\\u00")
        ),
    )
    assert load_rules(rules)[0].name == hostile
    junit = tmp_path / "gate.xml"
    gate(_serialized(), rules, junit=junit)
    case = ET.parse(junit).getroot().find("testsuite/testcase")  # parses: no character XML 1.0 forbids
    assert case.get("name") == "nul\\x00 esc\\x1b[31m bel\\x07 vt\\x0b \\ufffe \\u202e end"
    assert case.find("failure").get("message") == "value true, expected == false"


def test_terminal_output_never_carries_escape_sequences_from_the_summary(tmp_path):
    summary = copy.deepcopy(HEALTHY)
    summary["tail_steps"]["straggler"]["verdict"] = "rank 1 (\x1b]52;c;cHduZWQ=\x07npu:1\x1b[2J)"
    rules = _write(tmp_path, "rules.toml", '[[rule]]\nname = "straggler \\u001b[5m"\ncheck = "tail_steps.straggler.verdict == \'none\'"\n')
    result = CliRunner().invoke(
        cli,
        ["gate", str(_summary_file(tmp_path, summary)), "--rules", str(rules)],
        env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(tmp_path / "step.md")},
    )
    assert result.exit_code == 1
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "rank 1 (\\x1b]52;c;cHduZWQ=\\x07npu:1\\x1b[2J), expected == none" in result.output
    assert "\x1b" not in (tmp_path / "step.md").read_text()


def test_error_lines_never_carry_escape_sequences(tmp_path):
    rules = _write(tmp_path, "rules.toml", '[[rule]]\ncheck = "exit_status == 0"\n')
    missing = tmp_path / "run\x1b]0;pwned\x07"
    result = CliRunner().invoke(cli, ["gate", str(missing), "--rules", str(rules)], env=NOT_ON_GITHUB)
    assert result.exit_code == 2 and "\x1b" not in result.output and "run\\x1b]0;pwned\\x07" in result.output


def test_github_escaping_follows_the_workflow_command_rules():
    assert _github_data("50% done\r\nnext") == "50%25 done%0D%0Anext"
    assert _github_property("a: b, c%\n") == "a%3A b%2C c%25%0A"


def test_on_github_actions_failures_become_annotations_and_a_step_summary_table(tmp_path):
    rules = _write(
        tmp_path,
        "rules.toml",
        """
[[rule]]
name = "runs overlap: depth, 100% | bind\\nhidden"
check = "pipeline.serialized == false"
[[rule]]
check = "validation.valid == true"
[[rule]]
check = "late_starts.items.*.excess_ms < 20"
""",
    )
    summary = _summary_file(tmp_path, _serialized())
    step_summary = _write(tmp_path, "step-summary.md", "## earlier step\n")
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(step_summary)}
    result = CliRunner().invoke(cli, ["gate", str(summary), "--rules", str(rules)], env=env)
    assert result.exit_code == 1
    annotations = [line for line in result.output.splitlines() if line.startswith("::")]
    assert annotations == [
        ("::error title=runs overlap%3A depth%2C 100%25 | bind%0Ahidden::pipeline.serialized: value true, expected == false")
    ]
    assert "FAIL    runs overlap: depth, 100% | bind\\nhidden [pipeline.serialized]" in result.output  # plain lines too
    text = step_summary.read_text()
    assert text.startswith("## earlier step\n### dsprof gate FAILED: 2 passed, 1 failed")  # appended, not replaced
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert table == [
        "| status | rule | figure | outcome |",
        ("| **FAIL** | runs overlap: depth, 100% &#124; bind\\\\nhidden | pipeline.serialized | value true, expected == false |"),
        "| PASS | validation.valid == true | validation.valid | value true == true |",
        "| PASS | late\\_starts.items.\\*.excess\\_ms &lt; 20 | late\\_starts.items.\\*.excess\\_ms | no items to check |",
    ]
    # a second gate step appends its own table after the first one
    CliRunner().invoke(cli, ["gate", str(summary), "--rules", str(rules)], env=env)
    assert step_summary.read_text().count("### dsprof gate FAILED") == 2


@pytest.mark.parametrize(
    "rules_text, summary_name, message",
    [
        ('[[rule]]\ncheck = "exit_status <== 0"\n', "summary.json", "cannot read"),
        ('[[rule]]\ncheck = "root_ms.p05 <= 1"\n', "summary.json", "did you mean"),
        ('[[rule]]\ncheck = "exit_status == 0"\n', "absent.json", "not found"),
        ("[[rule]]\ncheck = " + "[" * 500 + "]" * 500 + "\n", "summary.json", "nested more than"),
    ],
)
def test_on_github_actions_a_gate_that_cannot_judge_says_so_in_an_annotation_and_the_step_summary(
    tmp_path, rules_text, summary_name, message
):
    rules = _write(tmp_path, "rules.toml", rules_text)
    _summary_file(tmp_path, HEALTHY)
    step_summary = _write(tmp_path, "step-summary.md", "## earlier step\n")
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(step_summary)}
    result = CliRunner().invoke(cli, ["gate", str(tmp_path / summary_name), "--rules", str(rules)], env=env)
    assert result.exit_code == 2
    (annotation,) = result.stdout.splitlines()
    assert annotation.startswith("::error title=dsprof gate%3A rules error::") and message in annotation
    (error,) = result.stderr.splitlines()
    assert error.startswith("dsprof: error: ") and message in error
    text = step_summary.read_text()
    assert text.startswith("## earlier step\n### dsprof gate ERROR: ") and message in text


def test_a_rules_error_reaches_python_callers_after_the_github_report(tmp_path):
    rules = _write(tmp_path, "rules.toml", '[[rule]]\nname = "a | b\\nc"\ncheck = "validation.valid =="\n')
    step_summary = tmp_path / "step-summary.md"
    printed: list[str] = []
    environ = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(step_summary)}
    with pytest.raises(InputError) as excinfo:
        gate_command(_summary_file(tmp_path, HEALTHY), rules, out=printed.append, environ=environ)
    assert printed == ["::error title=dsprof gate%3A rules error::" + str(excinfo.value).replace("\n", "%0A")]
    assert step_summary.read_text().count("\n") == 2  # one line, then the blank line that ends it
    assert "|" not in step_summary.read_text().replace("&#124;", "")  # no table cell breaks from the rule's name
    printed.clear()
    with pytest.raises(InputError):
        gate_command(_summary_file(tmp_path, HEALTHY), rules, out=printed.append, environ={"GITHUB_ACTIONS": "false"})
    assert printed == []


def test_elsewhere_the_output_is_plain_text_and_no_step_summary_is_written(tmp_path):
    rules = _write(tmp_path, "rules.toml", '[[rule]]\ncheck = "pipeline.serialized == false"\n')
    summary = _summary_file(tmp_path, _serialized())
    step_summary = _write(tmp_path, "step-summary.md", "untouched\n")
    result = CliRunner().invoke(
        cli, ["gate", str(summary), "--rules", str(rules)], env={"GITHUB_ACTIONS": None, "GITHUB_STEP_SUMMARY": str(step_summary)}
    )
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "FAIL    pipeline.serialized == false [pipeline.serialized]: value true, expected == false",
        f"gate FAILED: 0 passed, 1 failed, 0 missing, 0 skipped ({rules})"
        " — run degraded: the depth-2 pipeline is serialized: bind(N+1) waits for runner_run(N)",  # the run's own verdict says why
    ]
    assert step_summary.read_text() == "untouched\n"


def test_library_outputs_for_ci_name_every_rule():
    verdict = gate(_serialized(), REPO / "examples" / "ci-rules.toml")
    annotations = github_annotations(verdict)
    assert len(annotations) == sum(r.failed for r in verdict.results) >= 2
    assert all(line.startswith("::error title=") for line in annotations)
    table = format_step_summary(verdict)
    assert table.count("\n| ") == len(verdict.results) + 1  # header row plus one row per result


def test_cli_bad_rules_and_bad_summary_exit_2_with_one_line(tmp_path):
    runner = CliRunner()
    summary = _summary_file(tmp_path, HEALTHY)
    rules = _write(tmp_path, "rules.toml", '[[rule]]\ncheck = "runner_start_skew_ms.p95 =< 0.5"\n')
    result = runner.invoke(cli, ["gate", str(summary), "--rules", str(rules)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1
    assert result.output.startswith(f"dsprof: error: {rules}: [[rule]] #1")
    assert "Traceback" not in result.output

    typo = _write(tmp_path, "typo.toml", '[[rule]]\ncheck = "pipeline.serialised == false"\n')
    result = runner.invoke(cli, ["gate", str(summary), "--rules", str(typo)])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "did you mean pipeline.serialized?" in result.output

    not_json = _write(tmp_path, "broken.json", '{"schema": ')
    good_rules = _write(tmp_path, "good.toml", '[[rule]]\ncheck = "validation.valid == true"\n')
    result = runner.invoke(cli, ["gate", str(not_json), "--rules", str(good_rules)])
    assert result.exit_code == 2
    assert result.output.startswith(f"dsprof: error: {not_json}:1: not valid JSON")

    not_summary = _write(tmp_path, "other.json", '{"traceEvents": []}')
    result = runner.invoke(cli, ["gate", str(not_summary), "--rules", str(good_rules)])
    assert result.exit_code == 2 and "not a dsprof summary" in result.output


def test_help_shows_every_default_and_points_at_the_projects_docs():
    text = CliRunner().invoke(cli, ["gate", "--help"]).output
    assert "docs/GATE_RULES.md" in text and "../shared" not in text
    flat = " ".join(text.split())
    for default in ("[default: (none: [[relative]] rules are skipped)]", "[default: (not written)]"):
        assert default in flat
    assert "[default: (required unless --suggest)]" in flat and "[default: 1.5; 1<=x<=1000.0]" in flat
    assert '[default: (none: change = "worse" rules are skipped)]' in flat
    assert flat.count("[default:") == 6  # --rules, --margin, --baseline, --junit, --verdict, --history


# --------------------------------------------------------------------------- the shipped rules


@pytest.mark.parametrize("name", ["gate-rules.toml", "ci-rules.toml"])
def test_shipped_rules_parse_and_pass_a_healthy_summary(name):
    rules = load_rules(REPO / "examples" / name)
    assert rules
    verdict = gate(HEALTHY, REPO / "examples" / name, baseline=HEALTHY)
    assert verdict.passed, [(r.path, r.status, r.detail) for r in verdict.results if r.failed]
    assert not any(r.status == "skipped" for r in verdict.results)


def test_ci_rules_fail_a_serialized_pipeline_on_serialization_depth_and_cadence():
    verdict = gate(_serialized(), REPO / "examples" / "ci-rules.toml", baseline=HEALTHY)
    failed = {r.name for r in verdict.results if r.failed}
    assert failed == {
        "depth-2 pipeline is not serialized",
        "depth-2 pipeline: bind(N+1) overlaps runner_run(N) in at least 90% of adjacent pairs",
        "no pipeline overlap violations",
        "cadence hides the bind (runs in flight overlap)",
        "the run's verdict is healthy (no significant straggler, no material late work, pipeline not serialized)",
    }
    assert not verdict.passed


def test_ci_depth_rule_threshold_sits_between_the_measured_runs():
    # pairs overlapped / checked measured on real runs of the bundled runtime (examples/ci-rules.toml):
    # healthy 16/16, 56/56, 108/108; device-resident metadata 0/16, 0/56, 0/108
    for checked, overlapped, passes in ((16, 16, True), (108, 108, True), (108, 0, False), (20, 18, True), (20, 17, False)):
        summary = copy.deepcopy(HEALTHY)
        summary["pipeline"].update(pairs_checked=checked, pairs_overlapped=overlapped, overlap_share=round(overlapped / checked, 4))
        results = {r.name: r for r in gate(summary, REPO / "examples" / "ci-rules.toml").results}
        depth = results["depth-2 pipeline: bind(N+1) overlaps runner_run(N) in at least 90% of adjacent pairs"]
        assert (depth.status == "pass") is passes, (checked, overlapped, depth.detail)


# Summaries of any shape built from the schema's own key names (so that rules reach into them), with
# values a hostile or broken producer could hand over from Python: NaN, infinities, 10**400, control text.
SUMMARY_KEYS = [
    "figures",
    "pipeline",
    "serialized",
    "validation",
    "valid",
    "serving",
    "tokens_returned",
    "tokens_expected",
    "exit_status",
    "runner_run_ms",
    "bind_ms",
    "p50",
    "cadence_p50_ms",
    "pairs_checked",
    "pairs_overlapped",
    "violations",
    "achieved_depth",
    "0",
    "items",
]
ANY_SUMMARY = any_summary(SUMMARY_KEYS)


@settings(deadline=None)
@given(ANY_SUMMARY, ANY_SUMMARY)
def test_any_summary_gives_a_verdict_or_one_input_error(summary, baseline):
    try:
        verdict = gate(summary, REPO / "examples" / "gate-rules.toml", baseline=baseline)
    except InputError as exc:
        assert str(exc).startswith(str(REPO / "examples" / "gate-rules.toml"))
        return
    json.dumps(verdict.to_json(), allow_nan=False)
    assert "\x1b" not in format_verdict(verdict) + "".join(github_annotations(verdict)) + format_step_summary(verdict)
    with tempfile.TemporaryDirectory() as scratch:
        ET.parse(write_junit(verdict, Path(scratch) / "gate.xml"))
