"""Text of whole columns, built with Arrow string kernels.

The writers that produce one line per row (the Chrome trace writer, the span
table's JSONL, the synthetic generator of :mod:`dsprof.testing`) assemble it
column by column, so their cost per row stays flat however large the input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:  # annotations only: the span table writers use this module without pandas
    import pandas as pd


def json_string(values, *, null: str | None = "", large: bool = False) -> pa.Array:
    """Quoted JSON string literals of a string column (backslash, quote and control bytes escaped).

    A null becomes the literal of ``null`` (``""`` by default), or stays null
    with ``null=None`` (for members that are left out when absent). Escapes
    each distinct value once (names, phases and devices repeat on millions of
    rows) and spreads the results with a dictionary take. ``large`` gives
    ``large_string`` (for a whole file's text, which may pass 2 GiB).
    """
    text = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values, pa.string(), from_pandas=True)
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks()
    if not pa.types.is_large_string(text.type):
        text = pc.cast(text, pa.string())
    if null is not None:
        text = pc.fill_null(text, null)
    encoded = pc.dictionary_encode(text)
    distinct = pc.cast(encoded.dictionary, pa.string())  # the distinct values are few and short
    distinct = pc.replace_substring(distinct, "\\", "\\\\")
    distinct = pc.replace_substring(distinct, '"', '\\"')
    if len(distinct) and pc.any(pc.match_substring_regex(distinct, r"[\x00-\x1f]")).as_py():
        for code in range(0x20):  # the 32 control characters, not the rows
            distinct = pc.replace_substring(distinct, chr(code), f"\\u{code:04x}")
    quoted = join_text('"', distinct, '"') if len(distinct) else pa.array([], pa.string())
    return (quoted.cast(pa.large_string()) if large else quoted).take(encoded.indices)


def us_text(ns: pd.Series | np.ndarray) -> pa.Array:
    """Exact µs text of integer ns: ``12`` when whole, else ``12.345`` (no float rounding)."""
    values = np.asarray(ns, dtype=np.int64)
    magnitude = np.abs(values)
    sign = pa.array(np.where(values < 0, "-", ""))
    whole = pa.array(magnitude // 1000)
    frac = pa.array(magnitude % 1000)
    with_frac = join_text(sign, whole, ".", pc.utf8_lpad(pc.cast(frac, pa.string()), 3, "0"))
    return pc.if_else(pc.equal(frac, 0), join_text(sign, whole), with_frac)


def join_text(*parts) -> pa.Array:
    """Element-wise concatenation of literal strings and columns (numpy, pandas, Arrow), in Arrow.

    Non-string columns are cast to their decimal text; a null in any column
    makes that row null (callers fill nulls first where they need text).
    """
    arrays: list = []
    for part in parts:
        if isinstance(part, str):
            arrays.append(part)
            continue
        if isinstance(part, pa.ChunkedArray):
            part = part.combine_chunks()
        elif not isinstance(part, pa.Array):
            part = pa.array(part, from_pandas=True)
        arrays.append(part if pa.types.is_string(part.type) or pa.types.is_large_string(part.type) else pc.cast(part, pa.string()))
    lengths = {len(a) for a in arrays if not isinstance(a, str)}
    if len(lengths) != 1:
        raise ValueError("join_text: needs columns of one length")
    return pc.binary_join_element_wise(*arrays, "")


def text_buffer(text: pa.Array) -> memoryview:
    """The concatenated bytes of a string array (its data buffer between the first and last offset), zero-copy."""
    if len(text) == 0:
        return memoryview(b"")
    text = text.cast(pa.large_string())
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int64)[text.offset : text.offset + len(text) + 1]
    data = text.buffers()[2]
    return memoryview(data)[offsets[0] : offsets[-1]] if data is not None else memoryview(b"")
