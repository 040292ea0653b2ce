"""Kineto traces beside a STRACE log (analysis/ingest/kineto_join.py), on a synthetic run whose answers are known (no torch).

Each rank's Kineto trace is written on Unix time, as torch 2.13 writes it: the
STRACE runner_run start mapped by the rank's CLOCK_ANCHOR, plus a known lag
(the label opens after the STRACE mark), with a device program and its op.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.ingest import read_paths
from dsprof.analysis.ingest.kineto import ACTIVITY, COMPUTE
from dsprof.analysis.store.dataset import open_dataset
from dsprof.commands.ingest import ingest_paths
from dsprof.profiler import artifacts, torch_labels
from dsprof.profiler import strace_format as fmt
from dsprof.testing.synthetic import SyntheticRun

RANKS, STEPS = 2, 4
LAG_NS = 3_000  # the Kineto step opens (and closes) this long after the STRACE marks
PROGRAM_AT_NS, PROGRAM_NS, OP_AT_NS, OP_NS = 1_000_000, 5_000_000, 1_500_000, 2_000_000


def _write_kineto(run: Path, skew_ns: int = 0) -> None:
    """One trace per rank of the STRACE run's decode steps; ``skew_ns`` moves a rank's clock off its anchor."""
    trace = read_paths([run / artifacts.SERVER_LOG])
    rows = trace.spans.to_pylist()
    offset = {a["pid"]: a["wall_ns"] - a["mono_ns"] for a in trace.anchors.to_pylist()}
    roots = {(r["pid"], r["inv"]): r for r in rows if r["name"] == fmt.ROOT and r["step"] is not None and r["step"] >= 0}
    folder = run / artifacts.TORCH_PROFILER_DIR
    folder.mkdir()
    for rank in range(RANKS):
        runners = [(roots[(r["pid"], r["inv"])]["step"], r) for r in rows if r["name"] == fmt.RUNNER_RUN and (r["pid"], r["inv"]) in roots]
        mine = [(step, r) for step, r in runners if roots[(r["pid"], r["inv"])]["rank"] == rank]
        base = offset[mine[0][1]["pid"]] + mine[0][1]["ts_ns"] - 1_000_000_000 + skew_ns * rank

        def us(ns: int, base: int = base) -> float:
            return (ns - base) / 1000

        events = []
        for step, r in mine:
            start = r["ts_ns"] + offset[r["pid"]] + skew_ns * rank
            events += [
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"ProfilerStep#{step}",
                    "pid": 1,
                    "tid": 1,
                    "ts": us(start + LAG_NS),
                    "dur": r["dur_ns"] / 1000,
                },
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": torch_labels.step_label(torch_labels.PROGRAM, step),
                    "pid": 1,
                    "tid": 2,
                    "ts": us(start + PROGRAM_AT_NS),
                    "dur": PROGRAM_NS / 1000,
                },
                {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": us(start + OP_AT_NS), "dur": OP_NS / 1000},
            ]
        document = {
            "distributedInfo": {"rank": rank, "world_size": RANKS},
            "host_name": "h",
            "baseTimeNanoseconds": base,
            "traceEvents": events,
        }
        (folder / artifacts.torch_profile_name(rank)).write_text(json.dumps(document))


@pytest.mark.slow
@pytest.mark.parametrize("device_phases", [False, True])
def test_kineto_joins_the_strace_runs_on_their_clock(tmp_path, device_phases):
    run = SyntheticRun(ranks=RANKS, steps=STEPS, device_phases=device_phases, sa_profile=False).write(tmp_path / "run")
    _write_kineto(run)
    trace = read_paths([run])
    joined = trace.spans.filter(pc.equal(trace.spans.column("source"), "kineto")).to_pylist()
    assert not [r for r in joined if r["clk"] != fmt.CLK_DEVICE]  # no Kineto run of its own: the device timeline only
    strace_runs = {(r["pid"], r["inv"]) for r in trace.spans.to_pylist() if r["name"] == fmt.ROOT and r["source"] == "strace"}
    activities = [r for r in joined if r["name"] == f"{ACTIVITY}.compute"]
    assert len(activities) == RANKS * STEPS and {(r["pid"], r["inv"]) for r in activities} <= strace_runs
    # placed from the STRACE runner_run start, on the STRACE clock (the label's lag is no part of it)
    assert {r["ts_ns"] for r in activities} == {OP_AT_NS}
    walls = [r for r in joined if r["name"] == fmt.DEVICE_WALL]
    if device_phases:  # the run has its own device timeline: only the activities join it
        assert not walls and not [r for r in joined if r["name"] == COMPUTE]
    else:
        assert {(r["ts_ns"], r["dur_ns"]) for r in walls} == {(PROGRAM_AT_NS, PROGRAM_NS)} and len(walls) == RANKS * STEPS
    notes = [n for n in trace.notes if n.startswith("Kineto")]
    assert f"{RANKS * STEPS} of {RANKS * STEPS} Kineto steps matched" in notes[0]
    assert all("from its CLOCK_ANCHOR" in n and f"start residual median {LAG_NS} ns" in n for n in notes[1:]), notes
    summary = analyze_trace(trace).summary
    assert summary["validation"]["valid"] and summary["figures"]["root_ms"]["count"] == RANKS * STEPS  # no second set of runs
    # a span dataset (the STRACE rows handed to a sink as they are read) gets the same rows
    ingest_paths([run], tmp_path / "dataset")
    assert analyze_trace(open_dataset(tmp_path / "dataset")).summary["device_time"] == summary["device_time"]


def test_a_clock_off_its_anchor_is_taken_from_the_spans(tmp_path):
    run = SyntheticRun(ranks=RANKS, steps=STEPS, device_phases=False, sa_profile=False).write(tmp_path / "run")
    _write_kineto(run, skew_ns=50_000_000)  # rank 1's profiler clock 50 ms off its anchor
    notes = [n for n in read_paths([run]).notes if n.startswith("Kineto clock")]
    assert "from its CLOCK_ANCHOR" in notes[0] and "from the runner_run spans (no usable CLOCK_ANCHOR)" in notes[1], notes
    assert "start residual median 0 ns" in notes[1]  # the spans' own lag is taken for the clock
