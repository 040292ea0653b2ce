"""Write the span table to a file; the format follows the extension.

* ``.parquet``: Arrow :data:`~dsprof.analysis.spans.SPAN_SCHEMA` as is
  (``attrs`` a ``map<string,string>``, ``inv`` ``uint64``).
* ``.csv``: one row per span, header first; ``attrs`` as JSON object text;
  ``inv`` and ``depth`` empty where null; ``inv`` printed as an exact
  unsigned integer.
* ``.jsonl``: one JSON object per span with the schema's keys in order;
  ``attrs`` a JSON object; ``inv`` an integer (exact up to 2**64-1) or null.

The JSON text is built with Arrow string kernels over whole columns
(``outputs/json_text.py``), escaping each distinct string once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from dsprof.analysis.outputs.json_text import json_string
from dsprof.analysis.spans import spans_to_arrow
from dsprof.errors import InputError
from dsprof.profiler.synthetic import text_buffer

SPAN_TABLE_FORMATS = (".parquet", ".csv", ".jsonl")


def check_span_table_path(path: str | os.PathLike) -> str:
    """The output format for ``path`` (its extension), or InputError if unsupported."""
    suffix = Path(path).suffix.lower()
    if suffix not in SPAN_TABLE_FORMATS:
        raise InputError(path, f"unknown span table format {suffix or '(no extension)'!r}", expected=", ".join(SPAN_TABLE_FORMATS))
    return suffix


def write_span_table(spans: pd.DataFrame, path: str | os.PathLike) -> None:
    """Write ``spans`` as Parquet, CSV or JSONL according to the extension of ``path``."""
    suffix = check_span_table_path(path)
    table = spans_to_arrow(spans).combine_chunks()
    if suffix == ".parquet":
        pq.write_table(table, str(path))
    elif suffix == ".csv":
        index = table.schema.get_field_index("attrs")
        pa_csv.write_csv(table.set_column(index, "attrs", attrs_json(_column(table, "attrs"))), str(path))
    else:
        Path(path).write_bytes(_jsonl_bytes(table))


def _column(table: pa.Table, name: str) -> pa.Array:
    column = table.column(name)
    return column.chunk(0) if column.num_chunks == 1 else pa.concat_arrays(column.chunks) if column.num_chunks else pa.array([], column.type)


def _lit(text: str) -> pa.Scalar:
    return pa.scalar(text, pa.large_string())


def attrs_json(attrs: pa.Array) -> pa.Array:
    """A ``map<string,string>`` column as JSON object text per row (``{}`` for none)."""
    attrs = attrs.cast(attrs.type)  # a plain MapArray
    if attrs.null_count:
        attrs = attrs.fill_null(pa.scalar([], attrs.type))
    offsets = attrs.offsets.to_numpy().astype(np.int64)
    keys = attrs.keys.slice(offsets[0], offsets[-1] - offsets[0])
    items = attrs.items.slice(offsets[0], offsets[-1] - offsets[0])
    pairs = pc.binary_join_element_wise(_json_strings(keys), _json_strings(items), _lit(":"))
    per_row = pa.LargeListArray.from_arrays(pa.array(offsets - offsets[0], pa.int64()), pairs)
    return pc.binary_join_element_wise(_lit("{"), pc.binary_join(per_row, _lit(",")), _lit("}"), _lit(""))


def _json_strings(values: pa.Array) -> pa.Array:
    """JSON string literals as ``large_string`` (nulls stay null), for text that may pass 2 GiB."""
    return json_string(values, null=None, large=True)


def _json_numbers(values: pa.Array) -> pa.Array:
    return values.cast(pa.large_string()).fill_null(_lit("null"))


def _jsonl_bytes(table: pa.Table) -> bytes:
    """The whole JSONL file: one object per row, keys in schema order, built column-wise."""
    if table.num_rows == 0:
        return b""
    parts: list = []
    for i, field in enumerate(table.schema):
        column = _column(table, field.name)
        if field.name == "attrs":
            text = attrs_json(column)
        elif pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            text = _json_strings(column).fill_null(_lit("null"))
        else:
            text = _json_numbers(column)
        parts += [_lit(("{" if i == 0 else ",") + json.dumps(field.name) + ":"), text]
    lines = pc.binary_join_element_wise(*parts, _lit("}\n"), _lit(""))
    return bytes(text_buffer(lines))  # without nulls, the value buffer is the file
