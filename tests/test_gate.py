"""The rule gate on hand-built summaries: every rule kind passing and failing, exit codes, outputs."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from dsprof.analysis.gate import gate, load_rules
from dsprof.cli.main import cli
from dsprof.errors import InputError

REPO = Path(__file__).resolve().parents[1]


def _block(p50, p95, p99, maximum, count=10):
    return {"p50": p50, "p95": p95, "p99": p99, "max": maximum, "count": count}


HEALTHY = {
    "schema": "dsprof.summary/1",
    "dsprof_version": "0.1.0",
    "exit_status": 0,
    "validation": {"valid": True, "decode_steps": 10, "rank_roots": 40, "ranks": 4, "problems": []},
    "figures": {
        "runner_start_skew_ms": _block(0.1, 0.3, 0.45, 0.5),
        "runner_end_skew_ms": _block(0.2, 0.8, 1.0, 1.2),
        "bind_ms": _block(1.0, 1.2, 1.4, 1.5),
        "runner_run_ms": _block(18.0, 19.0, 19.5, 20.0),
        "root_ms": _block(20.0, 22.0, 23.0, 25.0),
        "per_rank": {"0": {"root_ms": _block(20.0, 21.0, 22.0, 23.0)}},
    },
    "late_starts": {"threshold_ms": 5.0, "count": 0, "items": []},
    "tail_steps": {"threshold_ms": 5.0, "count": 0, "items": [], "straggler": {"verdict": "none"}},
    "pipeline": {"serialized": False, "violations": 0, "cadence_p50_ms": 12.0,
                 "achieved_depth": {"0": 1.8, "1": 1.7, "2": 1.75, "3": 1.6}},
    "serving": {"tokens_returned": 640, "tokens_expected": 640, "throughput_tok_s": 400.0,
                "effective_tpot_ms": 80.0},
}


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


def test_absolute_rules_pass_and_fail(tmp_path):
    rules = _write(tmp_path, "rules.toml", """
[[rule]]
check = "runner_start_skew_ms.p95 <= 0.5"
[[rule]]
check = "runner_end_skew_ms.max < 1.0"
[[rule]]
check = "figures.root_ms.p50 >= 20"
[[rule]]
check = "late_starts.count == 0"
[[rule]]
check = "tail_steps.straggler.verdict == 'none'"
""")
    verdict = gate(HEALTHY, rules)
    assert _statuses(verdict) == {
        "figures.runner_start_skew_ms.p95": "pass",   # 0.3 <= 0.5
        "figures.runner_end_skew_ms.max": "fail",     # 1.2 < 1.0 is false
        "figures.root_ms.p50": "pass",                # 20.0 >= 20 (boundary)
        "late_starts.count": "pass",
        "tail_steps.straggler.verdict": "pass",
    }
    assert not verdict.passed and verdict.exit_code == 1
    failed = [r for r in verdict.results if r.status == "fail"][0]
    assert failed.value == 1.2 and failed.limit == 1.0


def test_boolean_rules_and_path_on_right_side(tmp_path):
    rules = _write(tmp_path, "rules.toml", """
[[rule]]
check = "validation.valid == true"
[[rule]]
check = "pipeline.serialized == false"
[[rule]]
check = "serving.tokens_returned == serving.tokens_expected"
[[rule]]
name = "cadence below 0.9 x root"
check = "pipeline.cadence_p50_ms < 0.9 * root_ms.p50"
""")
    assert gate(HEALTHY, rules).passed
    broken = copy.deepcopy(HEALTHY)
    broken["validation"]["valid"] = False
    broken["pipeline"]["serialized"] = True
    broken["serving"]["tokens_returned"] = 600
    broken["pipeline"]["cadence_p50_ms"] = 19.0  # 0.9 * 20.0 = 18.0
    verdict = gate(broken, rules)
    assert [r.status for r in verdict.results] == ["fail"] * 4
    assert verdict.results[3].name == "cadence below 0.9 x root"
    assert verdict.results[3].limit == pytest.approx(18.0)
    assert verdict.results[2].limit == 640


def test_sums_of_figures_and_negative_numbers(tmp_path):
    rules = _write(tmp_path, "rules.toml", """
[[rule]]
check = "pipeline.cadence_p50_ms < runner_run_ms.p50 + 0.5 * bind_ms.p50"
[[rule]]
check = "root_ms.p50 >= runner_run_ms.p50 + bind_ms.p50 * 1 - 0.5"
[[rule]]
check = "runner_start_skew_ms.p50 > -0.001"
[[rule]]
check = "runner_start_skew_ms.p50 <= -root_ms.p50 + 20.5"
""")
    summary = copy.deepcopy(HEALTHY)
    summary["figures"]["bind_ms"] = _block(3.0, 4.0, 4.5, 5.0)
    verdict = gate(summary, rules)
    # limits: 18 + 1.5 = 19.5; 18 + 3 - 0.5 = 20.5; -0.001; -20 + 20.5 = 0.5
    assert [r.limit for r in verdict.results] == pytest.approx([19.5, 20.5, -0.001, 0.5])
    assert [r.status for r in verdict.results] == ["pass", "fail", "pass", "pass"]
    assert "(runner_run_ms.p50 + 0.5 * bind_ms.p50)" in verdict.results[0].detail
    summary["pipeline"]["cadence_p50_ms"] = 19.5  # on the limit: < fails
    assert gate(summary, rules).results[0].status == "fail"
    del summary["figures"]["bind_ms"]
    missing = gate(summary, rules).results[0]
    assert missing.status == "missing" and missing.detail == "bind_ms.p50 is missing from the summary"


def test_wildcard_checks_every_rank(tmp_path):
    rules = _write(tmp_path, "rules.toml", '[[rule]]\ncheck = "pipeline.achieved_depth.* >= 1.65"\n')
    verdict = gate(HEALTHY, rules)
    assert _statuses(verdict) == {
        "pipeline.achieved_depth.0": "pass",
        "pipeline.achieved_depth.1": "pass",
        "pipeline.achieved_depth.2": "pass",
        "pipeline.achieved_depth.3": "fail",  # 1.6
    }


def test_missing_figure_fails_as_missing(tmp_path):
    rules = _write(tmp_path, "rules.toml", """
[[rule]]
check = "runner_start_skew_ms.p95 <= 0.5"
[[rule]]
check = "pipeline.cadence_p50_ms <= 50"
""")
    partial = copy.deepcopy(HEALTHY)
    partial["figures"]["runner_start_skew_ms"] = {"p50": None, "p95": None, "p99": None, "max": None, "count": 0}
    del partial["pipeline"]["cadence_p50_ms"]
    verdict = gate(partial, rules)
    assert [r.status for r in verdict.results] == ["missing", "missing"]
    assert verdict.exit_code == 1
    assert verdict.counts == {"pass": 0, "fail": 0, "missing": 2, "skipped": 0}


def test_relative_rules_against_baseline(tmp_path):
    rules = _write(tmp_path, "rules.toml", """
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
""")
    baseline = _summary_file(tmp_path, HEALTHY, "baseline.json")
    current = copy.deepcopy(HEALTHY)
    current["figures"]["runner_end_skew_ms"]["p99"] = 1.19        # limit 1.0 * 1.2 = 1.2 → pass
    current["serving"]["throughput_tok_s"] = 359.0                # limit 400 * 0.9 = 360 → fail
    current["figures"]["runner_start_skew_ms"]["p95"] = 0.46      # limit 0.3 + 0.1 + 0.05 = 0.45 → fail
    verdict = gate(current, rules, baseline=baseline)
    assert [r.status for r in verdict.results] == ["pass", "fail", "fail"]
    assert [r.limit for r in verdict.results] == pytest.approx([1.2, 360.0, 0.45])
    assert verdict.results[0].baseline == 1.0
    current["figures"]["runner_end_skew_ms"]["p99"] = 1.21
    current["serving"]["throughput_tok_s"] = 361.0
    current["figures"]["runner_start_skew_ms"]["p95"] = 0.44
    assert [r.status for r in gate(current, rules, baseline=baseline).results] == ["fail", "pass", "pass"]


def test_relative_rules_skip_without_baseline(tmp_path):
    rules = _write(tmp_path, "rules.toml", """
[[rule]]
check = "validation.valid == true"
[[relative]]
figure = "runner_end_skew_ms.p99"
max_increase = "20%"
""")
    verdict = gate(HEALTHY, rules)
    assert [r.status for r in verdict.results] == ["pass", "skipped"]
    assert verdict.passed


@pytest.mark.parametrize(
    "rules_text, message",
    [
        ("[[rule]]\ncheck = \"runner_start_skew_ms.p95 0.5\"\n", "exactly one comparison operator"),
        ("[[rule]]\ncheck = \"runner_start_skew_ms.p95 <= 0.5 <= 1\"\n", "exactly one comparison operator"),
        ("[[rule]]\ncheck = \"runner_start_skew_ms.p95 <= __import__('os')\"\n", "cannot read"),
        ("[[rule]]\ncheck = \"0.5 >= runner_start_skew_ms.p95\"\n", "left side"),
        ("[[rule]]\ncheck = \"runner_start_skew_ms <= 0.5\"\n", "is a block, not a value"),
        ("[[rule]]\ncheck = \"validation.valid <= 1\"\n", "compares validation.valid"),
        ("[[rule]]\ncheck = \"pipeline.serialized > false\"\n", "needs numbers"),
        ("[[rule]]\nchek = \"validation.valid == true\"\n", "unknown key"),
        ("[[rule]]\ncheck = \"root_ms.p50 <= bind_ms.p50 +\"\n", "as a term"),
        ("[[rule]]\ncheck = \"root_ms.p50 <= bind_ms.p50 * root_ms.p50\"\n", "as a term"),
        ("[[rule]]\ncheck = \"root_ms.p50 <= 2 * pipeline.achieved_depth.*\"\n", "only allowed on the left"),
        ("[[rule]]\ncheck = \"root_ms.p50 <= 1 + validation.valid\"\n", "not a number"),
        ("[[relative]]\nfigure = \"root_ms.p50\"\n", "exactly one of max_increase or max_decrease"),
        ("[[relative]]\nfigure = \"root_ms.p50\"\nmax_increase = \"twenty\"\n", "not a number or percentage"),
        ("[rules]\n", "unknown top-level key"),
        ("", "no rules"),
        ("[[rule]\n", "not valid TOML"),
    ],
)
def test_bad_rules_raise_input_error_naming_the_file(tmp_path, rules_text, message):
    rules = _write(tmp_path, "bad.toml", rules_text)
    with pytest.raises(InputError) as excinfo:
        gate(HEALTHY, rules)
    assert message in str(excinfo.value)
    assert str(excinfo.value).startswith(str(rules))


def test_cli_exit_codes_verdict_and_junit(tmp_path):
    rules = _write(tmp_path, "rules.toml", """
[[rule]]
check = "runner_start_skew_ms.p95 <= 0.5"
[[rule]]
check = "pipeline.serialized == false"
[[relative]]
figure = "runner_end_skew_ms.p99"
max_increase = "20%"
""")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _summary_file(run_dir, HEALTHY)
    runner = CliRunner()

    ok = runner.invoke(cli, ["gate", str(run_dir), "--rules", str(rules)])
    assert ok.exit_code == 0, ok.output
    assert "gate PASSED: 2 passed, 0 failed, 0 missing, 1 skipped" in ok.output

    serialized = copy.deepcopy(HEALTHY)
    serialized["pipeline"]["serialized"] = True
    serialized["figures"]["runner_end_skew_ms"]["p99"] = 2.0
    bad = _summary_file(tmp_path, serialized, "serialized.json")
    junit, verdict_path = tmp_path / "gate.xml", tmp_path / "verdict.json"
    failed = runner.invoke(cli, ["gate", str(bad), "--rules", str(rules), "--baseline", str(run_dir),
                                 "--junit", str(junit), "--verdict", str(verdict_path)])
    assert failed.exit_code == 1, failed.output
    lines = failed.output.splitlines()
    assert lines[0].startswith("PASS") and "0.300 <= 0.500" in lines[0]
    assert lines[1].startswith("FAIL") and "pipeline.serialized" in lines[1]
    assert lines[2].startswith("FAIL") and "limit <= 1.200" in lines[2]

    verdict = json.loads(verdict_path.read_text())
    assert verdict["schema"] == "dsprof.gate_verdict/1"
    assert verdict["passed"] is False
    assert verdict["counts"] == {"pass": 1, "fail": 2, "missing": 0, "skipped": 0}
    assert [r["status"] for r in verdict["results"]] == ["pass", "fail", "fail"]

    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "2"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["runner_start_skew_ms.p95 <= 0.5", "pipeline.serialized == false",
                                              "runner_end_skew_ms.p99 max_increase 20%"]
    assert cases[0].find("failure") is None
    assert cases[1].find("failure").get("type") == "fail"


def test_cli_bad_rules_and_bad_summary_exit_2_with_one_line(tmp_path):
    runner = CliRunner()
    summary = _summary_file(tmp_path, HEALTHY)
    rules = _write(tmp_path, "rules.toml", "[[rule]]\ncheck = \"runner_start_skew_ms.p95 =< 0.5\"\n")
    result = runner.invoke(cli, ["gate", str(summary), "--rules", str(rules)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1
    assert result.output.startswith(f"dsprof: error: {rules}: [[rule]] #1")
    assert "Traceback" not in result.output

    not_json = _write(tmp_path, "broken.json", "{\"schema\": ")
    good_rules = _write(tmp_path, "good.toml", "[[rule]]\ncheck = \"validation.valid == true\"\n")
    result = runner.invoke(cli, ["gate", str(not_json), "--rules", str(good_rules)])
    assert result.exit_code == 2
    assert result.output.startswith(f"dsprof: error: {not_json}:1: not valid JSON")

    not_summary = _write(tmp_path, "other.json", "{\"traceEvents\": []}")
    result = runner.invoke(cli, ["gate", str(not_summary), "--rules", str(good_rules)])
    assert result.exit_code == 2 and "not a dsprof summary" in result.output


@pytest.mark.parametrize("name", ["gate-rules.toml", "ci-rules.toml"])
def test_shipped_rules_parse_and_pass_a_healthy_summary(name):
    rules = load_rules(REPO / "examples" / name)
    assert rules
    verdict = gate(HEALTHY, REPO / "examples" / name, baseline=HEALTHY)
    assert verdict.passed, [(r.path, r.status, r.detail) for r in verdict.results if r.failed]


def test_ci_rules_fail_a_serialized_pipeline():
    serialized = copy.deepcopy(HEALTHY)
    serialized["pipeline"]["serialized"] = True
    serialized["pipeline"]["violations"] = 36
    serialized["pipeline"]["cadence_p50_ms"] = 19.2  # bind + runner_run: above 18.0 + 0.5 * 1.0
    serialized["pipeline"]["achieved_depth"] = {"0": 1.0, "1": 1.0, "2": 1.0, "3": 1.0}
    verdict = gate(serialized, REPO / "examples" / "ci-rules.toml", baseline=HEALTHY)
    failed = {r.path for r in verdict.results if r.failed}
    assert "pipeline.serialized" in failed
    assert "pipeline.cadence_p50_ms" in failed
    assert not verdict.passed
