"""The Python reader of one piece of a STRACE log: it defines what the reader returns.

Lines are cut without copying (Arrow offsets at the newlines) and handled in
batches, in three tiers: plain records (one version-1 record with single spaces
to the end of its line, the common case) by one capture-free regular expression
and NumPy cuts at their separators; other lines holding a marker by a capturing
expression over the column; only what that rejects (torn, split, garbled) takes
a Python path, to rejoin continuation lines or name the drop. Each batch
becomes typed Arrow columns at once. Rules: docs/FORMATS.md, "STRACE as dsprof reads it".
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.ingest.strace_records import (
    ATTR_FIRST_PIECE,
    FIELD_PIECE,
    NUMBER_FIELDS,
    NUMBER_GROUPS,
    PLAIN_RECORD_PATTERN,
    SIDE_RECORD_PATTERN,
    STRACE_PATTERN,
    STRACE_RE,
    TEXT_FIELDS,
    Drops,
    Records,
    add_table,
    integers,
    read_anchors,
    read_chip_devices,
)
from dsprof.analysis.store.spans import PARQUET_SCHEMA
from dsprof.errors import InputError
from dsprof.profiler.strace_format import REQUIRED_FIELDS, STRACE_MARKER, STRACE_VERSION, VALUE_FIELDS, VERSION_FIELD

MAX_CONTINUATION_LINES = 3
# Lines handled per vectorised pass; bounds the temporary copies of a big log.
LINES_PER_BATCH = 1 << 14  # small enough for its temporaries to stay in cache
MAX_BATCH_BYTES = 1 << 30
_EQUALS = ord("=")
_SPACE = ord(" ")  # bytes up to the space (controls, CR, LF) separate too
# The grammar's whitespace is ASCII (RE2's \s); other spaces (e.g. U+00A0) are text.
_ASCII_SPACE_CHARS = " \t\n\r\f\v"
_ASCII_SPACES = re.compile(r"\s+", re.ASCII)
_VERSION_RE = re.compile(rf" {VERSION_FIELD}=(\d+)(?:\s|$)")


class ParsedPiece(NamedTuple):
    """What one piece of a log holds; ``binary_at`` is a line of the piece (1-based) or None."""

    table: pa.Table
    anchors: pa.Table
    chips: pa.Table
    records_found: int  # STRACE records kept or dropped
    n_lines: int
    binary_at: int | None
    n_bytes: int
    drops: Drops  # what the piece could not use; first lines numbered as ``line``


def parse_piece(data: memoryview, file: str, line_base: int) -> ParsedPiece:
    """Rows of one piece of a log whose first line is line ``line_base + 1``, and what it dropped."""
    n_bytes = len(data)
    text, binary_at = as_utf8(data)
    log = _Log(text)
    # each batch becomes typed Arrow columns at once, so the text of its fields never piles up
    tables: list[pa.Table] = []
    orders: list[np.ndarray] = []
    slow: list[_SlowRecord] = []
    drops = Drops()  # first lines numbered within the piece until the end
    for start, stop in _batches(log, file, line_base):
        records, batch_slow = _extract_batch(log, start, stop, drops)
        add_table(tables, orders, records, file, line_base, drops)
        slow.extend(batch_slow)
    slow.extend(_marker_split_records(log))
    add_table(tables, orders, _finish_slow_records(slow, log, drops), file, line_base, drops)
    records_found = sum(t.num_rows for t in tables) + drops.total()  # only record drops are counted so far

    side = _side_lines(log)
    anchors = read_anchors(side, drops)
    chips = read_chip_devices(side, drops)
    table = pa.concat_tables(tables) if tables else PARQUET_SCHEMA.empty_table()
    order = np.concatenate(orders + [np.empty(0, np.int64)])
    if np.any(np.diff(order) < 0):  # records from the slow path go back to their place
        table = table.take(pa.array(np.argsort(order, kind="stable")))
    in_log = drops.renumbered(lambda line: line + line_base)
    return ParsedPiece(table, anchors, chips, records_found, len(log.lines), binary_at, n_bytes, in_log)


def _side_lines(log: _Log) -> pa.Array:
    """The lines that may hold clock anchors or chip_process lines (also before a record on its line).

    A log holds few of them: one search of the whole piece skips the
    line-by-line test for the pieces that have none.
    """
    if not pc.match_substring_regex(log.whole, SIDE_RECORD_PATTERN)[0].as_py():
        return pa.array([], pa.large_string())
    return log.lines.filter(pc.match_substring_regex(log.lines, SIDE_RECORD_PATTERN))


def _batches(log: _Log, file: str, line_base: int) -> list[tuple[int, int]]:
    """Line ranges of at most LINES_PER_BATCH lines and MAX_BATCH_BYTES bytes (32-bit offsets)."""
    ranges = []
    start, n_lines = 0, len(log.lines)
    while start < n_lines:
        by_bytes = int(np.searchsorted(log.offsets, log.offsets[start] + MAX_BATCH_BYTES, side="right")) - 1
        stop = min(start + LINES_PER_BATCH, n_lines, max(by_bytes, start + 1))
        if log.offsets[stop] - log.offsets[start] > MAX_BATCH_BYTES:
            raise InputError(file, "a line longer than 1 GiB", line=line_base + start + 1, expected="a text log")
        ranges.append((start, stop))
        start = stop
    return ranges


def as_utf8(data: memoryview) -> tuple[memoryview | bytes, int | None]:
    """Valid UTF-8 for Arrow's string kernels, and the 1-based line of the first binary byte (or None).

    Invalid bytes become U+FFFD so that the rest of a partly damaged log is still read.
    """
    whole = pa.Array.from_buffers(pa.large_binary(), 1, [None, pa.py_buffer(np.array([0, len(data)], np.int64)), pa.py_buffer(data)])
    first_bad = []
    valid: memoryview | bytes = data
    try:
        whole.cast(pa.large_string())
    except pa.ArrowInvalid:
        text = str(data, "utf-8", errors="replace")
        first_bad.append(text[: text.find("\ufffd")].count("\n") + 1)
        valid = text.encode("utf-8")
    buf = np.frombuffer(valid, np.uint8)
    if len(buf) and buf.min() == 0:  # a NUL byte: no text log holds one
        nul = int(np.argmin(buf))
        first_bad.append(int(np.count_nonzero(buf[:nul] == ord("\n"))) + 1)
    return valid, (min(first_bad) if first_bad else None)


class _Log:
    """A log's bytes, and its lines (each keeping its newline) and its whole text as zero-copy Arrow arrays."""

    def __init__(self, data: memoryview | bytes):
        self.buf = np.frombuffer(data, dtype=np.uint8)
        step = 1 << 24  # bounded temporaries while finding newlines
        newlines = [np.flatnonzero(self.buf[i : i + step] == 10) + i for i in range(0, len(self.buf), step)]
        ends = np.concatenate(newlines + [np.empty(0, np.int64)]).astype(np.int64) + 1
        if len(self.buf) and (len(ends) == 0 or ends[-1] != len(self.buf)):
            ends = np.append(ends, len(self.buf))
        self.offsets = np.concatenate([np.zeros(1, np.int64), ends])
        self.data = pa.py_buffer(data)
        self.lines = pa.Array.from_buffers(pa.large_string(), len(ends), [None, pa.py_buffer(self.offsets), self.data])
        self.whole = pa.Array.from_buffers(pa.large_string(), 1, [None, pa.py_buffer(self.offsets[[0, -1]]), self.data])
        self.marker_line, self.marker_end = self._first_markers()

    def _first_markers(self) -> tuple[np.ndarray, np.ndarray]:
        """Each line holding a STRACE marker, and the position just after its first marker."""
        marker_at = pc.find_substring(self.lines, STRACE_MARKER).to_numpy(zero_copy_only=False)
        line = np.flatnonzero(marker_at >= 0)
        return line, self.offsets[line] + marker_at[line] + len(STRACE_MARKER)

    def texts(self, bounds: np.ndarray, lo: int, hi: int) -> pa.Array:
        """Zero-copy texts between consecutive byte positions ``bounds`` (all within [lo, hi]).

        Built with 32-bit offsets relative to ``lo`` (a batch is far below
        2 GiB): Arrow's kernels, ``take`` above all, are much faster on them
        than on 64-bit offsets.
        """
        offsets = (np.asarray(bounds, np.int64) - lo).astype(np.int32)
        return pa.Array.from_buffers(pa.string(), len(bounds) - 1, [None, pa.py_buffer(offsets), self.data.slice(lo, hi - lo)])

    def text(self, index: int) -> str:
        """One line without its line break."""
        return self.lines[index].as_py().rstrip("\r\n")

    def may_continue(self, index: np.ndarray) -> np.ndarray:
        """Whether line ``index + 1`` exists and could continue a record (does not open with '[' or end at once)."""
        nxt = index + 1
        exists = nxt < len(self.lines)
        first = np.full(len(index), ord("["), np.uint8)
        first[exists] = self.buf[self.offsets[nxt[exists]]]
        return exists & (first != ord("[")) & (first != ord("\n")) & (first != ord("\r"))


# A record for the Python path: the line it starts on (0-based), its text after
# the marker up to the end of that line or the next marker, the line that may
# continue it (None when something else follows it on its line), and its
# position in the log.
_SlowRecord = tuple[int, str, int | None, int]
# Order keys: line * _ORDER_STRIDE + place of the record on its line.
_ORDER_STRIDE = 1 << 20


def _extract_batch(log: _Log, first: int, stop: int, drops: Drops) -> tuple[Records, list[_SlowRecord]]:
    """The records of lines [first, stop): plain ones by separator positions, others by regex, the rest in Python.

    A line is plain when it holds one marker followed by a plain record up to
    its end, and the next line cannot be a continuation of it. Sent to the
    Python path: what the record pattern rejects, and records that end their
    line when the next line could be the rest of them (a newline injected
    inside the attributes) — in a log whose lines carry the usual prefix the
    next line opens with '[' and rules that out at once.
    """
    lo, hi = int(log.offsets[first]), int(log.offsets[stop])
    in_batch = slice(*np.searchsorted(log.marker_line, [first, stop]))
    with_marker, rec_start = log.marker_line[in_batch], log.marker_end[in_batch]
    # a plain record runs to the end of its line without a '[', so its line holds no other marker
    plain = pc.match_substring_regex(log.texts(np.append(rec_start, hi), lo, hi), PLAIN_RECORD_PATTERN).to_numpy(zero_copy_only=False)
    plain &= ~log.may_continue(with_marker)
    plain_lines = with_marker[plain]
    parts = [_tokenize_plain(log, rec_start[plain], plain_lines, first, stop)]

    other_lines = with_marker[~plain]
    slow: list[_SlowRecord] = []
    if len(other_lines):
        records, slow = _segment_records(log, other_lines, drops)
        parts.append(records)
    return Records.concat(parts), slow


def _tokenize_plain(log: _Log, rec_start: np.ndarray, line: np.ndarray, first: int, stop: int) -> Records:
    """Fields and attributes of plain records, located by the positions of their separators.

    Every piece wanted (8 field values, then keys and values) lies between two
    consecutive separators. Numbers are cast straight from a zero-copy array
    whose every other cell is a wanted piece (the cells in between are null,
    so the cast skips them); text pieces are gathered with ``take``.
    """
    n = len(rec_start)
    if n == 0:
        return Records.empty()
    lo, hi = int(log.offsets[first]), int(log.offsets[stop])
    region = log.buf[lo:hi]
    is_separator = np.empty(len(region) + 1, bool)
    np.less_equal(region, _SPACE, out=is_separator[:-1])
    is_separator[:-1] |= region == _EQUALS
    is_separator[-1] = True  # the end of a last line without newline
    # positions relative to lo, 32-bit like the offsets of the arrays built from them
    separators = np.flatnonzero(is_separator).astype(np.int32)
    pieces = _PieceTexts(separators, log.data.slice(lo, hi - lo))
    line_end = log.offsets[line + 1]
    rec_end = line_end - (log.buf[line_end - 1] == ord("\n"))
    rec_end -= log.buf[np.maximum(rec_end - 1, 0)] == ord("\r")
    q0 = np.searchsorted(separators, rec_start - lo)  # the space before "v="

    numbers, overflow = {}, np.zeros(n, bool)
    for names in NUMBER_GROUPS:
        value_piece = q0[:, None] + np.array([FIELD_PIECE[f] for f in names])
        values, over = integers(pieces.spaced(value_piece), NUMBER_FIELDS[names[0]])
        values, over = values[0::2].reshape(n, len(names)), over[0::2].reshape(n, len(names))
        numbers.update({f: values[:, i] for i, f in enumerate(names)})
        overflow |= over.any(axis=1)
    cells = pieces.spaced(q0[:, None] + np.array([FIELD_PIECE[f] for f in TEXT_FIELDS]))  # cell 2 * (record * 2 + k)
    texts = {f: cells.take(pa.array(np.arange(2 * k, 4 * n, 4))) for k, f in enumerate(TEXT_FIELDS)}

    # attributes: pieces q0 + ATTR_FIRST_PIECE onwards, key and value in turn
    attr_pieces = np.searchsorted(separators, rec_end - lo) - q0 - ATTR_FIRST_PIECE  # 2 per attribute
    base = np.zeros(n + 1, np.int64)
    np.cumsum(attr_pieces, out=base[1:])
    piece = np.repeat(q0 + ATTR_FIRST_PIECE - base[:-1], attr_pieces) + np.arange(base[-1], dtype=np.int64)
    cells = pieces.spaced(piece)  # piece i = cell 2i
    every_pair = np.arange(0, 2 * base[-1], 4)
    return Records(
        line + 1,
        line * _ORDER_STRIDE + 1,
        numbers,
        overflow,
        texts,
        cells.take(pa.array(every_pair)),
        cells.take(pa.array(every_pair + 2)),
        np.repeat(np.arange(n, dtype=np.int64), attr_pieces // 2),
    )


class _PieceTexts:
    """The pieces of a stretch of log between consecutive separators (positions relative to its start)."""

    def __init__(self, separators: np.ndarray, data: pa.Buffer):
        self.separators, self.data = separators, data

    def spaced(self, piece: np.ndarray) -> pa.Array:
        """Zero-copy texts whose cell 2i is piece ``piece.flat[i]``; the cells between are null.

        Kernels skip the null cells, so a cast reads just the wanted pieces
        without gathering them first.
        """
        piece = piece.ravel()
        bounds = np.empty(2 * len(piece), np.int32)
        np.add(self.separators[piece], 1, out=bounds[0::2])
        bounds[1::2] = self.separators[piece + 1]
        cells = max(len(bounds) - 1, 0)
        every_other = pa.py_buffer(np.full((cells + 7) // 8, 0x55, np.uint8))  # validity bits 1, 0, 1, 0, ...
        return pa.Array.from_buffers(pa.string(), cells, [every_other, pa.py_buffer(bounds), self.data])


def _segment_records(log: _Log, line_index: np.ndarray, drops: Drops) -> tuple[Records, list[_SlowRecord]]:
    """Records of lines that are not plain: split at every marker, parsed by the capturing regex."""
    pieces = pc.split_pattern(log.lines.take(pa.array(line_index)), STRACE_MARKER)
    list_offsets = pieces.offsets.to_numpy().astype(np.int64)
    pieces_per_line = np.diff(list_offsets)
    flat = pieces.flatten()
    is_record = np.ones(len(flat), dtype=bool)
    is_record[list_offsets[:-1]] = False  # the text before the first marker
    is_last = np.zeros(len(flat), dtype=bool)
    is_last[list_offsets[1:] - 1] = True
    place = np.arange(len(flat), dtype=np.int64) - list_offsets[:-1].repeat(pieces_per_line)
    segments = flat.filter(pa.array(is_record))
    seg_line = np.repeat(line_index, pieces_per_line)[is_record]
    seg_order = seg_line * _ORDER_STRIDE + place[is_record]
    continues = is_last[is_record] & log.may_continue(seg_line)

    fields = pc.extract_regex(segments, STRACE_PATTERN)
    matched = fields.is_valid().to_numpy(zero_copy_only=False)
    version_ok = pc.equal(fields.field(VERSION_FIELD), str(STRACE_VERSION)).fill_null(False).to_numpy(zero_copy_only=False)
    other_version = matched & ~version_ok
    drops.count("unknown_version", other_version.sum(), int(seg_line[other_version].min()) + 1 if other_version.any() else None)
    good = matched & version_ok & ~continues
    mask = pa.array(good)
    records = Records.from_tails(
        seg_line[good] + 1,
        seg_order[good],
        {f: fields.field(f).filter(mask) for f in VALUE_FIELDS},
        fields.field("tail").filter(mask),
    )
    slow = [
        (int(seg_line[i]), segments[int(i)].as_py().rstrip("\r\n"), int(seg_line[i]) + 1 if continues[i] else None, int(seg_order[i]))
        for i in np.flatnonzero(~matched | (version_ok & continues))
    ]
    return records, slow


def _marker_split_records(log: _Log) -> list[_SlowRecord]:
    """Records whose ``[STRACE]`` marker itself was cut by a newline (``[STR`` / ``ACE] v=1 ...``).

    Found by looking at the bytes just before each newline, so only the few
    candidate line pairs are examined in Python.
    """
    buf = log.buf
    marker = STRACE_MARKER.encode()
    found: list[_SlowRecord] = []
    newline_at = log.offsets[1:-1] - 1  # every line but the last, which nothing follows
    if len(newline_at) == 0:
        return found
    # only lines whose last character could end a cut marker
    last_char = buf[np.clip(newline_at - 1, 0, None)]
    candidates = np.flatnonzero((buf[newline_at] == 10) & np.isin(last_char, np.frombuffer(marker[:-1], np.uint8)))
    for i in candidates:
        line = log.text(int(i))
        for k in range(1, len(marker)):
            if line.endswith(STRACE_MARKER[:k]):
                nxt = log.text(int(i) + 1)
                if nxt.startswith(STRACE_MARKER[k:]):
                    rest = nxt[len(marker) - k :]
                    cut = rest.find(STRACE_MARKER)
                    next_line = int(i) + 2 if cut < 0 else None
                    found.append((int(i), rest if cut < 0 else rest[:cut], next_line, int(i) * _ORDER_STRIDE + _ORDER_STRIDE - 1))
                break
    return found


def _finish_slow_records(slow: list[_SlowRecord], log: _Log, drops: Drops) -> Records:
    """Rejoin records cut by newlines; count why the others are dropped."""
    found = []
    for line_idx, segment, next_line, order in slow:
        match = _join_continuations(segment, next_line, log)
        if match and match.group(VERSION_FIELD) == str(STRACE_VERSION):
            found.append((line_idx + 1, order, match.groupdict()))
            continue
        drops.count("unknown_version" if match else _drop_reason(segment), 1, line_idx + 1)
    if not found:
        return Records.empty()
    return Records.from_tails(
        np.array([f[0] for f in found], np.int64),
        np.array([f[1] for f in found], np.int64),
        {name: pa.array([f[2][name] for f in found], pa.large_string()) for name in VALUE_FIELDS},
        pa.array([f[2]["tail"] for f in found], pa.large_string()),
    )


def _join_continuations(text: str, next_line: int | None, log: _Log) -> re.Match | None:
    """The record that ``text`` starts, extended over following lines while that completes it.

    An incomplete record takes the next line if the join parses (the newline
    removed, or read as a space); a complete one that ends its line takes the
    next line only if the join parses and uses that whole line, so unrelated
    text after a record is never glued to it.
    """
    match = STRACE_RE.match(text)
    n_lines = len(log.lines)
    index = next_line
    for _ in range(MAX_CONTINUATION_LINES):
        if index is None or index >= n_lines or (match and not _open_end(match, text)):
            break
        if match is None and _version_of(text) not in (None, str(STRACE_VERSION)):
            break
        nxt = log.text(index)
        if not nxt or nxt.startswith("["):
            break
        cut = nxt.find(STRACE_MARKER)
        if match and cut >= 0:  # a complete record is not extended by text that leads up to another record
            break
        head = nxt if cut < 0 else nxt[:cut]
        extended = None
        for candidate in (text + head, text + " " + head):
            found = STRACE_RE.match(candidate)
            if found and (match is None or _uses_all(found, candidate)):
                extended = (found, candidate)
                break
        if extended:
            match, text = extended
        elif match is None:
            text += head
        else:
            break
        if cut >= 0:
            break
        index += 1
    return match


def _uses_all(match: re.Match, text: str) -> bool:
    return not text[match.end("tail") :].strip(_ASCII_SPACE_CHARS)


def _open_end(match: re.Match, text: str) -> bool:
    """A parsed record the next line may still extend: nothing after it, or one cut token (``run`` of ``run_id=7``)."""
    leftover = text[match.end("tail") :]
    if not leftover.strip(_ASCII_SPACE_CHARS):
        return True
    token = leftover[1:]
    return leftover[0] == " " and not any(c in _ASCII_SPACE_CHARS or c in "[]" for c in token)


def _version_of(segment: str) -> str | None:
    m = _VERSION_RE.match(segment)
    return m.group(1) if m else None


def _drop_reason(segment: str) -> str:
    """Why a record that the record pattern rejects cannot be used.

    ``torn_record``: the text stops inside the required fields, which are in
    order so far (the last one possibly cut, ``dur=`` or ``dur=-`` included);
    ``bad_value``: every required field is there but one does not parse;
    ``missing_field``: required fields out of order or absent.
    """
    version = _version_of(segment)
    if version is not None and version != str(STRACE_VERSION):
        return "unknown_version"
    body = segment.split("[", 1)[0]
    tokens = [t for t in _ASCII_SPACES.split(body) if t]
    keys = [t.split("=", 1)[0] for t in tokens]
    cut_short = bool(tokens) and not body.endswith(tuple(_ASCII_SPACE_CHARS))  # the last token may be partial
    if len(keys) <= len(REQUIRED_FIELDS):
        complete_keys = keys[:-1] if cut_short else keys
        in_order = complete_keys == list(REQUIRED_FIELDS[: len(complete_keys)])
        if in_order and cut_short:
            expected = REQUIRED_FIELDS[len(keys) - 1]
            last = tokens[-1]
            in_order = last.startswith(expected + "=") or (expected + "=").startswith(last)
        last_value_cut = cut_short and len(keys) == len(REQUIRED_FIELDS) and f"{REQUIRED_FIELDS[-1]}=-".startswith(tokens[-1])
        if in_order and (len(keys) < len(REQUIRED_FIELDS) or last_value_cut):
            return "torn_record"
    if all(f in keys for f in REQUIRED_FIELDS):
        return "bad_value"
    return "missing_field"
