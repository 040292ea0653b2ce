"""``dsprof ingest -o DIR/``: the span dataset, its manifest and time windows, and the command itself."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from dsprof.analysis.ingest import read_paths
from dsprof.analysis.store.dataset import DATASET_SCHEMA, MANIFEST, SpanDatasetWriter, open_dataset, rows_of, window_of_rows
from dsprof.analysis.store.spans import SPAN_SCHEMA, Trace
from dsprof.cli.main import cli
from dsprof.commands.ingest import ingest_paths
from dsprof.errors import InputError
from dsprof.profiler import strace_format as fmt
from dsprof.testing.strace_readers import READERS, select_reader

WALL = 1_764_470_000_123_456_789


def record(pid: int, inv: int, ts: int, name: str = fmt.ROOT, clk: str = fmt.CLK_HOST, **attrs) -> str:
    attrs = {fmt.CLK_ATTR: clk, **attrs} if clk == fmt.CLK_DEVICE else attrs
    return fmt.format_prefix(ts, 1, "INFO", "strace_span") + fmt.format_strace_payload(
        pid=pid, tid=pid, inv=inv, hid="ab", depth=0, name=name, ts_ns=ts, dur_ns=10, attrs=attrs
    )


@pytest.fixture()
def windowed_log(tmp_path):
    """Invocations whose windows (of 1000 ns) are known: see the comments."""
    lines = [
        fmt.format_anchor_record(1, 0, WALL, 1),
        record(1, 10, 1200, fmt.BIND),  # inv (1, 10) starts at 500 below: window 0
        record(1, 10, 5, fmt.DEVICE_WALL, clk=fmt.CLK_DEVICE),  # device clock: goes with its invocation, window 0
        record(1, 10, 500, rank=3),
        record(2, 10, 1500),  # same inv, another pid: window 1
        record(1, 11, 2100, step=4),  # window 2
        record(1, 11, 3, fmt.DEVICE_WALL, clk=fmt.CLK_DEVICE),
        record(3, 12, 7, fmt.DEVICE_WALL, clk=fmt.CLK_DEVICE),  # only device rows: the table's median host start, 1500: window 1
        record(1, 10, 600)[:60],  # torn
    ]
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("reader", READERS)
def test_rows_go_to_the_window_of_their_invocation(reader, monkeypatch, windowed_log):
    select_reader(reader, monkeypatch)  # the compiled helper or the Arrow group-by
    table = read_paths([windowed_log]).spans
    assert window_of_rows(table, 1000).tolist() == [0, 0, 0, 1, 2, 2, 1]


@pytest.mark.parametrize("reader", READERS)
def test_dataset_files_and_manifest(reader, monkeypatch, windowed_log, tmp_path):
    select_reader(reader, monkeypatch)
    writer = SpanDatasetWriter(tmp_path / "out", window_ns=1000)
    trace = read_paths([windowed_log], sink=writer)
    writer.finish(trace)
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["schema"] == DATASET_SCHEMA and manifest["window_ns"] == 1000 and manifest["span_schema"] == SPAN_SCHEMA.names
    assert [(f["path"], f["window"], f["rows"], f["min_ts_ns"], f["max_ts_ns"]) for f in manifest["files"]] == [
        ("time_window=0/part-0.parquet", 0, 3, 5, 1200),
        ("time_window=1/part-1.parquet", 1, 2, 7, 1500),
        ("time_window=2/part-2.parquet", 2, 2, 3, 2100),
    ]
    side = manifest["trace"]
    assert (side["records_read"], side["lines_read"], side["dropped"]) == (9, 9, {"torn_record": 1})
    assert side["anchors"] == [[1, 0, WALL]] and side["files"] == [str(windowed_log)]
    opened = open_dataset(tmp_path / "out")
    assert opened.anchors.to_pylist() == [{"pid": 1, "mono_ns": 0, "wall_ns": WALL}]  # exact past 2**53
    tables = [pq.read_table(path) for path in opened.span_files]
    assert all(t.schema.equals(SPAN_SCHEMA) for t in tables)
    assert [t.column("ts_ns").to_pylist() for t in tables] == [[1200, 5, 500], [1500, 7], [2100, 3]]
    assert tables[0].column("rank").to_pylist() == [None, None, 3] and tables[2].column("step").to_pylist() == [4, None]
    assert tables[0].column("clk").to_pylist() == ["host", "dev", "host"]


def spans_at(*ts: int) -> pa.Table:
    """Host rows without invocation at the given starts (other columns null)."""
    columns = {field.name: pa.nulls(len(ts), field.type) for field in SPAN_SCHEMA}
    columns.update(ts_ns=pa.array(ts, pa.int64()), clk=pa.array([fmt.CLK_HOST] * len(ts)))
    return pa.table(columns, schema=SPAN_SCHEMA)


def test_a_window_left_behind_gets_a_new_part(tmp_path):
    writer = SpanDatasetWriter(tmp_path / "out", window_ns=1000)
    writer.add(spans_at(10, 20, 30))
    writer.add(spans_at(5010, 5020))  # window 5: window 0 is more than one window behind, its part is closed
    writer.add(spans_at(40))  # window 0 again: a new part
    writer.finish(Trace())
    files = json.loads((tmp_path / "out" / MANIFEST).read_text())["files"]
    assert [(f["path"], f["rows"]) for f in files] == [
        ("time_window=0/part-0.parquet", 3),
        ("time_window=0/part-2.parquet", 1),
        ("time_window=5/part-1.parquet", 2),
    ]
    assert pq.read_table(tmp_path / "out" / "time_window=0/part-2.parquet").column("ts_ns").to_pylist() == [40]


def test_rows_of_slices_long_runs_and_gathers_the_rest():
    table = pa.table({"x": np.arange(20_000)})
    rows = np.concatenate([np.arange(3, 9), np.arange(100, 9000), [9005, 9007], np.arange(12_000, 19_000)])
    assert rows_of(table, rows).column("x").to_pylist() == rows.tolist()
    assert rows_of(table, np.arange(5, 50)).column("x").to_pylist() == list(range(5, 50))


@pytest.mark.parametrize("reader", READERS)
def test_ingest_twice_replaces_the_dataset_and_both_readers_write_the_same(reader, monkeypatch, windowed_log, tmp_path):
    select_reader(reader, monkeypatch)
    out = tmp_path / "out"
    (out / "time_window=99").mkdir(parents=True)
    (out / "time_window=99" / "part-7.parquet").write_bytes(b"stale")
    trace = ingest_paths([windowed_log], str(out) + "/")
    assert not (out / "time_window=99" / "part-7.parquet").exists()
    assert trace.spans.num_rows == 0 and trace.spans_written == {"strace": 7} and trace.dropped == {"torn_record": 1}
    assert [p.relative_to(out).as_posix() for p in trace.span_files] == ["time_window=0/part-0.parquet"]  # 17 s windows: one
    assert pq.read_table(trace.span_files[0]).num_rows == 7
    other = "python" if reader == "compiled" else "compiled"
    select_reader(other, monkeypatch)
    again = ingest_paths([windowed_log], tmp_path / "again")
    assert (out / MANIFEST).read_text().replace(str(out), "") == (tmp_path / "again" / MANIFEST).read_text().replace(
        str(tmp_path / "again"), ""
    )
    assert pq.read_table(again.span_files[0]).equals(pq.read_table(trace.span_files[0]))


def test_a_failed_ingest_leaves_no_manifest(tmp_path, windowed_log):
    out = tmp_path / "out"
    ingest_paths([windowed_log], out)
    blob = tmp_path / "blob.log"
    blob.write_bytes(b"\x00\x01 not text")
    with pytest.raises(InputError, match="binary data"):
        ingest_paths([windowed_log, blob], out)
    assert not (out / MANIFEST).exists()
    with pytest.raises(InputError, match="incomplete"):
        open_dataset(out)
    assert not [p for p in out.rglob("*") if p.name.startswith(".")]  # no temporary file left


def test_cli_ingest_prints_the_report_and_refuses_bad_outputs(tmp_path, windowed_log):
    runner = CliRunner()
    result = runner.invoke(cli, ["ingest", str(windowed_log), "-o", str(tmp_path / "out") + "/"])
    assert result.exit_code == 0, result.output
    assert "spans kept: 7 (strace 7)" in result.output and "torn_record: 1" in result.output
    assert f"span dataset: {tmp_path / 'out'}/ (1 Parquet file(s)" in result.output
    result = runner.invoke(cli, ["ingest", str(windowed_log), "-o", str(tmp_path / "spans.xlsx")])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        f"dsprof: error: {tmp_path / 'spans.xlsx'}: unknown span table format '.xlsx' (expected .parquet, .csv, .jsonl)"
    )


def test_dsprof_ingest_does_not_import_pandas(tmp_path, windowed_log):
    script = textwrap.dedent(
        f"""
        import sys
        from dsprof.cli.main import cli
        try:
            cli(["ingest", {str(windowed_log)!r}, "-o", {str(tmp_path / "out") + "/"!r}], standalone_mode=False)
        finally:
            print("pandas imported:", "pandas" in sys.modules)
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert "pandas imported: False" in run.stdout
