"""The STRACE record grammar as the Python reader matches it, and records turned into span rows.

Every field list, marker and pattern here is derived from
:mod:`dsprof.profiler.strace_format` (the field kinds, the markers, the
prefix), so the reader cannot drift from the producers.
:class:`Records` holds parsed records as typed columns; :func:`add_table`
makes span rows of them (dropping and counting what cannot be a span);
:func:`read_anchors` and :func:`read_chip_devices` read the side records.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.store.spans import (
    ANCHOR_SCHEMA,
    CHIP_SCHEMA,
    DICTIONARY_TYPE,
    MAX_TIME_NS,
    PARQUET_SCHEMA,
    PER_FILE_COLUMNS,
    SPAN_SCHEMA,
    split_attributes,
)
from dsprof.profiler import strace_format as fmt
from dsprof.profiler.strace_format import FIELD_KINDS, REQUIRED_FIELDS, STRACE_VERSION, VALUE_FIELDS, decode_value


def _literal(text: str) -> str:
    """``text`` as a regular expression matching it literally (RE2 and Python's re alike)."""
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", text)


# A token of the k=v grammar: no spaces or separators (they are escaped).
_SEPARATORS = _literal(fmt.TOKEN_SEPARATORS)
_TOKEN = r"[^\s" + _SEPARATORS + r"]"
_PLAIN_TOKEN = r"[^\x00-\x20" + _SEPARATORS + r"]"  # also no raw control bytes: they would pass for separators
# Each field kind's value, as the capturing pattern takes it: digit counts are
# capped, so a longer number fails there and is dropped as bad_value.
_KIND_PATTERN = {
    fmt.KIND_VERSION: r"\d{1,9}",
    fmt.KIND_I64: r"-?\d{1,19}",
    fmt.KIND_N64: r"\d{1,19}",
    fmt.KIND_U64: r"\d{1,20}",
    fmt.KIND_TOKEN: _TOKEN + "+",
    fmt.KIND_TOKEN0: _TOKEN + "*",
}
# ... and as the plain pattern checks it: digit runs unbounded (counted repeats
# slow the DFA down; values too long for 64 bits are caught by out_of_range).
_PLAIN_KIND_PATTERN = {
    fmt.KIND_VERSION: str(STRACE_VERSION),
    fmt.KIND_I64: r"-?\d+",
    fmt.KIND_N64: r"\d+",
    fmt.KIND_U64: r"\d+",
    fmt.KIND_TOKEN: _PLAIN_TOKEN + "+",
    fmt.KIND_TOKEN0: _PLAIN_TOKEN + "*",
}
_HEAD = "^" + "".join(f" {f}=(?P<{f}>{_KIND_PATTERN[FIELD_KINDS[f]]})" for f in REQUIRED_FIELDS)
# One record after its "[STRACE]" marker, followed by anything that cannot
# belong to it (space, '[' of the next log prefix, end).
STRACE_PATTERN = _HEAD + r"(?P<tail>(?: +" + _TOKEN + r"+=" + _TOKEN + r"*)*)(?:\s|\[|$)"
# The common shape, checked without captures (fast DFA): a version-1 record
# with single spaces that is the rest of its line. Such records are then cut
# into fields by the separator positions alone, without the much slower capturing regex.
PLAIN_RECORD_PATTERN = (
    "^"
    + "".join(f" {f}={_PLAIN_KIND_PATTERN[FIELD_KINDS[f]]}" for f in REQUIRED_FIELDS)
    + r"(?: "
    + _PLAIN_TOKEN
    + r"+="
    + _PLAIN_TOKEN
    + r"*)*\r?(?:\n|$)"
)
STRACE_RE = re.compile(STRACE_PATTERN, re.ASCII)
# Plain record, as separator-delimited pieces after its leading space: field i
# of REQUIRED_FIELDS is piece 2i (its key), its value piece 2i + 1; attributes
# follow as key, value, key, value, ...
FIELD_PIECE = {f: 2 * i + 1 for i, f in enumerate(REQUIRED_FIELDS)}
ATTR_FIRST_PIECE = 2 * len(REQUIRED_FIELDS)
# The typed fields: numbers (by the dtype their kind fits) and encoded text.
_KIND_DTYPE = {fmt.KIND_I64: np.int64, fmt.KIND_N64: np.int64, fmt.KIND_U64: np.uint64}
NUMBER_FIELDS = {f: _KIND_DTYPE[FIELD_KINDS[f]] for f in VALUE_FIELDS if FIELD_KINDS[f] in _KIND_DTYPE}
TEXT_FIELDS = tuple(f for f in VALUE_FIELDS if FIELD_KINDS[f] in (fmt.KIND_TOKEN, fmt.KIND_TOKEN0))
# The number fields grouped by dtype (each group is cast in one pass).
NUMBER_GROUPS = tuple(tuple(f for f, t in NUMBER_FIELDS.items() if t == dtype) for dtype in dict.fromkeys(NUMBER_FIELDS.values()))
# The span column of each field (the times carry their unit in the column name).
FIELD_COLUMNS = {f: {fmt.TS_FIELD: "ts_ns", fmt.DUR_FIELD: "dur_ns"}.get(f, f) for f in VALUE_FIELDS}

# A clock anchor counts only as a complete log record, as the serving stack's
# reader takes it: its prefix with the TIMING level and the clock_anchor function,
# then nothing after wall_ns but blanks to the end of the line. A payload copied
# into another message, or trailed by more text, would move another process's
# wall clock. (The record may follow other text on its line, as in the stack.)
# tests/test_ingest_strace.py::test_anchors_and_chip_processes guards it.
ANCHOR_PATTERN = (
    _literal(f"[{fmt.PREFIX_CLOCK}=")
    + r"\d+\]"
    + _literal(f"[{fmt.PREFIX_THREAD}")
    + r"[0-9a-fA-F]+\]"
    + _literal(f"[{fmt.ANCHOR_LEVEL}]")
    + r"\s+"
    + _literal(fmt.ANCHOR_FUNC + ":")
    + r"\s+"
    + _literal(fmt.ANCHOR_MARKER)
    + "".join(rf"\s+{f}=(?P<{f}>\d+)" for f in fmt.ANCHOR_FIELDS)
    + r"[ \t]*\r?\n?$"
)
SIDE_RECORD_PATTERN = _literal(fmt.ANCHOR_MARKER) + "|" + _literal(fmt.CHIP_READY_MARKER)
_CHIP_PID, _CHIP_DEVICE = fmt.CHIP_READY_FIELDS
CHIP_PATTERN = (
    _literal(fmt.CHIP_READY_MARKER)
    + rf"{_CHIP_PID}=(?P<{_CHIP_PID}>\d{{1,19}}) {_CHIP_DEVICE}=(?P<{_CHIP_DEVICE}>{_TOKEN}+)"
    + _literal(fmt.CHIP_READY_END)
)
SOURCE, _PHASE = "strace", "X"  # the source and Chrome phase of every STRACE row


class Records:
    """Records with typed numeric fields, text fields (one Arrow column each) and their attributes.

    ``numbers`` holds pid, tid, depth, ts, dur (int64) and inv (uint64);
    ``overflow`` marks records whose digits do not fit 64 bits (their numbers
    are meaningless; they are dropped as ``bad_value``). ``texts`` holds hid
    and name, still encoded. ``keys``/``values`` hold every trailing attribute
    (still encoded) and ``token_row`` the record each belongs to, in record
    order. ``order`` is the record's position in the log (line, then place on
    the line).
    """

    def __init__(
        self,
        line: np.ndarray,
        order: np.ndarray,
        numbers: dict[str, np.ndarray],
        overflow: np.ndarray,
        texts: dict[str, pa.Array],
        keys: pa.Array,
        values: pa.Array,
        token_row: np.ndarray,
    ):
        self.line, self.order, self.numbers, self.overflow, self.texts = line, order, numbers, overflow, texts
        self.keys, self.values, self.token_row = keys, values, token_row

    def __len__(self) -> int:
        return len(self.line)

    @classmethod
    def concat(cls, parts: list[Records]) -> Records:
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        row_base = np.cumsum([0] + [len(p) for p in parts[:-1]])

        def stack(arrays: list[pa.Array]) -> pa.Array:
            return pa.concat_arrays([a.cast(pa.large_string()) for a in arrays])

        return cls(
            np.concatenate([p.line for p in parts]),
            np.concatenate([p.order for p in parts]),
            {f: np.concatenate([p.numbers[f] for p in parts]) for f in NUMBER_FIELDS},
            np.concatenate([p.overflow for p in parts]),
            {f: stack([p.texts[f] for p in parts]) for f in TEXT_FIELDS},
            stack([p.keys for p in parts]),
            stack([p.values for p in parts]),
            np.concatenate([p.token_row + base for p, base in zip(parts, row_base, strict=True)]),
        )

    @classmethod
    def empty(cls) -> Records:
        nothing = pa.array([], pa.large_string())
        none = np.empty(0, np.int64)
        return cls(
            none,
            none,
            {f: np.empty(0, NUMBER_FIELDS[f]) for f in NUMBER_FIELDS},
            np.empty(0, bool),
            {f: nothing for f in TEXT_FIELDS},
            nothing,
            nothing,
            none,
        )

    @classmethod
    def from_tails(cls, line: np.ndarray, order: np.ndarray, fields: dict[str, pa.Array], tails: pa.Array) -> Records:
        """Records whose fields are all still text, attributes one ``k=v k=v`` text per record."""
        token_lists = pc.split_pattern(pc.utf8_rtrim(tails, "\r\n"), " ")
        tokens = token_lists.flatten()
        token_row = pc.list_parent_indices(token_lists)
        nonempty = pc.greater(pc.binary_length(tokens), 0)
        pairs = pc.split_pattern(tokens.filter(nonempty), "=", max_splits=1)
        row = token_row.filter(nonempty).to_numpy().astype(np.int64)
        numbers, overflow = {}, np.zeros(len(line), bool)
        for name, dtype in NUMBER_FIELDS.items():
            numbers[name], over = integers(fields[name], dtype)
            overflow |= over
        texts = {name: fields[name] for name in TEXT_FIELDS}
        return cls(line, order, numbers, overflow, texts, pc.list_element(pairs, 0), pc.list_element(pairs, 1), row)

    def filter(self, keep: np.ndarray) -> Records:
        if keep.all():
            return self
        new_row = np.cumsum(keep) - 1
        token_keep = keep[self.token_row]
        mask, token_mask = pa.array(keep), pa.array(token_keep)
        return Records(
            self.line[keep],
            self.order[keep],
            {f: a[keep] for f, a in self.numbers.items()},
            self.overflow[keep],
            {f: a.filter(mask) for f, a in self.texts.items()},
            self.keys.filter(token_mask),
            self.values.filter(token_mask),
            new_row[self.token_row[token_keep]],
        )


def integers(digits: pa.Array, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """Values of decimal strings as ``dtype`` (int64 or uint64), and which overflow 64 bits.

    Null cells are skipped (their values are meaningless), as are overflowing
    ones. The strings are known to be digits (the record patterns say so), so
    a failed cast can only mean an overflow, which is rare: only then are the
    culprits located.
    """
    arrow_type = pa.from_numpy_dtype(dtype)
    overflow = np.zeros(len(digits), bool)
    try:
        values = digits.cast(arrow_type)
    except pa.ArrowInvalid:
        overflow = out_of_range(digits, signed=dtype == np.int64)
        values = pc.if_else(pa.array(overflow), pa.scalar(None, digits.type), digits).cast(arrow_type)
    data: np.ndarray = np.frombuffer(values.buffers()[1], dtype)
    return data[values.offset : values.offset + len(values)], overflow


@dataclass
class Drops:
    """What a piece of a log could not use: records by reason, and the first line (1-based) each record reason was seen at.

    Each piece's reader fills its own and returns it with the rows
    (:class:`~dsprof.analysis.ingest.strace_lines.ParsedPiece`); whoever reads
    the whole log adds the pieces' up.
    """

    counts: dict[str, int] = field(default_factory=dict)
    first_lines: dict[str, int] = field(default_factory=dict)

    def count(self, reason: str, n: int, line: int | None = None) -> None:
        """Count ``n`` records dropped for ``reason``, the first of them at ``line`` where known."""
        if n:
            self.counts[reason] = self.counts.get(reason, 0) + int(n)
            if line is not None and (reason not in self.first_lines or line < self.first_lines[reason]):
                self.first_lines[reason] = int(line)

    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, other: Drops) -> None:
        """Count the drops of a later piece too: a reason's first line stays the one seen first."""
        for reason, n in other.counts.items():
            self.counts[reason] = self.counts.get(reason, 0) + n
        for reason, line in other.first_lines.items():
            self.first_lines.setdefault(reason, line)

    def renumbered(self, line: Callable[[int], int]) -> Drops:
        """The same drops, each first line given by ``line`` (a piece's line numbers made the log's)."""
        return Drops(dict(self.counts), {reason: line(at) for reason, at in self.first_lines.items()})


def out_of_range(digits: pa.Array, signed: bool) -> np.ndarray:
    """Decimal strings that overflow int64 (``signed``) or uint64.

    Only values at least as long as the limit can overflow; those of equal
    length are compared as text, which orders equal-length digit strings.
    """
    over = np.zeros(len(digits), dtype=bool)
    magnitude = pc.utf8_ltrim(digits, "-") if signed else digits
    limit_length = 19 if signed else 20
    length = pc.binary_length(magnitude).to_numpy(zero_copy_only=False)
    longest = np.flatnonzero(length >= limit_length)
    if len(longest):
        index = pa.array(longest, pa.int64())
        value = pc.utf8_ltrim(magnitude.take(index).cast(pa.large_string()), "0")  # leading zeros do not count
        value_length = pc.binary_length(value).to_numpy(zero_copy_only=False)
        if signed:
            limit = pc.if_else(pc.starts_with(digits.take(index), "-"), pa.scalar(str(2**63)), pa.scalar(str(2**63 - 1))).cast(
                pa.large_string()
            )
        else:
            limit = pa.scalar(str(2**64 - 1), pa.large_string())
        too_big = pc.greater(value, limit).to_numpy(zero_copy_only=False)
        over[longest] = (value_length > limit_length) | ((value_length == limit_length) & too_big)
    return over


def _decode_where_escaped(values: pa.Array) -> pa.Array:
    """Percent-decode the values that contain '%': each distinct one once, then scattered back."""
    escaped = pc.match_substring(values, "%")
    if not pc.any(escaped).as_py():
        return values
    encoded = pc.dictionary_encode(values.filter(escaped))
    decoded = pa.array([decode_value(v) for v in encoded.dictionary.to_pylist()], values.type)
    return pc.replace_with_mask(values, escaped, decoded.take(encoded.indices))


def _attribute_columns(records: Records) -> tuple[pa.Array, dict[str, pa.Array], pa.Array]:
    """The clk column, the promoted attribute columns and the ``attrs`` map of the rest."""
    n = len(records)
    keys, values, row = records.keys, records.values, records.token_row
    is_clk = pc.equal(keys, fmt.CLK_ATTR)
    clk = pa.repeat(pa.scalar(fmt.CLK_HOST), n)
    if pc.any(is_clk).as_py():
        dev_rows = row[pc.and_(is_clk, pc.equal(values, fmt.CLK_DEVICE)).to_numpy(zero_copy_only=False)]
        is_dev = np.zeros(n, dtype=bool)
        is_dev[dev_rows] = True
        clk = pc.if_else(pa.array(is_dev), pa.scalar(fmt.CLK_DEVICE), clk)
        keep = pc.invert(is_clk)
        keys, values, row = keys.filter(keep), values.filter(keep), row[keep.to_numpy(zero_copy_only=False)]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(row, minlength=n), out=offsets[1:])
    keys = _decode_where_escaped(keys.cast(pa.string()))
    values = _decode_where_escaped(values.cast(pa.string()))
    promoted, attrs = split_attributes(offsets, keys, values)
    return clk, promoted, attrs


def add_table(
    tables: list[pa.Table],
    orders: list[np.ndarray],
    records: Records,
    file: str,
    line_base: int,
    drops: Drops,
) -> None:
    """Append the span rows of ``records``; drop and count what cannot be a span.

    ``bad_value``: a number that does not fit 64 bits, a negative start, or an
    end (ts + dur) at or past MAX_TIME_NS (SQL over the spans adds and subtracts times); ``negative_duration``: a span that ends before it
    starts (it would inflate every figure built on it).
    """
    if not len(records):
        return
    number = records.numbers
    ts, dur = number[fmt.TS_FIELD], number[fmt.DUR_FIELD]
    past_bound = (ts >= MAX_TIME_NS) | ((ts >= 0) & (dur >= MAX_TIME_NS - np.clip(ts, 0, MAX_TIME_NS)))
    bad = records.overflow | (ts < 0) | past_bound
    negative = ~bad & (dur < 0)
    for reason, mask in (("bad_value", bad), ("negative_duration", negative)):
        drops.count(reason, mask.sum(), int(records.line[mask].min()) if mask.any() else None)  # line in the piece
    records = records.filter(~(bad | negative))
    n = len(records)
    if n == 0:
        return
    number, text = records.numbers, records.texts
    clk, promoted, attrs = _attribute_columns(records)
    columns = {
        **constant_columns(file, n),
        "line": pa.array(records.line + line_base, pa.int64()),
        **{FIELD_COLUMNS[f]: pa.array(values) for f, values in number.items()},
        **{FIELD_COLUMNS[f]: _decode_where_escaped(values.cast(pa.string())) for f, values in text.items()},
        "clk": clk,
        **promoted,
        "attrs": attrs,
    }
    tables.append(pa.table([columns[name] for name in SPAN_SCHEMA.names], schema=PARQUET_SCHEMA))
    orders.append(records.order)


def read_anchors(lines: pa.Array, drops: Drops) -> pa.Table:
    """One row per clock anchor that is a complete record (see ANCHOR_PATTERN); wall ns stay int64.

    Anything else that names ``[CLOCK_ANCHOR]`` (a copy inside another message,
    a payload with text after it) is not an anchor and is counted as ``bad_anchor``,
    and so is an anchor whose times lie outside ``[0, MAX_TIME_NS)``.
    """
    candidates = lines.filter(pc.match_substring(lines, fmt.ANCHOR_MARKER))
    if not len(candidates):
        return ANCHOR_SCHEMA.empty_table()
    fields = pc.extract_regex(candidates, ANCHOR_PATTERN)
    valid = fields.is_valid()
    drops.count("bad_anchor", len(candidates) - pc.sum(valid).as_py())
    fields = fields.filter(valid)
    version, *numbers = fmt.ANCHOR_FIELDS
    ok = pc.equal(fields.field(version), str(fmt.ANCHOR_VERSION)).to_numpy(zero_copy_only=False)
    for name in numbers:
        ok &= ~out_of_range(fields.field(name), signed=True)
    drops.count("bad_anchor", (~ok).sum())
    fields = fields.filter(pa.array(ok))
    columns = {column: fields.field(name).cast(pa.int64()) for column, name in zip(ANCHOR_SCHEMA.names, numbers, strict=True)}
    anchors = pa.table(columns, schema=ANCHOR_SCHEMA)
    # times within [0, MAX_TIME_NS): a span's time moved by (wall - mono) then stays inside int64
    in_bounds = np.ones(anchors.num_rows, bool)
    for column in ("mono_ns", "wall_ns"):
        values = anchors.column(column).to_numpy()
        in_bounds &= (values >= 0) & (values < MAX_TIME_NS)
    drops.count("bad_anchor", (~in_bounds).sum())
    return anchors.filter(pa.array(in_bounds)) if not in_bounds.all() else anchors


def read_chip_devices(lines: pa.Array, drops: Drops) -> pa.Table:
    """One row per ``[chip_process pid=P dev=D] ready`` line."""
    candidates = lines.filter(pc.match_substring(lines, fmt.CHIP_READY_MARKER))
    if not len(candidates):
        return CHIP_SCHEMA.empty_table()
    fields = pc.extract_regex(candidates, CHIP_PATTERN)
    fields = fields.filter(fields.is_valid())
    ok = ~out_of_range(fields.field(_CHIP_PID), signed=True)
    drops.count("bad_chip_process", len(candidates) - len(fields) + int((~ok).sum()))
    fields = fields.filter(pa.array(ok))
    devices = pa.array([decode_value(d) for d in fields.field(_CHIP_DEVICE).to_pylist()], pa.string())  # one per rank process
    return pa.table([fields.field(_CHIP_PID).cast(pa.int64()), devices], schema=CHIP_SCHEMA)


def constant_columns(file: str, n: int) -> dict[str, pa.Array]:
    """The columns that hold one value on every row of a log, each a dictionary of one entry (nothing per row to hash or write)."""
    zeros = pa.py_buffer(np.zeros(n, np.int32))
    columns = {}
    values = {"source": SOURCE, "file": file, "cat": "", "ph": _PHASE}
    for name in PER_FILE_COLUMNS:
        data = values[name].encode()
        entry = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(np.array([0, len(data)], np.int32)), pa.py_buffer(data)])
        columns[name] = pa.DictionaryArray.from_buffers(DICTIONARY_TYPE, n, [None, zeros], dictionary=entry)
    return columns
