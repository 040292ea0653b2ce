"""Kineto traces beside a STRACE log: the device timeline of the STRACE runs, on the STRACE clock.

An artifact directory of ``dsprof run --torch-profiler`` holds each rank's
STRACE runs and its Kineto steps over the same ``runner_run``. The Kineto runs
must not become a second set of decode runs: their device-clock rows
(:mod:`.kineto`) join the STRACE run of the same rank and step instead, mapped
through the rank's ``CLOCK_ANCHOR`` and checked on ``runner_run``, seen by both
(:data:`ANCHOR_TOLERANCE_NS`). What joins, the clocks and the check:
docs/FORMATS.md, "Beside a STRACE log".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.ingest.strace_records import SOURCE as STRACE_SOURCE
from dsprof.analysis.store.spans import SPAN_SCHEMA, Trace, anchor_offsets_sql, with_sequence
from dsprof.interrupts import interruptible
from dsprof.profiler import strace_format as fmt

if TYPE_CHECKING:  # duckdb is imported where a Kineto trace is read: a command reading none never loads it
    import duckdb

# an anchor that leaves the runner_run spans of both sources further apart than this is not the profiler's clock
ANCHOR_TOLERANCE_NS = 1_000_000
_INDEX_COLUMNS = ("pid", "inv", "tid", "hid", "name", "ts_ns", "dur_ns", "rank", "step")


class RunIndex:
    """The few rows of STRACE runs the join needs (roots, runner_run, device_wall), gathered from whole tables or,
    as a span sink, from the chunks handed on to ``sink`` (a log read into a span dataset)."""

    def __init__(self, sink=None):
        self.sink = sink
        self.parts: list[pa.Table] = []

    def add(self, table: pa.Table) -> None:
        if self.sink is not None:
            self.sink.add(table)
        keep = pc.and_(
            pc.is_in(table.column("name"), pa.array([fmt.ROOT, fmt.RUNNER_RUN, fmt.DEVICE_WALL])), pc.is_valid(table.column("inv"))
        )
        keep = pc.and_(keep, pc.equal(table.column("source").cast(pa.string()), STRACE_SOURCE))
        kept = table.select(list(_INDEX_COLUMNS)).filter(keep)  # the few columns first: a chunk has dozens
        if kept.num_rows:
            self.parts.append(kept.cast(pa.schema([SPAN_SCHEMA.field(c) for c in _INDEX_COLUMNS])))

    def table(self) -> pa.Table:
        schema = pa.schema([SPAN_SCHEMA.field(c) for c in _INDEX_COLUMNS])
        return pa.concat_tables(self.parts) if self.parts else schema.empty_table()


def join_device_timeline(kineto: Trace, runs: pa.Table, anchors: pa.Table) -> Trace | None:
    """The Kineto rows as the device timeline of the STRACE runs (see the module docstring); None when no STRACE
    run has a rank and step, so that the Kineto traces stand alone."""
    import duckdb

    con = interruptible(duckdb.connect())
    con.execute("SET enable_progress_bar = false")
    try:
        con.register("index_in", runs)
        con.execute(f"""CREATE TEMP TABLE strace AS
            SELECT r.pid, r.inv, r.tid, r.hid, r.rank, r.step, u.ts_ns AS runner_ns, u.ts_ns + u.dur_ns AS runner_end_ns,
                   w.inv IS NOT NULL AS has_wall
            FROM (SELECT * FROM index_in WHERE name = '{fmt.ROOT}' AND rank IS NOT NULL AND step IS NOT NULL AND step >= 0) r
            JOIN (SELECT pid, inv, min(ts_ns) AS ts_ns, arg_min(dur_ns, ts_ns) AS dur_ns FROM index_in
                  WHERE name = '{fmt.RUNNER_RUN}' GROUP BY ALL) u USING (pid, inv)
            LEFT JOIN (SELECT DISTINCT pid, inv FROM index_in WHERE name = '{fmt.DEVICE_WALL}') w USING (pid, inv)""")
        if not con.execute("SELECT count(*) FROM strace").fetchall()[0][0]:
            return None
        con.register("kineto_in", kineto.spans)
        con.register("anchors_in", with_sequence(anchors))
        _match(con)
        trace = Trace(spans=_rows(con), files=kineto.files, dropped=dict(kineto.dropped), drop_sites=dict(kineto.drop_sites))
        trace.notes = [n for n in kineto.notes if not n.startswith("Kineto traces: ")] + _notes(con)
        return trace
    finally:
        con.close()


def _match(con: duckdb.DuckDBPyConnection) -> None:
    """``matched``: each Kineto run with the STRACE run of its rank and step, and ``clock``: per rank, the offset that
    maps a Kineto time onto the STRACE clock (mono = kineto − offset_ns), from the anchor or else from the spans."""
    con.execute(f"""CREATE TEMP TABLE matched AS
        SELECT k.pid AS k_pid, k.inv AS k_inv, k.rank, k.step, k.ts_ns AS k_runner_ns, k.ts_ns + k.dur_ns AS k_end_ns,
               s.pid, s.inv, s.tid, s.hid, s.runner_ns, s.runner_end_ns, s.has_wall, a.offset_ns AS anchor_ns
        FROM (SELECT * FROM kineto_in WHERE name = '{fmt.ROOT}') k
        JOIN strace s ON s.rank = k.rank AND s.step = k.step
        LEFT JOIN ({anchor_offsets_sql("anchors_in")}) a ON a.pid = s.pid""")
    con.execute(f"""CREATE TEMP TABLE clock AS
        WITH per_rank AS (SELECT rank, any_value(anchor_ns) AS anchor_ns, quantile_disc(k_runner_ns - runner_ns, 0.5) AS spans_ns, count(*) AS runs,
                                 median(k_runner_ns - coalesce(anchor_ns, 0) - runner_ns) AS anchor_residual_ns
                          FROM matched GROUP BY rank)
        SELECT rank, runs,
               CASE WHEN anchor_ns IS NOT NULL AND abs(anchor_residual_ns) <= {ANCHOR_TOLERANCE_NS} THEN anchor_ns
                    ELSE spans_ns END AS offset_ns,
               anchor_ns IS NOT NULL AND abs(anchor_residual_ns) <= {ANCHOR_TOLERANCE_NS} AS from_anchor
        FROM per_rank""")


def _rows(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """The Kineto device-clock rows of the matched runs, re-keyed to their STRACE run, offsets from its runner_run start."""
    rows = con.sql(f"""
        SELECT k.* REPLACE (m.pid AS pid, m.tid AS tid, m.inv AS inv, m.hid AS hid,
                            k.ts_ns + m.k_runner_ns - c.offset_ns - m.runner_ns AS ts_ns)
        FROM kineto_in k JOIN matched m ON m.k_pid = k.pid AND m.k_inv = k.inv JOIN clock c ON c.rank = m.rank
        WHERE k.clk = '{fmt.CLK_DEVICE}'
          AND (NOT m.has_wall OR starts_with(k.name, '{fmt.DEVICE_WALL}.activity.'))
        ORDER BY m.pid, m.inv, k.depth, ts_ns, k.name, k.dur_ns""").to_arrow_table()
    return rows.cast(SPAN_SCHEMA)


def _notes(con: duckdb.DuckDBPyConnection) -> list[str]:
    """What was joined, the clock of each rank, and the check's residual on the spans both sources see."""
    ((kineto_runs,),) = con.execute(f"SELECT count(*) FROM kineto_in WHERE name = '{fmt.ROOT}'").fetchall()
    ((matched, walls),) = con.execute("SELECT count(*), count(*) FILTER (WHERE has_wall) FROM matched").fetchall()
    notes = [
        f"Kineto traces joined to the STRACE runs as their device timeline: {matched} of {kineto_runs} Kineto steps matched a STRACE run "
        f"of their rank and step ({walls} with STRACE device-phase markers: the activities only; the rest the whole device timeline); "
        "the unmatched are left out"
    ]
    clocks = con.execute("""
        SELECT c.rank, c.offset_ns, c.from_anchor, c.runs,
               median(m.k_runner_ns - c.offset_ns - m.runner_ns), max(abs(m.k_runner_ns - c.offset_ns - m.runner_ns)),
               median(m.k_end_ns - c.offset_ns - m.runner_end_ns), max(abs(m.k_end_ns - c.offset_ns - m.runner_end_ns))
        FROM clock c JOIN matched m USING (rank) GROUP BY ALL ORDER BY c.rank""").fetchall()
    for rank, offset, from_anchor, runs, start_med, start_max, end_med, end_max in clocks:
        source = "its CLOCK_ANCHOR" if from_anchor else "the runner_run spans (no usable CLOCK_ANCHOR)"
        notes.append(
            f"Kineto clock of rank {rank}: Unix time − {int(offset)} ns = CLOCK_MONOTONIC, from {source}; check on {runs} runner_run spans "
            f"seen by both: start residual median {int(start_med)} ns (max |{int(start_max)}| ns), "
            f"end residual median {int(end_med)} ns (max |{int(end_max)}| ns)"
        )
    return notes
