"""A large trace's invocations are aggregated in passes over shares of them, and the engine's tables are compressed:
the same table and the same summary as one pass, in less memory."""

from __future__ import annotations

import json

import pytest

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.ingest import read_paths
from dsprof.analysis.stages import invocations as invocations_module
from dsprof.analysis.stages.invocations import create_invocations
from dsprof.analysis.store import engine as engine_module
from dsprof.analysis.store.dataset import SpanDatasetWriter, files_by_window, open_dataset
from dsprof.analysis.store.engine import open_engine, parquet_source
from dsprof.testing.synthetic import SyntheticRun


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    run = tmp_path_factory.mktemp("passes") / "run"
    SyntheticRun(ranks=4, steps=60, host_evidence=True).write(run)
    return read_paths([run])


def _invocations(trace, passes: int, monkeypatch) -> list[tuple]:
    monkeypatch.setattr(invocations_module, "SPANS_PER_PASS", -(-trace.span_count // passes))
    engine = open_engine(trace)
    try:
        create_invocations(engine)
        return engine.rows("SELECT * FROM invocations ORDER BY pid, inv")
    finally:
        engine.close()


def test_the_invocations_of_several_passes_are_those_of_one(trace, monkeypatch):
    one = _invocations(trace, 1, monkeypatch)
    assert len(one) == 4 * (60 + 1)  # a decode run per rank and step, and a prefill run per rank
    for passes in (2, 3, 7):
        assert _invocations(trace, passes, monkeypatch) == one


def test_an_analysis_in_passes_writes_the_summary_of_one_pass(trace, monkeypatch):
    def summary_text(passes: int) -> str:
        monkeypatch.setattr(invocations_module, "SPANS_PER_PASS", -(-trace.span_count // passes))
        result = analyze_trace(trace)
        try:
            return json.dumps(result.summary, sort_keys=True)
        finally:
            result.engine.close()

    assert summary_text(5) == summary_text(1)


def test_a_smaller_memory_limit_aggregates_fewer_spans_a_pass(trace, monkeypatch):
    one = _invocations(trace, 1, monkeypatch)
    limit = 512 << 20
    engine = open_engine(trace, memory_limit=limit)
    try:
        assert engine.memory_limit == limit
        assert invocations_module.spans_per_pass(engine) == min(invocations_module.SPANS_PER_PASS, limit // 400)
        # as if each span took a third of the limit: three passes, the same table
        monkeypatch.setattr(invocations_module, "PASS_BYTES_PER_SPAN", limit // -(-trace.span_count // 3))
        assert -(-trace.span_count // invocations_module.spans_per_pass(engine)) == 3
        statements: list[str] = []
        run = engine.run
        monkeypatch.setattr(engine, "run", lambda query, params=None: (statements.append(query), run(query, params))[1])
        create_invocations(engine)
        assert sum(q.startswith("INSERT INTO invocations") for q in statements) == 3
        assert engine.rows("SELECT * FROM invocations ORDER BY pid, inv") == one
    finally:
        engine.close()


def _table_bytes(engine) -> int:
    return engine.scalar("SELECT sum(memory_usage_bytes) FROM duckdb_memory() WHERE tag = 'IN_MEMORY_TABLE'")


def test_a_compacted_table_takes_a_fraction_of_its_plain_size(trace, monkeypatch):
    engine = open_engine(trace)
    try:
        engine.run(
            "CREATE TABLE wide AS SELECT i AS step, i % 64 AS rank, i * 1000 AS ts_ns, NULL::BIGINT AS absent FROM range(1000000) t(i)"
        )
        plain = _table_bytes(engine)
        monkeypatch.setattr(engine_module, "COMPACT_BYTES", plain + 1)
        engine.compact()  # below the size worth a checkpoint: left plain
        assert _table_bytes(engine) == plain
        monkeypatch.setattr(engine_module, "COMPACT_BYTES", plain)
        engine.compact()
        assert plain > 8 * _table_bytes(engine), (plain, _table_bytes(engine))
        assert engine.rows("SELECT count(*), sum(step), max(rank), count(absent) FROM wide") == [(1_000_000, 499_999_500_000, 63, 0)]
    finally:
        engine.close()


def _dataset_in_slices(trace, directory, window_ns: int, slice_rows: int):
    """``trace``'s spans written as a span dataset a slice of rows at a time, as a log's pieces are: an invocation cut
    between slices has rows in the window of each slice's earliest start of it, so windows this short spread some wide."""
    writer = SpanDatasetWriter(directory, window_ns=window_ns)
    for start in range(0, trace.spans.num_rows, slice_rows):
        writer.add(trace.spans.slice(start, slice_rows))
    writer.finish(trace)
    return open_dataset(directory)


def _spread(dataset) -> dict[int, int]:
    """How many invocations lie in how many windows past their first one (0: all rows in one window)."""
    engine = open_engine(dataset)
    try:
        rows = engine.rows(
            f"SELECT d, count(*) FROM (SELECT max(time_window) - min(time_window) AS d FROM {parquet_source(dataset.span_files)} "
            "WHERE inv IS NOT NULL GROUP BY pid, inv) GROUP BY d"
        )
    finally:
        engine.close()
    return dict(rows)


def test_the_invocations_of_a_span_dataset_in_passes_over_its_windows_are_those_of_one(trace, tmp_path, monkeypatch):
    dataset = _dataset_in_slices(trace, tmp_path / "spans", window_ns=10_000_000, slice_rows=97)
    windows = files_by_window(dataset.span_files)
    assert windows is not None and len(windows) > 20  # passes over runs of windows, not shares of the invocations
    spread = _spread(dataset)
    assert spread.get(1) and sum(n for d, n in spread.items() if d > 1), spread  # rows in the next window, and strays
    one = _invocations(trace, 1, monkeypatch)
    for passes in (2, 5, 11, 1000):  # 1000: a window a pass, so that rows in the next window and strays cross passes
        assert _invocations(dataset, passes, monkeypatch) == one
