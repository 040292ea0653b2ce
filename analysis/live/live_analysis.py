"""Following a running job: its logs read as they grow, a window of recent steps analysed on demand.

:class:`LiveAnalysis` follows the text logs among its paths (a directory's
``*.log``, as :func:`~dsprof.analysis.ingest.read_paths` reads it; logs that
appear later are picked up) with one :class:`~dsprof.analysis.ingest.follow.LogFollower`
each. Every span table parsed goes to two places:

* the span dataset on disk (:class:`~dsprof.analysis.store.dataset.SpanDatasetWriter`,
  what ``dsprof ingest`` writes), so memory stays bounded however long the job
  runs, and the final analysis reads everything seen;
* a :class:`StepRing` in memory holding the last ``window`` decode steps.

The SA_PROFILE fragments among its paths (:func:`~dsprof.analysis.ingest.fragment_source`)
are followed too, by a :class:`~dsprof.analysis.ingest.fragment_follow.FragmentFollower`
each; their request spans are held by :class:`ServingRows` for the window's
serving figures only (the dataset gets the fragments once, at the end).

:meth:`LiveAnalysis.window` analyses the ring, with the request spans that
overlap its time, with the same stages as ``dsprof analyze``
(:func:`~dsprof.analysis.analyze.analyze_trace`). :meth:`LiveAnalysis.finish`
parses what is left, reads the inputs that are not followed into the dataset
(SA_PROFILE fragments and merges, Kineto traces, side files) once, through the
same sink, and completes the dataset.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.analyze import DEFAULT_THRESHOLD_MS, AnalysisResult, analyze_trace
from dsprof.analysis.ingest import fragment_source, is_text_log, read_paths
from dsprof.analysis.ingest.follow import LogFollower
from dsprof.analysis.ingest.fragment_follow import FragmentFollower
from dsprof.analysis.stages.serving import request_spans
from dsprof.analysis.store.dataset import SpanDatasetWriter
from dsprof.analysis.store.predicates import host_root, host_row, host_start, query_arrow
from dsprof.analysis.store.spans import SPAN_SCHEMA, Trace, concat_spans, merge_traces
from dsprof.analysis.summary import Summary
from dsprof.errors import InputError
from dsprof.profiler import artifacts

DEFAULT_WINDOW_STEPS = 200
# Rows gathered from polls before they go to the dataset: a poll's few rows would each make a small row group.
WRITE_ROWS = 1 << 16
# Stages of a window's analysis run at once: it is mostly the planning of many small queries, one core each.
WINDOW_STAGE_WORKERS = min(2, os.cpu_count() or 1)
# Chunks a column of the ring may be in before it is made one chunk again (StepRing.take_window).
RING_CHUNKS = 8
# Request spans held for the window's serving figures, at most (the oldest go first).
SERVING_ROWS = 1 << 16


@dataclass
class RingCut:
    """Which rows of the ring stay (``keep``) and which are analysed now (``analyse``: complete steps only)."""

    keep: np.ndarray
    analyse: np.ndarray


class StepRing:
    """The STRACE rows of the last ``window`` decode steps (by when their invocations started), and the open ones after them.

    Trimmed by invocation: a row stays with its invocation (``pid, inv``),
    whose step is its root's. The window is the ``window`` steps that started
    last; rows of invocations that started before the window's span again
    before its start are let go (a step number met again after a restart is
    a new step), so memory is bounded by the window, not by the job.
    Invocations whose root is not written yet and steps with fewer roots than
    the fullest step of the window (not every rank has reached them yet), or
    than ``expect_ranks`` (a rank whose log is not there yet), are kept but not
    analysed: a step is analysed complete or not at all.
    """

    def __init__(self, window: int = DEFAULT_WINDOW_STEPS, expect_ranks: int | None = None):
        if window < 2:
            raise InputError("--window", f"{window} steps is too few", expected="a window of at least 2 steps")
        self.window = window
        self.expect_ranks = expect_ranks or 0
        self._tables: list[pa.Table] = []

    def add(self, table: pa.Table) -> None:
        if table.num_rows:
            self._tables.append(table)

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in self._tables)

    def take_window(self) -> pa.Table:
        """Trim the ring to the window and return the rows of its complete steps (SPAN_SCHEMA).

        The polls' tables since the last take become one chunk (a query over hundreds of chunks pays for each), and
        the ring is one chunk again once it holds :data:`RING_CHUNKS`: copying the whole ring at every take cost a
        tenth of a refresh. The rows let go are nearly always the oldest and those analysed the first, so both are
        slices where they can be (:func:`_rows_where`).
        """
        if not self._tables:
            return SPAN_SCHEMA.empty_table()
        held, new = self._tables[:1], self._tables[1:]
        if new:
            held.append(pa.concat_tables(new, promote_options="permissive").combine_chunks())
        ring = pa.concat_tables(held, promote_options="permissive")
        if ring.column(0).num_chunks > RING_CHUNKS:
            ring = ring.combine_chunks()
        cut = self._cut(ring)
        ring = _rows_where(ring, cut.keep, kept=True)
        self._tables = [ring]
        return _rows_where(ring, cut.analyse[cut.keep]).cast(SPAN_SCHEMA)

    def _cut(self, ring: pa.Table) -> RingCut:
        """Which rows stay and which are analysed: one query over the ring (DuckDB, in place)."""
        columns = ring.select(["pid", "inv", "step", "depth", "clk", "ts_ns"]).append_column("row", pa.array(np.arange(ring.num_rows)))
        marks = query_arrow(_ring_query(self.window, self.expect_ranks), ring=columns)
        keep, analyse = np.zeros(ring.num_rows, bool), np.zeros(ring.num_rows, bool)
        rows = marks.column("row").to_numpy()
        keep[rows] = marks.column("keep").to_numpy(zero_copy_only=False)
        analyse[rows] = marks.column("analyse").to_numpy(zero_copy_only=False)
        return RingCut(keep, analyse)


def _rows_where(table: pa.Table, mask: np.ndarray, *, kept: bool = False) -> pa.Table:
    """The rows of ``table`` where ``mask`` holds: a slice (no copy) where they are one run of rows, else a filter.

    ``kept``: the result is held on to, so a slice of less than half the table is copied instead (a slice would
    hold the whole table's memory: the first poll of a long log reads all of it).
    """
    rows = np.flatnonzero(mask)
    one_run = len(rows) > 0 and int(rows[-1]) - int(rows[0]) + 1 == len(rows)
    if one_run and not (kept and 2 * len(rows) < table.num_rows):
        return table.slice(int(rows[0]), len(rows))
    return table.filter(pa.array(mask))


def _ring_query(window: int, expect_ranks: int) -> str:
    """SQL over ``ring`` (rows numbered ``row``): each row's ``keep`` and ``analyse`` (:class:`StepRing`).

    Per invocation its step (its rows' ``step``), start (:func:`host_start`) and whether its root is there; per step
    the latest start and the roots. The window is the ``window`` steps that started last; ``floor``: its first start
    less its length; ``done``: the latest start of its complete steps. Without a step yet every row stays and the
    rooted invocations (and the rows outside any) are analysed.
    """
    return f"""
    WITH invs AS (SELECT pid, inv, max(step) AS step, {host_start()} AS start, coalesce(bool_or({host_root()}), FALSE) AS rooted
                  FROM ring WHERE inv IS NOT NULL GROUP BY pid, inv),
         steps AS (SELECT step, max(start) AS latest, sum(rooted::INTEGER) AS roots FROM invs WHERE step IS NOT NULL GROUP BY step),
         win AS (SELECT * FROM steps ORDER BY latest DESC NULLS FIRST, step DESC LIMIT {int(window)}),
         complete AS (SELECT step, latest FROM win WHERE roots >= greatest((SELECT max(roots) FROM win), {int(expect_ranks)})),
         bounds AS (SELECT count(*) > 0 AS stepped, min(latest) - (max(latest) - min(latest)) AS floor,
                           (SELECT max(latest) FROM complete) AS done FROM win),
         marks AS (SELECT i.pid, i.inv, i.rooted,
                          (i.step IS NULL OR i.step IN (SELECT step FROM win)) AND (i.start IS NULL OR i.start >= b.floor) AS keep,
                          i.step IN (SELECT step FROM complete) OR (i.step IS NULL AND i.start <= b.done) AS settled
                   FROM invs i, bounds b)
    SELECT r.row,
           coalesce(CASE WHEN NOT b.stepped THEN TRUE WHEN r.inv IS NULL THEN r.ts_ns >= b.floor ELSE m.keep END, FALSE) AS keep,
           coalesce(CASE WHEN NOT b.stepped THEN r.inv IS NULL OR m.rooted
                         WHEN r.inv IS NULL THEN r.ts_ns >= b.floor AND r.ts_ns <= b.done
                         ELSE m.keep AND m.rooted AND m.settled END, FALSE) AS analyse
    FROM ring r CROSS JOIN bounds b LEFT JOIN marks m ON r.pid = m.pid AND r.inv = m.inv"""


@dataclass
class LiveWindow:
    """A window taken to be analysed: its trace, and the invocations an earlier window aggregated from rows it holds unchanged."""

    trace: Trace
    known_invocations: pa.Table | None
    take: int  # the count of windows taken, this one included


@dataclass
class WindowResult:
    """A window's summary, and its invocation table: what the next window need not aggregate again."""

    summary: Summary
    invocations: pa.Table
    take: int


def analyze_window(window: LiveWindow, threshold_ms: float = DEFAULT_THRESHOLD_MS) -> AnalysisResult:
    """The analysis of a window (``analyze``'s stages, :data:`WINDOW_STAGE_WORKERS` at once); close its engine when done."""
    return analyze_trace(
        window.trace, threshold_ms=threshold_ms, known_invocations=window.known_invocations, stage_workers=WINDOW_STAGE_WORKERS
    )


def window_summary(window: LiveWindow, threshold_ms: float = DEFAULT_THRESHOLD_MS) -> WindowResult:
    """The summary of a window taken by :meth:`LiveAnalysis.take`, with its invocations, its engine closed.

    Safe on a worker thread while the logs are polled: it reads only ``window`` and opens an engine of its own.
    """
    result = analyze_window(window, threshold_ms)
    try:
        return _window_result(result, window)
    finally:
        result.engine.close()


def _window_result(result: AnalysisResult, window: LiveWindow) -> WindowResult:
    """What an analysed window hands on: its summary, and its invocation table (read before its engine closes)."""
    return WindowResult(result.summary, result.engine.arrow("SELECT * FROM invocations"), window.take)


class ServingRows:
    """The request spans of the followed fragments, held for the window's serving figures; bounded.

    Only the rows the serving figures read are held (``request_spans``): a
    verbose job's kernel spans would crowd them out. Each window takes the
    rows that overlap its time and lets go of those that ended before it
    began; past ``cap`` rows the oldest go, so memory is bounded however long
    the job runs, windows taken or not.
    """

    def __init__(self, cap: int = SERVING_ROWS):
        self.cap = cap
        self.rows = 0
        self._tables: list[pa.Table] = []

    def add(self, spans: pa.Table) -> None:
        held = request_spans(spans) if spans.num_rows else spans
        if held.num_rows:
            self._tables.append(held)
            self.rows += held.num_rows
            self._trim_to_cap()

    def _trim_to_cap(self) -> None:
        """Let the oldest rows go until ``cap`` are left (whole tables, then a slice of the first)."""
        while self.rows > self.cap:
            extra, first = self.rows - self.cap, self._tables[0]
            if first.num_rows <= extra:
                self._tables.pop(0)
                self.rows -= first.num_rows
            else:
                self._tables[0] = first.slice(extra)
                self.rows -= extra

    def take(self, start_ns: int, end_ns: int) -> pa.Table:
        """The rows that overlap [start_ns, end_ns]; those that ended before ``start_ns`` are let go."""
        if not self._tables:
            return SPAN_SCHEMA.empty_table()
        held = pa.concat_tables(self._tables)
        held = held.filter(pc.greater_equal(pc.add(held["ts_ns"], held["dur_ns"]), start_ns))
        self._tables, self.rows = ([held] if held.num_rows else []), held.num_rows
        return held.filter(pc.less_equal(held["ts_ns"], end_ns))


def steps_time_range(spans: pa.Table) -> tuple[int, int] | None:
    """From the first start to the last end of the decode steps' host-clock rows in ``spans`` (None: it has none).

    The steps' rows, not every row analysed: a row of an invocation without a step (a GC pause between runs) may lie
    well before the window's first step.
    """
    query = f"SELECT min(ts_ns), max(ts_ns + dur_ns) FROM spans WHERE {host_row()} AND step IS NOT NULL"
    first, last = query_arrow(query, spans=spans.select(["clk", "step", "ts_ns", "dur_ns"])).to_pylist()[0].values()
    return None if first is None else (first, last)


def _untouched(invocations: pa.Table, touched: pa.Table) -> pa.Table:
    """The rows of ``invocations`` whose (pid, inv) is not among ``touched``'s, in their order."""
    keys = invocations.select(["pid", "inv"]).append_column("row", pa.array(np.arange(invocations.num_rows)))
    rows = keys.join(touched, keys=["pid", "inv"], join_type="left anti").column("row").to_numpy()
    return invocations.take(np.sort(rows))


class LiveAnalysis:
    """The followed logs of ``paths``, their rows written to ``dataset_dir`` and kept for a window in memory."""

    def __init__(
        self,
        paths: Sequence[str | os.PathLike],
        dataset_dir: str | os.PathLike,
        *,
        window: int = DEFAULT_WINDOW_STEPS,
        threshold_ms: float = DEFAULT_THRESHOLD_MS,
        expect_ranks: int | None = None,
    ):
        self.paths = [Path(p) for p in paths]
        for path in self.paths:  # a log the job has not written yet is waited for, in a directory that exists
            if not path.exists() and not path.parent.is_dir():
                raise InputError(path, "no such file, nor a directory for it to appear in")
        self.threshold_ms = threshold_ms
        self.ring = StepRing(window, expect_ranks)
        self.followers: dict[Path, LogFollower] = {}
        self.fragments: dict[Path, FragmentFollower] = {}  # by fragments directory (or fragment)
        self.serving = ServingRows()
        self.writer = SpanDatasetWriter(dataset_dir)
        self._unwritten: list[pa.Table] = []
        self._unwritten_rows = 0
        self.bytes_read = 0
        self.takes = 0
        self._touched: list[pa.Table] = []  # the (pid, inv) of the rows read since the last window was taken
        self._learned: WindowResult | None = None  # the invocations of the latest window analysed

    def poll(self) -> int:
        """Read the logs' and fragments' new bytes (picking up new ones in watched directories); how many bytes were new."""
        self._discover()
        before = self.bytes_read
        for follower in self.followers.values():
            for table in follower.poll():
                self._take(table)
        for fragments in self.fragments.values():
            self.serving.add(fragments.poll().spans)
        self.bytes_read = sum(f.total_read for f in self.followers.values()) + sum(f.total_read for f in self.fragments.values())
        return self.bytes_read - before

    def job_ended(self) -> bool:
        """Whether a watched artifact directory holds the runtime's performance_summary.json (written at the job's end)."""
        return any((path / artifacts.PERFORMANCE_SUMMARY).is_file() for path in self.paths if path.is_dir())

    def window(self) -> AnalysisResult | None:
        """The analysis of the window's complete steps, or None while it holds none. Close its engine when done."""
        window = self.take()
        if window is None:
            return None
        result = analyze_window(window, self.threshold_ms)
        self.learn(_window_result(result, window))
        return result

    def take(self) -> LiveWindow | None:
        """The window to analyse (:meth:`window_trace`), with the invocations known from the window before it.

        An invocation's row of the window before is kept if none of its rows came since that window was taken: its
        rows are then the same (the ring lets an invocation go whole), so its aggregate is. The window before must
        have been analysed and learnt (:meth:`learn`) by now, else every invocation is aggregated again.
        """
        trace = self.window_trace()
        if trace is None:
            return None
        touched = pa.concat_tables(self._touched) if self._touched else None
        self._touched = []
        self.takes += 1
        known = self._learned.invocations if self._learned is not None and self._learned.take == self.takes - 1 else None
        return LiveWindow(trace, None if known is None or touched is None else _untouched(known, touched), self.takes)

    def learn(self, result: WindowResult) -> None:
        """Keep the invocations of an analysed window for the next (the latest taken only)."""
        if self._learned is None or result.take > self._learned.take:
            self._learned = result

    def window_trace(self) -> Trace | None:
        """The window's complete steps with the request spans that overlap them, the clock anchors and chips seen so far."""
        spans = self.ring.take_window()
        if not spans.num_rows:
            return None
        followed = merge_traces([f.trace() for f in self.followers.values()])
        steps_time = steps_time_range(spans) if self.serving.rows else None  # no request spans followed: none to take
        requests = SPAN_SCHEMA.empty_table() if steps_time is None else self.serving.take(*steps_time)
        trace = Trace(spans=concat_spans([spans, requests]), files=followed.files)
        trace.anchors, trace.chip_devices = followed.anchors, followed.chip_devices
        return trace

    def drain(self) -> None:
        """Parse every followed log and fragment to its last byte (a torn last record or line too): the job has ended."""
        self._discover()
        for follower in self.followers.values():
            for table in follower.finish():
                self._take(table)
        for fragments in self.fragments.values():
            self.serving.add(fragments.finish().spans)
        self._write()

    def finish(self) -> Trace:
        """Parse what is left, read the inputs not followed, complete the dataset; its Trace (spans on disk)."""
        self.drain()
        others = read_paths(self.paths, sink=self.writer, logs=False)
        self.writer.add(others.spans)
        others.spans = SPAN_SCHEMA.empty_table()
        listed = [log for log in self._logs() if log in self.followers]  # read_paths' order, whenever each log appeared
        in_order = [self.followers[log] for log in [*listed, *(log for log in self.followers if log not in listed)]]
        trace = merge_traces([*(f.trace() for f in in_order), others])
        trace.dropped = dict(sorted(trace.dropped.items()))
        self.writer.finish(trace)
        return trace

    def abort(self) -> None:
        for fragments in self.fragments.values():
            fragments.close()
        self.writer.abort()

    def _take(self, table: pa.Table) -> None:
        self.ring.add(table)
        self._touched.append(table.select(["pid", "inv"]))
        self._unwritten.append(table)
        self._unwritten_rows += table.num_rows
        if self._unwritten_rows >= WRITE_ROWS:
            self._write()

    def _write(self) -> None:
        """Hand the rows gathered to the dataset writer, as one table."""
        if self._unwritten:
            self.writer.add(pa.concat_tables(self._unwritten))
        self._unwritten, self._unwritten_rows = [], 0

    def _discover(self) -> None:
        """Follow every text log named, every ``*.log`` that now is in a watched directory, and the fragments now written."""
        for log in self._logs():
            if log not in self.followers and not self._followed_elsewhere(log):
                self.followers[log] = LogFollower(log)
        for source in filter(None, map(fragment_source, self.paths)):
            if source not in self.fragments:
                self.fragments[source] = FragmentFollower(source)

    def _followed_elsewhere(self, log: Path) -> bool:
        """Whether ``log`` is a file already followed under another name (rotated to a name that also ends in .log)."""
        try:
            status = log.stat()
        except OSError:
            return True  # gone again: nothing to follow
        return any((status.st_dev, status.st_ino) in f.identities for f in self.followers.values())

    def _logs(self) -> list[Path]:
        """The text logs of the paths, in read_paths' order: each path's, a directory's ``*.log`` sorted by name."""
        logs: list[Path] = []
        for path in self.paths:
            if path.is_dir():
                logs.extend(sorted(p for p in path.glob("*.log") if p.is_file()))
            elif path in self.followers or (path.is_file() and is_text_log(path)):
                logs.append(path)
        return list(dict.fromkeys(logs))
