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
from dsprof.analysis.store.engine import open_engine
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
