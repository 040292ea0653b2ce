"""The Kineto reader on small hand-written per-rank traces whose answers are known (no torch)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.ingest import kineto, read_paths
from dsprof.analysis.ingest.kineto import ACTIVITY, BETWEEN_OPS, COMPUTE, HOST_GAP, SHARED_PID_BASE, read_kineto_traces
from dsprof.analysis.store.spans import SPAN_SCHEMA
from dsprof.cli.main import cli
from dsprof.commands.report import export_from_dir
from dsprof.profiler import strace_format as fmt
from dsprof.profiler import torch_labels

BASE_NS = 1_000_000_000_000
A2A = f"{fmt.DEVICE_WALL}.ncclDevKernel_AllToAll{fmt.WAIT_SUFFIX}"


def _x(name: str, cat: str, ts: float, dur: float, tid: int = 1, **args) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 10, "tid": tid, "args": args}


def _kernel(name: str, ts: float, dur: float, correlation: int, launch_ts: float) -> list[dict]:
    cat = "gpu_memcpy" if name == "memcpy" else "gpu_memset" if name == "memset" else "kernel"
    return [
        _x("cudaLaunchKernel", "cuda_runtime", launch_ts, 1, correlation=correlation),
        _x(name, cat, ts, dur, tid=7, correlation=correlation, stream=7),
    ]


def rank_events(rank: int) -> list[dict]:
    """Two ProfilerSteps; rank 1 reaches both all-to-alls last. Times in µs from the base."""
    shift = 2 * rank
    events = [
        _x("ProfilerStep#1", "user_annotation", 0 + shift, 100),
        _x("ProfilerStep#2", "user_annotation", 100 + shift, 100),
        _x("nccl:all_to_all", "user_annotation", 8 + shift, 3),  # the kernel is preferred: one record per call
        {"ph": "s", "id": 1, "pid": 10, "tid": 1, "ts": 5, "name": "ac2g", "cat": "ac2g"},
        *_kernel("early", -5, 3, 99, -10),  # launched before the first step: left out
    ]
    if rank == 0:
        events += _kernel("gemm", 10, 30, 1, 5) + _kernel("gemm2", 30, 20, 2, 6) + _kernel("memcpy", 45, 10, 3, 7)
        events += _kernel("ncclDevKernel_AllToAll(int)", 60, 30, 4, 8)
        events += _kernel("gemm", 110, 20, 5, 102) + _kernel("ncclDevKernel_AllToAll(int)", 140, 40, 6, 103)
        events += _kernel("memset", 185, 5, 7, 104)
    else:
        events += _kernel("gemm", 12, 50, 1, 6) + _kernel("ncclDevKernel_AllToAll(int)", 70, 20, 4, 8)
        events += _kernel("gemm", 105, 40, 5, 103) + _kernel("ncclDevKernel_AllToAll(int)", 150, 30, 6, 104)
    return events


def write_rank(directory: Path, rank: int, *, name: str | None = None, gz: bool = False, info: bool = True, extra=()) -> Path:
    document = {
        "schemaVersion": 1,
        "deviceProperties": [],
        **({"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2}} if info else {}),
        "host_name": "h0",
        "baseTimeNanoseconds": BASE_NS,
        "traceEvents": rank_events(rank) + list(extra),
    }
    path = directory / (name or f"rank{rank}.json{'.gz' if gz else ''}")
    text = json.dumps(document).encode()
    path.write_bytes(gzip.compress(text) if gz else text)
    return path


def rows(trace, name: str) -> list[dict]:
    spans = trace.spans
    return spans.filter(pc.equal(spans.column("name"), name)).to_pylist()


def test_runs_collectives_and_peers(tmp_path):
    trace = read_kineto_traces([write_rank(tmp_path, 0), write_rank(tmp_path, 1, gz=True)])
    roots = rows(trace, fmt.ROOT)
    assert [(r["rank"], r["step"], r["ts_ns"], r["dur_ns"]) for r in roots] == [
        (0, 1, BASE_NS, 100_000),
        (0, 2, BASE_NS + 100_000, 100_000),
        (1, 1, BASE_NS + 2_000, 100_000),
        (1, 2, BASE_NS + 102_000, 100_000),
    ]
    assert {r["callable"] for r in roots} == {"ProfilerStep"}
    waits = rows(trace, A2A)
    # offsets from each step's start; the last arrival (rank 1) is every instance's peer
    assert [(w["ts_ns"], w["dur_ns"], dict(w["attrs"])) for w in waits] == [
        (60_000, 30_000, {"peer": "1", "instance": "1"}),
        (40_000, 40_000, {"peer": "1", "instance": "2"}),
        (68_000, 20_000, {"peer": "1", "instance": "1"}),
        (48_000, 30_000, {"peer": "1", "instance": "2"}),
    ]
    assert not rows(trace, f"{fmt.DEVICE_WALL}.nccl:all_to_all{fmt.WAIT_SUFFIX}")
    # compute: the union of the computation kernels in the step; host gap: the step less compute and collectives
    assert [r["dur_ns"] for r in rows(trace, COMPUTE)] == [40_000, 20_000, 50_000, 40_000]
    assert [r["dur_ns"] for r in rows(trace, HOST_GAP)] == [100_000 - 40_000 - 30_000, 100_000 - 20_000 - 40_000, 30_000, 30_000]
    kinds = [r["name"].rsplit(".", 1)[1] for r in trace.spans.to_pylist() if r["name"].startswith(ACTIVITY)]
    assert sorted(kinds) == sorted(["compute"] * 5 + ["communication"] * 4 + ["memory"] * 2)  # "early" left out
    assert trace.dropped == {}


def test_directory_and_summary(tmp_path):
    write_rank(tmp_path, 0)
    write_rank(tmp_path, 1, name="worker1.pt.trace.json.gz", gz=True)
    summary = analyze_trace(read_paths([tmp_path])).summary
    assert summary["validation"]["valid"], summary["validation"]
    assert summary["figures"]["runner_start_skew_ms"]["max"] == 0.002
    assert summary["figures"]["step_interval_ms"]["max"] == 0.1
    assert summary["figures"]["validate_ms"]["count"] == 0 and summary["figures"]["bind_ms"]["count"] == 0


def test_damage_rank_order_and_step_marker(tmp_path):
    bad = [{"ph": "X", "name": "no_ts", "pid": 10, "tid": 1, "dur": 3}]
    marker = [_x("decode_step", "user_annotation", 0, 100), _x("decode_step", "user_annotation", 100, 100)]
    paths = [write_rank(tmp_path, r, info=False, extra=bad + marker) for r in (0, 1)]
    trace = read_paths(paths, step_marker="decode_step")
    assert trace.dropped == {"bad_event": 2}
    assert any("ranks from the order of the files" in note for note in trace.notes)
    roots = rows(trace, fmt.ROOT)
    assert [(r["rank"], r["step"], r["callable"]) for r in roots] == [
        (0, 0, "decode_step"),
        (0, 1, "decode_step"),
        (1, 0, "decode_step"),
        (1, 1, "decode_step"),
    ]


def test_not_kineto_stays_chrome(tmp_path):
    path = tmp_path / "plain.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [_x("a", "x", 0, 1)]}))
    trace = read_paths([path])
    assert trace.spans.column("source").to_pylist() == ["chrome"]


def test_directory_of_nothing_is_refused(tmp_path):
    (tmp_path / "notes.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(Exception, match="directory holds no dsprof inputs"):
        read_paths([tmp_path])


def test_device_time_breakdown(tmp_path):
    """Rank 0's kernels [10,40] [30,50] compute, [45,55] memcpy, [60,90] all-to-all | [110,130] compute, [140,180] a2a, [185,190] memset."""
    write_rank(tmp_path, 0)
    write_rank(tmp_path, 1)
    device_time = analyze_trace(read_paths([tmp_path])).summary["device_time"]
    # span 10..190; busy: 45 + 30 + 20 + 40 + 5; compute: 40 + 20
    assert device_time["ranks"]["0"] == {"span_ms": 0.18, "busy_ms": 0.14, "idle_ms": 0.04, "compute_ms": 0.06, "non_compute_ms": 0.08}
    # rank 1: [12,62] compute, [70,90] a2a | [105,145] compute, [150,180] a2a
    assert device_time["ranks"]["1"] == {"span_ms": 0.168, "busy_ms": 0.14, "idle_ms": 0.028, "compute_ms": 0.09, "non_compute_ms": 0.05}
    steps = {(row["step"], row["rank"]): row for row in device_time["per_step"]}
    assert list(steps) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert steps[(1, 0)] == {
        "step": 1,
        "rank": 0,
        "span_ms": 0.08,
        "busy_ms": 0.075,
        "idle_ms": 0.005,
        "compute_ms": 0.04,
        "non_compute_ms": 0.035,
    }
    assert steps[(2, 0)] == {
        "step": 2,
        "rank": 0,
        "span_ms": 0.08,
        "busy_ms": 0.065,
        "idle_ms": 0.015,
        "compute_ms": 0.02,
        "non_compute_ms": 0.045,
    }


def test_no_device_activity_no_breakdown(tmp_path):
    steps = [_x("ProfilerStep#1", "user_annotation", 0, 100), _x("aten::mm", "cpu_op", 10, 20)]
    for rank in (0, 1):
        document = {"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": steps}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(document))
    summary = analyze_trace(read_paths([tmp_path])).summary
    assert "device_time" not in summary  # absent, never zero


def test_analyze_command_takes_the_step_marker(tmp_path):
    marker = [_x("decode_step", "user_annotation", 0, 100), _x("decode_step", "user_annotation", 100, 100)]
    for rank in (0, 1):
        write_rank(tmp_path, rank, extra=marker)
    result = CliRunner().invoke(cli, ["analyze", str(tmp_path), "--step-marker", "decode_step", "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [row["step"] for row in summary["per_step"]] == [0, 1]


def test_report_and_perfetto_export_of_a_kineto_job(tmp_path):
    for rank in (0, 1):
        write_rank(tmp_path, rank)  # both files' pid is 10: the runs take distinct int32 pids
    runner = CliRunner()
    assert runner.invoke(cli, ["analyze", str(tmp_path)]).exit_code == 0
    result = runner.invoke(cli, ["export", str(tmp_path), "-o", str(tmp_path / "job.pftrace")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "job.pftrace").stat().st_size > 0 and (tmp_path / "report.html").is_file()
    # its device-time breakdown and kernel activities overlap without nesting: no track can hold them, so the
    # export leaves them out (report.html draws them)
    events = json.loads(export_from_dir(tmp_path, tmp_path / "job.json").read_text())["traceEvents"]
    assert [e for e in events if e["ph"] == "X"] and not [e for e in events if e.get("cat") == "device"]


def test_the_same_traces_read_twice_give_the_same_rows(tmp_path):
    paths = [write_rank(tmp_path, 0), write_rank(tmp_path, 1)]
    assert read_kineto_traces(paths).spans.equals(read_kineto_traces(list(reversed(paths))).spans)


def _pipelined_rank(directory: Path, rank: int) -> Path:
    """The bundled runtime's shape: steps overlap on the host thread (1); the device programs run on an executor
    thread (2), labelled with their step (the prefill's without); the collectives on a gloo thread (3). µs."""
    program = torch_labels.PROGRAM
    late = 20 * rank  # rank 1 reaches the second all-to-all last
    events = [
        _x("ProfilerStep#0", "user_annotation", 0, 100),
        _x("ProfilerStep#1", "user_annotation", 60, 140),
        _x("aten::copy_", "cpu_op", 65, 10),  # the host binds the next run: no device work
        _x(program, "user_annotation", -20, 25, tid=2),  # the prefill: no step of its own
        _x("aten::mm", "cpu_op", -15, 15, tid=2),
        _x(torch_labels.step_label(program, 0), "user_annotation", 5, 85, tid=2),
        _x("aten::mm", "cpu_op", 10, 20, tid=2),
        _x("aten::mm", "cpu_op", 50, 20, tid=2),
        _x(torch_labels.step_label(program, 1), "user_annotation", 92, 88, tid=2),
        _x("aten::mm", "cpu_op", 95, 30, tid=2),
        _x("gloo:all_to_all", "user_annotation", 32 + rank, 13 - rank, tid=3),
        _x("gloo:all_to_all", "user_annotation", 130 + late, 40 - late, tid=3),
    ]
    document = {
        "distributedInfo": {"rank": rank, "world_size": 2},
        "host_name": "h0",
        "baseTimeNanoseconds": BASE_NS,
        "traceEvents": events,
    }
    path = directory / f"rank{rank}.json"
    path.write_text(json.dumps(document))
    return path


def test_device_programs_of_overlapping_steps(tmp_path):
    """A step's device timeline is its numbered program: its ops, and the collectives inside it, whatever the host did."""
    trace = read_kineto_traces([_pipelined_rank(tmp_path, r) for r in (0, 1)])
    rank0 = [r for r in trace.spans.to_pylist() if r["pid"] == SHARED_PID_BASE]
    by_step = {(r["inv"], r["name"]): r for r in rank0}
    assert [(r["step"], r["ts_ns"], r["dur_ns"]) for r in rank0 if r["name"] == fmt.ROOT] == [
        (0, BASE_NS, 100_000),
        (1, BASE_NS + 60_000, 140_000),
    ]
    # device_wall: the program, from the step's start
    assert [(by_step[(i, fmt.DEVICE_WALL)]["ts_ns"], by_step[(i, fmt.DEVICE_WALL)]["dur_ns"]) for i in (1, 2)] == [
        (5_000, 85_000),
        (32_000, 88_000),
    ]
    # compute: the executor's ops in the program (not the host's copy, not the prefill's mm)
    assert [(by_step[(i, COMPUTE)]["ts_ns"], by_step[(i, COMPUTE)]["dur_ns"]) for i in (1, 2)] == [(10_000, 40_000), (35_000, 30_000)]
    wait = f"{fmt.DEVICE_WALL}.gloo:all_to_all{fmt.WAIT_SUFFIX}"
    assert [(by_step[(i, wait)]["ts_ns"], by_step[(i, wait)]["dur_ns"], dict(by_step[(i, wait)]["attrs"])) for i in (1, 2)] == [
        (32_000, 13_000, {"peer": "1", "instance": "1"}),
        (70_000, 40_000, {"peer": "1", "instance": "2"}),
    ]
    # the program's outermost ops are the CPU device's activities
    activities = [(r["inv"], r["ts_ns"], r["dur_ns"]) for r in rank0 if r["name"] == f"{ACTIVITY}.compute"]
    assert activities == [(1, 10_000, 20_000), (1, 50_000, 20_000), (2, 35_000, 30_000)]
    # between the ops: the program less compute and collectives (the device's own time, no host gap)
    assert [by_step[(i, BETWEEN_OPS)]["dur_ns"] for i in (1, 2)] == [85_000 - 40_000 - 13_000, 88_000 - 30_000 - 40_000]
    assert (1, HOST_GAP) not in by_step
    summary = analyze_trace(trace).summary
    assert summary["validation"]["valid"], summary["validation"]
    assert summary["pipeline"]["serialized"] is None  # no bind phase: no verdict on the overlap


def test_cuda_programs_assign_kernels_by_their_launch(tmp_path):
    """On CUDA the program's label is the host's enqueue: its kernels (by their launch) are the step's, and the device
    timeline spans the step, not the label."""
    program = torch_labels.PROGRAM
    paths = []
    for rank in (0, 1):
        events = [
            _x("ProfilerStep#0", "user_annotation", 0, 100),
            _x("ProfilerStep#1", "user_annotation", 60, 140),
            _x(torch_labels.step_label(program, 0), "user_annotation", 1, 4),
            _x(torch_labels.step_label(program, 1), "user_annotation", 61, 4),
            *_kernel("gemm", 10, 40, 1, 2),
            *_kernel("gemm", 70, 80, 2, 62),  # runs into step 1's overlap with step 0: still step 1's
        ]
        document = {"distributedInfo": {"rank": rank, "world_size": 2}, "baseTimeNanoseconds": BASE_NS, "traceEvents": events}
        paths.append(tmp_path / f"rank{rank}.json")
        paths[-1].write_text(json.dumps(document))
    trace = read_kineto_traces(paths)
    rank0 = [r for r in trace.spans.to_pylist() if r["pid"] == SHARED_PID_BASE]
    assert [(r["inv"], r["ts_ns"], r["dur_ns"]) for r in rank0 if r["name"] == fmt.DEVICE_WALL] == [(1, 0, 100_000), (2, 0, 140_000)]
    assert [(r["inv"], r["ts_ns"], r["dur_ns"]) for r in rank0 if r["name"] == COMPUTE] == [(1, 10_000, 40_000), (2, 10_000, 80_000)]
    assert [(r["inv"], r["dur_ns"]) for r in rank0 if r["name"] == HOST_GAP] == [(1, 60_000), (2, 60_000)]
    assert not [r for r in rank0 if r["name"] == BETWEEN_OPS]


def test_rows_handed_to_a_sink_in_chunks_are_the_rows_read_into_memory(tmp_path, monkeypatch):
    """Out of core (``analyze`` of a big job, ``ingest``): the same rows, a chunk at a time, and no spill folder left."""
    paths = [write_rank(tmp_path, 0), write_rank(tmp_path, 1)]
    in_memory = read_kineto_traces(paths).spans
    made: list[Path] = []
    own_folder = kineto.make_owned_dir
    monkeypatch.setattr(kineto, "make_owned_dir", lambda prefix: made.append(own_folder(prefix, tmp_path)) or made[-1])
    monkeypatch.setattr(kineto, "ROWS_PER_CHUNK", 3)
    chunks: list[pa.Table] = []
    sink = type("ListSink", (), {"add": lambda self, table: chunks.append(table)})()
    trace = read_kineto_traces(paths, sink=sink)
    assert trace.spans.num_rows == 0 and trace.spans_written == {kineto.SOURCE: in_memory.num_rows}
    assert len(chunks) > len(paths) and max(c.num_rows for c in chunks) <= 3
    assert pa.concat_tables([c.cast(SPAN_SCHEMA) for c in chunks]).equals(in_memory)
    assert made and not made[0].exists()
