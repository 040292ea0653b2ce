"""The span table: the one data model every reader fills and every analysis reads.

A span table is a pandas DataFrame whose columns and dtypes are fixed by
:data:`SPAN_SCHEMA`. Units are in the column names. Timestamps are integer
nanoseconds on the host monotonic clock, except rows with ``clk == "dev"``,
whose ``ts_ns`` is on a per-invocation device clock and must never be placed on
the host axis.

Columns
-------
source   ``strace`` | ``sa_profile`` | ``chrome``: which reader produced the row
file     the path the row was read from
line     1-based line number (text logs, JSONL fragments) or event index (JSON)
pid, tid OS process and thread ids (Chrome ``pid``/``tid`` for JSON traces)
name     span name (decoded)
cat      Chrome category; ``""`` for STRACE rows
ph       ``X`` complete span or ``i`` instant (``dur_ns == 0``)
ts_ns    start, ns
dur_ns   duration, ns
inv      STRACE invocation id (uint64), null elsewhere
hid      STRACE callable hash (hex text), ``""`` elsewhere
depth    STRACE nesting depth, null elsewhere
clk      ``host`` or ``dev``
attrs    decoded attributes / Chrome ``args`` as a map<string,string>; nested
         JSON values are kept as their JSON text
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

ATTRS_TYPE = pa.map_(pa.string(), pa.string())

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
        ("attrs", ATTRS_TYPE),
    ]
)

SPAN_COLUMNS = tuple(SPAN_SCHEMA.names)

# pandas dtypes for each Arrow type of the schema: nullable where the schema
# allows nulls (inv, depth), Arrow-backed strings, and the attribute map kept in
# Arrow so that lookups stay vectorised (see attr_columns).
_PANDAS_DTYPES = {
    "source": "string[pyarrow]",
    "file": "string[pyarrow]",
    "line": "int64",
    "pid": "int64",
    "tid": "int64",
    "name": "string[pyarrow]",
    "cat": "string[pyarrow]",
    "ph": "string[pyarrow]",
    "ts_ns": "int64",
    "dur_ns": "int64",
    "inv": "UInt64",
    "hid": "string[pyarrow]",
    "depth": "Int64",
    "clk": "string[pyarrow]",
    "attrs": pd.ArrowDtype(ATTRS_TYPE),
}


def spans_from_arrow(table: pa.Table) -> pd.DataFrame:
    """Convert an Arrow table that follows SPAN_SCHEMA into the pandas span table."""
    table = table.select(list(SPAN_COLUMNS)).cast(SPAN_SCHEMA)
    frame = pd.DataFrame(
        {
            name: table.column(name).to_pandas(types_mapper=_types_mapper_for(name))
            for name in SPAN_COLUMNS
        }
    )
    return frame.astype({k: v for k, v in _PANDAS_DTYPES.items() if k != "attrs"})


def _types_mapper_for(column: str):
    if column == "attrs":
        return lambda arrow_type: pd.ArrowDtype(arrow_type)
    if column in ("inv", "depth"):
        # straight to the nullable dtype: via float64 (what nulls would force)
        # 64-bit invocation ids would lose their low bits
        dtype = _PANDAS_DTYPES[column]
        return lambda arrow_type: pd.api.types.pandas_dtype(dtype)
    return None


def spans_to_arrow(spans: pd.DataFrame) -> pa.Table:
    """The span table as Arrow, for Parquet output and pyarrow kernels."""
    arrays = []
    for name in SPAN_COLUMNS:
        column = spans[name]
        if isinstance(column.dtype, pd.ArrowDtype):
            arrays.append(pa.chunked_array(column.array._pa_array, type=SPAN_SCHEMA.field(name).type))
        else:
            arrays.append(pa.array(column, type=SPAN_SCHEMA.field(name).type, from_pandas=True))
    return pa.Table.from_arrays(arrays, schema=SPAN_SCHEMA)


def empty_spans() -> pd.DataFrame:
    return spans_from_arrow(SPAN_SCHEMA.empty_table())


def concat_spans(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Stack span tables from several readers, keeping the schema's dtypes."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return empty_spans()
    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    return spans_from_arrow(pa.concat_tables([spans_to_arrow(f) for f in frames]))


def attr_columns(spans: pd.DataFrame, keys: list[str] | tuple[str, ...]) -> pd.DataFrame:
    """Pull named attributes out of ``attrs`` as string columns (null where absent; first match wins).

    Vectorised over the map's flattened keys: one comparison per key over all
    entries, then each hit is assigned to its row through the map offsets
    (Arrow's map_lookup is several times slower on large tables).
    """
    attrs = spans["attrs"]
    if len(spans) == 0:
        return pd.DataFrame({k: pd.Series([], dtype="string[pyarrow]") for k in keys}, index=spans.index)
    arrow = pa.chunked_array(attrs.array._pa_array, type=ATTRS_TYPE).combine_chunks()
    # keys/items are the whole child arrays; offsets index into them (also for a slice)
    offsets = np.asarray(arrow.offsets)
    first, last = int(offsets[0]), int(offsets[-1])
    entry_keys = arrow.keys.slice(first, last - first)
    items = arrow.items
    columns = {}
    for key in keys:  # a loop over the requested keys, not the rows
        hits = np.flatnonzero(pc.equal(entry_keys, key).to_numpy(zero_copy_only=False)) + first
        rows = np.searchsorted(offsets, hits, side="right") - 1
        rows, first_hit = np.unique(rows, return_index=True)
        entry_of_row = np.full(len(arrow), -1, dtype=np.int64)
        entry_of_row[rows] = hits[first_hit]
        values = items.take(pa.array(entry_of_row, mask=entry_of_row < 0))
        columns[key] = pd.Series(values.to_numpy(zero_copy_only=False), index=spans.index, dtype="string[pyarrow]")
    return pd.DataFrame(columns, index=spans.index)


@dataclass
class Trace:
    """Everything read from a set of artifacts: spans plus the side tables.

    ``anchors``: one row per CLOCK_ANCHOR (pid, mono_ns, wall_ns as int64; wall
    nanoseconds exceed 2**53, so they are never floats). ``chip_devices``: one
    row per ``[chip_process pid= dev=] ready`` line (pid, device). ``dropped``
    counts records that could not be used, by reason (e.g. ``torn_record``,
    ``unknown_version``, ``bad_json``); nothing is dropped silently.
    """

    spans: pd.DataFrame = field(default_factory=empty_spans)
    anchors: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(
            {"pid": pd.Series([], dtype="int64"), "mono_ns": pd.Series([], dtype="int64"), "wall_ns": pd.Series([], dtype="int64")}
        )
    )
    chip_devices: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame({"pid": pd.Series([], dtype="int64"), "device": pd.Series([], dtype="string[pyarrow]")})
    )
    dropped: dict[str, int] = field(default_factory=dict)
    records_read: int = 0
    files: list[str] = field(default_factory=list)
    # Per-file extras a reader found (e.g. performance_summary.json contents).
    extras: dict[str, object] = field(default_factory=dict)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())
