"""Chrome trace event fields made into columns, a batch of events at a time (see :mod:`.chrome` for the rules).

Numbers (``ts``, ``dur``, ``pid``, ``tid``) become int64 columns with a
status per value, and ``args`` objects become flat key/value pairs, cut out
of the raw JSON by byte positions rather than parsed member by member.
"""

from __future__ import annotations

import hashlib
import re
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.store.spans import MAX_TIME_NS
from dsprof.profiler.chrome_json import (
    MEMBERS_DECODER,
    VALUE_DECODER,
    compact_json,
    int64_of,
    json_text,
    string_delimiters,
)

_MAX_US = (MAX_TIME_NS - 1) // 1000  # the largest integer µs whose ns lie within the span time bound
_PHASE_CODES = {"X": 0, "B": 1, "E": 2, "i": 3, "I": 3, "M": 4}
PH_X, PH_B, PH_E, PH_I, PH_M, PH_OTHER = range(6)
_PHASE_NAMES = ["X", "B", "E", "i", "I", "M"]  # a list: pa.array at import would import pandas into dsprof ingest
_PHASE_OF_INDEX = np.array([PH_X, PH_B, PH_E, PH_I, PH_I, PH_M, PH_OTHER], np.int8)  # index_in result (null -> 6) to phase code
# Value status of a number column: usable, unusable (absent, null, not a number), out of range
VALUE_OK, VALUE_MISSING, VALUE_OUT_OF_RANGE = 0, 1, 2
_NUMERIC_TEXT = re.compile(r"-?[0-9]{1,40}(?:\.[0-9]{1,40})?(?:[eE][+-]?[0-9]{1,6})?")
_UNSET_TYPE = type(msgspec.UNSET)
_QUOTE, _BACKSLASH, _COLON, _OPEN_OBJECT = b'"\\:{'
_SPACE, _TAB, _NEWLINE, _RETURN, _OPEN_ARRAY = b" \t\n\r["
# B/E rows kept until the end of a file, where they are paired


def phase_codes(phases: list[Any]) -> np.ndarray:
    """One code per event: X, B, E, i (i or I), M, or other (anything else, non-strings too)."""
    if set(map(type, phases)) <= {str}:
        index = pc.index_in(pa.array(phases, pa.string()), value_set=pa.array(_PHASE_NAMES, pa.string())).fill_null(len(_PHASE_NAMES))
        return _PHASE_OF_INDEX[index.to_numpy()]
    return np.fromiter((_PHASE_CODES.get(p, PH_OTHER) if type(p) is str else PH_OTHER for p in phases), np.int8, len(phases))


def ns_column(values: list[Any], absent_is_zero: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Microseconds to int64 ns, and a status per value (VALUE_OK, VALUE_MISSING, VALUE_OUT_OF_RANGE).

    All-integer and all-decimal batches are converted vectorised; anything
    else (or a failure there, e.g. a value out of range) value by value.
    """
    kinds = set(map(type, values))
    if absent_is_zero and _UNSET_TYPE in kinds:
        values = [0 if v is msgspec.UNSET else v for v in values]
        kinds = set(map(type, values))
    if kinds <= {int}:
        try:
            micros = np.array(values, np.int64)
        except OverflowError:
            pass
        else:
            fits = (micros <= _MAX_US) & (micros >= -_MAX_US)
            return np.where(fits, micros * 1000, 0), np.where(fits, VALUE_OK, VALUE_OUT_OF_RANGE).astype(np.int8)
    elif kinds <= {int, Decimal}:
        try:
            decimals = pa.array(values)
            ns = pc.cast(pc.round(pc.multiply(decimals, pa.scalar(Decimal(1000))), 0, round_mode="half_to_even"), pa.int64()).to_numpy()
            fits = (ns < MAX_TIME_NS) & (ns > -MAX_TIME_NS)
            return np.where(fits, ns, 0), np.where(fits, VALUE_OK, VALUE_OUT_OF_RANGE).astype(np.int8)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            pass  # out of range, or beyond decimal256: value by value
    ns = np.zeros(len(values), np.int64)
    status = np.zeros(len(values), np.int8)
    for i, value in enumerate(values):
        ns[i], status[i] = _scalar_ns(value)
    return ns, status


def _scalar_ns(value: Any) -> tuple[int, int]:
    """(ns, status) of one µs value: an int, a decimal, or a numeric string."""
    if type(value) is str and _NUMERIC_TEXT.fullmatch(value):
        value = Decimal(value)
    if type(value) is int:
        return (value * 1000, VALUE_OK) if -_MAX_US <= value <= _MAX_US else (0, VALUE_OUT_OF_RANGE)
    if not isinstance(value, Decimal):
        return 0, VALUE_MISSING
    if value.adjusted() > 18:  # |µs| >= 1e19: past int64 in ns, and never worth building as an int
        return 0, VALUE_OUT_OF_RANGE
    sign, digits, exponent = value.as_tuple()
    ns = int(Decimal((sign, digits, int(exponent) + 3)).to_integral_value(rounding=ROUND_HALF_EVEN))  # exact: no context rounding
    return (ns, VALUE_OK) if -MAX_TIME_NS < ns < MAX_TIME_NS else (0, VALUE_OUT_OF_RANGE)


def id_column(values: list[Any]) -> tuple[np.ndarray, list[str | None] | None, np.ndarray]:
    """pid/tid column: int64 ids, per-row label text (None when no row has one) and a status per row."""
    status = np.zeros(len(values), np.int8)
    if set(map(type, values)) <= {int}:
        try:
            return np.array(values, np.int64), None, status
        except OverflowError:
            pass
    ids = np.zeros(len(values), np.int64)
    labels: list[str | None] = [None] * len(values)
    for i, value in enumerate(values):
        attrs: dict[str, str] = {}
        number = scalar_id(value, "label", attrs)
        if number is None:
            status[i] = VALUE_OUT_OF_RANGE
        else:
            ids[i] = number
            labels[i] = attrs.get("label")
    return ids, (labels if any(label is not None for label in labels) else None), status


def scalar_id(value: Any, label_key: str, attrs: dict[str, str]) -> int | None:
    """An int pid/tid: numbers as they are (None if past int64), other text hashed (original kept in attrs)."""
    if value is None or value is msgspec.UNSET or type(value) is bool:
        return 0
    number = int64_of(value)
    if number is not None:
        return number
    if type(value) is int or (isinstance(value, Decimal) and value == value.to_integral_value()):
        return None  # a number past int64
    text = value if type(value) is str else str(value) if isinstance(value, Decimal) else json_text(value)
    attrs[label_key] = text
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


def text_column(values: list[Any]) -> pa.Array:
    """name/cat: strings as they are, absent or null as "", anything else as JSON text."""
    if set(map(type, values)) <= {str}:
        return pa.array(values, pa.string())
    return pa.array([v if type(v) is str else "" if v is None or v is msgspec.UNSET else json_text(v) for v in values], pa.string())


def attribute_pairs(
    args: list[Any], pid_labels: list[str | None] | None, tid_labels: list[str | None] | None
) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """Per-row attribute counts and the flat key/value text of every row, in order (labels first, then args)."""
    n = len(args)
    if set(map(type, args)) <= {msgspec.Raw}:
        rows = np.arange(n)
    else:
        rows = np.flatnonzero(np.fromiter((type(a) is msgspec.Raw for a in args), bool, n))
        args = [args[i] for i in rows.tolist()]
    parts = []
    for key, labels in (("pid_label", pid_labels), ("tid_label", tid_labels)):
        if labels is not None:
            at = [i for i, label in enumerate(labels) if label is not None]
            parts.append((np.array(at, np.int64), pa.array([key] * len(at), pa.string()), pa.array([labels[i] for i in at], pa.string())))
    parts.append(_args_members(args, rows))
    row = np.concatenate([p[0] for p in parts])
    keys, values = pa.concat_arrays([p[1] for p in parts]), pa.concat_arrays([p[2] for p in parts])
    if len(parts) > 1 or np.any(np.diff(row) < 0):
        order = np.argsort(row, kind="stable")  # labels were put first; members keep their order
        row, keys, values = row[order], keys.take(pa.array(order)), values.take(pa.array(order))
    return np.bincount(row, minlength=n).astype(np.int64), keys, values


def _args_members(args: list[msgspec.Raw], rows: np.ndarray) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """The members of each ``args`` (JSON text; ``rows`` their row numbers) as (row, key text, value text), by position.

    Flat objects written without whitespace — what recorders write — are cut
    vectorised: the parser has already checked each text to be JSON, so in
    such an object every string that ends right before a ``:`` is a key, and
    its value runs from that colon to the comma before the next key (or to the
    closing brace). Others (pretty-printed, nested containers, args that is
    not an object) are parsed one by one. A string value is its decoded text,
    anything else its JSON text with the exact digits.
    """
    if not args:
        return np.zeros(0, np.int64), pa.array([], pa.string()), pa.array([], pa.string())
    lengths = np.fromiter(map(len, args), np.int64, len(args))
    starts = np.zeros(len(args) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    blob = b"".join(args)
    data = np.frombuffer(blob, np.uint8)
    # by the parser: not an object, or holding whitespace or a second bracket anywhere (even inside a string)
    by_parser = data[starts[:-1]] != _OPEN_OBJECT
    odd = np.flatnonzero(
        (data == _SPACE) | (data == _OPEN_OBJECT) | (data == _OPEN_ARRAY) | (data == _NEWLINE) | (data == _TAB) | (data == _RETURN)
    )
    odd_row = np.searchsorted(starts, odd, side="right") - 1
    by_parser[odd_row[odd != starts[odd_row]]] = True
    delimiters = string_delimiters(data)
    closers = delimiters[1::2]
    key = np.flatnonzero(data[np.minimum(closers + 1, len(data) - 1)] == _COLON)
    key_open, key_close = delimiters[2 * key], closers[key]
    member_row = np.searchsorted(starts, key_close, side="right") - 1
    fast = ~by_parser[member_row]
    key_open, key_close, member_row = key_open[fast], key_close[fast], member_row[fast]
    last = np.ones(len(member_row), bool)
    last[:-1] = member_row[1:] != member_row[:-1]
    value_start = key_close + 2
    value_end = np.where(last, starts[member_row + 1] - 1, np.roll(key_open, -1) - 1)  # the closing brace, or the comma
    quoted = data[value_start] == _QUOTE
    keys = _unescaped(blob, key_open + 1, key_close, np.ones(len(key_open), bool))
    values = _unescaped(blob, value_start + quoted, value_end - quoted, quoted)
    row = rows[member_row]
    parsed = np.flatnonzero(by_parser)
    if len(parsed):
        extra = [(rows[i], key, value) for i in parsed.tolist() for key, value in members_by_parser(args[i])]
        row = np.concatenate([row, np.array([r for r, _, _ in extra], np.int64)])
        keys = pa.concat_arrays([keys, pa.array([k for _, k, _ in extra], pa.string())])
        values = pa.concat_arrays([values, value_texts([v for _, _, v in extra])])
    return row, keys, values


def members_by_parser(args: msgspec.Raw) -> list[tuple[str, msgspec.Raw]]:
    """The members of one ``args`` parsed as JSON: an object's members, nothing for null, else ``args`` itself whole."""
    text = bytes(args)
    if text[:1] == b"{":
        return list(MEMBERS_DECODER.decode(text).items())
    return [] if text == b"null" else [("args", args)]


def _unescaped(blob: bytes, starts: np.ndarray, ends: np.ndarray, strings: np.ndarray) -> pa.Array:
    """The text of ``blob[starts:ends]`` each (ascending, disjoint); pieces that are JSON strings (``strings``) with escapes are decoded.

    The pieces are cut by Arrow: ``blob`` seen as an array of the pieces and
    the gaps between them, of which ``take`` keeps the pieces.
    """
    n = len(starts)
    if not n:
        return pa.array([], pa.string())
    bounds = np.empty(2 * n + 2, np.int64)
    bounds[0], bounds[-1] = 0, len(blob)
    bounds[1:-1:2], bounds[2:-1:2] = starts, ends
    pieces = pa.Array.from_buffers(pa.large_string(), 2 * n + 1, [None, pa.py_buffer(bounds), pa.py_buffer(blob)])
    texts = pieces.take(pa.array(np.arange(1, 2 * n, 2)))
    backslash = np.flatnonzero(np.frombuffer(blob, np.uint8) == _BACKSLASH)
    piece = np.searchsorted(starts, backslash, side="right") - 1
    inside = (piece >= 0) & (backslash < ends[np.maximum(piece, 0)])
    escaped = np.zeros(n, bool)
    escaped[piece[inside]] = True
    redo = np.flatnonzero(escaped & strings)
    if len(redo):
        decoded = [
            VALUE_DECODER.decode(blob[start - 1 : end + 1]) for start, end in zip(starts[redo].tolist(), ends[redo].tolist(), strict=True)
        ]
        mask = np.zeros(n, bool)
        mask[redo] = True
        texts = pc.replace_with_mask(texts, pa.array(mask), pa.array(decoded, pa.large_string()))
    return texts.cast(pa.string())


def value_texts(values: list[msgspec.Raw]) -> pa.Array:
    """Attribute text of each JSON value: a string decoded, anything else compact JSON text (exact digits)."""
    return pa.array([decoded if type(decoded := VALUE_DECODER.decode(v)) is str else compact_json(v) for v in values], pa.string())
