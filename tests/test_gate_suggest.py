"""``dsprof gate --suggest``: rules from healthy runs, in the rules format, that pass those runs and fail a worse one."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from dsprof.analysis.policy.gate import evaluate_gate
from dsprof.analysis.policy.gate_rules import load_rules
from dsprof.analysis.policy.gate_suggest import suggest_rules
from dsprof.cli.main import cli
from dsprof.commands.analysis_job import analyze_paths
from dsprof.testing.synthetic import SyntheticRun


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> list[dict]:
    """Three healthy runs: one analysed synthetic run, and two with other effect sizes as a noisy machine gives them."""
    tmp = tmp_path_factory.mktemp("healthy")
    SyntheticRun(ranks=2, steps=20).write(tmp / "run")
    base = analyze_paths([tmp / "run"], tmp / "run").summary
    runs = [copy.deepcopy(dict(base)) for _ in range(3)]
    for run, (what_if, straggler, slow) in zip(runs[1:], [(0.04, 0.06, 2), (0.02, 0.07, 3)], strict=True):
        run["what_if"]["share_of_decode_wall"] = what_if
        run["tail_steps"]["straggler"]["share"] = straggler
        run["slow_steps"]["count"] = slow
    return runs


def _rules(tmp_path, text: str):
    path = tmp_path / "suggested.toml"
    path.write_text(text)
    return path


def test_suggested_rules_parse_and_pass_every_healthy_run(healthy, tmp_path):
    rules = _rules(tmp_path, suggest_rules(healthy, margin=1.5))
    assert len(load_rules(rules)) == 9
    for run in healthy:
        verdict = evaluate_gate(run, rules)
        assert verdict.passed, [r.detail for r in verdict.results if r.failed]


def test_limits_are_the_worst_healthy_value_times_the_margin_with_a_floor(healthy):
    text = suggest_rules(healthy, margin=1.5)
    assert 'check = "what_if.share_of_decode_wall <= 0.06"' in text  # 0.04 x 1.5
    assert 'check = "tail_steps.straggler.share <= 0.105"' in text  # 0.07 x 1.5
    assert 'check = "slow_steps.count <= 0.225 * validation.decode_steps"' in text  # 3 of 20 x 1.5
    assert "# Healthy: " in text and "# Protects against a straggler" in text
    floors = suggest_rules(healthy[:1], margin=1.5)  # the synthetic run has no late work: the floors hold
    assert 'check = "what_if.share_of_decode_wall <= 0.05"' in floors
    assert 'check = "tail_steps.straggler.share <= 0.08"' in floors


def test_a_run_beyond_the_suggested_limits_fails(healthy, tmp_path):
    rules = _rules(tmp_path, suggest_rules(healthy))
    faulty = copy.deepcopy(healthy[0])
    faulty["what_if"]["share_of_decode_wall"] = 0.3
    faulty["tail_steps"]["straggler"]["share"] = 0.25
    failed = [r.path for r in evaluate_gate(faulty, rules).results if r.failed]
    assert failed == ["what_if.share_of_decode_wall", "tail_steps.straggler.share"]


def test_a_figure_missing_from_a_run_is_not_suggested(healthy):
    partial = copy.deepcopy(healthy[0])
    partial["what_if"]["share_of_decode_wall"] = None
    text = suggest_rules([healthy[0], partial])
    assert "# not suggested: what_if.share_of_decode_wall is not a number (below 2^63) in every run" in text
    assert "what_if.share_of_decode_wall <=" not in text


def test_cli_suggest_prints_rules_and_refuses_mixed_options(healthy, tmp_path):
    paths = []
    for i, run in enumerate(healthy):
        paths.append(tmp_path / f"s{i}.json")
        paths[-1].write_text(json.dumps(run))
    result = CliRunner().invoke(cli, ["gate", "--suggest", "--margin", "2", *map(str, paths)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# Suggested by dsprof gate --suggest from 3 healthy run(s), margin 2.")
    assert 'check = "what_if.share_of_decode_wall <= 0.08"' in result.stdout
    mixed = CliRunner().invoke(cli, ["gate", "--suggest", str(paths[0]), "--rules", "x.toml"])
    assert mixed.exit_code == 2 and "--suggest prints rules" in mixed.stderr
    several = CliRunner().invoke(cli, ["gate", *map(str, paths), "--rules", "x.toml"])
    assert several.exit_code == 2 and "give one SUMMARY to check (got 3" in several.stderr
