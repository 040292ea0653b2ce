"""Write the span table to one file, chunk by chunk; the format follows the extension.

``.parquet``: :data:`~dsprof.analysis.store.spans.SPAN_SCHEMA` as is, written like
the span dataset's parts. ``.csv``: a header, then one row per span, ``attrs``
as JSON object text, null cells empty, ``inv`` an exact unsigned integer.
``.jsonl``: one object per span, the schema's keys in order, integers exact or
null. Files go through :mod:`dsprof.fileio`; the JSON text is built with Arrow
string kernels over whole columns (``outputs/text.py``), escaping each
distinct string once. Usage: docs/CLI.md, "dsprof ingest".
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from dsprof.analysis.outputs.text import json_string, text_buffer
from dsprof.analysis.store.dataset import BackgroundWrites, SpanParquetFile
from dsprof.analysis.store.spans import SPAN_SCHEMA, Trace
from dsprof.errors import InputError
from dsprof.fileio import atomic_output

SPAN_TABLE_FORMATS = (".parquet", ".csv", ".jsonl")
# CSV columns: the span table's, with attrs as JSON text.
# What a spreadsheet reads as the start of a formula (OWASP's CSV injection list).
_FORMULA_START = r"^[=+\-@\t\r]"
_CSV_SCHEMA = pa.schema([f.with_type(pa.string()) if f.name == "attrs" else f for f in SPAN_SCHEMA])


def check_span_table_path(path: str | os.PathLike) -> str:
    """The output format for ``path`` (its extension), or InputError if unsupported."""
    suffix = Path(path).suffix.lower()
    if suffix not in SPAN_TABLE_FORMATS:
        raise InputError(path, f"unknown span table format {suffix or '(no extension)'!r}", expected=", ".join(SPAN_TABLE_FORMATS))
    return suffix


class SpanTableWriter:
    """A SpanSink that writes one span table file: every table it is given, in order, then :meth:`finish`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.format = check_span_table_path(path)
        self.rows = 0
        self._stack = ExitStack()
        self._parquet: SpanParquetFile | None = None
        self._jobs = BackgroundWrites()
        self._handle: BinaryIO | None = None
        self._csv: pa_csv.CSVWriter | None = None
        if self.format == ".parquet":
            self._parquet = SpanParquetFile(self.path)
            return
        self._handle = self._stack.enter_context(atomic_output(self.path))
        if self.format == ".csv":
            self._csv = pa_csv.CSVWriter(self._handle, _CSV_SCHEMA)

    def add(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        self.rows += table.num_rows
        if self._parquet is not None:
            self._jobs.run(self._parquet.write, table)
            return
        table = _plain(table)
        if self._csv is not None:
            index = table.schema.get_field_index("attrs")
            self._csv.write_table(inert_cells(table.set_column(index, "attrs", attrs_json(_column(table, "attrs")))))
        elif self._handle is not None:
            self._handle.write(_jsonl_bytes(table))

    def finish(self, trace: Trace | None = None) -> Path:
        """Put the file in place (``trace`` is not needed: one file holds only spans)."""
        if self._parquet is not None:
            self._jobs.run(self._parquet.close)
        self._jobs.wait()
        if self._csv is not None:
            self._csv.close()
        self._stack.close()
        return self.path

    @property
    def span_files(self) -> list[Path]:
        return [self.path] if self.format == ".parquet" else []

    def abort(self) -> None:
        """Stop after an error: the file is not written (an older one stays)."""
        self._jobs.stop()
        if self._parquet is not None:
            self._parquet.discard()
        self._stack.__exit__(RuntimeError, RuntimeError("aborted"), None)


def inert_cells(table: pa.Table) -> pa.Table:
    """Text cells a spreadsheet would run as a formula (``=``, ``+``, ``-``, ``@``, tab, CR first) behind a ``'``.

    Span names and attributes come from traces anyone can write; opened in a
    spreadsheet, ``=HYPERLINK(...)`` would be live. Each distinct value is
    checked once (names repeat on millions of rows).
    """
    for index, field in enumerate(table.schema):
        if not pa.types.is_string(field.type):
            continue
        encoded = pc.dictionary_encode(_column(table, field.name))
        distinct = encoded.dictionary
        risky = pc.match_substring_regex(distinct, _FORMULA_START)
        if pc.any(risky).as_py():
            distinct = pc.if_else(risky, pc.binary_join_element_wise("'", distinct, ""), distinct)
            table = table.set_column(index, field.name, distinct.take(encoded.indices))
    return table


def _plain(table: pa.Table) -> pa.Table:
    """The table with dictionary-encoded text decoded (the text writers take plain strings)."""
    return table.cast(SPAN_SCHEMA) if table.schema != SPAN_SCHEMA else table


def _column(table: pa.Table, name: str) -> pa.Array:
    column = table.column(name)
    return (
        column.chunk(0) if column.num_chunks == 1 else pa.concat_arrays(column.chunks) if column.num_chunks else pa.array([], column.type)
    )


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
    return pc.binary_join_element_wise(_lit("{"), pc.binary_join(per_row, _lit(",")), _lit("}"), _lit("")).cast(pa.string())


def _json_strings(values: pa.Array) -> pa.Array:
    """JSON string literals as ``large_string`` (nulls stay null), for text that may pass 2 GiB."""
    return json_string(values, null=None, large=True)


def _json_numbers(values: pa.Array) -> pa.Array:
    return values.cast(pa.large_string()).fill_null(_lit("null"))


def _jsonl_bytes(table: pa.Table) -> memoryview:
    """The JSONL text of a table: one object per row, keys in schema order, built column-wise."""
    parts: list = []
    for i, field in enumerate(table.schema):
        column = _column(table, field.name)
        if field.name == "attrs":
            text = attrs_json(column).cast(pa.large_string())
        elif pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            text = _json_strings(column).fill_null(_lit("null"))
        else:
            text = _json_numbers(column)
        parts += [_lit(("{" if i == 0 else ",") + json.dumps(field.name) + ":"), text]
    lines = pc.binary_join_element_wise(*parts, _lit("}\n"), _lit(""))
    return text_buffer(lines)  # without nulls, the value buffer is the text
