"""SA_PROFILE fragments / merged traces and generic Chrome / Kineto JSON, with hand-known answers."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsprof.analysis.ingest import json_stream, read_paths
from dsprof.analysis.ingest.chrome import read_chrome_trace
from dsprof.analysis.ingest.sa_profile import read_sa_profile
from dsprof.errors import InputError
from dsprof.profiler import sa_profile
from dsprof.profiler.chrome_json import MERGE_RECORD


def col(spans: pa.Table, name: str) -> list:
    return spans.column(name).to_pylist()


def unique(spans: pa.Table, name: str) -> list:
    return sorted(set(col(spans, name)))


def fragment_events(pid: int) -> list[dict]:
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"worker-{pid}"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": 7, "args": {"name": "scheduler"}},
        {
            "name": "request",
            "cat": "request",
            "ph": "X",
            "ts": 1_000,
            "dur": 250,
            "pid": pid,
            "tid": 7,
            "args": {"request_id": "r-1", "tokens": 256, "meta": {"a": [1, 2]}, "ok": True},
        },
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
    assert col(spans, "name") == ["request", "kernel.decode_fwd", "preempt"]
    assert unique(spans, "source") == ["sa_profile"]
    assert col(spans, "line") == [3, 4, 5]
    assert col(spans, "ts_ns") == [1_000_000, 1_010_000, 1_020_000]
    assert col(spans, "dur_ns") == [250_000, 3_000, 0]
    assert col(spans, "ph") == ["X", "X", "i"]
    assert col(spans, "cat") == ["request", "kernel", "scheduler"]
    assert spans.column("inv").null_count == spans.column("depth").null_count == 3
    assert unique(spans, "hid") == [""] and unique(spans, "clk") == ["host"]
    assert dict(col(spans, "attrs")[0]) == {"request_id": "r-1", "tokens": "256", "meta": '{"a":[1,2]}', "ok": "true"}
    assert trace.process_names == {31: "worker-31"}
    assert trace.thread_names == {(31, 7): "scheduler"}
    assert trace.dropped == {} and trace.records_read == 5


def test_torn_and_malformed_fragment_lines_counted(tmp_path):
    events = fragment_events(5)
    path = tmp_path / "trace.5.jsonl"
    lines = [json.dumps(e) for e in events]
    lines.insert(2, "not json at all")
    lines.insert(3, "[1, 2]")  # JSON, but not an event object
    path.write_text("\n".join(lines) + '\n\n   \n{"name": "request", "ph": "X", "ts": 10')
    trace = read_sa_profile(path)
    assert trace.spans.num_rows == 3
    assert trace.dropped == {"bad_json": 3}  # blank lines are not records
    assert col(trace.spans, "line") == [5, 6, 7]
    assert trace.records_read == 8


def test_fragment_with_no_readable_line_is_an_input_error(tmp_path):
    path = tmp_path / "trace.9.jsonl"
    path.write_bytes(b"\n\x00\x01garbage\n{broken\n")
    with pytest.raises(InputError) as info:
        read_sa_profile(path)
    assert info.value.path == str(path) and info.value.line == 2
    with pytest.raises(InputError) as info:  # the only fragment of a directory
        read_sa_profile(tmp_path)
    assert info.value.path == str(path) and info.value.line == 2


def test_a_garbage_fragment_among_good_ones_is_skipped_and_counted(tmp_path):
    """A partial artifact is read as far as it goes: one unreadable fragment does not lose the others."""
    write_fragment(tmp_path / "fragments", 1, fragment_events(1))
    (tmp_path / "fragments" / "trace.2.jsonl").write_bytes(b"\x00\x01garbage\n{broken\n[1]\n")
    trace = read_sa_profile(tmp_path)
    assert trace.spans.num_rows == 3 and trace.dropped == {"bad_json": 3} and trace.records_read == 8
    assert any("trace.2.jsonl: skipped, no line is a JSON event" in note for note in trace.notes)


def test_attribute_text_keeps_numbers_exactly(tmp_path):
    """Non-string args become their JSON text as written: 1.10 stays 1.10, 1e3 stays 1e3, nested compacted."""
    line = (
        '{"name":"a","ph":"X","ts":1,"dur":1,"pid":1,"tid":1,"args":{"x":1.10,"e":1e3,"big":123456789012345678901234567890,'
        '"neg":-0.0,"s":"t\\"ab,\\u00e9:","k\\"ey":"v","nested":{"a": [1.50, "x y"]},"n":null,"b":false,"rank":3,"step":"7"}}'
    )
    (tmp_path / "trace.1.jsonl").write_text(line + "\n")
    trace = read_sa_profile(tmp_path / "trace.1.jsonl")
    assert dict(col(trace.spans, "attrs")[0]) == {
        "x": "1.10",
        "e": "1e3",
        "big": "123456789012345678901234567890",
        "neg": "-0.0",
        "s": 't"ab,é:',
        'k"ey': "v",
        "nested": '{"a":[1.50,"x y"]}',
        "n": "null",
        "b": "false",
    }
    assert col(trace.spans, "rank") == [3] and col(trace.spans, "step") == [7]  # promoted from text and from numbers


def test_non_object_args_and_label_ids(tmp_path):
    events = [
        {"name": "a", "ph": "X", "ts": 1, "dur": 1, "pid": "worker 3", "tid": "12", "args": [1, 2.5]},
        {"name": 7, "cat": None, "ph": "X", "ts": "2.5", "dur": 1, "pid": 1.0, "tid": True, "args": "text"},
        {"name": "c", "ph": "X", "ts": 3, "dur": 1, "pid": 2, "tid": 2, "args": None},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(events))
    spans = read_chrome_trace(path).spans
    assert col(spans, "name") == ["a", "7", "c"] and col(spans, "cat") == ["", "", ""]
    assert col(spans, "ts_ns") == [1000, 2500, 3000]
    assert col(spans, "tid") == [12, 0, 2] and col(spans, "pid")[1:] == [1, 2]
    assert [dict(a) for a in col(spans, "attrs")] == [{"pid_label": "worker 3", "args": "[1,2.5]"}, {"args": "text"}, {}]


def test_output_dir_prefers_an_up_to_date_merge(tmp_path):
    out = tmp_path / "sa"
    write_fragment(out / "fragments", 1, fragment_events(1))
    write_fragment(out / "fragments", 2, fragment_events(2), torn_tail='{"ph":')
    trace = read_sa_profile(out)
    assert unique(trace.spans, "pid") == [1, 2] and trace.spans.num_rows == 6
    assert trace.dropped == {"bad_json": 1}
    assert trace.process_names == {1: "worker-1", 2: "worker-2"}
    assert trace.notes == [f"read 2 fragment(s) of {out}: no merged trace.json"]
    sa_profile.merge_fragments(out)
    trace = read_sa_profile(out)
    assert trace.files == [str(out / "trace.json")] and trace.spans.num_rows == 6
    assert trace.dropped == {"bad_json": 1}  # the line the merge skipped, reported from its record
    assert col(trace.spans, "line") == [2, 3, 4, 7, 8, 9]  # event indices in traceEvents
    assert trace.notes == [f"read {out / 'trace.json'}: the merge is up to date with the 2 fragment(s) beside it"]


def test_stale_merge_is_passed_over_for_the_fragments(tmp_path):
    """A fragment that grew, or appeared, after the merge: the fragments are read, and the note says why."""
    out = tmp_path / "sa"
    write_fragment(out / "fragments", 1, fragment_events(1))
    sa_profile.merge_fragments(out)
    with open(out / "fragments" / "trace.1.jsonl", "a") as fragment:
        fragment.write(json.dumps({"name": "late", "ph": "X", "ts": 2_000, "dur": 5, "pid": 1, "tid": 7}) + "\n")
    trace = read_sa_profile(out)
    assert "late" in col(trace.spans, "name") and trace.files == [str(out / "fragments" / "trace.1.jsonl")]
    size = (out / "fragments" / "trace.1.jsonl").stat().st_size
    assert trace.notes[0].startswith("read 1 fragment(s) instead of") and f"trace.1.jsonl is {size} bytes" in trace.notes[0]
    sa_profile.merge_fragments(out)
    write_fragment(out / "fragments", 2, fragment_events(2))
    trace = read_paths([out / "trace.json"])  # the merge named directly: the same choice
    assert unique(trace.spans, "pid") == [1, 2] and "trace.2.jsonl is not in it" in trace.notes[0]


def test_stale_merge_of_another_tool_by_modification_time(tmp_path):
    """A merge without dsprof's record (the serving stack's own): fragments written after it win."""
    out = tmp_path / "sa"
    write_fragment(out / "fragments", 1, fragment_events(1))
    (out / "trace.json").write_text(json.dumps({"traceEvents": fragment_events(1)[:3]}))
    os.utime(out / "fragments" / "trace.1.jsonl", ns=(1, 1))
    trace = read_sa_profile(out)
    assert trace.files == [str(out / "trace.json")] and trace.spans.num_rows == 1
    os.utime(out / "fragments" / "trace.1.jsonl")
    os.utime(out / "trace.json", ns=(1, 1))
    trace = read_sa_profile(out)
    assert trace.spans.num_rows == 3 and "trace.1.jsonl was written after it" in trace.notes[0]


def test_unreadable_merge_is_passed_over_for_the_fragments(tmp_path):
    out = tmp_path / "sa"
    write_fragment(out / "fragments", 1, fragment_events(1))
    (out / "trace.json").write_text('{"traceEvents": oops')
    trace = read_sa_profile(out)
    assert trace.spans.num_rows == 3 and "the merge is unreadable" in trace.notes[0] and "trace.json:1" in trace.notes[0]


def test_json_output_path_with_only_fragments(tmp_path):
    write_fragment(tmp_path / "run.json.fragments", 4, fragment_events(4))
    trace = read_sa_profile(tmp_path / "run.json")
    assert trace.spans.num_rows == 3 and "the merge was never written" in trace.notes[0]
    assert unique(read_paths([tmp_path / "run.json"]).spans, "source") == ["sa_profile"]
    # once merged, the merge is read (and recognised as SA_PROFILE by its fragments beside it)
    sa_profile.merge_fragments(tmp_path / "run.json")
    trace = read_paths([tmp_path / "run.json"])
    assert trace.files == [str(tmp_path / "run.json")] and unique(trace.spans, "source") == ["sa_profile"]


def test_generic_chrome_begin_end_pairing_and_unmatched(tmp_path):
    events = [
        {"name": "outer", "ph": "B", "ts": 10, "pid": 1, "tid": 1, "cat": "c", "args": {"x": 1, "y": "begin"}},
        {"name": "inner", "ph": "B", "ts": 12, "pid": 1, "tid": 1},
        {"name": "other-thread", "ph": "B", "ts": 13, "pid": 1, "tid": 2},
        {"ph": "E", "ts": 15, "pid": 1, "tid": 1},
        {"ph": "E", "ts": 20, "pid": 1, "tid": 1, "args": {"y": "end", "z": 2}},
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
    rows = trace.spans.select(["name", "ph", "ts_ns", "dur_ns", "tid", "line"]).to_pylist()
    assert [list(r.values()) for r in rows] == [
        ["outer", "X", 10_000, 10_000, 1, 0],
        ["inner", "X", 12_000, 3_000, 1, 1],
        ["zero", "X", 30_000, 0, 1, 6],
        ["next", "X", 30_000, 1_000, 1, 8],
        ["mark", "i", 40_000, 0, 1, 10],
    ]
    assert col(trace.spans, "attrs")[0] == [("x", "1"), ("y", "end"), ("z", "2")]  # E's value at B's place
    assert unique(trace.spans, "source") == ["chrome"]
    assert trace.dropped == {"unmatched_end": 1, "unmatched_begin": 1, "unsupported_phase": 1, "unsupported_metadata": 1}


def reference_pairs(events: list[tuple[int, str, int]]) -> tuple[list[tuple[int, int, int]], int, int]:
    """B/E pairing the plain way: a stack per tid, events in (ts, file order)."""
    stacks: dict[int, list[tuple[int, int]]] = {}
    pairs, unmatched_end = [], 0
    for index, (tid, ph, ts) in sorted(enumerate(events), key=lambda e: (e[1][0], e[1][2], e[0])):
        stack = stacks.setdefault(tid, [])
        if ph == "B":
            stack.append((index, ts))
        elif stack:
            begin, begin_ts = stack.pop()
            pairs.append((begin, begin_ts * 1000, (ts - begin_ts) * 1000))
        else:
            unmatched_end += 1
    return sorted(pairs), unmatched_end, sum(len(s) for s in stacks.values())


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 3), st.sampled_from("BE"), st.integers(0, 6)), max_size=40))
def test_begin_end_pairing_matches_a_stack(tmp_path, events):
    path = tmp_path / "be.json"
    path.write_text(json.dumps([{"name": f"s{i}", "ph": ph, "ts": ts, "pid": 1, "tid": tid} for i, (tid, ph, ts) in enumerate(events)]))
    pairs, unmatched_end, unmatched_begin = reference_pairs(events)
    trace = read_chrome_trace(path)
    assert sorted(zip(col(trace.spans, "line"), col(trace.spans, "ts_ns"), col(trace.spans, "dur_ns"), strict=True)) == pairs
    assert col(trace.spans, "line") == sorted(col(trace.spans, "line"))
    assert trace.dropped.get("unmatched_end", 0) == unmatched_end and trace.dropped.get("unmatched_begin", 0) == unmatched_begin


def test_kineto_base_time_float_microseconds_and_string_ids(tmp_path):
    base = 1_764_470_000_123_456_789  # > 2**53
    events = [
        {"name": "aten::mm", "cat": "cpu_op", "ph": "X", "ts": 0.0015, "dur": 2.0005, "pid": "1234", "tid": "1235"},
        {"name": "gemm", "cat": "kernel", "ph": "X", "ts": 123456789.123456, "dur": 1.0, "pid": "Spans", "tid": "stream 7"},
        {"name": "big", "cat": "cpu_op", "ph": "X", "ts": 1.0005, "dur": 0.0025, "pid": 1, "tid": 1},
    ]
    # Kineto writes baseTimeNanoseconds after traceEvents, pretty-printed
    path = tmp_path / "trace.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"schemaVersion": 1, "traceEvents": events, "baseTimeNanoseconds": base}, indent=2).encode()))
    trace = read_chrome_trace(path)
    spans = trace.spans
    # exact decimal arithmetic, half-even: 1.5 ns -> 2, 2000.5 -> 2000, 1000.5 -> 1000, 2.5 -> 2
    assert col(spans, "ts_ns") == [base + 2, base + 123_456_789_123, base + 1000]
    assert col(spans, "dur_ns") == [2000, 1000, 2]
    assert col(spans, "pid")[0] == 1234 and col(spans, "tid")[0] == 1235
    assert dict(col(spans, "attrs")[1]) == {"pid_label": "Spans", "tid_label": "stream 7"}
    again = read_chrome_trace(path).spans  # a stable hash: the same text always maps to the same id
    assert col(again, "pid") == col(spans, "pid") and col(spans, "pid")[1] >= 0
    before = tmp_path / "before.json"
    before.write_text(json.dumps({"baseTimeNanoseconds": str(base), "traceEvents": events}))
    assert col(read_chrome_trace(before).spans, "ts_ns") == col(spans, "ts_ns")


class ListSink:
    def __init__(self):
        self.tables: list[pa.Table] = []

    def add(self, table: pa.Table) -> None:
        self.tables.append(table)


def test_sink_gets_every_row_with_the_base_time_known_only_at_the_end(tmp_path, monkeypatch):
    """With a sink nothing is kept; rows waiting for a late baseTimeNanoseconds are held in a spill file, then sent."""
    monkeypatch.setattr(json_stream, "READ_BYTES", 512)  # many batches
    events = [{"name": f"e{i}", "ph": "X", "ts": i, "dur": 1, "pid": 1, "tid": 1, "args": {"i": i}} for i in range(200)]
    events += [{"name": "b", "ph": "B", "ts": 500, "pid": 1, "tid": 1}, {"ph": "E", "ts": 501, "pid": 1, "tid": 1}]
    path = tmp_path / "late.json"
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 7}))
    whole = read_chrome_trace(path)
    sink = ListSink()
    trace = read_chrome_trace(path, sink=sink)
    assert trace.spans.num_rows == 0 and len(sink.tables) > 5
    assert pa.concat_tables(sink.tables).sort_by("line").equals(whole.spans)
    assert col(whole.spans, "ts_ns")[:2] == [7, 1007] and whole.spans.num_rows == 201


def layouts(events: list[dict]) -> dict[str, str]:
    return {
        "compact": json.dumps({"traceEvents": events}, separators=(",", ":")),
        "one per line": '{"traceEvents":[\n' + ",\n".join(json.dumps(e) for e in events) + "\n]}\n",
        "pretty": json.dumps({"displayTimeUnit": "ms", "traceEvents": events, "otherData": {"k": [1, {"a": "]}"}]}}, indent=3),
        "array": json.dumps(events, indent=1),
    }


@settings(
    max_examples=min(40, settings.default.max_examples),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "name": st.text(max_size=8),
                "ph": st.sampled_from(["X", "i", "B", "E", "C"]),
                "ts": st.integers(0, 10**9),
                "dur": st.integers(0, 10**6),
                "pid": st.integers(0, 3),
                "tid": st.integers(0, 3),
            },
            optional={
                "args": st.dictionaries(
                    st.text(max_size=5),
                    st.one_of(st.text(max_size=6), st.integers(), st.booleans(), st.none(), st.lists(st.integers(), max_size=3)),
                    max_size=3,
                )
            },
        ),
        max_size=30,
    ),
    st.integers(16, 300),
)
def test_any_layout_and_chunking_reads_the_same(tmp_path, monkeypatch, events, chunk_bytes):
    """Compact, one event per line, pretty-printed or a bare array, read in small chunks: always the same spans."""
    expected = None
    for name, text in layouts(events).items():
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        whole = read_chrome_trace(path)
        monkeypatch.setattr(json_stream, "READ_BYTES", chunk_bytes)
        chunked = read_chrome_trace(path)
        monkeypatch.undo()
        got = (whole.spans.drop_columns(["file"]).to_pylist(), whole.dropped, whole.records_read)
        assert (chunked.spans.drop_columns(["file"]).to_pylist(), chunked.dropped, chunked.records_read) == got
        expected = expected or got
        assert got == expected, name


def test_truncated_document_keeps_the_events_before_the_cut(tmp_path):
    events = [{"name": f"e{i}", "ph": "X", "ts": i, "dur": 1, "pid": 1, "tid": 1} for i in range(5)]
    text = json.dumps({"traceEvents": events})
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index('"e4"') + 6])  # inside the last event
    trace = read_chrome_trace(path)
    assert col(trace.spans, "name") == ["e0", "e1", "e2", "e3"] and trace.dropped == {"torn_event": 1, "truncated_document": 1}
    assert trace.drop_sites == {"torn_event": f"{path}:1", "truncated_document": f"{path}:1"}  # a drop, with where it ends
    assert "ends early inside traceEvents (truncated)" in trace.notes[0]
    path.write_text(json.dumps(events)[:-1])  # the JSON Array Format may lack its ']'
    trace = read_chrome_trace(path)
    assert trace.spans.num_rows == 5 and trace.dropped == {}
    gz = tmp_path / "cut.json.gz"
    gz.write_bytes(gzip.compress(text.encode())[:-12])  # a gzip stream cut short
    trace = read_chrome_trace(gz)
    assert trace.spans.num_rows >= 4 and "gzip stream cut short" in trace.notes[0]
    path.write_text('{"otherData": {"a": 1}, "traceEv')
    with pytest.raises(InputError, match="ends early"):
        read_chrome_trace(path)


def test_gzip_detected_by_magic_bytes(tmp_path):
    path = tmp_path / "trace.bin"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": [{"name": "a", "ph": "X", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}).encode()))
    trace = read_paths([path])
    assert col(trace.spans, "name") == ["a"] and col(trace.spans, "source") == ["chrome"]


def test_invalid_json_names_file_and_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"traceEvents": [\n{"ph": "X"},\n{oops}\n]}')
    with pytest.raises(InputError) as info:
        read_paths([path])
    assert info.value.path == str(path) and info.value.line == 3 and "event 1" in str(info.value)
    path.write_text('{"traceEvents": []} trailing')
    with pytest.raises(InputError, match="trailing data"):
        read_chrome_trace(path)


def test_json_that_is_not_a_trace_is_an_input_error(tmp_path):
    path = tmp_path / "other.json"
    for text in ('{"hello": "world"}', "{}", '{"traceEvents": {"a": 1}}', '"text"', "", '{"traceEvents": [], "traceEvents": []}'):
        path.write_text(text)
        with pytest.raises(InputError, match="not a Chrome trace|not a list|empty file|twice"):
            read_chrome_trace(path)


def test_events_without_timestamps_are_counted(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {"name": "a", "ph": "X", "pid": 1, "tid": 1},
                    {"name": "b", "ph": "X", "ts": "soon", "dur": 1, "pid": 1, "tid": 1},
                    7,
                    {"name": "c", "ph": "X", "ts": 5, "dur": 1, "pid": 1, "tid": 1},
                    {"name": "d", "ph": "X", "ts": None, "pid": 1, "tid": 1},
                ]
            }
        )
    )
    trace = read_chrome_trace(path)
    assert col(trace.spans, "name") == ["c"] and trace.dropped == {"bad_event": 4} and trace.records_read == 5


def test_read_paths_sa_profile_merge_source(tmp_path):
    serving = tmp_path / "serving-trace"
    serving.mkdir()
    (serving / "trace.json").write_text(json.dumps({"traceEvents": fragment_events(3)}))
    assert unique(read_paths([serving / "trace.json"]).spans, "source") == ["sa_profile"]
    other = tmp_path / "elsewhere.json"
    other.write_text(json.dumps({"traceEvents": fragment_events(3)}))
    assert unique(read_paths([other]).spans, "source") == ["chrome"]


def test_merge_record_is_read_from_the_head_only(tmp_path):
    """The merge's record stands before traceEvents: the staleness check never reads the events."""
    out = tmp_path / "sa"
    write_fragment(out / "fragments", 1, fragment_events(1))
    sa_profile.merge_fragments(out)
    head = (out / "trace.json").read_bytes().split(b'"traceEvents"')[0]
    assert json.loads(head.rstrip(b",\n ") + b"}")["otherData"][MERGE_RECORD]["fragments"] == {
        "trace.1.jsonl": (out / "fragments" / "trace.1.jsonl").stat().st_size
    }
    document = json_stream.ChromeDocument(out / "trace.json")
    assert document.head()[MERGE_RECORD]["counts"]["events"] == 5
