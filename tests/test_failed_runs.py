"""A failed run is never reported as better: partial serving figures, no pipeline verdict, diff and gate call it a failure.

The crashed run is a synthetic run whose rank 1 stopped early and whose runtime reported what a crash leaves: a
non-zero exit status, part of the tokens, and a throughput over the first (fast) steps that reads higher than the
healthy run's (the issue: 1844 tok/s crashed against 1056 tok/s healthy, "+74.5% better").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from dsprof.analysis.policy.diff import diff_summaries, format_diff, run_failure
from dsprof.analysis.policy.gate import RUN_FAILED_RULE, evaluate_gate
from dsprof.commands.analysis_job import analyze_paths
from dsprof.testing.synthetic import SyntheticRun

STEPS = 20


@dataclass
class CrashedRun(SyntheticRun):
    """Rank 1 crashed: the first ``completed_requests`` requests got every token, the others a third of theirs."""

    completed_requests: int = 0
    elapsed_share: float = 0.3  # of the healthy batch elapsed: the runtime's clock stopped at the crash

    def tokens_returned_per_request(self) -> np.ndarray:
        tokens = super().tokens_returned_per_request()
        tokens[self.completed_requests :] = self.output_tokens // 3
        return tokens

    def performance_summary_dict(self) -> dict:
        summary = super().performance_summary_dict()
        elapsed = summary["batch_elapsed_s"] * self.elapsed_share
        summary.update(
            exit_status=1,
            failed_rank=1,
            message="rank 1 (npu:1) failed: InjectedCrash: rank 1 crashed at decode step 6 (injected)",
            batch_elapsed_s=elapsed,
            throughput_tok_s=round(summary["tokens_returned"] / elapsed, 3),
        )
        return summary


def _summary(run: SyntheticRun, tmp_path, name: str) -> dict:
    run.write(tmp_path / name)
    return analyze_paths([tmp_path / name], tmp_path / name).summary


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    healthy = _summary(SyntheticRun(ranks=2, steps=STEPS), tmp, "healthy")
    crashed = _summary(CrashedRun(ranks=2, steps=STEPS, missing_steps={1: STEPS - 6}), tmp, "crashed")
    # a crash near the end: half of the requests had every token
    half = _summary(CrashedRun(ranks=2, steps=STEPS, missing_steps={1: 1}, completed_requests=4, elapsed_share=0.95), tmp, "half")
    return healthy, crashed, half


@pytest.mark.slow
def test_the_runtime_figure_of_the_crashed_run_reads_higher(runs, tmp_path):
    healthy, _, _ = runs
    written = CrashedRun(ranks=2, steps=STEPS).performance_summary_dict()
    assert written["throughput_tok_s"] > healthy["serving"]["throughput_tok_s"]  # what the fix must not pass on


def test_crashed_serving_figures_are_partial_and_count_completed_requests_only(runs):
    healthy, crashed, half = runs
    assert healthy["serving"]["partial"] is False and healthy["serving"]["partial_reason"] is None
    serving = crashed["serving"]
    assert serving["partial"] is True
    assert serving["partial_reason"].startswith("the run exited with status 1 (rank 1 (npu:1) failed: InjectedCrash")
    assert "; 680 of 2048 tokens returned; throughput and TPOT count the 0 of 8 requests that completed" in serving["partial_reason"]
    assert serving["throughput_tok_s"] == 0.0 and serving["effective_tpot_ms"] is None  # no request completed
    assert "0 of 8" in serving["sources"]["throughput_tok_s"]
    # four of eight requests completed: their tokens over the batch elapsed, their TPOT
    elapsed, tokens = half["serving"]["batch_elapsed_s"], 4 * 256
    assert half["serving"]["throughput_tok_s"] == pytest.approx(tokens / elapsed, abs=1e-3)
    assert half["serving"]["effective_tpot_ms"] == pytest.approx(elapsed * 1000 / 256, abs=1e-3)
    for failed in (crashed, half):
        assert failed["serving"]["throughput_tok_s"] < healthy["serving"]["throughput_tok_s"]


def test_a_failed_run_gets_no_pipeline_verdict(runs):
    healthy, crashed, _ = runs
    assert healthy["pipeline"]["serialized"] is False and healthy["pipeline"]["partial"] is False
    assert crashed["pipeline"]["serialized"] is None and crashed["pipeline"]["partial"] is True
    assert crashed["pipeline"]["diagnosis"].startswith("no verdict: the run failed (exit status 1); over the steps it completed: ")


def test_diff_never_calls_a_failed_run_better(runs):
    healthy, crashed, half = runs
    for failed in (crashed, half):
        result = diff_summaries(healthy, failed)
        assert not [f.figure for f in result.figures if f.assessment == "better"]
        assert not [label.figure for label in result.labels if label.assessment == "better"]
        labels = {label.figure: label.assessment for label in result.labels}
        assert labels["exit_status"] == labels["serving.partial"] == "worse"
        assert result.regressions
        text = format_diff(result)
        assert "failed run (B): <dict>: exit status 1: rank 1 (npu:1) failed" in text
        assert "better" not in text
        # the reverse comparison does not call the healthy run worse than the crash on any figure
        assert not [f.figure for f in diff_summaries(failed, healthy).figures if f.assessment == "worse"]


def test_the_gate_fails_a_failed_run_whatever_the_rules(runs, tmp_path):
    healthy, crashed, half = runs
    rules = tmp_path / "rules.toml"
    rules.write_text('[[relative]]\nfigure = "serving.throughput_tok_s"\nmax_decrease = "10%"\n')
    assert evaluate_gate(healthy, rules, baseline=healthy).passed
    for failed in (crashed, half):
        verdict = evaluate_gate(failed, rules, baseline=healthy)
        assert not verdict.passed
        first = verdict.results[0]
        assert (first.name, first.status) == (RUN_FAILED_RULE, "fail")
        assert first.detail == run_failure(failed)


def test_partial_figures_without_an_exit_status_are_a_failure_too(runs):
    healthy, _, _ = runs
    torn = {**healthy, "run": {**healthy["run"], "exit_status": None}, "exit_status": None}
    torn["serving"] = {**healthy["serving"], "partial": True, "partial_reason": "300 of 2048 tokens returned"}
    assert run_failure(torn) == "partial figures: 300 of 2048 tokens returned"
    assert run_failure(healthy) is None


def test_the_printed_summaries_say_a_crashed_runs_figures_are_partial():
    from dsprof.analysis.outputs.console import format_console_summary
    from dsprof.analysis.outputs.summary_md import format_summary_md

    summary = {"serving": {"throughput_tok_s": 0.0, "partial": True, "partial_reason": "the run exited with status 1"}}
    assert "PARTIAL: the run exited with status 1" in format_console_summary(summary)  # type: ignore[arg-type]
    assert "**partial**: the run exited with status 1" in format_summary_md(summary)  # type: ignore[arg-type]
