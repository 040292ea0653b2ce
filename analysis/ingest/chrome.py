"""Reader for Chrome Trace Event Format JSON (generic Chrome / PyTorch Kineto traces).

Accepts a top-level list of events or an object with ``traceEvents``, plain
or gzip-compressed (by gzip magic bytes), read as a stream
(:mod:`dsprof.analysis.ingest.json_stream`): memory holds one batch of events
and the rows made so far, whatever the file's size. Also the event converter
that the SA_PROFILE reader shares (:class:`SpanBuilder`): decoded events
(:class:`~dsprof.profiler.chrome_json.TraceEvent`, parsed by msgspec with the
rules of :mod:`dsprof.profiler.chrome_json`) become span rows a batch at a
time, column by column.

How events become span rows, and what is dropped and counted: docs/FORMATS.md
"Chrome JSON as dsprof reads it".
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import ipc

from dsprof.analysis.ingest.chrome_columns import (
    PH_B,
    PH_E,
    PH_I,
    PH_M,
    PH_OTHER,
    PH_X,
    VALUE_MISSING,
    VALUE_OK,
    VALUE_OUT_OF_RANGE,
    attribute_pairs,
    id_column,
    members_by_parser,
    ns_column,
    phase_codes,
    scalar_id,
    text_column,
    value_texts,
)
from dsprof.analysis.ingest.json_stream import ChromeDocument
from dsprof.analysis.ingest.sink import SpanSink
from dsprof.analysis.store.spans import MAX_TIME_NS, SPAN_SCHEMA, Trace, attr_map_parts, split_attributes
from dsprof.profiler.chrome_json import (
    DEFAULT_LIMITS,
    INT64_MAX,
    INT64_MIN,
    JsonLimits,
    TraceEvent,
)
from dsprof.progress import Progress

# the drop reason of a document cut short: whatever followed the cut is lost (its line is where the document ends)
TRUNCATED_DOCUMENT = "truncated_document"
# B/E rows kept until the end of a file, where they are paired
_BEGIN_END_SCHEMA = pa.schema(
    [
        ("file", pa.int32()),  # the row's file: its index in SpanBuilder.files
        ("line", pa.int64()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("ts_ns", pa.int64()),
        ("begin", pa.bool_()),
        ("name", pa.string()),
        ("cat", pa.string()),
        ("attrs", pa.map_(pa.string(), pa.string())),
    ]
)


def read_chrome_trace(
    path: str | os.PathLike,
    progress: Progress = None,
    source: str = "chrome",
    *,
    limits: JsonLimits = DEFAULT_LIMITS,
    sink: SpanSink | None = None,
) -> Trace:
    """Read a Chrome/Kineto JSON trace (``.json`` or gzip) into a Trace (spans to ``sink`` when given)."""
    path = Path(path)
    if progress is not None:
        progress(f"reading {path}")
    return read_document(path, source, limits, sink)[0]


def read_document(
    path: Path, source: str, limits: JsonLimits = DEFAULT_LIMITS, sink: SpanSink | None = None
) -> tuple[Trace, ChromeDocument]:
    """A Chrome JSON document's Trace, and the document (for its top-level members)."""
    document = ChromeDocument(path, limits)
    builder = SpanBuilder(str(path), source, sink=sink)
    for batch in document.batches():
        builder.base_ns = document.base_ns if document.base_before_events else None
        builder.add(batch.events, batch.index, skipped=batch.dropped, nulled=batch.nulled)
    trace = builder.finish(document.base_ns or 0)
    trace.notes.extend(document.notes)
    if document.cut_line is not None:  # the rest of the document is lost: a drop, with where it ends
        trace.count(TRUNCATED_DOCUMENT)
        for reason in (TRUNCATED_DOCUMENT, "torn_event"):
            if trace.dropped.get(reason):
                trace.drop_sites[reason] = f"{path}:{document.cut_line}"
    return trace, document


class SpanBuilder:
    """Span rows of one file from batches of decoded events (see the module docstring for the rules).

    ``file`` names the one file the events come from; a list of names makes
    one builder serve many small files (SA_PROFILE fragments, a few events
    each), every batch then saying which file each event is from: their rows
    are converted together instead of a file at a time. ``B``/``E`` pair only
    within their file.

    ``base_ns`` is added to every ``ts``; ``None`` while it is not known yet
    (Kineto writes ``baseTimeNanoseconds`` after ``traceEvents``): rows are then
    held — in memory, or in a temporary Arrow file when a ``sink`` bounds
    memory — and get it in :meth:`finish`. ``B``/``E`` rows are held until
    :meth:`finish` too, where they are paired.
    """

    def __init__(self, file: str | list[str], source: str, sink: SpanSink | None = None):
        self.files = [file] if isinstance(file, str) else list(file)
        self.file = self.files[0] if self.files else ""  # for notes on a one-file builder
        self.source = source
        self.sink = sink
        self.base_ns: int | None = 0
        self.trace = Trace(files=list(self.files))
        self.nulled = 0  # NaN/Infinity values read as null
        self._ready: list[pa.Table] = []  # rows with their final ts (kept when there is no sink)
        self._held = _HeldTables(spill=sink is not None)  # rows waiting for base_ns
        self._begin_end: list[pa.Table] = []

    def add(
        self,
        events: list[TraceEvent],
        where: np.ndarray,
        *,
        skipped: dict[str, int] | None = None,
        nulled: int = 0,
        file_of: np.ndarray | None = None,
    ) -> None:
        """Convert one batch; ``where`` holds each event's line number or index.

        ``skipped`` counts the batch's records that were no events, by reason;
        ``nulled`` the NaN/Infinity values its events held (read as null);
        ``file_of`` each event's file (an index into ``files``; None: the first).
        """
        self.trace.records_read += len(events) + sum((skipped or {}).values())
        for reason, count in (skipped or {}).items():
            self.trace.count(reason, count)
        self.nulled += nulled
        table, begin_end = self._convert(events, where, np.zeros(len(events), np.int32) if file_of is None else file_of)
        if begin_end.num_rows:
            self._begin_end.append(begin_end)
        if not table.num_rows:
            return
        if self.base_ns is None:
            self._held.add(table)
        else:
            self._emit(self._with_base(table, self.base_ns))

    def finish(self, base_ns: int = 0) -> Trace:
        """The file's Trace: held rows get ``base_ns``; B/E pairs are made."""
        for table in self._held.tables():
            self._emit(self._with_base(table, base_ns))
        paired = False
        if self._begin_end:
            pairs = _pair_begin_end(pa.concat_tables(self._begin_end), self.trace)
            self._begin_end = []
            if len(pairs["line"]):
                self._emit(self._with_base(self._span_table(pairs), base_ns))
                paired = True
        if self.sink is None:
            spans = pa.concat_tables(self._ready) if self._ready else SPAN_SCHEMA.empty_table()
            self.trace.spans = self._in_file_order(spans) if paired else spans  # pairs were made last
        if self.nulled:
            self.trace.notes.append(nulled_note(self.file, self.nulled))
        self.trace.dropped = {k: v for k, v in self.trace.dropped.items() if v}
        return self.trace

    def _in_file_order(self, spans: pa.Table) -> pa.Table:
        """Rows by file (in ``files`` order), then line: as if each file had been read on its own (a stable sort)."""
        if len(self.files) == 1:
            return spans.sort_by("line")
        file_index = pc.index_in(spans.column("file"), value_set=pa.array(self.files)).to_numpy(zero_copy_only=False)
        return spans.take(pa.array(np.lexsort((spans.column("line").to_numpy(), file_index))))

    def _emit(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        if self.sink is not None:
            self.sink.add(table)
        else:
            self._ready.append(table)

    def _with_base(self, table: pa.Table, base_ns: int) -> pa.Table:
        """``ts_ns + base_ns``, dropping (as ``bad_value``) rows it would take, start or end, past ±MAX_TIME_NS."""
        ts = table.column("ts_ns").to_numpy()
        dur = table.column("dur_ns").to_numpy()
        if abs(base_ns) >= 2 * MAX_TIME_NS:
            fits = np.zeros(len(ts), bool)
        else:  # |ts|, |dur| < MAX_TIME_NS (ns_column): nothing below leaves int64
            low, high = max(-MAX_TIME_NS - base_ns, INT64_MIN), min(MAX_TIME_NS - base_ns, INT64_MAX)
            fits = (ts > low) & (ts < high)
            fits[fits] &= dur[fits] < MAX_TIME_NS - (ts[fits] + base_ns)
        if not fits.all():
            self.trace.count("bad_value", int((~fits).sum()))
            table = table.filter(pa.array(fits))
            ts = ts[fits]
        if not base_ns:
            return table
        return table.set_column(table.schema.get_field_index("ts_ns"), "ts_ns", pa.array(ts + base_ns, pa.int64()))

    def _convert(self, events: list[TraceEvent], where: np.ndarray, file_of: np.ndarray) -> tuple[pa.Table, pa.Table]:
        """X/i rows (span table) and B/E rows (kept for pairing) of one batch; drops are counted."""
        phase = phase_codes([e.ph for e in events])
        for i in np.flatnonzero(phase == PH_M).tolist():  # metadata: a few per process
            self._metadata(events[i])
        self.trace.count("unsupported_phase", int((phase == PH_OTHER).sum()))
        keep = np.flatnonzero(phase <= PH_I)
        if len(keep) < len(events):
            events = [events[i] for i in keep.tolist()]
            where, phase, file_of = where[keep], phase[keep], file_of[keep]
        ts_ns, ts_status = ns_column([e.ts for e in events])
        dur_ns, dur_status = ns_column([e.dur for e in events], absent_is_zero=True)
        is_x = phase == PH_X
        dur_ns[~is_x] = 0
        dur_status[~is_x] = VALUE_OK
        pid, pid_labels, pid_status = id_column([e.pid for e in events])
        tid, tid_labels, tid_status = id_column([e.tid for e in events])
        status = np.maximum.reduce([ts_status, dur_status, pid_status, tid_status])
        self.trace.count("bad_event", int((status == VALUE_MISSING).sum()))
        self.trace.count("bad_value", int((status == VALUE_OUT_OF_RANGE).sum()))
        negative = (status == VALUE_OK) & (dur_ns < 0)
        self.trace.count("negative_duration", int(negative.sum()))
        usable = (status == VALUE_OK) & ~negative
        counts, keys, values = attribute_pairs([e.args for e in events], pid_labels, tid_labels)
        columns = {
            "file": file_of,
            "line": where,
            "pid": pid,
            "tid": tid,
            "ts_ns": ts_ns,
            "dur_ns": dur_ns,
            "name": text_column([e.name for e in events]),
            "cat": text_column([e.cat for e in events]),
        }
        spans = usable & ((phase == PH_X) | (phase == PH_I))
        begin_end = usable & ((phase == PH_B) | (phase == PH_E))
        table = self._span_table(_rows(columns, phase, counts, keys, values, spans))
        if not begin_end.any():
            return table, _BEGIN_END_SCHEMA.empty_table()
        be_rows = _rows(columns, phase, counts, keys, values, begin_end)
        be_table = pa.table(
            {
                **{k: be_rows[k] for k in ("file", "line", "pid", "tid", "ts_ns")},
                "begin": pa.array(be_rows["phase"] == PH_B),
                "name": be_rows["name"],
                "cat": be_rows["cat"],
                "attrs": be_rows["attrs"],
            },
            schema=_BEGIN_END_SCHEMA,
        )
        return table, be_table

    def _metadata(self, event: TraceEvent) -> None:
        attrs: dict[str, str] = {}
        pid = scalar_id(event.pid, "pid_label", attrs)
        tid = scalar_id(event.tid, "tid_label", attrs)
        members = dict(members_by_parser(event.args)) if isinstance(event.args, msgspec.Raw) else {}
        if pid is None or tid is None or "name" not in members:
            self.trace.count("unsupported_metadata" if pid is not None and tid is not None else "bad_value")
            return
        label = value_texts([members["name"]])[0].as_py()
        if event.name == "process_name":
            self.trace.process_names[pid] = label
        elif event.name == "thread_name":
            self.trace.thread_names[(pid, tid)] = label
        else:
            self.trace.count("unsupported_metadata")

    def _span_table(self, rows: dict[str, Any]) -> pa.Table:
        """SPAN_SCHEMA rows from converted columns (attrs as a map, split into the promoted columns here)."""
        n = len(rows["line"])
        offsets, keys, values = attr_map_parts(rows["attrs"])
        promoted, attrs = split_attributes(offsets, keys, values)
        columns = {
            "source": pa.repeat(pa.scalar(self.source), n),
            "file": pa.repeat(pa.scalar(self.file), n) if len(self.files) == 1 else pa.array(self.files).take(pa.array(rows["file"])),
            "line": pa.array(rows["line"], pa.int64()),
            "pid": pa.array(rows["pid"], pa.int64()),
            "tid": pa.array(rows["tid"], pa.int64()),
            "name": rows["name"],
            "cat": rows["cat"],
            "ph": pa.repeat(pa.scalar("X"), n) if "phase" not in rows else pa.array(np.where(rows["phase"] == PH_X, "X", "i"), pa.string()),
            "ts_ns": pa.array(rows["ts_ns"], pa.int64()),
            "dur_ns": pa.array(rows["dur_ns"], pa.int64()),
            "inv": pa.nulls(n, pa.uint64()),
            "hid": pa.repeat(pa.scalar(""), n),
            "depth": pa.nulls(n, pa.int64()),
            "clk": pa.repeat(pa.scalar("host"), n),
            **promoted,
            "attrs": attrs,
        }
        return pa.table([columns[name] for name in SPAN_SCHEMA.names], schema=SPAN_SCHEMA)


def nulled_note(file: str, nulled: int) -> str:
    """The note on a file whose NaN/Infinity values were read as null."""
    return f"{file}: {nulled} NaN/Infinity value(s) read as null (not JSON)"


class _HeldTables:
    """Span tables waiting for ``baseTimeNanoseconds``: a list, or a temporary Arrow IPC file (``spill``)."""

    def __init__(self, spill: bool):
        self.spill = spill
        self._tables: list[pa.Table] = []
        self._file: Any = None
        self._writer: ipc.RecordBatchFileWriter | None = None

    def add(self, table: pa.Table) -> None:
        if not self.spill:
            self._tables.append(table)
            return
        if self._writer is None:
            self._file = tempfile.TemporaryFile(prefix="dsprof-spans-")
            self._writer = ipc.new_file(self._file, SPAN_SCHEMA)
        self._writer.write_table(table)

    def tables(self) -> Iterator[pa.Table]:
        """Each held table once, then nothing is held."""
        yield from self._tables
        self._tables = []
        if self._writer is not None:
            self._writer.close()
            self._file.seek(0)
            reader = ipc.open_file(self._file)
            for i in range(reader.num_record_batches):
                yield pa.Table.from_batches([reader.get_batch(i)])
            self._file.close()
            self._writer = self._file = None


def _rows(
    columns: dict[str, Any], phase: np.ndarray, counts: np.ndarray, keys: pa.Array, values: pa.Array, mask: np.ndarray
) -> dict[str, Any]:
    """The rows of ``mask``: plain columns filtered, their attribute pairs as a map column."""
    if mask.all():  # the common case: nothing to filter
        offsets = np.zeros(len(mask) + 1, np.int32)
        np.cumsum(counts, out=offsets[1:])
        return {**columns, "phase": phase, "attrs": pa.MapArray.from_arrays(pa.array(offsets), keys, values)}
    chosen = pa.array(mask)
    rows = {k: (v[mask] if isinstance(v, np.ndarray) else v.filter(chosen)) for k, v in columns.items()}
    rows["phase"] = phase[mask]
    pair_rows = np.repeat(mask, counts)
    offsets = np.zeros(int(mask.sum()) + 1, np.int32)
    np.cumsum(counts[mask], out=offsets[1:])
    pair_mask = pa.array(pair_rows)
    rows["attrs"] = pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), keys.filter(pair_mask), values.filter(pair_mask))
    return rows


def _pair_begin_end(rows: pa.Table, trace: Trace) -> dict[str, Any]:
    """Match each E to the innermost open B of its (file, pid, tid), in time order (file order breaks ties); vectorised.

    Per (file, pid, tid), in time order, the stack depth is the running sum of +1
    (B) / -1 (E), where an E that finds the stack empty is unmatched and does
    not move it: such an E makes a new minimum of the running sum below zero.
    Matched Bs and Es then alternate at each depth, B first, so a B followed
    at its depth by an E is a pair; Bs left over were never closed.
    """
    pid, tid = rows.column("pid").to_numpy(), rows.column("tid").to_numpy()
    ts, line = rows.column("ts_ns").to_numpy(), rows.column("line").to_numpy()
    file = rows.column("file").to_numpy()
    begin = rows.column("begin").to_numpy(zero_copy_only=False)
    order = np.lexsort((line, ts, tid, pid, file))
    pid, tid, begin, in_file = pid[order], tid[order], begin[order], file[order]
    n = len(order)
    new_group = np.ones(n, bool)
    new_group[1:] = (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1]) | (in_file[1:] != in_file[:-1])
    group = np.cumsum(new_group) - 1
    running = np.cumsum(np.where(begin, 1, -1))
    start = np.flatnonzero(new_group)
    running -= np.repeat(np.append(0, running[start[1:] - 1]), np.diff(np.append(start, n)))  # restart each group at 0
    spread = 2 * n + 2  # shift groups apart so that one running minimum serves them all
    low = np.minimum(np.minimum.accumulate(running - group * spread) + group * spread, 0)
    low_before = np.zeros(n, np.int64)
    low_before[1:] = low[:-1]
    low_before[new_group] = 0
    unmatched_end = ~begin & (low < low_before)
    level = running - low + np.where(begin, 0, 1)  # depth a B opens / an E closes
    kept = np.flatnonzero(~unmatched_end)
    by_level = kept[np.lexsort((kept, level[kept], group[kept]))]
    b, e = by_level[:-1], by_level[1:]
    pair = begin[b] & ~begin[e] & (group[b] == group[e]) & (level[b] == level[e])
    b_rows, e_rows = order[b[pair]], order[e[pair]]
    trace.count("unmatched_end", int(unmatched_end.sum()))
    trace.count("unmatched_begin", int(begin.sum()) - len(b_rows))
    by_line = np.lexsort((line[b_rows], file[b_rows]))  # rows in the order of their B
    b_rows, e_rows = b_rows[by_line], e_rows[by_line]
    return {
        "file": file[b_rows],
        "line": line[b_rows],
        "pid": rows.column("pid").to_numpy()[b_rows],
        "tid": rows.column("tid").to_numpy()[b_rows],
        "ts_ns": ts[b_rows],
        "dur_ns": ts[e_rows] - ts[b_rows],
        "name": rows.column("name").take(pa.array(b_rows)),
        "cat": rows.column("cat").take(pa.array(b_rows)),
        "attrs": _merged_attrs(rows.column("attrs").combine_chunks(), b_rows, e_rows),
    }


def _merged_attrs(attrs: pa.MapArray, b_rows: np.ndarray, e_rows: np.ndarray) -> pa.MapArray:
    """Per pair, B's attributes then E's new ones; for a key in both, E's value at B's place."""
    b_map, e_map = attrs.take(pa.array(b_rows)), attrs.take(pa.array(e_rows))
    b_offsets, b_keys, b_values = attr_map_parts(b_map)
    e_offsets, e_keys, e_values = attr_map_parts(e_map)
    if not len(e_keys):
        return b_map
    pair = np.concatenate([np.repeat(np.arange(len(b_rows)), np.diff(b_offsets)), np.repeat(np.arange(len(b_rows)), np.diff(e_offsets))])
    keys = pa.concat_arrays([b_keys, e_keys])
    values = pa.concat_arrays([b_values, e_values])
    table = pa.table({"pair": pair, "key": keys, "at": np.arange(len(pair))})
    grouped = table.group_by(["pair", "key"], use_threads=False).aggregate([("at", "min"), ("at", "max")])
    first, last = grouped.column("at_min").to_numpy(), grouped.column("at_max").to_numpy()
    order = np.lexsort((first, grouped.column("pair").to_numpy()))
    per_pair = np.bincount(grouped.column("pair").to_numpy(), minlength=len(b_rows))
    offsets = np.zeros(len(b_rows) + 1, np.int32)
    np.cumsum(per_pair, out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets), keys.take(pa.array(first[order])), values.take(pa.array(last[order])))
