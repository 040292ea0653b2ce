"""The shared predicates (analysis/store/predicates.py) and the span dataset's compiled copy of one of them.

The dataset's writer finds each row's invocation start with a compiled helper
(an Arrow group-by where it is not built), for speed; here both are held to
the SQL that defines it, row for row, and the writer's windows to the Ray
path's ``in_window``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsprof.analysis.store import dataset
from dsprof.analysis.store.predicates import in_window, query_arrow, row_host_start, serving_row, starts_in
from dsprof.analysis.store.spans import MAX_TIME_NS
from dsprof.compiled import PURE_PYTHON_ENV
from dsprof.profiler import strace_format as fmt

NEVER = np.iinfo(np.int64).max


def _rows(ts: st.SearchStrategy[int]) -> st.SearchStrategy[list[tuple[int, int | None, bool, int]]]:
    """(pid, inv or None, on the host clock, ts_ns): few pids and invs, so rows share invocations."""
    inv = st.one_of(st.none(), st.integers(0, 5), st.just(2**64 - 1))
    return st.lists(st.tuples(st.integers(1, 3), inv, st.booleans(), ts), max_size=60)


ROWS = _rows(st.integers(-(2**40), 2**40))
# timestamps up to the span table's bound: windows are compared as integers, exactly
LATE_ROWS = _rows(st.integers(0, MAX_TIME_NS - 1))


def _table(rows: list[tuple[int, int | None, bool, int]]) -> pa.Table:
    pid, inv, host, ts = zip(*rows, strict=True) if rows else ((), (), (), ())
    return pa.table(
        {
            "pid": pa.array(pid, pa.int64()),
            "inv": pa.array(inv, pa.uint64()),
            "clk": pa.array(["host" if h else fmt.CLK_DEVICE for h in host], pa.string()),
            "ts_ns": pa.array(ts, pa.int64()),
        }
    )


def _dataset_starts(table: pa.Table) -> np.ndarray:
    ts = dataset._int64s(table.column("ts_ns"))
    host = pc.not_equal(table.column("clk"), fmt.CLK_DEVICE).to_numpy(zero_copy_only=False)
    return dataset._invocation_starts(table, ts, host)


def _sql_starts(table: pa.Table) -> np.ndarray:
    numbered = table.append_column("row", pa.array(np.arange(table.num_rows)))
    found = query_arrow(f"SELECT row, coalesce({row_host_start()}, {NEVER}) AS start FROM spans", spans=numbered)
    starts = np.empty(table.num_rows, np.int64)
    starts[found.column("row").to_numpy()] = found.column("start").to_numpy()
    return starts


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "arrow"])
@given(rows=ROWS)
def test_the_dataset_writer_finds_the_invocation_starts_the_sql_defines(compiled, rows):
    if compiled and dataset.compiled_starts is None:
        pytest.skip("the compiled helpers are not built")
    with pytest.MonkeyPatch.context() as env:
        if not compiled:
            env.setenv(PURE_PYTHON_ENV, "1")
        table = _table(rows)
        assert _dataset_starts(table).tolist() == _sql_starts(table).tolist()


@given(rows=st.one_of(ROWS, LATE_ROWS), window_ns=st.sampled_from([1, 7, 1 << 20, 1 << 34]))
def test_in_window_selects_the_invocations_the_writer_puts_in_each_window(rows, window_ns):
    """Each invocation rooted at its earliest host row: ``in_window`` (Ray) and the writer's window agree."""
    table = _table([r for r in rows if r[1] is not None and r[2]])  # host rows of invocations
    first = table.group_by(["pid", "inv"]).aggregate([("ts_ns", "min")])
    table = table.join(first, ["pid", "inv"])
    rooted = table.append_column("depth", pc.if_else(pc.equal(table["ts_ns"], table["ts_ns_min"]), 0, 1)).drop_columns("ts_ns_min")
    windows = dataset.window_of_rows(rooted, window_ns).tolist()
    by_writer = dict(zip(zip(rooted["pid"].to_pylist(), rooted["inv"].to_pylist(), strict=True), windows, strict=True))
    for window in {*windows[:5], *(w + 1 for w in windows[:2])}:
        query = f"SELECT pid, inv FROM spans GROUP BY pid, inv HAVING {in_window(window, window_ns)}"
        chosen = {(r["pid"], r["inv"]) for r in query_arrow(query, spans=rooted).to_pylist()}
        assert chosen == {key for key, w in by_writer.items() if w == window}


def test_starts_in_is_half_open_and_open_where_a_bound_is_none():
    table = pa.table({"t": pa.array([9, 10, 19, 20], pa.int64())})
    kept = lambda where: query_arrow(f"SELECT t FROM spans WHERE {where}", spans=table).column("t").to_pylist()  # noqa: E731
    assert kept(starts_in("t", 10, 20)) == [10, 19]
    assert kept(starts_in("t", None, 20)) == [9, 10, 19]
    assert kept(starts_in("t", 10, None)) == [10, 19, 20]
    assert kept(starts_in("t", None, None)) == [9, 10, 19, 20]


def test_a_serving_row_is_one_without_inv_or_depth():
    table = pa.table({"inv": pa.array([1, None, 1, None], pa.uint64()), "depth": pa.array([0, 0, None, None], pa.int64())})
    assert query_arrow(f"SELECT {serving_row()} AS s FROM spans", spans=table).column("s").to_pylist() == [False, True, True, True]
