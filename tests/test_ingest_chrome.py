"""SA_PROFILE fragments / merged traces and generic Chrome / Kineto JSON, with hand-known answers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dsprof.analysis.ingest import read_chrome_trace, read_paths, read_sa_profile
from dsprof.errors import InputError


def fragment_events(pid: int) -> list[dict]:
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"worker-{pid}"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": 7, "args": {"name": "scheduler"}},
        {"name": "request", "cat": "request", "ph": "X", "ts": 1_000, "dur": 250, "pid": pid, "tid": 7, "args": {"request_id": "r-1", "tokens": 256, "meta": {"a": [1, 2]}, "ok": True}},
        {"name": "kernel.decode_fwd", "cat": "kernel", "ph": "X", "ts": 1_010, "dur": 3, "pid": pid, "tid": 7, "args": {}},
        {"name": "preempt", "cat": "scheduler", "ph": "i", "s": "t", "ts": 1_020, "pid": pid, "tid": 7},
    ]


def write_fragment(directory: Path, pid: int, events: list[dict], torn_tail: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"trace.{pid}.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + torn_tail)
    return path


def test_fragment_rows_units_metadata_and_instants(tmp_path):
    path = write_fragment(tmp_path / "fragments", 31, fragment_events(31))
    trace = read_sa_profile(path)
    spans = trace.spans
    assert spans["name"].tolist() == ["request", "kernel.decode_fwd", "preempt"]
    assert spans["source"].unique().tolist() == ["sa_profile"]
    assert spans["line"].tolist() == [3, 4, 5]
    assert spans["ts_ns"].tolist() == [1_000_000, 1_010_000, 1_020_000]
    assert spans["dur_ns"].tolist() == [250_000, 3_000, 0]
    assert spans["ph"].tolist() == ["X", "X", "i"]
    assert spans["cat"].tolist() == ["request", "kernel", "scheduler"]
    assert spans["inv"].isna().all() and spans["depth"].isna().all() and (spans["hid"] == "").all()
    assert (spans["clk"] == "host").all()
    assert dict(spans["attrs"].iloc[0]) == {"request_id": "r-1", "tokens": "256", "meta": '{"a":[1,2]}', "ok": "true"}
    assert trace.extras["process_names"] == {31: "worker-31"}
    assert trace.extras["thread_names"] == {(31, 7): "scheduler"}
    assert trace.dropped == {} and trace.records_read == 5


def test_torn_and_malformed_fragment_lines_counted(tmp_path):
    events = fragment_events(5)
    path = tmp_path / "trace.5.jsonl"
    lines = [json.dumps(e) for e in events]
    lines.insert(2, "not json at all")
    lines.insert(3, "[1, 2]")  # JSON, but not an event object
    path.write_text("\n".join(lines) + '\n{"name": "request", "ph": "X", "ts": 10')
    trace = read_sa_profile(path)
    assert len(trace.spans) == 3
    assert trace.dropped == {"bad_json": 3}
    assert trace.spans["line"].tolist() == [5, 6, 7]


def test_fragment_with_no_readable_line_is_an_input_error(tmp_path):
    path = tmp_path / "trace.9.jsonl"
    path.write_bytes(b"\x00\x01garbage\n{broken\n")
    with pytest.raises(InputError) as info:
        read_sa_profile(path)
    assert info.value.path == str(path) and info.value.line == 1


def test_output_dir_prefers_merge_then_fragments(tmp_path):
    out = tmp_path / "sa"
    write_fragment(out / "fragments", 1, fragment_events(1))
    write_fragment(out / "fragments", 2, fragment_events(2), torn_tail='{"ph":')
    trace = read_sa_profile(out)
    assert sorted(trace.spans["pid"].unique().tolist()) == [1, 2] and len(trace.spans) == 6
    assert trace.dropped == {"bad_json": 1}
    assert trace.extras["process_names"] == {1: "worker-1", 2: "worker-2"}
    merged = fragment_events(1) + fragment_events(2)
    (out / "trace.json").write_text(json.dumps({"traceEvents": merged}))
    trace = read_sa_profile(out)
    assert trace.files == [str(out / "trace.json")] and len(trace.spans) == 6 and trace.dropped == {}
    assert trace.spans["line"].tolist() == [2, 3, 4, 7, 8, 9]  # event indices in traceEvents


def test_json_output_path_with_only_fragments(tmp_path):
    write_fragment(tmp_path / "run.json.fragments", 4, fragment_events(4))
    trace = read_sa_profile(tmp_path / "run.json")
    assert len(trace.spans) == 3
    assert read_paths([tmp_path / "run.json"]).spans["source"].unique().tolist() == ["sa_profile"]
    # once merged, the merge is read (and recognised as SA_PROFILE by its fragments beside it)
    (tmp_path / "run.json").write_text(json.dumps({"traceEvents": fragment_events(4)}))
    trace = read_paths([tmp_path / "run.json"])
    assert trace.files == [str(tmp_path / "run.json")] and trace.spans["source"].unique().tolist() == ["sa_profile"]


def test_generic_chrome_begin_end_pairing_and_unmatched(tmp_path):
    events = [
        {"name": "outer", "ph": "B", "ts": 10, "pid": 1, "tid": 1, "cat": "c", "args": {"x": 1}},
        {"name": "inner", "ph": "B", "ts": 12, "pid": 1, "tid": 1},
        {"name": "other-thread", "ph": "B", "ts": 13, "pid": 1, "tid": 2},
        {"ph": "E", "ts": 15, "pid": 1, "tid": 1},
        {"ph": "E", "ts": 20, "pid": 1, "tid": 1, "args": {"y": "end"}},
        {"ph": "E", "ts": 21, "pid": 1, "tid": 1},  # no open B
        {"name": "zero", "ph": "B", "ts": 30, "pid": 1, "tid": 1},
        {"ph": "E", "ts": 30, "pid": 1, "tid": 1},
        {"name": "next", "ph": "B", "ts": 30, "pid": 1, "tid": 1},
        {"ph": "E", "ts": 31, "pid": 1, "tid": 1},
        {"name": "mark", "ph": "I", "ts": 40, "pid": 1, "tid": 1},
        {"name": "counter", "ph": "C", "ts": 41, "pid": 1, "tid": 1, "args": {"v": 1}},
        {"name": "process_sort_index", "ph": "M", "pid": 1, "tid": 1, "args": {"sort_index": 1}},
    ]
    path = tmp_path / "kineto.json"
    path.write_text(json.dumps(events))
    trace = read_chrome_trace(path)
    rows = trace.spans[["name", "ph", "ts_ns", "dur_ns", "tid", "line"]].values.tolist()
    assert rows == [
        ["outer", "X", 10_000, 10_000, 1, 0],
        ["inner", "X", 12_000, 3_000, 1, 1],
        ["zero", "X", 30_000, 0, 1, 6],
        ["next", "X", 30_000, 1_000, 1, 8],
        ["mark", "i", 40_000, 0, 1, 10],
    ]
    assert dict(trace.spans["attrs"].iloc[0]) == {"x": "1", "y": "end"}
    assert trace.spans["source"].unique().tolist() == ["chrome"]
    assert trace.dropped == {"unmatched_end": 1, "unmatched_begin": 1, "unsupported_phase": 1, "unsupported_metadata": 1}


def test_kineto_base_time_float_microseconds_and_string_ids(tmp_path):
    base = 1_764_470_000_123_456_789  # > 2**53
    document = {
        "schemaVersion": 1,
        "baseTimeNanoseconds": base,
        "traceEvents": [
            {"name": "aten::mm", "cat": "cpu_op", "ph": "X", "ts": 0.0015, "dur": 2.0005, "pid": "1234", "tid": "1235"},
            {"name": "gemm", "cat": "kernel", "ph": "X", "ts": 123456789.123456, "dur": 1.0, "pid": "Spans", "tid": "stream 7"},
            {"name": "big", "cat": "cpu_op", "ph": "X", "ts": 1.0005, "dur": 0.0025, "pid": 1, "tid": 1},
        ],
    }
    path = tmp_path / "trace.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    trace = read_chrome_trace(path)
    spans = trace.spans
    # exact decimal arithmetic, half-even: 1.5 ns -> 2, 2000.5 -> 2000, 1000.5 -> 1000, 2.5 -> 2
    assert spans["ts_ns"].tolist() == [base + 2, base + 123_456_789_123, base + 1000]
    assert spans["dur_ns"].tolist() == [2000, 1000, 2]
    assert spans["pid"].tolist()[0] == 1234 and spans["tid"].tolist()[0] == 1235
    label_row = dict(spans["attrs"].iloc[1])
    assert label_row == {"pid_label": "Spans", "tid_label": "stream 7"}
    # a stable hash: the same text always maps to the same id
    again = read_chrome_trace(path).spans
    assert again["pid"].tolist() == spans["pid"].tolist() and spans["pid"].iloc[1] >= 0


def test_gzip_detected_by_magic_bytes(tmp_path):
    path = tmp_path / "trace.bin"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": [{"name": "a", "ph": "X", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}).encode()))
    trace = read_paths([path])
    assert trace.spans["name"].tolist() == ["a"] and trace.spans["source"].tolist() == ["chrome"]


def test_invalid_json_names_file_and_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"traceEvents": [\n{"ph": "X"},\n{oops}\n]}')
    with pytest.raises(InputError) as info:
        read_paths([path])
    assert info.value.path == str(path) and info.value.line == 3


def test_json_that_is_not_a_trace_is_an_input_error(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"hello": "world"}')
    with pytest.raises(InputError, match="not a Chrome trace"):
        read_chrome_trace(path)


def test_events_without_timestamps_are_counted(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 1}, {"name": "b", "ph": "X", "ts": "soon", "dur": 1, "pid": 1, "tid": 1}, 7, {"name": "c", "ph": "X", "ts": 5, "dur": 1, "pid": 1, "tid": 1}]}))
    trace = read_chrome_trace(path)
    assert trace.spans["name"].tolist() == ["c"] and trace.dropped == {"bad_event": 3}


def test_read_paths_sa_profile_merge_source(tmp_path):
    serving = tmp_path / "serving-trace"
    serving.mkdir()
    (serving / "trace.json").write_text(json.dumps({"traceEvents": fragment_events(3)}))
    assert read_paths([serving / "trace.json"]).spans["source"].unique().tolist() == ["sa_profile"]
    other = tmp_path / "elsewhere.json"
    other.write_text(json.dumps({"traceEvents": fragment_events(3)}))
    assert read_paths([other]).spans["source"].unique().tolist() == ["chrome"]
