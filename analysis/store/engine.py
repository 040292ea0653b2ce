"""The analysis engine: DuckDB over a span table, in memory or on disk.

Perfetto's trace processor is the model: the readers fill one storage schema
(:mod:`dsprof.analysis.store.spans`) and every analysis is a query over it. The span
table is registered as the relation ``spans`` — an Arrow table in memory, or
the Parquet files of a span dataset (:mod:`dsprof.analysis.store.dataset`) read out
of core — so the same SQL runs over a small test trace and a day-long 64-rank
soak, under a memory cap (DuckDB spills to disk beyond it).

The heavy, span-sized work is one aggregation into the invocation table
(:mod:`dsprof.analysis.stages.invocations`); everything after it works on one row per
run (rank x step), which is small.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import duckdb
import pyarrow as pa

from dsprof.analysis.store.memory_limit import default_memory_limit
from dsprof.analysis.store.spans import Trace, with_sequence
from dsprof.interrupts import interruptible
from dsprof.tempdirs import make_owned_dir, remove_owned_dir

# DuckDB spills into a private folder of each engine (dsprof.tempdirs: a killed process's folder is removed by the next)
SPILL_PREFIX = "dsprof-duckdb-"


# The relations every engine starts with; the analysis stages (analysis/stages/runner.py) add the rest.
ENGINE_TABLES = ("spans", "spans_in_memory", "anchors", "chip_devices")


class Relation(NamedTuple):
    """A relation on a connection: ``table`` or ``view``, and whether it is TEMP (the connection's own)."""

    kind: str
    temporary: bool


@dataclass
class Engine:
    """A DuckDB connection with the trace's tables registered: ``spans``, ``anchors``, ``chip_devices``."""

    con: duckdb.DuckDBPyConnection
    trace: Trace
    # table -> the stage that wrote it (analysis/stages/runner.py keeps this)
    written: dict[str, str] = field(default_factory=dict)
    # the relations as the last stage left them, while run_stages runs stages back to back (None: look them up)
    settled_relations: set[str] | None = None
    # a connection of its own beside the engine's (cursor()): a stage runs on it beside another
    beside: bool = False
    # bytes DuckDB may hold before spilling (open_engine sets it): what a pass of the work may be sized by
    memory_limit: int = field(default_factory=default_memory_limit)
    # removes the engine's own spill folder (open_engine sets it; once only)
    _spill_cleanup: weakref.finalize | None = field(default=None, repr=False)

    def run(self, query: str, params: list | None = None) -> None:
        """Execute a statement (or several) to completion."""
        self.con.execute(query, params or []).fetchall()

    def rows(self, query: str, params: list | None = None) -> list[tuple]:
        return self.con.execute(query, params or []).fetchall()

    def sql(self, query: str, params: list | None = None) -> duckdb.DuckDBPyRelation:
        return self.con.sql(query, params=params)

    def arrow(self, query: str, params: list | None = None) -> pa.Table:
        """The result of ``query`` as an Arrow table."""
        return self.con.sql(query, params=params).to_arrow_table()

    def scalar(self, query: str, params: list | None = None):
        rows = self.con.execute(query, params or []).fetchall()
        return rows[0][0] if rows else None

    def compact(self) -> None:
        """Compress the tables written since the last call (an in-memory database compresses only at a checkpoint),
        once they hold COMPACT_BYTES: a small analysis (a live view's window) is not slowed by checkpoints.

        Not on a connection beside others (:meth:`cursor`): a checkpoint waits for their transactions; the
        stage runner compacts once they have ended."""
        if self.beside:
            return
        held = self.scalar("SELECT sum(memory_usage_bytes) FROM duckdb_memory() WHERE tag = 'IN_MEMORY_TABLE'")
        if (held or 0) >= COMPACT_BYTES:
            self.run("CHECKPOINT")

    def cursor(self) -> Engine:
        """An engine on a connection of its own to the same database, with the trace's relations registered on it:
        a stage runs on it beside another (:func:`~dsprof.analysis.stages.runner.run_stages`' workers).

        The tables and views it makes are everyone's, its TEMP relations its own (a stage's scratch). Close it
        when done; the database stays.
        """
        con = interruptible(self.con.cursor())
        _register_inputs(con, self.trace)
        return Engine(con, self.trace, self.written, memory_limit=self.memory_limit, beside=True)

    def relations(self) -> set[str]:
        """Names of every table and view (registered Arrow tables included) on the connection."""
        return set(self.relation_kinds())

    def relation_kinds(self) -> dict[str, Relation]:
        """Every relation the connection sees: name -> its kind, and whether it is TEMP (registered Arrow tables are)."""
        rows = self.rows(
            "SELECT table_name, 'table', temporary FROM duckdb_tables() "
            "UNION ALL SELECT view_name, 'view', temporary FROM duckdb_views() WHERE NOT internal"
        )
        return {name: Relation(kind, temporary) for name, kind, temporary in rows}

    def drop(self, name: str, kind: str | None = None) -> None:
        """Remove one relation, whatever kind it is (``kind``: as :meth:`relation_kinds` gave it, else looked up)."""
        if kind is None:
            relation = self.relation_kinds().get(name)
            kind = None if relation is None else relation.kind
        quoted = '"' + name.replace('"', '""') + '"'
        if kind == "table":
            self.run(f"DROP TABLE {quoted}")
        elif kind == "view":
            self.con.unregister(name)  # a registered Arrow table; nothing otherwise
            self.run(f"DROP VIEW IF EXISTS {quoted}")

    def close(self) -> None:
        """Close the connection and remove the engine's own spill folder (a second call does nothing more)."""
        self.con.close()
        if self._spill_cleanup is not None:
            self._spill_cleanup()


# The in-memory database the analysis' tables are made in: compressed, at each checkpoint (:meth:`Engine.compact`).
WORK_DATABASE = "work"
# Tables this large in memory are compressed when a stage has written them; smaller ones are left plain.
COMPACT_BYTES = 64 << 20


def open_engine(
    trace: Trace, *, memory_limit: int | None = None, spill_dir: str | os.PathLike | None = None, threads: int | None = None
) -> Engine:
    """An engine over ``trace``: its in-memory spans, or its span files, as one ``spans`` relation.

    ``threads``: DuckDB's threads for a query (default: one per core).

    Tables are made in a compressed in-memory database (:data:`WORK_DATABASE`): the tables sized by runs (a row
    per rank and step) take a seventh of their plain size once :meth:`Engine.compact` has run.

    DuckDB spills to ``spill_dir``, or else to a folder of this engine's own:
    made private (0700) under TMPDIR with a fresh name, so nothing planted at
    a fixed path is followed, and removed by :meth:`Engine.close` or, for an
    engine never closed, when it is collected or the process exits.
    """
    own_spill = None if spill_dir is not None else make_owned_dir(SPILL_PREFIX)
    memory_limit = memory_limit or default_memory_limit()
    try:
        con = interruptible(
            duckdb.connect(
                config={
                    "memory_limit": f"{memory_limit}B",
                    "temp_directory": str(spill_dir if spill_dir is not None else own_spill),
                    "preserve_insertion_order": True,
                }
            )
        )
        con.execute(f"ATTACH ':memory:' AS {WORK_DATABASE} (COMPRESS)")
        con.execute(f"SET threads = {threads or max(1, os.cpu_count() or 1)}")
        engine = _registered(con, trace)
        engine.memory_limit = memory_limit
    except BaseException:
        remove_owned_dir(own_spill)
        raise
    if own_spill is not None:
        engine._spill_cleanup = weakref.finalize(engine, remove_owned_dir, own_spill)
    return engine


def _registered(con: duckdb.DuckDBPyConnection, trace: Trace) -> Engine:
    """The engine of ``con`` with the trace's relations registered."""
    _register_inputs(con, trace)
    if trace.span_files:
        on_disk = (
            f"SELECT * EXCLUDE (time_window) FROM {parquet_source(trace.span_files)}"
            if any("time_window=" in str(p) for p in trace.span_files)
            else f"SELECT * FROM read_parquet([{', '.join(_sql_text(str(p)) for p in trace.span_files)}])"
        )
        con.execute(f"CREATE VIEW spans AS {on_disk} UNION ALL BY NAME SELECT * FROM spans_in_memory")
    else:
        con.execute("CREATE VIEW spans AS SELECT * FROM spans_in_memory")
    return Engine(con, trace)


def _register_inputs(con: duckdb.DuckDBPyConnection, trace: Trace) -> None:
    """On ``con`` (working in :data:`WORK_DATABASE`): the trace's Arrow tables, which a connection sees only if registered on it."""
    con.execute(f"USE {WORK_DATABASE}")
    con.execute("SET enable_progress_bar = false")  # progress is the caller's (one line per stage), not bars on stderr
    con.register("spans_in_memory", trace.spans)
    con.register("anchors", with_sequence(trace.anchors))
    con.register("chip_devices", with_sequence(trace.chip_devices))


def parquet_source(files: list[Path]) -> str:
    """SQL relation: the span rows of ``files``, parts of span datasets, with each row's ``time_window`` (its folder's)."""
    return f"read_parquet([{', '.join(_sql_text(str(p)) for p in files)}], hive_partitioning = true)"


def _sql_text(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"
