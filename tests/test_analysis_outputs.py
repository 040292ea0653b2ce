"""analyze writes summary.json, summary.md, combined-swimlane.json and report.html, agreeing with its summary."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from dsprof.analysis.outputs.console import format_console_summary, terminal_safe
from dsprof.analysis.outputs.summary_md import format_summary_md, md
from dsprof.analysis.summary import SUMMARY_SCHEMA, load_summary
from dsprof.commands.analysis_job import analyze_paths
from dsprof.commands.ingest import ingest_paths
from dsprof.testing.strace_readers import READERS, select_reader
from dsprof.testing.synthetic import SyntheticRun


def test_outputs_written_and_consistent(tmp_path):
    fence = np.full((8, 20), 9_000_000, dtype=np.int64)
    fence[4, 9] += 15_000_000
    run = SyntheticRun(ranks=8, steps=20, fence_wait_ns=fence, device_wall_ns=fence + 100_000)
    run.write(tmp_path / "run")
    outcome = analyze_paths([tmp_path / "run"], tmp_path / "out", expect_ranks=8)
    assert set(outcome.outputs) == {"summary.json", "summary.md", "combined-swimlane.json", "report.html"}
    assert load_summary(tmp_path / "out") == outcome.summary
    assert outcome.summary["schema"] == SUMMARY_SCHEMA

    text = outcome.outputs["summary.md"].read_text()
    assert text.index("**swimlane**: valid") < text.index("Tail steps") < text.index("| figure |")  # findings first
    assert "**run**: exit status 0" in text
    # the shape a reviewer recognises, not every knob (layers stays in summary.json)
    assert (
        "Workload: preset=synthetic, ranks=8, dp=8, ep=8, tp=1, requests=32, prompt\\_tokens=64, "
        "output\\_tokens=256, metadata=async, depth=2, device\\_phases=yes, seed=0"
    ) in text
    assert f"Tokens: {8 * 4 * 256} / {8 * 4 * 256} expected" in text
    assert "- step 9 · rank 4 (npu:4) · +15.0 ms · device: 15.000 ms slower device work" in text
    assert "| runner\\_start\\_skew\\_ms | 0.0 | 0.0 | 0.0 | 0.0 | 20 |" not in text  # figure names are ours: not escaped
    assert "| runner_start_skew_ms | 0.0 | 0.0 | 0.0 | 0.0 | 20 |" in text

    console = format_console_summary(outcome.summary)
    assert console.splitlines()[0].startswith("verdict    ") and console.splitlines()[1].startswith("swimlane   valid")
    assert "step 9 · rank 4 (npu:4) · +15.0 ms · device: 15.000 ms slower device work" in console
    assert json.loads(outcome.outputs["combined-swimlane.json"].read_text())["traceEvents"]


def test_failed_validation_is_stated_first(tmp_path):
    SyntheticRun(ranks=3, steps=6, missing_steps={1: 2}).write(tmp_path / "run")
    outcome = analyze_paths([tmp_path / "run"], tmp_path / "out")
    text = outcome.outputs["summary.md"].read_text()
    assert text.splitlines()[2].startswith("- **verdict**: invalid: the swimlane is not valid: ")
    assert "- **swimlane**: NOT valid: " in text.splitlines()[3]
    assert "rank 1 has 4 decode steps, others 6" in text
    assert format_console_summary(outcome.summary).splitlines()[1].startswith("swimlane   NOT valid: ")


def test_lists_are_worst_first_and_count_the_rest(tmp_path):
    fence = np.full((3, 14), 9_000_000, dtype=np.int64)
    fence[1, :12] += 6_000_000  # rank 1 ends 6 ms late in the first 12 steps
    fence[2, 13] += 20_000_000  # and rank 2 once, much later: it must come first
    SyntheticRun(ranks=3, steps=14, fence_wait_ns=fence, device_wall_ns=fence, pipelined=False).write(tmp_path / "run")
    outcome = analyze_paths([tmp_path / "run"], tmp_path / "out")
    text = outcome.outputs["summary.md"].read_text()
    assert outcome.summary["tail_steps"]["count"] == 13
    tail_section = text.split("Tail steps (")[1].split("\n\n")[0]
    items = [line for line in tail_section.splitlines() if line.startswith("- step ")]
    assert items[0].startswith("- step 13 · rank 2 (npu:2) · +20.0 ms")
    assert len(items) == 10 and "- … 3 more in summary.json and report.html" in text
    assert f"**straggler**: {outcome.summary['tail_steps']['straggler']['verdict']}" in text
    assert outcome.summary["tail_steps"]["straggler"]["rank"] == 1  # behind 12 of the 13 tails


def test_a_crash_names_the_failed_rank_and_its_message():
    summary = {
        "run": {"exit_status": 1, "failed_rank": 2, "failed_device": "cpu:2", "message": "rank 2 (cpu:2) failed: boom"},
        "validation": {"valid": False, "problems": ["rank 2 has 3 decode steps, others 5"]},
    }
    assert "**run**: exit status 1: rank 2 (cpu:2) failed: boom" in format_summary_md(summary)
    assert "run        exit status 1: rank 2 (cpu:2) failed: boom" in format_console_summary(summary)


def test_trace_text_is_inert_in_markdown_and_on_a_terminal():
    hostile = "npu:0<script>alert(1)</script>|*x*\x1b]8;;http://e\x07"
    assert md(hostile) == "npu:0\\<script\\>alert(1)\\</script\\>\\|\\*x\\*\\x1b\\]8;;http://e\\x07"
    assert "\x1b" not in terminal_safe(hostile) and "\x07" not in terminal_safe(hostile)


@pytest.mark.slow
@pytest.mark.parametrize("reader", READERS)
def test_dropped_records_get_one_console_line_with_the_first_place_of_each_reason(tmp_path, reader, monkeypatch):
    """A record torn mid-way and one without ``dur=``: the swimlane line counts them, the drop line says where."""
    select_reader(reader, monkeypatch)
    run = SyntheticRun(ranks=2, steps=12, sa_profile=False).write(tmp_path / "run")
    log = run / "server.log"
    lines = log.read_text().splitlines(keepends=True)
    records = [i for i, line in enumerate(lines) if "[STRACE]" in line and " dur=" in line]
    no_dur, torn = records[len(records) // 3], records[2 * len(records) // 3]
    lines[no_dur] = re.sub(r" dur=[0-9]+", "", lines[no_dur])
    lines[torn] = lines[torn][: lines[torn].index(" ts=") + 5] + "\n"
    log.write_text("".join(lines))
    summary = analyze_paths([log], None).summary
    assert summary["inputs"]["dropped"] == {"missing_field": 1, "torn_record": 1}
    assert summary["inputs"]["dropped_at"] == {"missing_field": f"{log}:{no_dur + 1}", "torn_record": f"{log}:{torn + 1}"}
    console = format_console_summary(summary)
    assert re.search(r"^swimlane +valid, 2 records dropped$", console, re.MULTILINE)
    drop_line = f"1 missing_field (first at {log}:{no_dur + 1}), 1 torn_record (first at {log}:{torn + 1})"
    assert re.search(rf"^dropped +{re.escape(drop_line)}$", console, re.MULTILINE)
    assert drop_line in format_summary_md(summary).replace("\\", "")
    ingest_paths([log], tmp_path / "spans")  # a span dataset keeps where its records were dropped
    from_dataset = analyze_paths([tmp_path / "spans"], None).summary
    assert from_dataset["inputs"]["dropped_at"] == summary["inputs"]["dropped_at"]
