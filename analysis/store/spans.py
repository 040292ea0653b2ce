"""The span table: the one data model every reader fills and every analysis queries.

An Arrow table with the columns of :data:`SPAN_SCHEMA` (each documented in
:data:`SPAN_COLUMN_DOCS`; docs/ARCHITECTURE.md "Engine tables" is generated
from both), in memory or as a Parquet dataset; the engine queries either
through DuckDB. Times are integer ns on the host monotonic clock, except rows
with ``clk == "dev"``, whose ``ts_ns`` is on a per-invocation device clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dsprof.profiler import strace_format as fmt

ATTRS_TYPE = pa.map_(pa.string(), pa.string())

# attribute name -> promoted column, integers and text
PROMOTED_INT_ATTRS: dict[str, str] = {
    fmt.RANK_ATTR: "rank",
    fmt.STEP_ATTR: "step",
    **{name: name for name in fmt.IDENTITY_ATTRS},
    fmt.OS_CPU_NS: "os_cpu_ns",
    fmt.OS_RQ_NS: "os_rq_ns",
    fmt.OS_NIVCSW: "os_nivcsw",
    fmt.OS_MAJFLT: "os_majflt",
}
PROMOTED_TEXT_ATTRS: dict[str, str] = {fmt.DEVICE_ATTR: "device", fmt.CALLABLE_ATTR: "callable"}

SPAN_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("file", pa.string()),
        ("line", pa.int64()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("name", pa.string()),
        ("cat", pa.string()),
        ("ph", pa.string()),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("inv", pa.uint64()),
        ("hid", pa.string()),
        ("depth", pa.int64()),
        ("clk", pa.string()),
        *((column, pa.int64()) for column in PROMOTED_INT_ATTRS.values()),
        *((column, pa.string()) for column in PROMOTED_TEXT_ATTRS.values()),
        ("attrs", ATTRS_TYPE),
    ]
)
SPAN_COLUMNS = tuple(SPAN_SCHEMA.names)
_PROMOTED = "promoted from the attribute of the same name (docs/FORMATS.md); null where absent or not an integer"
# column -> what it holds
SPAN_COLUMN_DOCS: dict[str, str] = {
    "source": "which reader produced the row: `strace`, `sa_profile` or `chrome`",
    "file": "the path the row was read from",
    "line": "1-based line (text logs, JSONL fragments) or event index (JSON)",
    "pid": "OS process id (Chrome `pid` for JSON traces)",
    "tid": "OS thread id (Chrome `tid`)",
    "name": "span name, decoded",
    "cat": "Chrome category; empty for STRACE rows",
    "ph": "`X` complete span or `i` instant (`dur_ns` 0)",
    "ts_ns": "start, ns (host monotonic clock; per-invocation device clock where `clk` is `dev`)",
    "dur_ns": "duration, ns; never negative (readers drop and count such spans)",
    "inv": "STRACE invocation id; null elsewhere",
    "hid": "STRACE callable hash (hex text); empty elsewhere",
    "depth": "STRACE nesting depth; null elsewhere",
    "clk": "`host` or `dev`",
    **{column: _PROMOTED for column in PROMOTED_INT_ATTRS.values()},
    "device": "the `device` attribute",
    "callable": "the `callable` attribute",
    "attrs": "every other attribute (Chrome `args` member) as text; non-string JSON values as their JSON text",
}
# Columns with few distinct values: dictionary-encoded in Parquet.
DICTIONARY_COLUMNS = ("source", "file", "name", "cat", "ph", "hid", "clk", "device", "callable")
# Columns that hold one value for all the rows a reader takes from one file: readers
# hand them over dictionary-encoded (PARQUET_SCHEMA), nothing per row to hash or write.
PER_FILE_COLUMNS = ("source", "file", "cat", "ph")
DICTIONARY_TYPE = pa.dictionary(pa.int32(), pa.string())
# SPAN_SCHEMA with PER_FILE_COLUMNS dictionary-encoded: what span Parquet writers and readers' sinks take.
PARQUET_SCHEMA = pa.schema([f.with_type(DICTIONARY_TYPE) if f.name in PER_FILE_COLUMNS else f for f in SPAN_SCHEMA])

# Integer attribute text the promoted columns take: what fits int64 without a doubt.
_INT_TEXT = r"^-?[0-9]{1,18}$"


# The bound on span times (ts_ns, and ts_ns + dur_ns): 2**62 ns, about 146 years. Readers drop and count
# rows beyond it, and the dataset reader refuses parts beyond it, so the sum or difference of two times
# in the analysis' SQL never leaves int64.
MAX_TIME_NS = 1 << 62

ANCHOR_SCHEMA = pa.schema([("pid", pa.int64()), ("mono_ns", pa.int64()), ("wall_ns", pa.int64())])
CHIP_SCHEMA = pa.schema([("pid", pa.int64()), ("device", pa.string())])


def with_sequence(table: pa.Table) -> pa.Table:
    """A side table with its order of reading in ``seq``: "the first ready line", "the last anchor"."""
    return table.append_column("seq", pa.array(range(table.num_rows), pa.int64()))


def anchor_offsets_sql(anchors: str) -> str:
    """SQL: per pid, ``offset_ns`` = wall − monotonic of its last clock anchor (``anchors`` with ``seq``; the serving
    stack keeps the last anchor of a process, so does dsprof)."""
    return f"SELECT pid, arg_max(wall_ns - mono_ns, seq) AS offset_ns FROM {anchors} GROUP BY pid"


def empty_spans() -> pa.Table:
    return SPAN_SCHEMA.empty_table()


def split_attributes(offsets: np.ndarray, keys: pa.Array, values: pa.Array) -> tuple[dict[str, pa.Array], pa.Array]:
    """Promoted columns and the ``attrs`` map of the rest, from every row's flat key/value pairs.

    ``offsets`` (n + 1 entries) delimit each row's pairs in ``keys``/``values``
    (decoded text). A key's first occurrence in a row is promoted when its value
    parses; everything not promoted stays in the map, in order.
    """
    n = len(offsets) - 1
    offsets = np.asarray(offsets, np.int64)
    keys = keys.cast(pa.string()) if keys.type != pa.string() else keys
    values = values.cast(pa.string()) if values.type != pa.string() else values
    row = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
    promoted = np.zeros(len(keys), dtype=bool)
    columns: dict[str, pa.Array] = {}
    for attrs_map, arrow_type, parses in (
        (PROMOTED_INT_ATTRS, pa.int64(), lambda v: pc.match_substring_regex(v, _INT_TEXT)),
        (PROMOTED_TEXT_ATTRS, pa.string(), lambda v: pc.is_valid(v)),
    ):
        for key, column in attrs_map.items():  # a loop over the vocabulary, not the rows
            hit = np.flatnonzero(pc.equal(keys, key).to_numpy(zero_copy_only=False))
            if len(hit):
                ok = parses(values.take(pa.array(hit))).to_numpy(zero_copy_only=False)
                hit = hit[ok]
                rows, first = np.unique(row[hit], return_index=True)  # the first occurrence in a row wins
                hit = hit[first]
            else:
                rows = hit
            promoted[hit] = True
            source = np.full(n, -1, np.int64)
            source[rows] = hit
            taken = values.take(pa.array(source, mask=source < 0))
            columns[column] = taken.cast(arrow_type) if arrow_type != pa.string() else taken
    keep = ~promoted
    kept_per_row = np.bincount(row[keep], minlength=n) if n else np.zeros(0, np.int64)
    map_offsets = np.zeros(n + 1, np.int32)
    np.cumsum(kept_per_row, out=map_offsets[1:])
    mask = pa.array(keep)
    rest = pa.MapArray.from_arrays(pa.array(map_offsets, pa.int32()), keys.filter(mask), values.filter(mask), type=ATTRS_TYPE)
    return columns, rest


def attr_map_parts(attrs: pa.Array) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """(offsets, keys, values) of a ``map<string,string>`` column (zero-copy slices)."""
    attrs = attrs.combine_chunks() if isinstance(attrs, pa.ChunkedArray) else attrs
    offsets = np.asarray(attrs.offsets, np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    return offsets - first, attrs.keys.slice(first, last - first), attrs.items.slice(first, last - first)


def concat_spans(tables: list[pa.Table]) -> pa.Table:
    """Stack span tables from several readers."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return empty_spans()
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


@dataclass
class Trace:
    """Everything read from a set of artifacts: spans plus the side tables.

    ``spans`` is the span table in memory; a reader told to spill (large logs)
    leaves it empty and lists its Parquet files in ``span_files`` instead.
    ``spans_written`` counts, by source, the rows handed to a sink rather than
    kept (``dsprof ingest``).
    ``anchors``: one row per accepted CLOCK_ANCHOR (pid, mono_ns, wall_ns; wall
    nanoseconds exceed 2**53, so they are never floats). ``chip_devices``: one
    row per ``[chip_process pid= dev=] ready`` line (pid, device). ``dropped``
    counts records that could not be used, by reason (e.g. ``torn_record``,
    ``unknown_version``, ``bad_json``); nothing is dropped silently.
    """

    spans: pa.Table = field(default_factory=empty_spans)
    span_files: list[Path] = field(default_factory=list)
    spans_written: dict[str, int] = field(default_factory=dict)
    anchors: pa.Table = field(default_factory=lambda: ANCHOR_SCHEMA.empty_table())
    chip_devices: pa.Table = field(default_factory=lambda: CHIP_SCHEMA.empty_table())
    dropped: dict[str, int] = field(default_factory=dict)
    drop_sites: dict[str, str] = field(default_factory=dict)  # reason -> "file:line" of the first record dropped for it
    records_read: int = 0
    lines_read: int = 0
    files: list[str] = field(default_factory=list)
    # Chrome metadata: pid -> process name, (pid, tid) -> thread name
    process_names: dict[int, str] = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    # the JSON side files of an artifact directory, as read (see dsprof.analysis.ingest.side_files)
    performance_summary: dict | None = None
    faults: dict | None = None
    # which SA_PROFILE source was read and why (merged trace.json or fragments)
    notes: list[str] = field(default_factory=list)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @property
    def span_count(self) -> int:
        if self.span_files:
            return sum(pq.ParquetFile(p).metadata.num_rows for p in self.span_files) + self.spans.num_rows
        return self.spans.num_rows

    def count(self, reason: str, n: int = 1) -> None:
        if n:
            self.dropped[reason] = self.dropped.get(reason, 0) + int(n)


def merge_traces(traces: list[Trace]) -> Trace:
    """One Trace from several: spans and side tables stacked, counters summed, names merged.

    Side files are taken from the first trace that has them.
    """
    merged = Trace()
    if not traces:
        return merged
    merged.spans = concat_spans([t.spans for t in traces])
    merged.anchors = pa.concat_tables([t.anchors for t in traces])
    merged.chip_devices = pa.concat_tables([t.chip_devices for t in traces])
    for trace in traces:
        for reason, count in trace.dropped.items():
            merged.count(reason, count)
        for reason, site in trace.drop_sites.items():
            merged.drop_sites.setdefault(reason, site)
        merged.span_files.extend(trace.span_files)
        for source, count in trace.spans_written.items():
            merged.spans_written[source] = merged.spans_written.get(source, 0) + count
        merged.records_read += trace.records_read
        merged.lines_read += trace.lines_read
        merged.files.extend(trace.files)
        merged.process_names.update(trace.process_names)
        merged.thread_names.update(trace.thread_names)
        merged.notes.extend(trace.notes)
        if merged.performance_summary is None:
            merged.performance_summary = trace.performance_summary
        if merged.faults is None:
            merged.faults = trace.faults
    return merged
