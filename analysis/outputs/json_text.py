"""JSON text of whole columns, built with Arrow string kernels.

The trace writers (combined swimlane, Perfetto export) assemble one line of
JSON per span; building it column by column keeps their cost per span flat
however large the trace. These are the pieces both writers need.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.profiler.synthetic import join_text


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
    whole = pa.array(values // 1000)
    frac = pa.array(values % 1000)
    with_frac = join_text(whole, ".", pc.utf8_lpad(pc.cast(frac, pa.string()), 3, "0"))
    return pc.if_else(pc.equal(frac, 0), pc.cast(whole, pa.string()), with_frac)
