"""Windows of a run (--steps, --since, --until): parsing, the cut by hand, pruned dataset reads, report and export.

"Cut by hand" is a log that holds every record of the window's invocations
(found here by parsing the text, not with dsprof) and nothing else of the
runtime: with the depth-2 pipeline a step's records straddle the next
step's, so a cut by byte range or by time would tear invocations apart.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner

from cli.main import cli
from dsprof.analysis import window_cut
from dsprof.analysis.ingest import read_paths
from dsprof.analysis.outputs.console import format_console_summary
from dsprof.analysis.store.dataset import SpanDatasetWriter, open_dataset
from dsprof.analysis.window import anchor_start_ns, parse_time, parse_window
from dsprof.analysis.window_cut import cut_trace
from dsprof.commands import analysis_job
from dsprof.commands.analysis_job import analyze_paths
from dsprof.errors import DsprofError
from dsprof.testing.synthetic import SyntheticRun

RANKS, STEPS = 3, 90
FIRST, LAST = 30, 59
# summary sections that are figures of the steps analysed (inputs and the serving block name files and counts read)
FIGURE_SECTIONS = ("figures", "per_step", "late_starts", "tail_steps", "slow_steps", "what_if", "trends", "tail_cost")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    fence = np.full((RANKS, STEPS), 2_000_000, dtype=np.int64)
    fence[1, [12, 31, 44, 59, 60, 77]] += 9_000_000  # tails inside, at the edges of and outside the window
    fence[2, [30, 58]] += 6_000_000
    return SyntheticRun(ranks=RANKS, steps=STEPS, fence_wait_ns=fence).write(tmp_path_factory.mktemp("windows") / "run")


def test_offsets_and_instants_parse_exactly():
    assert parse_time("+90s").offset_ns == 90 * 10**9
    assert parse_time("1h30m").offset_ns == 5400 * 10**9
    assert parse_time("+1.5s250ms").offset_ns == 1_750_000_000
    assert parse_time("2026-12-01T10:00:00Z").wall_ns == 1_796_119_200 * 10**9
    assert parse_time("2026-12-01T11:00:00.000000001+01:00").wall_ns == 1_796_119_200 * 10**9 + 1
    spec = parse_window("10:19", "+1s", "2026-12-01T10:00:00Z")
    assert spec is not None and spec.steps == (10, 19) and spec.since and spec.until
    assert parse_window() is None


@pytest.mark.parametrize(
    ("since", "until", "match"),
    [
        ("yesterday", None, "bad --since value"),
        ("2026-12-01T10:00:00", None, "bad --since value"),  # no zone: which clock is meant?
        ("+5", None, "bad --since value"),
        (None, "2026-13-01T10:00:00Z", "bad --until value"),
        ("+2m", "+1m", "not after"),
    ],
)
def test_bad_time_values_are_refused(since, until, match):
    with pytest.raises(DsprofError, match=match):
        parse_window(None, since, until)


def test_bad_window_is_one_line_and_exit_2(run, tmp_path):
    result = CliRunner().invoke(cli, ["analyze", str(run), "-o", str(tmp_path / "out"), "--since", "noon"])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "bad --since value 'noon'" in result.output
    assert not (tmp_path / "out").exists()


def test_a_wall_clock_window_needs_clock_anchors(tmp_path):
    SyntheticRun(ranks=2, steps=6, anchors=False, sa_profile=False).write(tmp_path / "run")
    with pytest.raises(DsprofError, match="no CLOCK_ANCHOR"):
        analyze_paths([tmp_path / "run"], None, window=parse_window(None, "2026-12-01T10:00:00Z"))


def _hand_cut(run: Path, out: Path, first: int, last: int) -> Path:
    """The run with its log cut by hand: every record of the invocations whose root has a step in first..last."""
    shutil.copytree(run, out)
    lines = (run / "server.log").read_text().splitlines(keepends=True)
    record = re.compile(r"\[STRACE\] .*?pid=(\d+) .*?inv=(\d+) .*?depth=(\d+) ")
    step_attr = re.compile(r" step=(-?\d+)")
    keep = set()
    for line in lines:
        found = record.search(line)
        step = step_attr.search(line)
        if found and found.group(3) == "0" and step and first <= int(step.group(1)) <= last:
            keep.add((found.group(1), found.group(2)))
    kept = [line for line in lines if not (m := record.search(line)) or (m.group(1), m.group(2)) in keep]
    (out / "server.log").write_text("".join(kept))
    return out


def _figures(summary: dict) -> dict:
    return {key: summary[key] for key in FIGURE_SECTIONS} | {"decode_steps": summary["validation"]["decode_steps"]}


def test_a_window_has_the_figures_of_the_same_steps_cut_by_hand(run, tmp_path):
    window = analyze_paths([run], None, window=parse_window(f"{FIRST}:{LAST}")).summary
    by_hand = analyze_paths([_hand_cut(run, tmp_path / "cut", FIRST, LAST)], None).summary
    assert [r["step"] for r in window["per_step"]] == list(range(FIRST, LAST + 1))
    assert _figures(window) == _figures(by_hand)
    assert {t["step"] for t in window["tail_steps"]["items"]} == {30, 31, 44, 58, 59}
    assert window["inputs"]["window"]["steps"] == [FIRST, LAST] and window["inputs"]["window"]["steps_by"] == "step attribute"
    assert window["validation"]["valid"], window["validation"]["problems"]


def _dataset_by_pieces(run: Path, out: Path, rows_per_piece: int) -> Path:
    """The run's span dataset written a log piece at a time, so that it has many row groups (as a long log has)."""
    trace = read_paths([run])
    writer = SpanDatasetWriter(out)
    for offset in range(0, trace.spans.num_rows, rows_per_piece):
        writer.add(trace.spans.slice(offset, rows_per_piece))
    trace.spans = trace.spans.slice(0, 0)
    writer.finish(trace)
    return out


@pytest.mark.slow
def test_a_dataset_window_reads_few_row_groups_and_gives_the_same_figures(tmp_path):
    fence = np.full((2, 500), 2_000_000, dtype=np.int64)
    fence[0, [250, 262, 279]] += 9_000_000
    run = SyntheticRun(ranks=2, steps=500, fence_wait_ns=fence, sa_worker_spans=False).write(tmp_path / "run")
    dataset = _dataset_by_pieces(run, tmp_path / "spans", rows_per_piece=250)
    spec = parse_window("250:279")
    assert spec is not None
    _, _, facts = cut_trace(open_dataset(dataset), spec)
    assert facts.row_groups > 30 and facts.row_groups_read < facts.row_groups / 2 and facts.invocations == 60
    from_dataset = analyze_paths([dataset], None, window=spec).summary
    from_log = analyze_paths([run], None, window=spec).summary
    assert [r["step"] for r in from_dataset["per_step"]] == list(range(250, 280))
    assert _figures(from_dataset) == _figures(from_log)
    assert from_dataset["inputs"]["window"] == from_log["inputs"]["window"]
    starts, run_start, _ = _root_starts(run)
    timed = parse_window(None, f"+{starts[250] - run_start}ns", f"+{starts[280] - run_start}ns")
    assert timed is not None
    _, _, facts = cut_trace(open_dataset(dataset), timed)
    assert facts.row_groups_read < facts.row_groups / 2 and facts.invocations == 60
    by_time = analyze_paths([dataset], None, window=timed).summary
    assert _figures(by_time) == _figures(analyze_paths([run], None, window=timed).summary) == _figures(from_log)


def _root_starts(run: Path) -> tuple[dict[int, int], int, int]:
    """step -> earliest root start (host ns) of the decode steps, the run's start and the anchors' wall − mono."""
    return _root_starts_of(read_paths([run]))


def _root_starts_of(trace) -> tuple[dict[int, int], int | None, int | None]:
    spans = trace.spans
    roots = spans.filter(pc.and_(pc.equal(spans.column("depth"), 0), pc.is_valid(spans.column("step"))))
    starts: dict[int, int] = {}
    for step, ts in zip(roots.column("step").to_pylist(), roots.column("ts_ns").to_pylist(), strict=True):
        starts[step] = min(ts, starts.get(step, ts))
    anchors = trace.anchors
    if not anchors.num_rows:
        return starts, None, None
    offset = anchors.column("wall_ns")[0].as_py() - anchors.column("mono_ns")[0].as_py()
    return starts, anchor_start_ns(anchors), offset


def _iso(wall_ns: int) -> str:
    seconds, fraction = divmod(wall_ns, 10**9)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{fraction:09d}Z"


@pytest.mark.slow
def test_time_windows_by_offset_and_by_wall_clock_agree(run):
    starts, run_start, offset = _root_starts(run)
    since, until = starts[FIRST], starts[LAST + 1]
    by_offset = analyze_paths([run], None, window=parse_window(None, f"+{since - run_start}ns", f"+{until - run_start}ns")).summary
    by_clock = analyze_paths([run], None, window=parse_window(None, _iso(since + offset), _iso(until + offset))).summary
    by_steps = analyze_paths([run], None, window=parse_window(f"{FIRST}:{LAST}")).summary
    assert [r["step"] for r in by_offset["per_step"]] == list(range(FIRST, LAST + 1))
    assert _figures(by_offset) == _figures(by_clock) == _figures(by_steps)
    assert by_offset["inputs"]["window"]["host_ns"] == [since, until] == by_clock["inputs"]["window"]["host_ns"]
    both = analyze_paths([run], None, window=parse_window(f"{FIRST - 10}:{FIRST + 4}", f"+{since - run_start}ns")).summary
    assert [r["step"] for r in both["per_step"]] == list(range(FIRST, FIRST + 5))


def test_a_window_that_cuts_steps_keeps_whole_steps_with_the_runs_own_numbers_and_figures(tmp_path):
    """Ranks start 1 ms apart, so a bound 0.5 ms after a step's first start cuts it: it is left out whole."""
    fence = np.full((RANKS, STEPS), 2_000_000, dtype=np.int64)
    fence[1, [31, 44, 59]] += 9_000_000
    offsets = np.arange(RANKS, dtype=np.int64)[:, None] * 1_000_000
    run = SyntheticRun(ranks=RANKS, steps=STEPS, fence_wait_ns=fence, bind_start_offset_ns=offsets).write(tmp_path / "run")
    starts, run_start, _ = _root_starts(run)
    whole = analyze_paths([run], None).summary
    window = analyze_paths(
        [run], None, window=parse_window(None, f"+{starts[FIRST] + 500_000 - run_start}ns", f"+{starts[LAST + 1] + 500_000 - run_start}ns")
    ).summary
    validation = window["validation"]
    assert validation["valid"], validation["problems"]
    assert validation["step_numbering"] == "producer" and window["inputs"]["window"]["partial_steps_left_out"] == 2
    kept = [r["step"] for r in window["per_step"]]
    assert kept == list(range(FIRST + 1, LAST + 1))  # steps FIRST and LAST + 1 were cut; the rest keep their numbers
    by_step = {r["step"]: r for r in whole["per_step"]}
    for row in window["per_step"]:  # each step's figures are the whole run's (the first has no predecessor: no interval)
        assert {k: v for k, v in row.items() if k != "interval_ms"} == {k: v for k, v in by_step[row["step"]].items() if k != "interval_ms"}
        assert row["interval_ms"] == (None if row["step"] == FIRST + 1 else by_step[row["step"]]["interval_ms"])
    assert {t["step"] for t in window["tail_steps"]["items"]} == {31, 44, 59}
    # steps keep the grid: only the fault in the window's last step (nothing after it) can shorten its decode wall
    assert whole["what_if"]["total_saved_ms"] == 0.0 and 0 < window["what_if"]["total_saved_ms"] <= 9.0
    assert "2 steps it cut left out whole" in format_console_summary(window)


@pytest.mark.slow
def test_report_and_export_draw_only_the_window(run, tmp_path):
    out = tmp_path / "out"
    analyze_paths([run], out)
    runner = CliRunner()
    trace_path = tmp_path / "window.json"
    inputs = ["--inputs", str(run)]  # the inputs lie outside the analysed directory
    result = runner.invoke(cli, ["export", str(out), "-o", str(trace_path), *inputs, "--steps", f"{FIRST}:{LAST}"])
    assert result.exit_code == 0, result.output
    assert "drawing only the window steps 30:59" in result.output
    trace = json.loads(trace_path.read_text())
    assert trace["otherData"]["window"]["steps"] == [FIRST, LAST]
    runtime = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "phase" in (e.get("args") or {})]
    steps = {e["args"]["step"] for e in runtime if e["args"].get("step") is not None}
    assert steps and min(steps) == FIRST and max(steps) == LAST
    whole = json.loads((out / "combined-swimlane.json").read_text())
    assert len(trace["traceEvents"]) < len(whole["traceEvents"]) / 2
    result = runner.invoke(cli, ["report", str(out), "-o", str(tmp_path / "r.html"), "--until", "+1s", "--since", "+2s"])
    assert result.exit_code == 2 and "not after" in result.output
    result = runner.invoke(cli, ["report", str(out), "-o", str(tmp_path / "r.html"), *inputs, "--steps", f"{FIRST}:{LAST}"])
    assert result.exit_code == 0, result.output
    assert "Swimlane drawn for the window steps 30:59 only." in (tmp_path / "r.html").read_text()


def test_a_wide_window_is_cut_to_disk_with_the_same_figures(run, tmp_path, monkeypatch):
    spec = parse_window(f"{FIRST}:{LAST}")
    in_memory = analyze_paths([run], None, window=spec).summary
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(window_cut, "IN_MEMORY_ROWS", 100)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    dataset = _dataset_by_pieces(run, tmp_path / "spans", rows_per_piece=250)
    cut, _, facts = cut_trace(open_dataset(dataset), spec)
    assert facts.spill is not None and cut.span_files and cut.spans.num_rows == 0
    shutil.rmtree(facts.spill)
    on_disk = analyze_paths([dataset], None, window=spec).summary
    assert _figures(on_disk) == _figures(in_memory)
    assert not [p for p in scratch.iterdir() if p.name.startswith(window_cut.SPILL_PREFIX)]


def test_a_big_log_read_through_a_temporary_dataset_is_cut_before_the_figures(run, monkeypatch):
    spec = parse_window(f"{FIRST}:{LAST}")
    in_memory = analyze_paths([run], None, window=spec).summary
    monkeypatch.setattr(analysis_job, "SPILL_BYTES", 0)  # every log goes to a temporary span dataset
    spilled = analyze_paths([run], None, window=spec)
    assert spilled.result.trace.span_files == [] and spilled.summary["inputs"]["spans"] == in_memory["inputs"]["spans"]
    assert _figures(spilled.summary) == _figures(in_memory)


@pytest.mark.parametrize("options", [["--steps", "500:600"], ["--since", "+10m"], ["--until", "+1ns"]])
def test_a_window_with_no_run_is_one_line_and_exit_2(run, tmp_path, options):
    result = CliRunner().invoke(cli, ["analyze", str(run), "-o", str(tmp_path / "out"), *options])
    last = result.output.strip().splitlines()[-1]  # after the reading progress
    assert result.exit_code == 2 and last.startswith("dsprof: error: ") and "no run of the trace lies in the window" in last


def test_the_ray_engine_takes_no_window(run):
    with pytest.raises(DsprofError, match="need --engine embedded"):
        analyze_paths([run], None, engine="ray", window=parse_window("1:2"))


def test_mixed_bounds_out_of_order_on_the_trace_clock_are_refused(run):
    _, run_start, offset = _root_starts(run)
    with pytest.raises(DsprofError, match="not after --since '\\+1s' on the trace's clock"):
        analyze_paths([run], None, window=parse_window(None, "+1s", _iso(run_start + offset)))


def test_without_step_attributes_steps_count_by_position(tmp_path):
    SyntheticRun(ranks=2, steps=20, root_attrs=False).write(tmp_path / "run")
    summary = analyze_paths([tmp_path / "run"], None, window=parse_window("5:9")).summary
    assert summary["inputs"]["window"]["steps_by"] == "position" and summary["validation"]["step_numbering"] == "position"
    assert [r["step"] for r in summary["per_step"]] == [5, 6, 7, 8, 9]


def test_a_report_of_a_windowed_analysis_draws_its_window(run, tmp_path):
    out = tmp_path / "out"
    analyze_paths([run], out, window=parse_window(f"{FIRST}:{LAST}"))
    result = CliRunner().invoke(cli, ["export", str(out), "-o", str(tmp_path / "t.json"), "--inputs", str(run)])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["window"]["steps"] == [FIRST, LAST]


def test_every_output_states_the_window(run, tmp_path):
    outcome = analyze_paths([run], tmp_path / "out", window=parse_window(f"{FIRST}:{LAST}", "+0s"))
    stated = "steps 30:59, since +0s only (figures of this window of the run)"
    assert stated in (tmp_path / "out" / "summary.md").read_text()
    assert stated in (tmp_path / "out" / "report.html").read_text()
    assert stated in format_console_summary(outcome.summary)
    assert "window" not in analyze_paths([run], None).summary["inputs"]


def test_offsets_without_clock_anchors_count_from_the_earliest_host_span(tmp_path):
    SyntheticRun(ranks=2, steps=20, anchors=False, sa_profile=False).write(tmp_path / "run")
    starts, _, _ = _root_starts_of(read_paths([tmp_path / "run"]))
    first = min(starts.values())
    summary = analyze_paths(
        [tmp_path / "run"], None, window=parse_window(None, f"+{starts[5] - first}ns", f"+{starts[10] - first}ns")
    ).summary
    assert summary["inputs"]["window"]["run_start_ns"] == first and [r["step"] for r in summary["per_step"]] == [5, 6, 7, 8, 9]
