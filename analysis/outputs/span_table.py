"""Write the span table to a file; the format follows the extension.

* ``.parquet``: Arrow :data:`~dsprof.analysis.spans.SPAN_SCHEMA` as is
  (``attrs`` a ``map<string,string>``, ``inv`` ``uint64``).
* ``.csv``: one row per span; ``attrs`` as a JSON object text; ``inv`` and
  ``depth`` empty where null; ``inv`` printed as an exact unsigned integer.
* ``.jsonl``: one JSON object per span; ``attrs`` a JSON object; ``inv`` an
  integer (exact to 2**64-1, since Python's json writes ints exactly) or null.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from dsprof.analysis.spans import SPAN_COLUMNS, spans_to_arrow
from dsprof.errors import InputError

SPAN_TABLE_FORMATS = (".parquet", ".csv", ".jsonl")
# Rows per JSONL write batch: bounds the Python objects alive at once.
_JSONL_BATCH_ROWS = 65536


def check_span_table_path(path: str | os.PathLike) -> str:
    """The output format for ``path`` (its extension), or InputError if unsupported."""
    suffix = Path(path).suffix.lower()
    if suffix not in SPAN_TABLE_FORMATS:
        raise InputError(path, f"unknown span table format {suffix or '(no extension)'!r}", expected=", ".join(SPAN_TABLE_FORMATS))
    return suffix


def write_span_table(spans: pd.DataFrame, path: str | os.PathLike) -> None:
    """Write ``spans`` as Parquet, CSV or JSONL according to the extension of ``path``."""
    suffix = check_span_table_path(path)
    table = spans_to_arrow(spans)
    if suffix == ".parquet":
        pq.write_table(table, str(path))
    elif suffix == ".csv":
        pa_csv.write_csv(_with_attrs_as_json(table), str(path))
    else:
        _write_jsonl(table, Path(path))


def _attrs_json(table: pa.Table) -> pa.Array:
    """``attrs`` as JSON object text, one per row (json.dumps escapes keys and values)."""
    return pa.array(
        [json.dumps(dict(pairs), ensure_ascii=False, separators=(",", ":")) if pairs is not None else "{}" for pairs in table.column("attrs").to_pylist()],
        pa.string(),
    )


def _with_attrs_as_json(table: pa.Table) -> pa.Table:
    index = table.schema.get_field_index("attrs")
    return table.set_column(index, "attrs", _attrs_json(table))


def _write_jsonl(table: pa.Table, path: Path) -> None:
    with path.open("w", encoding="utf-8") as out:
        for batch in table.to_batches(max_chunksize=_JSONL_BATCH_ROWS):
            columns = {name: batch.column(name).to_pylist() for name in SPAN_COLUMNS}
            columns["attrs"] = [dict(pairs) if pairs is not None else {} for pairs in columns["attrs"]]
            for row in zip(*columns.values()):
                out.write(json.dumps(dict(zip(SPAN_COLUMNS, row)), ensure_ascii=False, separators=(",", ":")))
                out.write("\n")
