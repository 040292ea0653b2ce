"""Span table files: Parquet keeps the schema, CSV and JSONL keep 64-bit ids and attrs exactly."""

from __future__ import annotations

import csv
import json

import pyarrow.parquet as pq
import pytest

from dsprof.analysis.ingest import read_paths
from dsprof.analysis.outputs.span_table import SpanTableWriter
from dsprof.analysis.store.spans import MAX_TIME_NS, SPAN_SCHEMA
from dsprof.commands.ingest import ingest_paths
from dsprof.errors import InputError
from dsprof.profiler.strace_format import format_prefix, format_strace_payload
from dsprof.testing.strace_readers import READERS, select_reader

BIG_INV = 2**64 - 1  # not representable as a float64
BIG_TS = MAX_TIME_NS - 7  # past 2**53 (not exact as a float64), inside the span time bound
NAME = 'chip.run\t"x"\\y\x01é'  # needs JSON escapes: tab, quote, backslash, a control byte
ATTRS = {"run_id": "3", "note": 'a "quoted", comma', "rank": "x"}


@pytest.fixture(autouse=True, params=READERS)
def reader(request, monkeypatch):
    select_reader(request.param, monkeypatch)


@pytest.fixture()
def inputs(tmp_path):
    log = tmp_path / "server.log"
    record = format_strace_payload(pid=7, tid=8, inv=BIG_INV, hid="beef", depth=0, name=NAME, ts_ns=BIG_TS, dur_ns=5, attrs=ATTRS)
    log.write_text(format_prefix(1, 2, "INFO", "f") + record + "\n")
    chrome = tmp_path / "k.json"
    chrome.write_text(json.dumps([{"name": "op", "cat": "cpu", "ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 1, "args": {"n": {"k": 1}}}]))
    return [log, chrome]


def test_parquet_round_trip_keeps_schema(tmp_path, inputs):
    out = tmp_path / "spans.parquet"
    trace = ingest_paths(inputs, out)
    table = pq.read_table(out)
    assert table.schema.equals(SPAN_SCHEMA, check_metadata=False)
    assert table.num_rows == 2 and trace.spans_written == {"chrome": 1, "strace": 1} and trace.span_files == [out]
    assert table.column("inv").to_pylist() == [BIG_INV, None]
    assert table.column("ts_ns").to_pylist()[0] == BIG_TS
    assert table.column("run_id").to_pylist() == [3, None]
    assert table.column("attrs").to_pylist() == [[("note", ATTRS["note"]), ("rank", "x")], [("n", '{"k":1}')]]
    assert table.column("name").to_pylist()[0] == NAME


def test_jsonl_exact_integers_and_attr_objects(tmp_path, inputs):
    out = tmp_path / "spans.jsonl"
    ingest_paths(inputs, out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["inv"] == BIG_INV and isinstance(rows[0]["inv"], int)
    assert rows[0]["ts_ns"] == BIG_TS and rows[0]["run_id"] == 3
    assert rows[0]["attrs"] == {"note": ATTRS["note"], "rank": "x"}
    assert rows[0]["name"] == NAME
    assert rows[1]["inv"] is None and rows[1]["depth"] is None and rows[1]["attrs"] == {"n": '{"k":1}'}
    assert list(rows[0]) == SPAN_SCHEMA.names


def test_csv_exact_integers_and_attrs_as_json(tmp_path, inputs):
    out = tmp_path / "spans.csv"
    ingest_paths(inputs, out)
    with out.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == SPAN_SCHEMA.names
    assert int(rows[0]["inv"]) == BIG_INV and rows[1]["inv"] == ""
    assert rows[0]["run_id"] == "3" and rows[1]["run_id"] == ""
    assert json.loads(rows[0]["attrs"]) == {"note": ATTRS["note"], "rank": "x"}
    assert rows[1]["source"] == "chrome" and rows[0]["source"] == "strace"
    assert rows[0]["name"] == NAME


def test_unknown_extension_is_an_input_error_before_reading(tmp_path):
    with pytest.raises(InputError, match="unknown span table format"):
        ingest_paths([tmp_path / "does-not-exist.log"], tmp_path / "spans.xlsx")


def test_a_failed_ingest_leaves_the_previous_file(tmp_path, inputs):
    out = tmp_path / "spans.jsonl"
    ingest_paths(inputs, out)
    before = out.read_bytes()
    binary = tmp_path / "blob.log"
    binary.write_bytes(b"\x00\x01\xff garbage")
    with pytest.raises(InputError, match="binary data"):
        ingest_paths([inputs[0], binary], out)
    assert out.read_bytes() == before and not list(tmp_path.glob(".spans.jsonl.*"))


def test_empty_table_writes_every_format(tmp_path):
    (tmp_path / "in.log").write_text("nothing here\n")
    spans = read_paths([tmp_path / "in.log"]).spans
    for suffix in (".parquet", ".csv", ".jsonl"):
        writer = SpanTableWriter(tmp_path / f"empty{suffix}")
        writer.add(spans)
        writer.finish()
    assert pq.read_table(tmp_path / "empty.parquet").num_rows == 0
    assert pq.read_table(tmp_path / "empty.parquet").schema.equals(SPAN_SCHEMA, check_metadata=False)
    assert (tmp_path / "empty.jsonl").read_text() == ""
    assert (tmp_path / "empty.csv").read_text().splitlines()[0].startswith('"source","file"')
