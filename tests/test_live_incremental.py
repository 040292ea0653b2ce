"""A live window aggregates only the invocations that are new or changed since the last one (analysis/invocations.py).

Every refresh of ``dsprof watch`` analyses a window that overlaps the last one
almost entirely. The invocation table is the one span-sized pass, so the rows
of invocations whose STRACE rows are unchanged are taken from the last
window's table; these tests check that the result is the table (and the
summary) a fresh aggregation gives, and that a changed invocation is
aggregated again.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.engine import open_engine
from dsprof.analysis.ingest import read_strace_log
from dsprof.analysis.invocations import invocation_query, reusing_statements
from dsprof.analysis.live import LiveAnalysis
from dsprof.testing.coupled import Shape, scenario_for
from dsprof.testing.coupled_log import write_log

SHAPE = Shape(ranks=4, steps=60, layers=2, seed=11)


@pytest.fixture(scope="module")
def log_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    scenario = scenario_for(SHAPE)
    path = tmp_path_factory.mktemp("faulty") / "server.log"
    write_log(scenario, scenario.run(), path)
    return path.read_bytes()


def test_every_window_equals_a_fresh_analysis_of_its_rows(tmp_path, log_bytes):
    log = tmp_path / "server.log"
    log.touch()
    live = LiveAnalysis([log], tmp_path / "spans", window=12)
    rng, at, windows = random.Random(3), 0, 0
    while at < len(log_bytes):
        step = rng.randint(20_000, 90_000)
        with log.open("ab") as handle:
            handle.write(log_bytes[at : at + step])
        at += step
        live.poll()
        result = live.window()
        if result is None:
            continue
        fresh = analyze_trace(result.trace)
        try:
            assert result.summary == fresh.summary
            assert _sorted(result.engine.arrow("SELECT * FROM invocations")).equals(
                _sorted(fresh.engine.arrow("SELECT * FROM invocations"))
            )
        finally:
            result.engine.close()
            fresh.engine.close()
        windows += 1
    live.abort()
    assert windows >= 5  # the window moved on several times: most of each came from the last one


def test_unchanged_invocations_are_reused_and_changed_ones_aggregated_again(tmp_path, log_bytes):
    log = tmp_path / "server.log"
    log.write_bytes(log_bytes)
    engine = open_engine(read_strace_log(log))
    try:
        engine.run(f"CREATE TABLE fresh AS {invocation_query()}")
        earlier = _sorted(engine.arrow("SELECT * FROM fresh"))
        # marked rows: a reused row keeps its mark; one whose span count no longer matches is aggregated again
        marked = earlier.set_column(earlier.schema.get_field_index("device_markers"), "device_markers", pa.array([-1] * earlier.num_rows))
        stale = pc.equal(pc.multiply(pc.divide(pa.array(range(earlier.num_rows)), 2), 2), pa.array(range(earlier.num_rows)))
        n_spans = pc.if_else(stale, pc.add(marked["n_spans"], 1), marked["n_spans"])
        marked = marked.set_column(marked.schema.get_field_index("n_spans"), "n_spans", n_spans)
        engine.con.register("earlier", marked)
        for statement in reusing_statements("earlier"):
            engine.run(statement)
        got = _sorted(engine.arrow("SELECT * FROM invocations"))
        assert engine.rows("DESCRIBE invocations") == engine.rows("DESCRIBE fresh")  # the fresh table's column types
    finally:
        engine.close()
    markers = got["device_markers"].to_pylist()
    fresh_markers = earlier["device_markers"].to_pylist()
    for row, is_stale in enumerate(stale.to_pylist()):
        assert markers[row] == (fresh_markers[row] if is_stale else -1)
    restored = got.set_column(got.schema.get_field_index("device_markers"), "device_markers", earlier["device_markers"])
    assert restored.equals(earlier)  # every other column as a fresh aggregation has it


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([("pid", "ascending"), ("inv", "ascending")])


def test_a_window_with_nothing_earlier_aggregates_everything(tmp_path, log_bytes):
    log: Path = tmp_path / "server.log"
    log.write_bytes(log_bytes)
    trace = read_strace_log(log)
    plain = analyze_trace(trace)
    empty = plain.engine.arrow("SELECT * FROM invocations LIMIT 0")
    reused = analyze_trace(trace, earlier_invocations=empty)
    try:
        assert reused.summary == plain.summary
    finally:
        plain.engine.close()
        reused.engine.close()


def test_with_expect_ranks_a_step_waits_for_a_rank_whose_log_is_not_there_yet(tmp_path, log_bytes):
    """Per-rank logs: the fourth rank's log appears after the first refresh; only --expect-ranks holds its steps back."""
    lines = log_bytes.decode().splitlines(keepends=True)
    pids = sorted({line.split(" pid=")[1].split()[0] for line in lines if "[STRACE]" in line})
    for rank, pid in enumerate(pids):
        (tmp_path / f"rank{rank}.txt").write_text("".join(line for line in lines if f"pid={pid} " in line or f"pid={pid}]" in line))
    logs = tmp_path / "logs"
    logs.mkdir()
    for rank in range(len(pids) - 1):
        (tmp_path / f"rank{rank}.txt").rename(logs / f"rank{rank}.log")
    default = LiveAnalysis([logs], tmp_path / "a", window=100)
    expecting = LiveAnalysis([logs], tmp_path / "b", window=100, expect_ranks=len(pids))
    default.poll()
    expecting.poll()
    early = default.window()
    assert early is not None and len(early.summary["figures"]["per_rank"]) == len(pids) - 1  # shown without the last rank
    early.engine.close()
    assert expecting.window() is None  # no step has every rank yet
    (tmp_path / f"rank{len(pids) - 1}.txt").rename(logs / f"rank{len(pids) - 1}.log")
    expecting.poll()
    full = expecting.window()
    assert full is not None and len(full.summary["figures"]["per_rank"]) == len(pids)
    assert full.summary["validation"]["valid"], full.summary["validation"]["problems"]
    full.engine.close()
    default.abort()
    expecting.abort()
