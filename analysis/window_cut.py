"""Cutting a window out of a trace, reading only the parts of a span dataset it needs.

What a window keeps (docs/FIGURES.md "Windows") is what cutting the window
out of the log by hand means, invocation by invocation:

* every record of the window's invocations: the runtime invocations whose
  host root has its ``step`` attribute in ``A..B`` (``--steps``) and starts in
  ``[since, until)`` on the host clock. A whole invocation or none: with the
  depth-2 pipeline step s's spans straddle step s+1's (its root closes after
  s+1 began), and a cut by byte range or by time would tear them;
* the garbage collections (``host.gc``) that overlap the window's runs,
  first root start to last root end: the findings cite them;
* every serving record (SA_PROFILE / Chrome): the profile window and the
  serving figures stay those of the run; drawings (``report``, ``export``)
  keep only those overlapping the window's runs.

Without a single step attribute on the roots, steps are numbered by
position; ``--steps`` then cannot be cut here and the swimlane keeps the
steps by their position (:attr:`Window.steps_by_position`), after any time cut.

A span dataset is read by Parquet row group, not whole: the footers hold
each row group's min/max ``step`` (the roots' step attributes; rows of a log
piece lie in one row group) and max ``ts_ns``, so a step window reads the
row groups whose steps lie near it (within :data:`MARGIN_STEPS`: an
invocation's records may sit in the piece before its root's) plus those
holding serving rows; a time window first reads the roots' columns of the
row groups that can hold them, to learn its steps. Footers of old datasets
hold the same statistics, so every dataset is pruned this way.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dsprof.analysis.store.dataset import SpanDatasetWriter
from dsprof.analysis.store.predicates import gc_row, host_root, host_row, overlaps, query_arrow, runtime_row, serving_row, starts_in
from dsprof.analysis.store.spans import SPAN_SCHEMA, Trace, concat_spans
from dsprof.analysis.window import MAX_STEP, Window, WindowSpec, anchor_start_ns, resolve_window
from dsprof.tempdirs import make_owned_dir, remove_owned_dir

# Row groups whose root steps lie within this many steps of the window are read too: a rank's records
# of step s may sit in the log piece before the one with its root, beside other ranks' roots of nearby steps.
MARGIN_STEPS = 64
# A cut whose row groups hold more rows than this is written to a temporary span dataset, not held in memory.
IN_MEMORY_ROWS = 2_000_000
SPILL_PREFIX = "dsprof-window-"
# Span files read at once (each a row group or a few; many small ones hold the serving rows of their time window).
READ_THREADS = max(1, min(8, os.cpu_count() or 1))
# The columns the roots of a time window are found from, before the rows they need are read.
_ROOT_COLUMNS = ["pid", "inv", "hid", "depth", "clk", "name", "ts_ns", "dur_ns", "step"]
# The host roots of runtime invocations (not another producer's, not a collection).
_ROOT = f"{runtime_row()} AND {host_root()}"


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group of a span file, with the statistics pruning uses (None: none recorded)."""

    path: Path
    index: int
    rows: int
    min_step: int | None
    max_step: int | None
    max_ts_ns: int | None
    serving_rows: bool  # some row without inv: SA_PROFILE / Chrome rows, kept whatever the window


@dataclass(frozen=True)
class CutFacts:
    """What a cut read and kept, for the printout; ``spill``: the temporary dataset a wide window was written to."""

    row_groups_read: int
    row_groups: int
    invocations: int
    steps_by_position: bool
    spill: Path | None = None
    partial_steps: int = 0  # steps the window cut (some of their runs in it, some not), all left out


@dataclass(frozen=True)
class Kept:
    """The window's invocations (``keys``: pid, inv), the host time their runs cover, first start to last end,
    and how many steps it cut (left out)."""

    keys: pa.Table
    first_ns: int | None
    last_ns: int | None
    partial_steps: int = 0


def cut_trace(
    trace: Trace, spec: WindowSpec, *, drawing: bool = False, progress: Callable[[str], None] | None = None
) -> tuple[Trace, Window, CutFacts]:
    """``trace`` cut to ``spec``'s window; the window placed on the host clock; what was read.

    The cut is held in memory, or, when the row groups it needs hold more than
    :data:`IN_MEMORY_ROWS`, written to a temporary span dataset (``facts.spill``,
    the caller's to remove). ``drawing``: keep only the serving spans that
    overlap the window's runs (report, export).
    """
    groups = row_groups(trace.span_files)
    start = anchor_start_ns(trace.anchors)
    if start is None and any(b is not None and b.offset_ns is not None for b in (spec.since, spec.until)):
        start = _host_start(trace, groups)  # a pass over every row group: only where an offset needs it
    window = dataclasses.replace(
        resolve_window(spec, trace.anchors, start), steps_by_position=spec.steps is not None and not _has_step_attributes(trace, groups)
    )
    chosen = _choose_row_groups(groups, window)
    if progress and groups:
        progress(f"window {window.describe()}: reading {len(chosen)} of {len(groups)} row groups")
    memory = trace.spans.cast(SPAN_SCHEMA) if groups else trace.spans
    if sum(g.rows for g in chosen) <= IN_MEMORY_ROWS:
        spans = concat_spans([read_row_groups(chosen), memory])
        kept = window_invocations([spans], window)
        window = dataclasses.replace(window, partial_steps=kept.partial_steps)
        facts = CutFacts(len(chosen), len(groups), kept.keys.num_rows, window.steps_by_position, partial_steps=kept.partial_steps)
        return dataclasses.replace(trace, spans=keep_rows(spans, kept, drawing=drawing), span_files=[]), window, facts
    kept = window_invocations([read_row_groups(chosen, _ROOT_COLUMNS), memory], window)
    window = dataclasses.replace(window, partial_steps=kept.partial_steps)
    facts = CutFacts(len(chosen), len(groups), kept.keys.num_rows, window.steps_by_position, partial_steps=kept.partial_steps)
    spill = make_owned_dir(SPILL_PREFIX)
    try:
        cut = _cut_to_disk(trace, chosen, memory, kept, drawing, spill)
    except BaseException:
        remove_owned_dir(spill)
        raise
    return cut, window, dataclasses.replace(facts, spill=spill)


def _cut_to_disk(trace: Trace, chosen: list[RowGroup], memory: pa.Table, kept: Kept, drawing: bool, directory: Path) -> Trace:
    """Write the cut a row group at a time to a span dataset in ``directory``: memory stays that of one row group."""
    writer = SpanDatasetWriter(directory)
    try:
        for group in [*chosen, None]:
            writer.add(keep_rows(memory if group is None else read_row_groups([group]), kept, drawing=drawing))
        side = dataclasses.replace(trace, spans=SPAN_SCHEMA.empty_table(), span_files=[])
        writer.finish(side)
    except BaseException:
        writer.abort()
        raise
    return dataclasses.replace(side, span_files=writer.span_files)


def row_groups(files: list[Path]) -> list[RowGroup]:
    """Every row group of ``files``, with its statistics from the footer."""
    groups = []
    for path in files:
        meta = pq.ParquetFile(path).metadata
        columns = {meta.schema.column(j).path: j for j in range(meta.num_columns)}
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            step = _stats(group.column(columns["step"]).statistics)
            ts = _stats(group.column(columns["ts_ns"]).statistics)
            inv = group.column(columns["inv"]).statistics
            serving = inv is None or not inv.has_null_count or inv.null_count > 0
            groups.append(RowGroup(path, i, group.num_rows, step[0], step[1], ts[1], serving))
    return groups


def _stats(stats: pq.Statistics | None) -> tuple[int | None, int | None]:
    if stats is None or not stats.has_min_max:
        return None, None
    return int(stats.min), int(stats.max)


def _has_step_attributes(trace: Trace, groups: list[RowGroup]) -> bool:
    """Whether any root carries a ``step`` attribute: from the footers where a row group holds only runtime rows,
    else from the roots themselves (serving rows may carry a ``step`` of their own)."""
    if any(g.min_step is not None and not g.serving_rows for g in groups):
        return True
    mixed = [g for g in groups if g.min_step is not None]
    for table in (read_row_groups(mixed, _ROOT_COLUMNS), trace.spans):
        if (
            table.num_rows
            and query_arrow(f"SELECT count(step) FROM spans WHERE {_ROOT}", spans=table.select(_ROOT_COLUMNS)).column(0)[0].as_py()
        ):
            return True
    return False


def _host_start(trace: Trace, groups: list[RowGroup]) -> int | None:
    """The earliest host-clock span of the trace (a run without CLOCK_ANCHOR lines starts there): one narrow pass."""
    tables = [read_row_groups(groups, ["ts_ns", "clk"]), trace.spans.select(["ts_ns", "clk"])]
    starts = [query_arrow(f"SELECT min(ts_ns) FROM spans WHERE {host_row()}", spans=t).column(0)[0].as_py() for t in tables if t.num_rows]
    starts = [s for s in starts if s is not None]
    return min(starts) if starts else None


def _choose_row_groups(groups: list[RowGroup], window: Window) -> list[RowGroup]:
    """The row groups that can hold the window's records (module docstring)."""
    candidates = [g for g in groups if g.serving_rows or window.from_ns is None or g.max_ts_ns is None or g.max_ts_ns >= window.from_ns]
    if window.steps_by_position or not candidates:
        return candidates
    if window.steps is not None:
        candidates = _near_steps(candidates, window.steps)
    if window.spec.timed:  # the roots in the time range say which steps it covers
        candidates = _started_before(candidates, window.until_ns)
        roots = _window_roots(read_row_groups(candidates, _ROOT_COLUMNS), window)
        found = pc.min_max(roots.column("step")) if roots.num_rows else None
        if found is None:
            return [g for g in candidates if g.serving_rows or g.min_step is None]
        if found["min"].as_py() is not None:
            candidates = _near_steps(candidates, (found["min"].as_py(), found["max"].as_py()))
    return candidates


def _near_steps(groups: list[RowGroup], steps: tuple[int, int]) -> list[RowGroup]:
    """The row groups whose root steps lie within MARGIN_STEPS of ``steps``, those with serving rows and those without statistics."""
    low, high = steps[0] - MARGIN_STEPS, steps[1] + MARGIN_STEPS
    return [g for g in groups if g.serving_rows or g.min_step is None or g.max_step is None or (g.min_step <= high and g.max_step >= low)]


def _started_before(groups: list[RowGroup], until_ns: int | None) -> list[RowGroup]:
    """Leave out the runtime row groups whose runs all start at or after ``until_ns``, from the footers alone.

    A rank's runs of step s + MARGIN_STEPS start after its runs of step s ended (the pipeline is
    at most MARGIN_STEPS deep, and ranks keep within it of each other); so once a row group of
    steps up to s holds a span at or after ``until_ns`` (its max ``ts_ns``), the row groups of
    steps from s + MARGIN_STEPS on hold no run starting before it.
    """
    known = [g for g in groups if not g.serving_rows and g.min_step is not None and g.max_step is not None and g.max_ts_ns is not None]
    if until_ns is None or not known:
        return groups
    by_last_step = sorted(known, key=lambda g: int(g.max_step or 0))
    last_steps = np.array([g.max_step for g in by_last_step], np.int64)
    latest = np.maximum.accumulate(np.array([g.max_ts_ns for g in by_last_step], np.int64))
    firsts = np.array([g.min_step for g in known], np.int64) - MARGIN_STEPS
    before = np.searchsorted(last_steps, firsts, side="right")  # row groups wholly of steps up to each one's first - margin
    late = (before > 0) & (latest[np.maximum(before - 1, 0)] >= until_ns)
    left_out = {(g.path, g.index) for g, out in zip(known, late.tolist(), strict=True) if out}
    return [g for g in groups if (g.path, g.index) not in left_out]


def read_row_groups(groups: list[RowGroup], columns: list[str] | None = None) -> pa.Table:
    """The rows of ``groups`` (SPAN_SCHEMA's columns, or ``columns``), file by file."""
    by_file: dict[Path, list[int]] = {}
    for group in groups:
        by_file.setdefault(group.path, []).append(group.index)
    with ThreadPoolExecutor(min(READ_THREADS, max(1, len(by_file)))) as pool:  # decoding releases the GIL
        tables = list(pool.map(lambda item: pq.ParquetFile(item[0]).read_row_groups(item[1], columns=columns), by_file.items()))
    if not tables:
        return SPAN_SCHEMA.empty_table() if columns is None else pa.schema([SPAN_SCHEMA.field(c) for c in columns]).empty_table()
    table = pa.concat_tables(tables, promote_options="permissive")
    return table.cast(SPAN_SCHEMA) if columns is None else table


def _window_roots(table: pa.Table, window: Window) -> pa.Table:
    """The runtime roots in ``table`` (pid, inv, hid, ts_ns, end_ns, step) and whether each run lies in the window (``inside``).

    Roots outside it are kept too: they say which steps the window cuts.
    """
    inside = starts_in("ts_ns", window.from_ns, window.until_ns)
    if window.steps is not None and not window.steps_by_position:
        every_step = window.steps == (0, MAX_STEP)  # the only window that holds a run without a step number (`0:`)
        inside += f" AND coalesce(step BETWEEN {int(window.steps[0])} AND {int(window.steps[1])}, {every_step})"
    query = f"""SELECT pid, inv, hid::VARCHAR AS hid, ts_ns, ts_ns + dur_ns AS end_ns, step, {inside} AS inside
                FROM spans WHERE {_ROOT}"""
    return query_arrow(query, spans=table.select(_ROOT_COLUMNS))


def _whole_steps(roots: pa.Table) -> tuple[pa.Array, int]:
    """Mask of the roots the window keeps, and how many steps it cut.

    A run is kept when it lies in the window and so does every other run of its step (same callable, same
    ``step`` attribute, on any rank): a step some of whose ranks started before ``since`` or at ``until`` is
    left out whole, so that the window's steps are the run's own, with every rank. Runs without a step
    attribute are kept by their own bounds.
    """
    numbered = roots.filter(pc.is_valid(roots.column("step")))
    steps = numbered.group_by(["hid", "step"]).aggregate([("inside", "sum"), ("inside", "count")])
    cut = pc.and_(pc.greater(steps.column("inside_sum"), 0), pc.less(steps.column("inside_sum"), steps.column("inside_count")))
    partial = steps.filter(cut).select(["hid", "step"]).append_column("cut", pa.array(np.ones(pc.sum(cut).as_py() or 0, bool)))
    rows = roots.select(["hid", "step"]).append_column("row", pa.array(np.arange(roots.num_rows)))
    in_cut = np.zeros(roots.num_rows, bool)
    in_cut[rows.join(partial, keys=["hid", "step"], join_type="inner").column("row").to_numpy()] = True
    return pc.and_(roots.column("inside"), pa.array(~in_cut)), partial.num_rows


def window_invocations(tables: list[pa.Table], window: Window) -> Kept:
    """The window's invocations among the roots in ``tables`` (each with at least :data:`_ROOT_COLUMNS`): whole steps only."""
    found = [roots for roots in (_window_roots(t, window) for t in tables if t.num_rows) if roots.num_rows]
    if not found:
        return Kept(pa.table({"pid": pa.array([], pa.int64()), "inv": pa.array([], pa.uint64())}), None, None)
    roots = pa.concat_tables(found)
    keep, partial = _whole_steps(roots)
    roots = roots.filter(keep)
    keys = roots.select(["pid", "inv"]).group_by(["pid", "inv"]).aggregate([])
    return Kept(keys, pc.min(roots.column("ts_ns")).as_py(), pc.max(roots.column("end_ns")).as_py(), partial)


def keep_rows(spans: pa.Table, kept: Kept, *, drawing: bool = False) -> pa.Table:
    """The rows of ``spans`` the window keeps (module docstring), in their order."""
    overlapping = overlaps(kept.first_ns, kept.last_ns, "s")
    serving = f"{serving_row('s')} AND {overlapping}" if drawing else serving_row("s")
    query = f"""SELECT s.row FROM spans s LEFT JOIN (SELECT pid, inv, TRUE AS member FROM kept) k ON s.pid = k.pid AND s.inv = k.inv
                WHERE k.member OR ({gc_row("s")} AND {overlapping}) OR {serving}"""
    columns = spans.select(["pid", "inv", "depth", "name", "clk", "ts_ns", "dur_ns"]).append_column(
        "row", pa.array(np.arange(spans.num_rows))
    )
    keep = np.zeros(spans.num_rows, bool)
    keep[query_arrow(query, spans=columns, kept=kept.keys).column("row").to_numpy()] = True
    return spans.filter(keep)
