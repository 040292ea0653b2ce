"""The row and invocation predicates of the span table, once, as SQL (docs/ARCHITECTURE.md "One home per concept").

Every path evaluates these same texts through DuckDB: the invocation pass over
``spans`` (batch and Ray), and the window cut and the live ring over their
Arrow tables in place (:func:`query_arrow`). An invocation is the rows sharing
``(pid, inv)`` (docs/FORMATS.md); its start is its host root's, else its
earliest host row's, else its earliest row's. The span dataset's writer finds
the same earliest host start per row with a compiled helper
(:mod:`dsprof.analysis.store.dataset`); tests/test_predicates.py holds it to
:func:`row_host_start`.
"""

from __future__ import annotations

import functools
import os

import duckdb
import pyarrow as pa

from dsprof.interrupts import interruptible
from dsprof.profiler import strace_format as fmt


def _prefix(alias: str) -> str:
    return f"{alias}." if alias else ""


def host_row(alias: str = "") -> str:
    """SQL: a row on the host clock (not a device-clock row)."""
    return f"{_prefix(alias)}clk <> '{fmt.CLK_DEVICE}'"


def host_root(alias: str = "") -> str:
    """SQL: an invocation's host root: a depth-0 host row."""
    return f"{_prefix(alias)}depth = 0 AND {host_row(alias)}"


def runtime_row(alias: str = "") -> str:
    """SQL: a STRACE row of the runtime — not another producer's (``ext.*``), not a GC span."""
    a = _prefix(alias)
    return f"{a}inv IS NOT NULL AND {a}depth IS NOT NULL AND {a}name NOT LIKE '{fmt.EXTERNAL_PREFIX}%' AND {a}name <> '{fmt.GC}'"


def runtime_device_row(alias: str = "") -> str:
    """SQL: a runtime row on the device clock (a run's device program and its phases)."""
    return f"{runtime_row(alias)} AND {_prefix(alias)}clk = '{fmt.CLK_DEVICE}'"


def serving_row(alias: str = "") -> str:
    """SQL: a serving row (SA_PROFILE or Chrome): anything that is not a STRACE record."""
    a = _prefix(alias)
    return f"({a}inv IS NULL OR {a}depth IS NULL)"


def gc_row(alias: str = "") -> str:
    """SQL: a garbage collection (``host.gc``, docs/FORMATS.md "Host evidence")."""
    return f"{_prefix(alias)}name = '{fmt.GC}' AND {host_row(alias)}"


def host_start() -> str:
    """SQL aggregate over an invocation's rows: its earliest host start (null without host rows)."""
    return f"min(ts_ns) FILTER (WHERE {host_row()})"


def invocation_start() -> str:
    """SQL aggregate over an invocation's rows: its start (its root's, else its earliest host row's, else its earliest row's)."""
    return f"coalesce(min(ts_ns) FILTER (WHERE {host_root()}), {host_start()}, min(ts_ns))"


def in_share(share: int, shares: int) -> str:
    """SQL per row: its invocation falls in share ``share`` of ``shares`` (by a hash of ``(pid, inv)``): a pass over
    one share holds every row of each of its invocations."""
    return f"hash(pid, inv) % {int(shares)} = {int(share)}"


def starts_in(start: str, from_ns: int | None, until_ns: int | None) -> str:
    """SQL: ``start`` (an invocation's start, as SQL) lies in ``[from_ns, until_ns)``; a side None is open."""
    bounds = [f"{start} >= {int(from_ns)}"] if from_ns is not None else []
    bounds += [f"{start} < {int(until_ns)}"] if until_ns is not None else []
    return f"({' AND '.join(bounds)})" if bounds else "TRUE"


def in_window(window: int, window_ns: int) -> str:
    """HAVING clause: the invocation starts in time window ``window`` of the span dataset (``[window, window + 1) * window_ns``)."""
    return starts_in(invocation_start(), int(window) * int(window_ns), (int(window) + 1) * int(window_ns))


def row_host_start() -> str:
    """SQL per row: its invocation's earliest host start (null without host rows); its own start without ``inv``."""
    return f"CASE WHEN inv IS NULL THEN ts_ns ELSE {host_start()} OVER (PARTITION BY pid, inv) END"


def overlaps(first_ns: int | None, last_ns: int | None, alias: str = "") -> str:
    """SQL: the row overlaps ``[first_ns, last_ns]`` (never, where either is None)."""
    if first_ns is None or last_ns is None:
        return "FALSE"
    a = _prefix(alias)
    return f"({a}ts_ns <= {int(last_ns)} AND {a}ts_ns + {a}dur_ns >= {int(first_ns)})"


@functools.cache
def _database(pid: int) -> duckdb.DuckDBPyConnection:
    """Process ``pid``'s in-memory DuckDB that the Arrow queries run in (a cursor each; a forked child makes its own)."""
    return duckdb.connect()


def query_arrow(query: str, **tables: pa.Table) -> pa.Table:
    """The result of ``query`` over ``tables`` (Arrow, read in place, each by its keyword's name)."""
    with interruptible(_database(os.getpid()).cursor()) as con:
        for name, table in tables.items():
            con.register(name, table)
        return con.sql(query).to_arrow_table()
