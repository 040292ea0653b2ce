"""analyze() writes summary.json, summary.md, combined-swimlane.json and report.html, agreeing with its result."""

from __future__ import annotations

import json

import numpy as np

from dsprof.analysis.analyze import analyze, format_summary_table
from dsprof.profiler.synthetic import SyntheticRun


def test_outputs_written_and_consistent(tmp_path):
    fence = np.full((8, 20), 9_000_000, dtype=np.int64)
    fence[4, 9] += 15_000_000
    run = SyntheticRun(ranks=8, steps=20, fence_wait_ns=fence, device_wall_ns=fence + 100_000)
    run.write(tmp_path / "run")
    result = analyze([tmp_path / "run"], tmp_path / "out", expect_ranks=8)
    assert set(result.outputs) == {"summary.json", "summary.md", "combined-swimlane.json", "report.html"}
    assert json.loads(result.outputs["summary.json"].read_text()) == result.summary
    assert result.summary["schema"] == "dsprof.summary/1"

    md = result.outputs["summary.md"].read_text()
    assert "combined swimlane validated with 20 decode steps and 160 rank roots" in md
    assert "Exit status: 0" in md
    # the shape a reviewer recognises, not every knob (layers stays in summary.json)
    assert ("Workload: preset=synthetic, ranks=8, dp=8, ep=8, tp=1, requests=32, prompt_tokens=64, "
            "output_tokens=256, metadata=async, depth=2, device_phases=True, seed=0") in md
    assert f"Tokens: {8 * 4 * 256} / {8 * 4 * 256} expected" in md
    assert "- step 9, rank 4 (npu:4): end skew 15.0 ms, device_wall +15.0 ms" in md
    assert "| runner_start_skew_ms | 0.0 | 0.0 | 0.0 | 0.0 | 20 |" in md

    table = format_summary_table(result.summary)
    assert "ranks / decode steps / rank roots    8 / 20 / 160" in table
    assert "step 9: rank 4 (npu:4) +15.0 ms, device_wall" in table
    assert json.loads(result.outputs["combined-swimlane.json"].read_text())["traceEvents"]


def test_failed_validation_is_stated_in_summary_md(tmp_path):
    SyntheticRun(ranks=3, steps=6, missing_steps={1: 2}).write(tmp_path / "run")
    result = analyze([tmp_path / "run"], tmp_path / "out")
    md = result.outputs["summary.md"].read_text()
    assert "Validation: FAILED (6 decode steps, 16 rank roots): " in md
    assert "rank 1 has 4 decode steps, others 6" in md
    assert format_summary_table(result.summary).startswith("valid                                NO: ")


def test_summary_md_lists_ten_tails_and_counts_the_rest(tmp_path):
    fence = np.full((3, 14), 9_000_000, dtype=np.int64)
    fence[1, :12] += 6_000_000  # rank 1 ends 6 ms late in the first 12 steps
    SyntheticRun(ranks=3, steps=14, fence_wait_ns=fence, device_wall_ns=fence, pipelined=False).write(tmp_path / "run")
    result = analyze([tmp_path / "run"], tmp_path / "out")
    md = result.outputs["summary.md"].read_text()
    assert result.summary["tail_steps"]["count"] == 12
    assert md.count("end skew 6.0 ms, device_wall +6.0 ms") == 10
    assert "- ... 2 more tail steps in summary.json" in md
    assert "straggler: rank 1 (npu:1)" in md
