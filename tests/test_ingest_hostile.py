"""Hostile JSON input: every reader either reads what it can (dropped counted) or raises one InputError line.

Memory-bound cases (a gzip bomb, an overlong line, a huge event, a big merge)
run in a child process under ``RLIMIT_AS``, so a reader that loaded the input
whole would fail there instead of passing.
"""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsprof.analysis.ingest import read_paths
from dsprof.analysis.ingest.chrome import read_chrome_trace
from dsprof.analysis.ingest.sa_profile import read_sa_profile
from dsprof.analysis.ingest.side_files import read_side_file
from dsprof.analysis.store.spans import MAX_TIME_NS, SPAN_SCHEMA
from dsprof.errors import InputError
from dsprof.profiler import sa_profile
from dsprof.profiler.chrome_json import JsonLimits

DEEP = 100_000
GOOD = {"name": "ok", "ph": "X", "ts": 5, "dur": 1, "pid": 1, "tid": 1, "args": {"a": 1}}


def good_line(**changes) -> str:
    return json.dumps({**GOOD, **changes})


def deep(depth: int = DEEP) -> str:
    return "[" * depth + "]" * depth


# -- deep nesting ------------------------------------------------------------------------------------


def test_deep_fragment_line_is_skipped_and_counted(tmp_path):
    path = tmp_path / "trace.1.jsonl"
    lines = [
        good_line(),
        '{"name":"x","args":{"a":' + deep() + "}}",
        deep(),
        '{"name":"y","ph":"X","ts":1,"x":' + "{" * DEEP,
        good_line(name="after"),
    ]
    path.write_text("\n".join(lines) + "\n")
    trace = read_sa_profile(path)
    assert trace.spans.column("name").to_pylist() == ["ok", "after"]
    assert trace.dropped == {"too_deep": 2, "bad_json": 1}  # the unclosed one is not JSON at all


@pytest.mark.parametrize(
    "text",
    [
        deep(),
        '{"traceEvents": [' + deep() + "]}",
        '{"traceEvents": [{"name": "a", "args": ' + deep() + "}]}",
        '{"metadata": ' + deep() + ', "traceEvents": []}',
        '{"traceEvents": [], "otherData": ' + "{" * DEEP + "}" * DEEP + "}",
    ],
)
def test_deep_document_is_an_input_error(tmp_path, text):
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(InputError, match="nested too deeply|not a Chrome trace|invalid JSON") as info:
        read_chrome_trace(path)
    assert info.value.path == str(path) and "\n" not in str(info.value)


def test_deep_side_file_is_an_input_error(tmp_path):
    path = tmp_path / "performance_summary.json"
    path.write_text('{"a": ' + deep() + "}")
    with pytest.raises(InputError, match="nested too deeply"):
        read_paths([path])


# -- numbers out of range, negative durations, NaN ------------------------------------------------------


def test_numbers_past_int64_are_dropped_and_counted(tmp_path):
    lines = [
        good_line(ts=10**30),
        good_line(ts=9_223_372_036_854_776),
        good_line(ts=-9_223_372_036_854_776),
        good_line(pid=10**25),
        good_line(tid=-(2**63) - 1),
        good_line(dur=10**17),
        '{"name":"f","ph":"X","ts":1e999999,"dur":1,"pid":1,"tid":1}',
        '{"name":"g","ph":"X","ts":1.5e30,"dur":1,"pid":1,"tid":1}',
        '{"name":"h","ph":"X","ts":1,"dur":1,"pid":1e25,"tid":1}',
        '{"name":"i","ph":"X","ts":' + "9" * 5000 + ',"pid":1,"tid":1}',
        '{"name":"j","ph":"i","ts":1e-999999,"pid":1,"tid":1}',
        good_line(ts=9_223_372_036_854_775),  # fits int64 in ns, but past MAX_TIME_NS (SQL adds times)
        good_line(ts=(MAX_TIME_NS - 1) // 1000 - 1, name="largest"),  # its end (dur 1 µs) just inside
    ]
    path = tmp_path / "trace.1.jsonl"
    path.write_text("\n".join(lines) + "\n")
    trace = read_sa_profile(path)
    assert trace.spans.column("name").to_pylist() == ["j", "largest"]
    assert trace.spans.column("ts_ns").to_pylist() == [0, ((MAX_TIME_NS - 1) // 1000 - 1) * 1000]
    assert trace.dropped == {"bad_value": 11}
    document = tmp_path / "t.json"
    document.write_text('{"traceEvents": [' + ",".join(lines) + "]}")
    assert read_chrome_trace(document).dropped == {"bad_value": 11}


def test_base_time_past_int64_drops_the_events_it_would_overflow(tmp_path):
    path = tmp_path / "t.json"
    events = [GOOD, {**GOOD, "ts": 9_000_000_000_000_000}]
    path.write_text(json.dumps({"baseTimeNanoseconds": 10**18, "traceEvents": events}))
    trace = read_chrome_trace(path)
    assert trace.spans.column("ts_ns").to_pylist() == [10**18 + 5000] and trace.dropped == {"bad_value": 1}
    for base in ("1e30", "100000000000000000000", '"soon"', "1.5", "true", "null", "NaN", "1e999999"):
        path.write_text('{"baseTimeNanoseconds": ' + base + ', "traceEvents": []}')
        with pytest.raises(InputError, match="baseTimeNanoseconds|out of range") as info:
            read_chrome_trace(path)
        assert info.value.line == 1


def test_negative_durations_are_dropped_and_counted(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps([GOOD, {**GOOD, "dur": -1}, {**GOOD, "dur": -0.0004}, {**GOOD, "dur": -0.0006}, {**GOOD, "ph": "i", "dur": -5}])
    )
    trace = read_chrome_trace(path)
    assert trace.spans.column("dur_ns").to_pylist() == [1000, 0, 0] and trace.dropped == {"negative_duration": 2}


def test_nan_and_infinity_are_read_as_null(tmp_path):
    """Python's json writes NaN/Infinity; they are no JSON: values become null, and the note says how many."""
    lines = [
        '{"name":"a","ph":"X","ts":1,"dur":2,"pid":1,"tid":1,"args":{"loss":NaN,"s":"NaN","v":[Infinity,-Infinity]}}',
        '{"name":"b","ph":"X","ts":NaN,"dur":2,"pid":1,"tid":1}',
        '{"name":"c","ph":"X","ts":1,"dur":Infinity,"pid":1,"tid":1}',
        '{"name":"d","ph":"X","ts":1,"dur":1,"pid":NaN,"tid":1}',
        "NaN",
    ]
    path = tmp_path / "trace.2.jsonl"
    path.write_text("\n".join(lines) + "\n")
    trace = read_sa_profile(path)
    assert trace.spans.column("name").to_pylist() == ["a", "d"] and trace.spans.column("pid").to_pylist() == [1, 0]
    assert dict(trace.spans.column("attrs").to_pylist()[0]) == {"loss": "null", "s": "NaN", "v": "[null,null]"}
    assert trace.dropped == {"bad_event": 2, "bad_json": 1}  # the last line is a bare null: not an event
    assert "6 NaN/Infinity value(s) read as null" in trace.notes[0]
    document = tmp_path / "t.json"
    document.write_text('{"traceEvents": [' + ",".join(lines[:4]) + "]}")
    assert read_chrome_trace(document).spans.num_rows == 2


def test_invalid_utf8_anywhere_is_not_json(tmp_path):
    """Also in members the parser skips and in args it keeps as text (found by the generated test below)."""
    bad = [
        b'{"name\x80":null,' + good_line().encode()[1:],
        good_line().encode()[:-2] + b',"x":"\xff"}',
        b'{"name":"a","ph":"X","ts":1,"dur":1,"pid":1,"tid":1,"args":{"k":"\xc3"}}',
        b'{"name":"a","ph":"X","ts":1,"dur":1,"pid":1,"tid":1,"args":{"k":"\\ud800"}}',
    ]
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    (fragments / "trace.1.jsonl").write_bytes(b"\n".join([*bad, good_line(name="fine").encode()]) + b"\n")
    trace = read_sa_profile(fragments / "trace.1.jsonl")
    assert trace.spans.column("name").to_pylist() == ["fine"] and trace.dropped == {"bad_json": 4}
    result = sa_profile.merge_fragments(tmp_path)
    assert (result.events, result.dropped) == (1, {"bad_json": 4})
    (tmp_path / "trace.json").read_text(encoding="utf-8")  # the merge is UTF-8 throughout
    document = tmp_path / "t.json"
    document.write_bytes(b'{"traceEvents": [' + good_line().encode() + b",\n" + bad[2] + b"]}")
    with pytest.raises(InputError, match="invalid JSON in event 1") as info:
        read_chrome_trace(document)
    assert info.value.line == 2


# -- sizes: bombs, overlong lines, huge events (in a child under RLIMIT_AS) --------------------------------


def run_limited(code: str, limit_mib: int = 1024, timeout: int = 300) -> dict:
    """Run ``code`` (which sets ``result``) in a child whose address space is capped; returns result and peak RSS."""
    body = textwrap.indent(textwrap.dedent(code).strip(), "    ")
    script = "\n".join(
        [
            "import json, resource",
            f"resource.setrlimit(resource.RLIMIT_AS, ({limit_mib} << 20, {limit_mib} << 20))",
            "from dsprof.errors import InputError",
            "try:",
            body,
            "except InputError as error:",
            "    result = {'error': str(error)}",
            "peak = [line for line in open('/proc/self/status') if line.startswith('VmHWM')][0].split()[1]",
            "print(json.dumps({**result, 'peak_rss_mib': int(peak) / 1024}))",
        ]
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def gzip_members(path: Path, head: bytes, body: bytes, copies: int, tail: bytes = b"") -> None:
    """A gzip file of many members (they inflate as one stream): ``head``, ``body`` × ``copies``, ``tail``."""
    member = gzip.compress(body, compresslevel=9)
    with open(path, "wb") as out:
        out.write(gzip.compress(head))
        out.writelines([member] * copies)
        out.write(gzip.compress(tail))


@pytest.mark.slow
def test_gzip_bomb_is_refused_in_bounded_memory(tmp_path):
    """A 5 MB .json.gz that inflates to 5 GiB (of whitespace inside traceEvents) is refused, never held."""
    path = tmp_path / "bomb.json.gz"
    gzip_members(path, b'{"traceEvents": [' + good_line().encode() + b",", b" " * (1 << 20), 5 * 1024, b"]}")
    assert 4 << 20 < path.stat().st_size < 6 << 20
    result = run_limited(f"from dsprof.analysis.ingest import read_paths\nresult = {{'spans': len(read_paths([{str(path)!r}]).spans)}}")
    assert "gzip bomb" in result["error"] and result["error"].startswith(str(path))
    assert result["peak_rss_mib"] < 400


@pytest.mark.slow
def test_gzip_bomb_of_events_is_refused_at_the_limit(tmp_path):
    """Valid events compressed ~1000x: read until the limit, then refused; memory stays well under the cap."""
    path = tmp_path / "events.json.gz"
    body = ("".join(good_line(name=f"e{i % 10}") + "," for i in range(20_000))).encode()
    gzip_members(path, b'{"traceEvents": [', body, 80, b"{}]}")
    limits = "JsonLimits(max_gzip_ratio=100, gzip_allowance_bytes=32 << 20)"
    result = run_limited(f"""
        from dsprof.analysis.ingest.chrome import read_chrome_trace
        from dsprof.profiler.chrome_json import JsonLimits
        result = {{'spans': len(read_chrome_trace({str(path)!r}, limits={limits}).spans)}}
    """)
    assert "gzip bomb" in result["error"] and result["peak_rss_mib"] < 600


@pytest.mark.slow
def test_overlong_fragment_line_is_skipped_in_bounded_memory(tmp_path):
    """A 300 MB line without a newline, then an event: the line is skipped (counted), the event read, the merge too."""
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    path = fragments / "trace.7.jsonl"
    with open(path, "wb") as out:
        out.write(good_line(name="before").encode() + b"\n" + b'{"name":"' + b"x" * (64 << 20))
        out.writelines(b"y" * (64 << 20) for _ in range(4))
        out.write(b'"}\n' + good_line(name="after").encode() + b"\n")
    result = run_limited(
        f"""
        from dsprof.analysis.ingest.sa_profile import read_fragment
        from dsprof.profiler.sa_profile import merge_fragments
        from pathlib import Path
        trace = read_fragment(Path({str(path)!r}))
        merged = merge_fragments({str(tmp_path)!r})
        result = {{'names': trace.spans.column('name').to_pylist(), 'dropped': trace.dropped, 'merge': merged.dropped, 'events': merged.events}}
    """,
        limit_mib=900,
    )
    assert result["names"] == ["before", "after"] and result["dropped"] == {"overlong_line": 1}
    assert result["merge"] == {"overlong_line": 1} and result["events"] == 2
    assert result["peak_rss_mib"] < 250


@pytest.mark.slow
def test_huge_event_in_a_document_is_an_input_error_in_bounded_memory(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as out:
        out.write(b'{"traceEvents": [' + good_line().encode() + b',\n{"name": "' + b"z" * (200 << 20) + b'"}]}')
    result = run_limited(
        f"from dsprof.analysis.ingest.chrome import read_chrome_trace\nresult = {{'n': len(read_chrome_trace({str(path)!r}).spans)}}",
        limit_mib=900,
    )
    assert result["error"] == f"{path}:2: event 1 is larger than {16 << 20} bytes (expected at most JsonLimits.max_event_bytes per event)"
    assert result["peak_rss_mib"] < 250


@pytest.mark.slow
def test_big_merge_and_read_stream_in_bounded_memory(tmp_path):
    """64 MB of fragments merged and the merge read with a sink under a cap: memory does not grow with the input."""
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    line = good_line(args={"request_id": "r" * 150, "rank": 1}).encode() + b"\n"
    for pid in range(4):
        (fragments / f"trace.{pid}.jsonl").write_bytes(line * ((16 << 20) // len(line)))
    result = run_limited(
        f"""
        from dsprof.analysis.ingest.sa_profile import read_sa_profile
        from dsprof.profiler.sa_profile import merge_fragments
        class Count:
            rows = 0
            def add(self, table):
                self.rows += table.num_rows
        merged = merge_fragments({str(tmp_path)!r})
        sink = Count()
        trace = read_sa_profile({str(tmp_path / "trace.json")!r}, sink=sink)
        result = {{'events': merged.events, 'rows': sink.rows, 'kept': trace.spans.num_rows}}
    """,
        limit_mib=900,
    )
    assert result["events"] == result["rows"] > 250_000 and result["kept"] == 0
    assert result["peak_rss_mib"] < 300


# -- generated hostile input at every reader ---------------------------------------------------------------


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["1e999999", "-1e999999", "9" * 400, "1.10", "NaN", '"\\ud800"', "-0"]).map(lambda t: RawJson(t)),
)


class RawJson(str):
    """JSON text put into a generated document as it is (numbers no Python float can hold)."""


values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)), max_leaves=8
)
events = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "name": values,
            "cat": values,
            "ph": st.one_of(st.sampled_from(["X", "B", "E", "i", "I", "M", "C"]), values),
            "ts": values,
            "dur": values,
            "pid": values,
            "tid": values,
            "args": values,
        },
    ),
    values,
)


def dumps(value: object) -> str:
    """JSON with Python's extensions (NaN, Infinity) and RawJson pasted in."""
    if isinstance(value, RawJson):
        return str(value)
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity") if math.isinf(value) else repr(value)
    if isinstance(value, list):
        return "[" + ",".join(map(dumps, value)) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + dumps(v) for k, v in value.items()) + "}"
    return json.dumps(value)


damage = st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["cut", "insert", "deep", "bytes"]), st.binary(max_size=8)), max_size=3)


def damaged(text: bytes, edits: list) -> bytes:
    for where, kind, blob in edits:
        at = int(where * len(text))
        if kind == "cut":
            text = text[:at]
        elif kind == "insert":
            text = text[:at] + blob + text[at:]
        elif kind == "deep":
            text = text[:at] + b"[" * 50_000 + text[at:]
        else:
            text = text[:at] + blob + text[at + len(blob) :]
    return text


def check_outcome(read, path: Path) -> None:
    """The read returns a well-formed trace or raises one InputError line naming the file; nothing else escapes."""
    try:
        trace = read(path)
    except InputError as error:
        assert "\n" not in str(error) and error.path.startswith(str(path.parent))
        return
    assert trace.spans.schema.equals(SPAN_SCHEMA)
    assert all(d >= 0 for d in trace.spans.column("dur_ns").to_pylist())
    assert all(count > 0 for count in trace.dropped.values())


@settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(
    document=st.one_of(
        st.fixed_dictionaries(
            {"traceEvents": st.lists(events, max_size=6)}, optional={"baseTimeNanoseconds": values, "otherData": values, "x": values}
        ),
        st.lists(events, max_size=6),
        values,
    ),
    edits=damage,
    compress=st.sampled_from(["plain", "gzip", "gzip cut"]),
)
def test_generated_documents_never_raise_anything_but_input_error(tmp_path, document, edits, compress):
    text = damaged(dumps(document).encode(), edits)
    if compress != "plain":
        text = gzip.compress(text)
        text = text[: len(text) // 2] if compress == "gzip cut" else text
    path = tmp_path / ("trace.json.gz" if compress != "plain" else "trace.json")
    path.write_bytes(text)
    check_outcome(read_chrome_trace, path)
    check_outcome(lambda p: read_paths([p]), path)
    side = tmp_path / "performance_summary.json"
    side.write_bytes(text)
    check_outcome(read_side_file, side)


@settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(lines=st.lists(st.tuples(events, damage), min_size=1, max_size=6), junk=st.binary(max_size=20))
def test_generated_fragments_never_raise_anything_but_input_error(tmp_path, lines, junk):
    text = b"\n".join(damaged(dumps(event).encode(), edits) for event, edits in lines) + b"\n" + junk
    fragments = tmp_path / "fragments"
    fragments.mkdir(exist_ok=True)
    path = fragments / "trace.1.jsonl"
    path.write_bytes(text)
    check_outcome(read_sa_profile, path)
    check_outcome(lambda p: read_paths([p.parent.parent]), path)
    try:
        result = sa_profile.merge_fragments(tmp_path, limits=JsonLimits(max_event_bytes=1 << 16))
    except InputError:
        return
    merged = (tmp_path / "trace.json").read_bytes()
    json.loads(merged, parse_constant=lambda c: pytest.fail(f"{c} in trace.json"))  # strict JSON, always
    assert result.events + result.skipped_lines <= text.count(b"\n") + 1
    check_outcome(read_sa_profile, tmp_path)
