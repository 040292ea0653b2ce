"""Property tests: random valid STRACE logs, corrupted the ways SPEC §2 lists, read back exactly.

Valid records are formatted with the real format functions; corruptions are
truncation (a torn record), two records joined on one line, a newline injected
anywhere in a record, unrelated lines in between and a bumped version. Every
valid record must come back with exactly its fields, nothing else may appear,
and every torn or bumped record must be counted as dropped. Each property
holds for both readers (the compiled scanner and the pure-Python reader);
tests/test_ingest_fast.py checks that they agree on everything.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsprof.analysis.ingest import strace_pieces
from dsprof.analysis.ingest.strace_log import parse_strace_bytes
from dsprof.analysis.store.spans import MAX_TIME_NS, PROMOTED_INT_ATTRS, PROMOTED_TEXT_ATTRS, SPAN_SCHEMA
from dsprof.errors import InputError
from dsprof.profiler.strace_format import CLK_ATTR, format_prefix, format_strace_payload
from dsprof.testing.strace_readers import READERS, outcome, select_reader

# starts and durations whose spans are kept (a negative start, a negative
# duration or an end at or past MAX_TIME_NS is dropped: see test_ingest_strace.py)
START = st.integers(0, MAX_TIME_NS // 2 - 1)
# any characters, including the ones STRACE escapes: space, '[', ']', '%', '=', controls
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
# attribute names other than those that become columns (clk, rank, device, ...)
KEY = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8).filter(
    lambda k: k not in PROMOTED_INT_ATTRS and k not in PROMOTED_TEXT_ATTRS and k != CLK_ATTR
)
SETTINGS = settings(
    max_examples=min(60, settings.default.max_examples),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(params=READERS)
def reader(request, monkeypatch):
    select_reader(request.param, monkeypatch)
    return request.param


records = st.fixed_dictionaries(
    {
        "pid": st.integers(0, 2**63 - 1),
        "tid": st.integers(0, 2**63 - 1),
        "inv": st.integers(0, 2**64 - 1),
        "hid": st.text(alphabet="0123456789abcdef", min_size=1, max_size=16),
        "depth": st.integers(0, 2**63 - 1),
        "name": TEXT,
        "ts_ns": START,
        "dur_ns": START,
        "attrs": st.dictionaries(st.one_of(KEY, st.just(CLK_ATTR)), st.one_of(TEXT, st.sampled_from(["dev", "host"])), max_size=4),
    }
)
prefixes = st.one_of(
    st.just(""),
    st.builds(
        format_prefix,
        st.integers(0, 2**63 - 1),
        st.integers(0, 2**48),
        st.sampled_from(["INFO", "WARN", "DEBUG"]),
        st.sampled_from(["chip_run", "span_close", "f"]),
    ),
)
# Unrelated log text: never a marker, and at least two words of which the
# first has no '=', so it cannot pass for the rest of a record. (A line that is
# one bare word right after a record ending its line is read as that record's
# continuation: the two cannot be told apart.)
junk_lines = st.builds(
    lambda t: "junk: " + t + " end",
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="[]\n\r"), max_size=30),
)

# what to do with one record: keep it whole, split it, tear it, bump its version, or put it on a line with the next one
actions = st.sampled_from(["whole", "whole", "split", "torn", "bump", "join"])


def expected_row(record: dict) -> tuple:
    attrs = {k: v for k, v in record["attrs"].items() if k != "clk"}
    clk = "dev" if record["attrs"].get("clk") == "dev" else "host"
    return (
        record["pid"],
        record["tid"],
        record["inv"],
        record["hid"],
        record["depth"],
        record["name"],
        record["ts_ns"],
        record["dur_ns"],
        clk,
        attrs,
    )


def got_rows(trace) -> list[tuple]:
    names = ("pid", "tid", "inv", "hid", "depth", "name", "ts_ns", "dur_ns", "clk")
    return [tuple(row[c] for c in names) + (dict(row["attrs"]),) for row in trace.spans.to_pylist()]


@SETTINGS
@given(
    plan=st.lists(st.tuples(records, prefixes, actions, st.floats(0, 1)), min_size=1, max_size=12),
    junk=st.lists(st.tuples(st.integers(0, 12), junk_lines), max_size=5),
)
def test_valid_records_recovered_exactly_and_corruption_counted(reader, plan, junk):
    lines: list[str] = []
    expected: list[tuple] = []
    expected_dropped = 0
    pending_join = ""
    for index, (record, prefix, action, where) in enumerate(plan):
        for at, text in junk:
            if at == index and not pending_join:
                lines.append(text)
        payload = format_strace_payload(**record)
        text = prefix + payload
        if action == "torn":
            # cut before the record's last required value is complete: detectable as torn
            cut = int(where * (text.index(" dur=") + len(" dur=")))
            lines.append(pending_join + text[:cut])
            pending_join = ""
            expected_dropped += cut >= len(prefix) + len("[STRACE]")
            continue
        if action == "bump":
            lines.append(pending_join + text.replace("[STRACE] v=1 ", "[STRACE] v=2 ", 1))
            pending_join = ""
            expected_dropped += 1
            continue
        expected.append(expected_row(record))
        if action == "join" and index + 1 < len(plan):
            pending_join += text
            continue
        text = pending_join + text
        pending_join = ""
        if action == "split":
            start = len(text) - len(payload)  # split inside this record
            cut = start + int(where * len(payload))
            lines.extend([text[:cut], text[cut:]])
        else:
            lines.append(text)
    data = ("\n".join(lines) + "\n").encode()

    trace = parse_strace_bytes(data, "generated.log")

    assert got_rows(trace) == expected
    assert trace.dropped_total == expected_dropped, trace.dropped
    assert set(trace.dropped) <= {"torn_record", "unknown_version", "missing_field"}


@SETTINGS
@given(
    plan=st.lists(st.tuples(records, prefixes), min_size=1, max_size=6),
    edits=st.lists(st.tuples(st.floats(0, 1), st.binary(max_size=6)), max_size=6),
)
def test_random_byte_damage_never_raises_unexpectedly(reader, plan, edits):
    data = bytearray(("\n".join(prefix + format_strace_payload(**record) for record, prefix in plan) + "\n").encode())
    for where, insert in edits:
        at = int(where * len(data))
        data[at : at + len(insert) // 2] = insert
    try:
        trace = parse_strace_bytes(bytes(data), "damaged.log")
    except InputError as error:  # only a file with no record left may be refused
        assert error.path == "damaged.log" and error.line is not None
        return
    assert trace.spans.num_rows <= len(plan) + data.count(b"[STRACE]")
    assert trace.spans.schema.equals(SPAN_SCHEMA)
    assert trace.records_read >= len(trace.spans) + trace.dropped_total - trace.dropped.get("bad_anchor", 0) - trace.dropped.get(
        "bad_chip_process", 0
    )


@SETTINGS
@given(
    plan=st.lists(st.tuples(records, prefixes, st.floats(0, 1), st.booleans()), min_size=1, max_size=8),
    edits=st.lists(st.tuples(st.floats(0, 1), st.binary(max_size=4)), max_size=3),
    chunk_bytes=st.integers(1, 300),
)
def test_reading_in_chunks_gives_the_same_trace_as_reading_whole(reader, plan, edits, chunk_bytes):
    lines = [
        "[mono_ns=1][T0x1][TIMING] clock_anchor: [CLOCK_ANCHOR] v=1 pid=7 mono_ns=5 wall_ns=9",
        "[chip_process pid=7 dev=npu%3A0] ready",
    ]
    for record, prefix, where, split in plan:
        text = prefix + format_strace_payload(**record)
        cut = int(where * len(text))
        lines.extend([text[:cut], text[cut:]] if split else [text])
    data = bytearray(("\n".join(lines) + "\n").encode())
    for where, insert in edits:
        at = int(where * len(data))
        data[at : at + len(insert) // 2] = insert
    whole = outcome(bytes(data), "chunked.log")
    saved = strace_pieces.PIECE_BYTES
    strace_pieces.PIECE_BYTES = chunk_bytes  # many pieces, cut wherever a line opens with '['
    try:
        chunked = outcome(bytes(data), "chunked.log")
    finally:
        strace_pieces.PIECE_BYTES = saved
    assert chunked == whole
