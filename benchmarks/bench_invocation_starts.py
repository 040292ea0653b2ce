"""Time the span dataset's per-row invocation start three ways: compiled helper, Arrow group-by, DuckDB window.

The span dataset's writer puts each row in the time window of its
invocation's earliest host start among the rows of its piece
(:func:`dsprof.analysis.store.dataset.window_of_rows`). The compiled helper
(``_invocation_starts.c``) does it, the Arrow group-by where it is
not built; the SQL of the same thing (:func:`~dsprof.analysis.store.predicates.row_host_start`,
a window function) is the definition the other paths share. This times the
three on the pieces of an 8-rank, 20,000-step synthetic log as ingest hands
them over (``strace_pieces.PIECE_BYTES`` of log each), and checks they agree.

    .venv/bin/python benchmarks/bench_invocation_starts.py [--ranks 8] [--steps 20000] [--keep DIR] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.ingest import read_paths
from dsprof.analysis.ingest.strace_pieces import PIECE_BYTES
from dsprof.analysis.store import dataset
from dsprof.analysis.store.predicates import query_arrow, row_host_start
from dsprof.compiled import PURE_PYTHON_ENV
from dsprof.testing.synthetic import SyntheticRun


def starts_compiled(table: pa.Table) -> np.ndarray:
    return _starts(table)


def starts_arrow(table: pa.Table) -> np.ndarray:
    os.environ[PURE_PYTHON_ENV] = "1"
    try:
        return _starts(table)
    finally:
        del os.environ[PURE_PYTHON_ENV]


def _starts(table: pa.Table) -> np.ndarray:
    """As :func:`~dsprof.analysis.store.dataset.window_of_rows` calls it."""
    ts = dataset._int64s(table.column("ts_ns"))
    host = pc.not_equal(table.column("clk"), "dev").to_numpy(zero_copy_only=False)
    return dataset._invocation_starts(table, ts, host)


def starts_duckdb(table: pa.Table) -> np.ndarray:
    """The SQL definition, INT64 max where an invocation has no host row (as the others)."""
    columns = table.select(["pid", "inv", "clk", "ts_ns"]).append_column("row", pa.array(np.arange(table.num_rows)))
    found = query_arrow(f"SELECT row, coalesce({row_host_start()}, {np.iinfo(np.int64).max}) AS start FROM spans", spans=columns)
    out = np.empty(table.num_rows, np.int64)
    out[found.column("row").to_numpy()] = found.column("start").to_numpy()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--keep", type=Path, help="generate the run here (reused when present)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        run = args.keep or Path(scratch) / "run"
        if not (run / "server.log").exists():
            SyntheticRun(ranks=args.ranks, steps=args.steps).write(run)
        log = run / "server.log"
        spans = read_paths([log]).spans
    pieces = max(1, round(log.stat().st_size / PIECE_BYTES)) if log.exists() else 1
    rows = -(-spans.num_rows // pieces)
    tables = [spans.slice(i, rows) for i in range(0, spans.num_rows, rows)]
    print(f"{args.ranks} x {args.steps}: {spans.num_rows:,} rows in {len(tables)} piece(s) of up to {rows:,}")
    results = {}
    for name, how in (("compiled", starts_compiled), ("arrow", starts_arrow), ("duckdb", starts_duckdb)):
        best = float("inf")
        for _ in range(args.repeats):
            began = time.perf_counter()
            out = [how(t) for t in tables]
            best = min(best, time.perf_counter() - began)
        results[name] = np.concatenate(out)
        print(f"  {name:9s} {best:7.3f} s  ({spans.num_rows / best / 1e6:6.1f} M rows/s)")
    agree = all(np.array_equal(results["compiled"], other) for other in results.values())
    print(f"  the three agree row for row: {agree}")


if __name__ == "__main__":
    main()
