"""Partial and inconsistent artifacts: every computable figure, and a verdict naming the problem."""

from __future__ import annotations

import json

import pytest

from dsprof.commands.analysis_job import analyze_paths
from dsprof.errors import InputError
from dsprof.profiler.strace_format import format_prefix, format_strace_payload
from dsprof.testing.synthetic import SyntheticRun


def analyze(paths, out=None, **options):
    return analyze_paths(paths, out, **options)


def checks(summary: dict) -> dict:
    return {c["name"]: c for c in summary["validation"]["checks"]}


def test_rank_missing_steps_and_torn_end(tmp_path):
    run = SyntheticRun(ranks=4, steps=15, missing_steps={3: 5}, torn_tail=True)
    run.write(tmp_path / "run")
    summary = analyze([tmp_path / "run"], expect_ranks=4).summary
    validation = summary["validation"]
    assert validation["valid"] is False
    assert validation["steps_per_rank"] == {"0": 15, "1": 15, "2": 15, "3": 10}
    assert "rank 3 has 10 decode steps, others 15" in validation["problems"]
    assert checks(summary)["rank_roots"]["detail"] == "55 rank roots, expected 15 x 4 = 60"
    assert checks(summary)["complete_steps"]["detail"].startswith("5 steps between 10 and 14 present on only 3 of 4 ranks")
    assert summary["inputs"]["dropped"] == {"torn_record": 1}
    # figures still computed, over the ranks that have each step
    t = run.timings()
    assert summary["figures"]["runner_start_skew_ms"]["count"] == 15
    assert summary["figures"]["bind_ms"]["count"] == 55
    assert [s["ranks"] for s in summary["per_step"]] == [4] * 10 + [3] * 5
    assert summary["figures"]["validate_ms"]["max"] == round(float((t.validate_end_ns - t.validate_start_ns).max()) / 1e6, 3)


def test_expected_ranks_missing_devices_and_anchors(tmp_path):
    SyntheticRun(ranks=3, steps=5, anchors=False, chip_ready_lines=False).write(tmp_path / "run")
    summary = analyze([tmp_path / "run"], expect_ranks=4).summary
    validation = summary["validation"]
    assert not validation["valid"]
    assert checks(summary)["devices"]["ok"] is False
    assert "3 ranks, expected 4" in checks(summary)["devices"]["detail"]
    assert "no decode steps on rank 3" in validation["problems"]
    assert any(p.startswith("no CLOCK_ANCHOR for pid 41000, 41001, 41002") for p in validation["problems"])
    # devices still come from the root attributes
    assert validation["devices"] == ["npu:0", "npu:1", "npu:2"]


def test_steps_on_a_varying_number_of_ranks_give_the_range(tmp_path):
    SyntheticRun(ranks=4, steps=15, missing_steps={2: 3, 3: 5}).write(tmp_path / "run")
    detail = checks(analyze([tmp_path / "run"]).summary)["complete_steps"]["detail"]
    assert detail == "5 steps between 10 and 14 present on only 2 to 3 of 4 ranks; their figures use the ranks that have them"


def test_crash_leaves_rootless_invocations(tmp_path):
    run = SyntheticRun(ranks=2, steps=6, sa_profile=False)
    run.write(tmp_path / "run")
    log = tmp_path / "run" / "server.log"
    lines = log.read_text().splitlines(keepends=True)
    # drop the last root of rank 1, as if the process died before the span closed
    last_root = max(i for i, line in enumerate(lines) if "pid=41001" in line and "depth=0" in line)
    log.write_text("".join(lines[:last_root] + lines[last_root + 1 :]))
    summary = analyze([tmp_path / "run"]).summary
    assert "1 invocations have spans but no chip.run root (torn or crashed run)" in summary["validation"]["problems"]
    assert summary["validation"]["steps_per_rank"] == {"0": 6, "1": 5}


def test_serving_trace_without_required_categories(tmp_path):
    run = SyntheticRun(ranks=2, steps=4)
    run.write(tmp_path / "run")
    path = tmp_path / "run" / "serving-trace" / "trace.json"
    data = json.loads(path.read_text())
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") != "scheduler"]
    path.write_text(json.dumps(data))
    summary = analyze([tmp_path / "run"]).summary
    assert "serving trace lacks categories: scheduler" in summary["validation"]["problems"]


def test_serving_figures_from_request_spans_when_no_performance_summary(tmp_path):
    run = SyntheticRun(ranks=2, steps=10, performance_summary=False, requests_per_rank=3, output_tokens=40)
    run.write(tmp_path / "run")
    serving = analyze([tmp_path / "run"]).summary["serving"]
    requests = [
        e for e in json.loads((tmp_path / "run" / "serving-trace" / "trace.json").read_text())["traceEvents"] if e.get("cat") == "request"
    ]
    elapsed_us = max(e["ts"] + e["dur"] for e in requests) - min(e["ts"] for e in requests)
    tokens = sum(e["args"]["output_tokens"] for e in requests)
    assert set(serving["sources"].values()) <= {"sa_profile request spans", "derived"}
    assert serving["tokens_returned"] == tokens == 6 * 40
    assert serving["tokens_expected"] == 6 * 40
    assert serving["batch_elapsed_s"] == round(elapsed_us / 1e6, 6)
    assert serving["throughput_tok_s"] == round(tokens / (elapsed_us / 1e6), 3)
    assert serving["effective_tpot_ms"] == round(elapsed_us / 1e3 / (tokens / 6), 3)


def test_serving_figures_from_performance_summary(tmp_path):
    run = SyntheticRun(ranks=2, steps=5)
    run.write(tmp_path / "run")
    summary = analyze([tmp_path / "run"]).summary
    written = json.loads((tmp_path / "run" / "performance_summary.json").read_text())
    for key in ("tokens_returned", "tokens_expected", "batch_elapsed_s", "throughput_tok_s", "effective_tpot_ms", "acceptance_rate"):
        assert summary["serving"][key] == written[key]
        assert summary["serving"]["sources"][key] == f"performance_summary.json:{key}"
    assert summary["workload"] == written["workload"] and summary["exit_status"] == 0


def test_no_decode_spans_still_yields_a_verdict(tmp_path):
    # one external span among unrelated text: something was read, but no runtime decode run
    ext = format_prefix(1, 1, "INFO", "ext") + format_strace_payload(
        pid=7, tid=7, inv=1, hid="ab", depth=0, name="ext.tool.step", ts_ns=10, dur_ns=5
    )
    (tmp_path / "server.log").write_text(f"[mono_ns=1][T0x1][INFO] boot: hello\nplain text\n{ext}\n")
    result = analyze([tmp_path / "server.log"], tmp_path / "out")
    summary = result.summary
    assert json.loads(result.outputs["combined-swimlane.json"].read_text())["traceEvents"] == []
    assert summary["validation"]["valid"] is False
    assert {"no decode steps found", "no rank roots"} <= set(summary["validation"]["problems"])
    assert summary["figures"]["runner_start_skew_ms"] == {"p50": None, "p95": None, "p99": None, "max": None, "count": 0}
    assert summary["pipeline"]["pairs_checked"] == 0


@pytest.mark.parametrize(
    "text, dropped",
    [
        ("[mono_ns=1][T0x1][INFO] boot: hello\nplain text\n", ""),
        ("[mono_ns=1][T0x1][INFO] f: [STRACE] v=1 pid=1 tid=1 inv=1 hid=ab depth=0 name=chip.r", "torn_record 1"),
    ],
)
def test_input_without_any_span_is_an_input_error(tmp_path, text, dropped):
    log = tmp_path / "server.log"
    log.write_text(text)
    with pytest.raises(InputError) as error:
        analyze([tmp_path], tmp_path / "out")
    assert str(error.value).startswith(f"{log}: no spans to analyse")
    assert dropped in str(error.value)
    assert not (tmp_path / "out").exists()


def test_other_producers_field_names_are_read_and_the_rest_comes_from_request_spans(tmp_path):
    """A performance_summary.json with common field names of other tools; missing figures fall back field by field."""
    run = SyntheticRun(ranks=2, steps=10, requests_per_rank=3, output_tokens=40)
    run.write(tmp_path / "run")
    (tmp_path / "run" / "performance_summary.json").write_text(
        json.dumps({"output_tokens": 240, "expected_output_tokens": 250, "batch_elapsed_seconds": 2.0})
    )
    serving = analyze([tmp_path / "run"]).summary["serving"]
    assert (serving["tokens_returned"], serving["tokens_expected"], serving["batch_elapsed_s"]) == (240, 250, 2.0)
    assert serving["throughput_tok_s"] == 120.0 and serving["sources"]["throughput_tok_s"] == "derived"
    assert serving["requests"] == 6 and serving["sources"]["requests"] == "sa_profile request spans"
    assert serving["effective_tpot_ms"] == round(2000 / (240 / 6), 3)
    assert serving["sources"]["tokens_returned"] == "performance_summary.json:output_tokens"


def test_conflicting_device_lines_and_shared_devices_are_invalid(tmp_path):
    SyntheticRun(ranks=2, steps=4).write(tmp_path / "run")
    log = tmp_path / "run" / "server.log"
    text = log.read_text().replace("[chip_process pid=41001 dev=npu:1]", "[chip_process pid=41001 dev=npu:0]")
    log.write_text(text + "[mono_ns=1][T0x1][INFO] chip_process: [chip_process pid=41000 dev=npu:7] ready\n")
    problems = analyze([tmp_path / "run"]).summary["validation"]["problems"]
    assert "pid 41000 announced 2 devices: npu:0, npu:7" in problems
    assert "ranks 0, 1 all run on device npu:0" in problems


def test_decode_roots_without_bind_children_are_analysed(tmp_path):
    SyntheticRun(ranks=2, steps=6).write(tmp_path / "run")
    log = tmp_path / "run" / "server.log"
    log.write_text("".join(line for line in log.read_text().splitlines(keepends=True) if "name=chip.run.bind" not in line))
    summary = analyze([tmp_path / "run"]).summary
    assert summary["figures"]["bind_ms"]["count"] == 0 and summary["figures"]["runner_start_skew_ms"]["count"] == 6
    assert summary["validation"]["valid"] is True
