"""Unions of time intervals in SQL: how much of a span of time some activity covered, every overlap counted once.

The one home of the interval union that the Kineto reader (compute and host
gaps per step) and the device-time breakdown share. Islands of overlapping
intervals are found with a running maximum of the ends (a window over the
intervals sorted by start), so the query is one sort per group, never a
per-row loop.
"""

from __future__ import annotations


def islands_sql(intervals: str, keys: str) -> str:
    """SQL: per ``keys``, the islands of overlapping intervals, one row each (``lo``, ``hi``).

    ``intervals`` is a relation (a table name or a parenthesised query) with
    the columns named in ``keys`` (comma-separated) and ``lo``, ``hi``. Of
    properly nested spans of one thread (a profiler's ops), the islands are the
    outermost spans.
    """
    return f"""SELECT {keys}, min(lo) AS lo, max(hi) AS hi FROM (
            SELECT *, sum(CASE WHEN lo > prev_hi THEN 1 ELSE 0 END)
                          OVER (PARTITION BY {keys} ORDER BY lo, hi ROWS UNBOUNDED PRECEDING) AS island
            FROM (SELECT {keys}, lo, hi,
                         max(hi) OVER (PARTITION BY {keys} ORDER BY lo, hi ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_hi
                  FROM {intervals} WHERE hi > lo))
        GROUP BY {keys}, island"""


def union_sql(intervals: str, keys: str) -> str:
    """SQL: per ``keys``, ``union_ns`` (the length of the union of ``[lo, hi)``) and ``first_ns`` (the earliest ``lo``).

    ``intervals`` as for :func:`islands_sql`.
    """
    return f"""SELECT {keys}, CAST(sum(hi - lo) AS BIGINT) AS union_ns, min(lo) AS first_ns FROM ({islands_sql(intervals, keys)})
    GROUP BY {keys}"""
