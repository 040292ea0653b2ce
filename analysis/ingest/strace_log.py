"""Reader for STRACE host-span records in any text log (SPEC §2).

The log is read in pieces of about :data:`CHUNK_BYTES`, each cut where a line
opens with '[' (no record can span such a cut, see :func:`_chunks`), so the
time taken grows linearly with the log and the reader's own memory stays
bounded by a few pieces whatever the log's size. A file is memory-mapped and
its pieces are views of it (:func:`_mapped_chunks`, the same cuts; pages
behind the reader are let go).

Where it is built, the compiled scanner (``_strace_scan.c``, see "the compiled
scanner" below) reads each piece on every core and hands the lines it does
not read itself to the Python code below, which defines the result: both give
the same rows, drops and counts on any input (tests/test_ingest_fast.py).

The Python reader cuts each piece into lines without copying (an Arrow string
array whose offsets are the newline positions). Lines are handled in batches,
in three tiers:

1. plain records — one version-1 record with single spaces running to the end
   of its line, the common case — are recognised by one capture-free regular
   expression over the whole batch and cut into fields by the positions of
   their separator bytes (NumPy); numbers are cast straight from the log's
   bytes, text fields gathered with Arrow ``take``;
2. other lines holding a marker (several records on a line, unusual spacing,
   other versions) are split at every marker and parsed by a capturing regular
   expression over the column;
3. only what that rejects (torn, split across lines, garbled) takes a Python
   path, to rejoin continuation lines or to name the reason it is dropped.

Each batch becomes typed Arrow columns at once, so the text of its fields
never piles up.

Reading rules (also what ``Trace.dropped`` counts):

* a record may sit anywhere in a line, after the ``[mono_ns=..][T0x..][LEVEL]
  func: `` prefix or not, and a line may hold several records;
* a record cut by a newline is rejoined with up to
  :data:`MAX_CONTINUATION_LINES` following lines when that completes it
  (the newline removed, or replaced by a space where that is what parses). A
  record already complete takes the next line only if that line cannot be a
  new log record (does not start with '[') and the join consumes all of it
  (e.g. ``run`` / ``_id=7 step=3``); a bare one-word line right after such a
  record is therefore read as its continuation — the two cannot be told
  apart, and the runtime's own lines always start with a prefix;
* a record with ``v`` other than 1 is skipped: ``unknown_version``;
* a record that stops before its required fields are complete:
  ``torn_record``; one whose required fields are out of order or absent:
  ``missing_field``; one whose fields are all there but a value does not
  parse (or overflows 64 bits): ``bad_value``;
* the same for ``[CLOCK_ANCHOR]`` lines (``bad_anchor``) and
  ``[chip_process ...] ready`` lines (``bad_chip_process``);
* unrelated log text is ignored and not counted as dropped; the number of
  lines read is kept in ``Trace.extras["lines_read"]``.

Column conventions for STRACE rows: ``source="strace"``, ``cat=""``,
``ph="X"``, ``line`` is the line the record starts on. The ``clk`` attribute
becomes the ``clk`` column (``"dev"`` when ``clk=dev``, else ``"host"``) and is
not repeated in ``attrs``; every other trailing ``k=v`` attribute, known or not,
is kept in ``attrs`` with keys and values percent-decoded.
"""

from __future__ import annotations

import contextlib
import functools
import io
import mmap
import os
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.dataset import DICTIONARY_TYPE, PARQUET_SCHEMA
from dsprof.analysis.spans import (
    ANCHOR_SCHEMA,
    ATTRS_TYPE,
    CHIP_SCHEMA,
    PROMOTED_INT_ATTRS,
    PROMOTED_TEXT_ATTRS,
    SPAN_COLUMNS,
    SPAN_SCHEMA,
    Trace,
    split_attributes,
)
from dsprof.errors import InputError
from dsprof.profiler import strace_format as fmt
from dsprof.profiler.strace_format import REQUIRED_FIELDS, STRACE_MARKER, STRACE_VERSION, decode_value

MAX_CONTINUATION_LINES = 3
# Lines handled per vectorised pass; bounds the temporary copies of a big log.
LINES_PER_BATCH = 1 << 14  # small enough for its temporaries to stay in cache
# Bytes parsed at a time (cut at a line boundary); bounds the temporaries of a big log.
CHUNK_BYTES = 64 << 20
MAX_BATCH_BYTES = 1 << 30
# Longest line kept: a longer one (a binary blob, /dev/zero) is skipped and counted
# as ``overlong_line``, and reading goes on, so memory stays bounded whatever the input.
MAX_LINE_BYTES = 1 << 20
# A token of the k=v grammar: no spaces, brackets or '=' (they are escaped).
_TOKEN = r"[^\s\[\]=]"
_HEAD = (
    r"^ v=(?P<v>\d{1,9}) pid=(?P<pid>-?\d{1,19}) tid=(?P<tid>-?\d{1,19}) inv=(?P<inv>\d{1,20})"
    r" hid=(?P<hid>" + _TOKEN + r"+) depth=(?P<depth>\d{1,19}) name=(?P<name>" + _TOKEN + r"*)"
    r" ts=(?P<ts>-?\d{1,19}) dur=(?P<dur>-?\d{1,19})"
)
# One record after its "[STRACE]" marker, followed by anything that cannot
# belong to it (space, '[' of the next log prefix, end). Digit counts are
# capped: a longer number fails here and is dropped as bad_value.
STRACE_PATTERN = _HEAD + r"(?P<tail>(?: +" + _TOKEN + r"+=" + _TOKEN + r"*)*)(?:\s|\[|$)"
# The common shape, checked without captures (fast DFA): a version-1 record
# with single spaces that is the rest of its line. Such records are then cut
# into fields by the separator positions alone (see _tokenize_plain), without
# the much slower capturing regex.
_PLAIN_TOKEN = r"[^\x00-\x20\[\]=]"  # also no raw control bytes: they would pass for separators below
# Digit runs are unbounded here (counted repeats slow the DFA down); values
# too long for 64 bits are caught by _out_of_range.
PLAIN_RECORD_PATTERN = (
    r"^ v=" + str(STRACE_VERSION) + r" pid=-?\d+ tid=-?\d+ inv=\d+ hid=" + _PLAIN_TOKEN + r"+ depth=\d+ name=" + _PLAIN_TOKEN + r"*"
    r" ts=-?\d+ dur=-?\d+(?: " + _PLAIN_TOKEN + r"+=" + _PLAIN_TOKEN + r"*)*\r?(?:\n|$)"
)
_EQUALS = ord("=")
_SPACE = ord(" ")  # bytes up to the space (controls, CR, LF) separate too
# Plain record, as separator-delimited pieces after its leading space: the
# value of field k (v=1, pid=2, ..., dur=9) is piece 2k-1; attributes follow
# from piece 18 on as key, value, key, value, ...
_FIELD_PIECES = np.array([2 * k - 1 for k in range(2, 10)])
_ATTR_FIRST_PIECE = 18
_STRACE_RE = re.compile(STRACE_PATTERN, re.ASCII)
# The grammar's whitespace is ASCII (RE2's \s); other spaces (e.g. U+00A0) are text.
_ASCII_SPACE_CHARS = " \t\n\r\f\v"
_ASCII_SPACES = re.compile(r"\s+", re.ASCII)
_VALUE_FIELDS = ("pid", "tid", "inv", "hid", "depth", "name", "ts", "dur")
_NUMBER_FIELDS = {"pid": np.int64, "tid": np.int64, "inv": np.uint64, "depth": np.int64, "ts": np.int64, "dur": np.int64}
_TEXT_FIELDS = ("hid", "name")

# A clock anchor counts only as a complete log record, as the serving stack's
# reader takes it: its prefix with the TIMING level and the clock_anchor function,
# then nothing after wall_ns but blanks to the end of the line. A payload copied
# into another message, or trailed by more text, would move another process's
# wall clock. (The record may follow other text on its line, as in the stack.)
# tests/test_ingest_strace.py::test_clock_anchor_only_as_a_complete_record guards it.
ANCHOR_PATTERN = (
    r"\[mono_ns=\d+\]\[T0x[0-9a-fA-F]+\]\[" + fmt.ANCHOR_LEVEL + r"\]\s+" + fmt.ANCHOR_FUNC + r":\s+"
    r"\[CLOCK_ANCHOR\]\s+v=(?P<v>\d+)\s+pid=(?P<pid>\d+)\s+mono_ns=(?P<mono_ns>\d+)\s+wall_ns=(?P<wall_ns>\d+)[ \t]*\r?\n?$"
)
SIDE_RECORD_PATTERN = r"\[CLOCK_ANCHOR\]|\[chip_process "
CHIP_PATTERN = r"\[chip_process pid=(?P<pid>\d{1,19}) dev=(?P<device>" + _TOKEN + r"+)\] ready"


Progress = Callable[[str], None] | None
_T = TypeVar("_T")


def read_strace_log(path: str | os.PathLike, progress: Progress = None, sink: SpanSink | None = None) -> Trace:
    """Read every STRACE record, clock anchor and chip_process line of a text log.

    The file is read and parsed a chunk at a time (see :func:`_chunks`), so
    time grows linearly with its size and memory holds one chunk plus the rows
    (or, with a ``sink``, one chunk's rows: each chunk's span table goes to it).
    """
    path = Path(path)
    try:
        with path.open("rb") as log_file:
            size = os.fstat(log_file.fileno()).st_size
            mapped = _mapped(log_file)
            if mapped is None:  # a pipe, or empty
                return _parse_chunks(_chunks(log_file), str(path), size, progress, sink)
            try:
                return _parse_chunks(_mapped_chunks(mapped), str(path), size, progress, sink)
            finally:
                with contextlib.suppress(BufferError):  # a view still held: the map goes with it
                    mapped.close()
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None


def parse_strace_bytes(data: bytes, file: str, progress: Progress = None) -> Trace:
    """Parse a whole log held in memory; ``file`` names it in rows and errors."""
    return _parse_chunks(_mapped_chunks(data), file, len(data), progress, None)


def _mapped(log_file: BinaryIO) -> mmap.mmap | None:
    """The file mapped into memory (read-only, read ahead), or None where it cannot be."""
    try:
        mapped = mmap.mmap(log_file.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    mapped.madvise(mmap.MADV_SEQUENTIAL)
    return mapped


class SpanSink(Protocol):
    """Where a reader puts each chunk's span table instead of keeping it (e.g. a Parquet dataset).

    The tables have the columns of SPAN_SCHEMA, with the columns that hold one
    value per log dictionary-encoded (dataset.PARQUET_SCHEMA); a trace read
    into memory gets them decoded.
    """

    def add(self, table: pa.Table) -> None: ...


# What _chunks yields: a piece of the log, or the number of lines it skipped as overlong.
_Piece = memoryview | int


def _chunks(log_file: io.BufferedIOBase) -> Iterator[_Piece]:
    """The log in pieces of about CHUNK_BYTES, each cut just before a line that opens with '['.

    No record spans such a cut: a record only ever continues onto a line that
    does not open with '[' (a log prefix or a new marker), and the rest of a
    marker cut by a newline (``ACE] v=1``) does not open with '[' either. So
    every piece parses on its own exactly as it would within the whole log.
    A piece without such a line grows by at most MAX_LINE_BYTES; then it is cut
    at its last newline, and a line longer than that is skipped (an ``int``
    is yielded for it), so the buffer never outgrows CHUNK_BYTES + MAX_LINE_BYTES.

    Pieces are read into one buffer, reused as long as nothing parsed from
    the previous piece still refers to it (the rows are copies), which saves
    faulting in fresh memory for every piece.
    """
    limit = CHUNK_BYTES + MAX_LINE_BYTES
    piece, kept = bytearray(CHUNK_BYTES), 0  # kept: bytes after the last cut, moved to the front
    skipping = False  # inside an overlong line: drop bytes up to its newline
    while True:
        if kept == len(piece):  # no cut in the whole buffer yet: make room for more
            piece.extend(bytes(min(CHUNK_BYTES, limit - len(piece))))
        with memoryview(piece) as whole, whole[kept:] as free:
            got = log_file.readinto(free)
        if not got:
            if kept and not skipping:
                yield memoryview(piece)[:kept]
            return
        filled = kept + got
        if skipping:
            newline = piece.find(b"\n", 0, filled)
            if newline < 0:
                kept = 0
                continue
            skipping = False
            piece[: filled - newline - 1] = piece[newline + 1 : filled]
            kept = filled - newline - 1
            continue
        cut = piece.rfind(b"\n[", 0, filled) + 1
        if cut == 0 and filled >= limit:
            cut = piece.rfind(b"\n", 0, filled) + 1
            if cut == 0:  # one line fills the whole buffer
                yield 1
                skipping, kept = True, 0
                continue
        if cut == 0:
            kept = filled
            continue
        view = memoryview(piece)[:cut]
        yield view
        del view
        try:
            piece.append(piece.pop())  # a resize: refused while anything still refers to the piece
        except BufferError:  # leave the piece to what refers to it
            old, piece = piece, bytearray(len(piece))
            piece[: filled - cut] = old[cut:filled]
        else:
            piece[: filled - cut] = piece[cut:filled]
        kept = filled - cut


def _mapped_chunks(data: mmap.mmap | bytes) -> Iterator[_Piece]:
    """The pieces :func:`_chunks` cuts the same log into, as views of the log mapped in memory: no copy.

    The same steps as _chunks, on offsets: the buffer is the stretch of the
    log from ``start``, ``kept`` bytes of it already "read", at most
    ``capacity`` bytes (grown as _chunks grows its buffer). Pages of a mapped
    file behind the reader are dropped, so its memory stays bounded.
    """
    view, size = memoryview(data), len(data)
    limit = CHUNK_BYTES + MAX_LINE_BYTES
    capacity, start, kept, skipping, dropped = CHUNK_BYTES, 0, 0, False, 0
    while True:
        if kept == capacity:
            capacity += min(CHUNK_BYTES, limit - capacity)
        got = min(capacity - kept, size - start - kept)
        if got <= 0:
            if kept and not skipping:
                yield view[start : start + kept]
            return
        filled = kept + got
        if skipping:
            newline = data.find(b"\n", start, start + filled)
            skipping = newline < 0
            start, kept = (start + filled, 0) if skipping else (newline + 1, start + filled - newline - 1)
            continue
        cut = data.rfind(b"\n[", start, start + filled) + 1
        if cut == 0 and filled >= limit:
            cut = data.rfind(b"\n", start, start + filled) + 1
            if cut == 0:
                yield 1
                skipping, start, kept = True, start + filled, 0
                continue
        if cut == 0:
            kept = filled
            continue
        yield view[start:cut]
        if isinstance(data, mmap.mmap):
            dropped = _drop_pages(data, dropped, cut)
        start, kept = cut, start + filled - cut


def _drop_pages(mapped: mmap.mmap, done: int, upto: int) -> int:
    """Let the pages of [done, upto) go from this process's memory (they are read again from the file if needed)."""
    upto -= upto % mmap.PAGESIZE
    if upto > done:
        mapped.madvise(mmap.MADV_DONTNEED, done, upto - done)
    return max(done, upto)


def _parse_chunks(chunks: Iterable[_Piece], file: str, size: int, progress: Progress, sink: SpanSink | None) -> Trace:
    """Parse each piece of a log and stack the results (lines numbered across pieces)."""
    trace = Trace(files=[file])
    tables: list[pa.Table] = []
    anchors: list[pa.Table] = []
    chips: list[pa.Table] = []
    records_found = n_lines = bytes_done = 0
    binary_at: int | None = None
    for part in _parsed_pieces(chunks, file, trace.dropped):
        if isinstance(part, int):  # an overlong line, skipped
            trace.count("overlong_line", part)
            n_lines += part
            continue
        if sink is not None:
            if part.table.num_rows:
                sink.add(part.table)
        else:
            tables.append(part.table)
        anchors.append(part.anchors)
        chips.append(part.chips)
        records_found += part.records_found
        if binary_at is None and part.binary_at is not None:
            binary_at = n_lines + part.binary_at
        n_lines += part.n_lines
        bytes_done += part.n_bytes
        if progress is not None and size > CHUNK_BYTES:
            progress(f"{file}: {bytes_done / 2**20:,.0f}/{size / 2**20:,.0f} MiB, {n_lines:,} lines")
    trace.spans = pa.concat_tables(tables).cast(SPAN_SCHEMA) if tables else SPAN_SCHEMA.empty_table()
    trace.anchors = pa.concat_tables(anchors) if anchors else ANCHOR_SCHEMA.empty_table()
    trace.chip_devices = pa.concat_tables(chips) if chips else CHIP_SCHEMA.empty_table()
    found_anything = records_found or trace.anchors.num_rows or trace.chip_devices.num_rows
    if not found_anything and binary_at is not None:
        raise InputError(file, "binary data, not a text log", line=binary_at, expected="a text log with [STRACE] records")
    trace.dropped = {k: v for k, v in sorted(trace.dropped.items()) if v}
    side_drops = trace.dropped.get("bad_anchor", 0) + trace.dropped.get("bad_chip_process", 0)
    trace.records_read = records_found + trace.anchors.num_rows + trace.chip_devices.num_rows + side_drops
    trace.lines_read = n_lines
    return trace


class _Chunk(NamedTuple):
    """What one piece of a log holds; ``binary_at`` is a line of the piece (1-based) or None."""

    table: pa.Table
    anchors: pa.Table
    chips: pa.Table
    records_found: int  # STRACE records kept or dropped
    n_lines: int
    binary_at: int | None
    n_bytes: int


def _parsed_pieces(chunks: Iterable[_Piece], file: str, dropped: dict[str, int]) -> Iterator[_Chunk | int]:
    """Each piece parsed (or the count of overlong lines skipped), by the compiled scanner where it is available."""
    scanner = compiled_scanner()
    if scanner is None:
        yield from _python_pieces(chunks, file, dropped)
        return
    assemble = _Assembler(file, dropped)
    for scanned in _read_ahead(_scanned(scanner, chunks)):
        yield scanned if isinstance(scanned, int) else assemble(*scanned)


def _python_pieces(chunks: Iterable[_Piece], file: str, dropped: dict[str, int]) -> Iterator[_Chunk | int]:
    """The pure-Python reader: each piece parsed by :func:`_parse_chunk`."""
    line_base = 0
    for data in chunks:
        if isinstance(data, int):
            line_base += data
            yield data
            continue
        part = _parse_chunk(data, file, line_base, dropped)
        del data  # so that the next piece may reuse its buffer
        line_base += part.n_lines
        yield part


def _parse_chunk(data: memoryview, file: str, line_base: int, dropped: dict[str, int]) -> _Chunk:
    """Rows of one piece of a log whose first line is line ``line_base + 1``; drops are added to ``dropped``."""
    n_bytes = len(data)
    text, binary_at = _as_utf8(data)
    log = _Log(text)
    record_drops = sum(dropped.values())
    # each batch becomes typed Arrow columns at once, so the text of its fields never piles up
    tables: list[pa.Table] = []
    orders: list[np.ndarray] = []
    slow: list[_SlowRecord] = []
    for start, stop in _batches(log, file, line_base):
        records, batch_slow = _extract_batch(log, start, stop, dropped)
        _add_table(tables, orders, records, file, line_base, dropped)
        slow.extend(batch_slow)
    slow.extend(_marker_split_records(log))
    _add_table(tables, orders, _finish_slow_records(slow, log, dropped), file, line_base, dropped)
    records_found = sum(t.num_rows for t in tables) + sum(dropped.values()) - record_drops  # only record drops are counted so far

    side = _side_lines(log)
    anchors = _anchors(side, dropped)
    chips = _chip_devices(side, dropped)
    table = pa.concat_tables(tables) if tables else PARQUET_SCHEMA.empty_table()
    order = np.concatenate(orders + [np.empty(0, np.int64)])
    if np.any(np.diff(order) < 0):  # records from the slow path go back to their place
        table = table.take(pa.array(np.argsort(order, kind="stable")))
    return _Chunk(table, anchors, chips, records_found, len(log.lines), binary_at, n_bytes)


def _side_lines(log: _Log) -> pa.Array:
    """The lines that may hold clock anchors or chip_process lines (also before a record on its line).

    A log holds few of them: one search of the whole piece skips the
    line-by-line test for the pieces that have none.
    """
    if not pc.match_substring_regex(log.whole, SIDE_RECORD_PATTERN)[0].as_py():
        return pa.array([], pa.large_string())
    return log.lines.filter(pc.match_substring_regex(log.lines, SIDE_RECORD_PATTERN))


class _Records:
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
    def concat(cls, parts: list[_Records]) -> _Records:
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
            {f: np.concatenate([p.numbers[f] for p in parts]) for f in _NUMBER_FIELDS},
            np.concatenate([p.overflow for p in parts]),
            {f: stack([p.texts[f] for p in parts]) for f in _TEXT_FIELDS},
            stack([p.keys for p in parts]),
            stack([p.values for p in parts]),
            np.concatenate([p.token_row + base for p, base in zip(parts, row_base, strict=True)]),
        )

    @classmethod
    def empty(cls) -> _Records:
        nothing = pa.array([], pa.large_string())
        none = np.empty(0, np.int64)
        return cls(
            none,
            none,
            {f: np.empty(0, _NUMBER_FIELDS[f]) for f in _NUMBER_FIELDS},
            np.empty(0, bool),
            {f: nothing for f in _TEXT_FIELDS},
            nothing,
            nothing,
            none,
        )

    @classmethod
    def from_tails(cls, line: np.ndarray, order: np.ndarray, fields: dict[str, pa.Array], tails: pa.Array) -> _Records:
        """Records whose fields are all still text, attributes one ``k=v k=v`` text per record."""
        token_lists = pc.split_pattern(pc.utf8_rtrim(tails, "\r\n"), " ")
        tokens = token_lists.flatten()
        token_row = pc.list_parent_indices(token_lists)
        nonempty = pc.greater(pc.binary_length(tokens), 0)
        pairs = pc.split_pattern(tokens.filter(nonempty), "=", max_splits=1)
        row = token_row.filter(nonempty).to_numpy().astype(np.int64)
        numbers, overflow = {}, np.zeros(len(line), bool)
        for name, dtype in _NUMBER_FIELDS.items():
            numbers[name], over = _integers(fields[name], dtype)
            overflow |= over
        texts = {name: fields[name] for name in _TEXT_FIELDS}
        return cls(line, order, numbers, overflow, texts, pc.list_element(pairs, 0), pc.list_element(pairs, 1), row)

    def filter(self, keep: np.ndarray) -> _Records:
        if keep.all():
            return self
        new_row = np.cumsum(keep) - 1
        token_keep = keep[self.token_row]
        mask, token_mask = pa.array(keep), pa.array(token_keep)
        return _Records(
            self.line[keep],
            self.order[keep],
            {f: a[keep] for f, a in self.numbers.items()},
            self.overflow[keep],
            {f: a.filter(mask) for f, a in self.texts.items()},
            self.keys.filter(token_mask),
            self.values.filter(token_mask),
            new_row[self.token_row[token_keep]],
        )


def _integers(digits: pa.Array, dtype: type) -> tuple[np.ndarray, np.ndarray]:
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
        overflow = _out_of_range(digits, signed=dtype == np.int64)
        values = pc.if_else(pa.array(overflow), pa.scalar(None, digits.type), digits).cast(arrow_type)
    data: np.ndarray = np.frombuffer(values.buffers()[1], dtype)
    return data[values.offset : values.offset + len(values)], overflow


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


def _as_utf8(data: memoryview) -> tuple[memoryview | bytes, int | None]:
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


def _extract_batch(log: _Log, first: int, stop: int, dropped: dict[str, int]) -> tuple[_Records, list[_SlowRecord]]:
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
        records, slow = _segment_records(log, other_lines, dropped)
        parts.append(records)
    return _Records.concat(parts), slow


def _tokenize_plain(log: _Log, rec_start: np.ndarray, line: np.ndarray, first: int, stop: int) -> _Records:
    """Fields and attributes of plain records, located by the positions of their separators.

    Every piece wanted (8 field values, then keys and values) lies between two
    consecutive separators. Numbers are cast straight from a zero-copy array
    whose every other cell is a wanted piece (the cells in between are null,
    so the cast skips them); text pieces are gathered with ``take``.
    """
    n = len(rec_start)
    if n == 0:
        return _Records.empty()
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
    for names in (("pid", "tid", "depth", "ts", "dur"), ("inv",)):
        value_piece = q0[:, None] + _FIELD_PIECES[[_VALUE_FIELDS.index(f) for f in names]]
        values, over = _integers(pieces.spaced(value_piece), _NUMBER_FIELDS[names[0]])
        values, over = values[0::2].reshape(n, len(names)), over[0::2].reshape(n, len(names))
        numbers.update({f: values[:, i] for i, f in enumerate(names)})
        overflow |= over.any(axis=1)
    cells = pieces.spaced(q0[:, None] + _FIELD_PIECES[[_VALUE_FIELDS.index(f) for f in _TEXT_FIELDS]])  # cell 2 * (record * 2 + k)
    texts = {f: cells.take(pa.array(np.arange(2 * k, 4 * n, 4))) for k, f in enumerate(_TEXT_FIELDS)}

    # attributes: pieces q0 + _ATTR_FIRST_PIECE onwards, key and value in turn
    attr_pieces = np.searchsorted(separators, rec_end - lo) - q0 - _ATTR_FIRST_PIECE  # 2 per attribute
    base = np.zeros(n + 1, np.int64)
    np.cumsum(attr_pieces, out=base[1:])
    piece = np.repeat(q0 + _ATTR_FIRST_PIECE - base[:-1], attr_pieces) + np.arange(base[-1], dtype=np.int64)
    cells = pieces.spaced(piece)  # piece i = cell 2i
    every_pair = np.arange(0, 2 * base[-1], 4)
    return _Records(
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


def _segment_records(log: _Log, line_index: np.ndarray, dropped: dict[str, int]) -> tuple[_Records, list[_SlowRecord]]:
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
    version_ok = pc.equal(fields.field("v"), str(STRACE_VERSION)).fill_null(False).to_numpy(zero_copy_only=False)
    _count(dropped, "unknown_version", (matched & ~version_ok).sum())
    good = matched & version_ok & ~continues
    mask = pa.array(good)
    records = _Records.from_tails(
        seg_line[good] + 1,
        seg_order[good],
        {f: fields.field(f).filter(mask) for f in _VALUE_FIELDS},
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


def _finish_slow_records(slow: list[_SlowRecord], log: _Log, dropped: dict[str, int]) -> _Records:
    """Rejoin records cut by newlines; count why the others are dropped."""
    found = []
    for line_idx, segment, next_line, order in slow:
        match = _join_continuations(segment, next_line, log)
        if match and match.group("v") == str(STRACE_VERSION):
            found.append((line_idx + 1, order, match.groupdict()))
            continue
        reason = "unknown_version" if match else _drop_reason(segment)
        dropped[reason] = dropped.get(reason, 0) + 1
    if not found:
        return _Records.empty()
    return _Records.from_tails(
        np.array([f[0] for f in found], np.int64),
        np.array([f[1] for f in found], np.int64),
        {name: pa.array([f[2][name] for f in found], pa.large_string()) for name in _VALUE_FIELDS},
        pa.array([f[2]["tail"] for f in found], pa.large_string()),
    )


def _join_continuations(text: str, next_line: int | None, log: _Log) -> re.Match | None:
    """The record that ``text`` starts, extended over following lines while that completes it.

    An incomplete record takes the next line if the join parses (the newline
    removed, or read as a space); a complete one that ends its line takes the
    next line only if the join parses and uses that whole line, so unrelated
    text after a record is never glued to it.
    """
    match = _STRACE_RE.match(text)
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
            found = _STRACE_RE.match(candidate)
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
    m = re.match(r" v=(\d+)(?:\s|$)", segment)
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
        last_value_cut = cut_short and len(keys) == len(REQUIRED_FIELDS) and "dur=-".startswith(tokens[-1])
        if in_order and (len(keys) < len(REQUIRED_FIELDS) or last_value_cut):
            return "torn_record"
    if all(f in keys for f in REQUIRED_FIELDS):
        return "bad_value"
    return "missing_field"


def _count(dropped: dict[str, int], reason: str, n: int) -> None:
    if n:
        dropped[reason] = dropped.get(reason, 0) + int(n)


def _out_of_range(digits: pa.Array, signed: bool) -> np.ndarray:
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


def _attribute_columns(records: _Records) -> tuple[pa.Array, dict[str, pa.Array], pa.Array]:
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


def _add_table(
    tables: list[pa.Table], orders: list[np.ndarray], records: _Records, file: str, line_base: int, dropped: dict[str, int]
) -> None:
    """Append the span rows of ``records``; drop and count what cannot be a span.

    ``bad_value``: a number that does not fit 64 bits, a negative start, or an
    end (ts + dur) past int64; ``negative_duration``: a span that ends before it
    starts (it would inflate every figure built on it).
    """
    if not len(records):
        return
    number = records.numbers
    ts, dur = number["ts"], number["dur"]
    with np.errstate(over="ignore"):
        past_int64 = (dur > 0) & (ts > np.iinfo(np.int64).max - dur)
    bad = records.overflow | (ts < 0) | past_int64
    negative = ~bad & (dur < 0)
    _count(dropped, "bad_value", bad.sum())
    _count(dropped, "negative_duration", negative.sum())
    records = records.filter(~(bad | negative))
    n = len(records)
    if n == 0:
        return
    number, text = records.numbers, records.texts
    clk, promoted, attrs = _attribute_columns(records)
    columns = {
        **_constant_columns(file, n),
        "line": pa.array(records.line + line_base, pa.int64()),
        "pid": pa.array(number["pid"]),
        "tid": pa.array(number["tid"]),
        "name": _decode_where_escaped(text["name"].cast(pa.string())),
        "ts_ns": pa.array(number["ts"]),
        "dur_ns": pa.array(number["dur"]),
        "inv": pa.array(number["inv"]),
        "hid": _decode_where_escaped(text["hid"].cast(pa.string())),
        "depth": pa.array(number["depth"]),
        "clk": clk,
        **promoted,
        "attrs": attrs,
    }
    tables.append(pa.table([columns[name] for name in SPAN_SCHEMA.names], schema=PARQUET_SCHEMA))
    orders.append(records.order)


def _anchors(lines: pa.Array, dropped: dict[str, int]) -> pa.Table:
    """One row per clock anchor that is a complete record (see ANCHOR_PATTERN); wall ns stay int64.

    Anything else that names ``[CLOCK_ANCHOR]`` (a copy inside another message,
    a payload with text after it) is not an anchor and is counted as ``bad_anchor``.
    """
    candidates = lines.filter(pc.match_substring(lines, fmt.ANCHOR_MARKER))
    if not len(candidates):
        return ANCHOR_SCHEMA.empty_table()
    fields = pc.extract_regex(candidates, ANCHOR_PATTERN)
    valid = fields.is_valid()
    _count(dropped, "bad_anchor", len(candidates) - pc.sum(valid).as_py())
    fields = fields.filter(valid)
    ok = pc.equal(fields.field("v"), str(fmt.ANCHOR_VERSION)).to_numpy(zero_copy_only=False)
    for name in ("pid", "mono_ns", "wall_ns"):
        ok &= ~_out_of_range(fields.field(name), signed=True)
    _count(dropped, "bad_anchor", (~ok).sum())
    fields = fields.filter(pa.array(ok))
    return pa.table({name: fields.field(name).cast(pa.int64()) for name in ANCHOR_SCHEMA.names}, schema=ANCHOR_SCHEMA)


def _chip_devices(lines: pa.Array, dropped: dict[str, int]) -> pa.Table:
    """One row per ``[chip_process pid=P dev=D] ready`` line."""
    candidates = lines.filter(pc.match_substring(lines, fmt.CHIP_READY_MARKER))
    if not len(candidates):
        return CHIP_SCHEMA.empty_table()
    fields = pc.extract_regex(candidates, CHIP_PATTERN)
    fields = fields.filter(fields.is_valid())
    ok = ~_out_of_range(fields.field("pid"), signed=True)
    _count(dropped, "bad_chip_process", len(candidates) - len(fields) + int((~ok).sum()))
    fields = fields.filter(pa.array(ok))
    devices = pa.array([decode_value(d) for d in fields.field("device").to_pylist()], pa.string())  # one per rank process
    return pa.table({"pid": fields.field("pid").cast(pa.int64()), "device": devices}, schema=CHIP_SCHEMA)


# -- the compiled scanner ------------------------------------------------------------------
#
# analysis/ingest/_strace_scan.c reads the lines whose records all follow the
# plain grammar and hands back the rest ("islands": torn, continued or garbled
# records, other versions, anchors, chip_process lines), which _parse_chunk
# reads exactly as above; the two are put back together in line order, so the
# result is the Python reader's, row for row.

_SOURCE, _PHASE = "strace", "X"  # the source and Chrome phase of every STRACE row
# Set to 1 to read with the Python code only (tests compare the two; benchmarks time both).
PURE_PYTHON_ENV = "DSPROF_PURE_PYTHON"
# Kinds of the required fields for the scanner, as _HEAD's groups take them:
# i64 = -?digits (19 at most), n64 = digits that fit int64, u64 = up to 20 digits
# that fit uint64, token = one or more token bytes, token0 = possibly none.
_FIELD_KINDS = {
    "v": "version",
    "pid": "i64",
    "tid": "i64",
    "inv": "u64",
    "hid": "token",
    "depth": "n64",
    "name": "token0",
    "ts": "i64",
    "dur": "i64",
}
_FIELD_COLUMNS = {"pid": "pid", "tid": "tid", "inv": "inv", "hid": "hid", "depth": "depth", "name": "name", "ts": "ts_ns", "dur": "dur_ns"}
# Threads of one scan: the piece is shared out at lines that open with '[', in parts of at least SCAN_MIN_PART_BYTES.
SCAN_THREADS = max(1, min(len(os.sched_getaffinity(0)), 16))
SCAN_MIN_PART_BYTES = 1 << 20


def compiled_module() -> Any | None:
    """The compiled helpers (_strace_scan), or None: not built, not importable, or :data:`PURE_PYTHON_ENV` asks for Python."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None
    try:
        from dsprof.analysis.ingest import _strace_scan  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _strace_scan


def compiled_scanner() -> Any | None:
    """The compiled scanner, or None (see :func:`compiled_module`)."""
    module = compiled_module()
    return None if module is None else _scanner_of(module)


@functools.cache
def _scanner_of(module: Any) -> Any:
    """A Scanner told the format's vocabulary (from strace_format and spans, never spelled out in C)."""
    return module.Scanner(
        marker=STRACE_MARKER.encode(),
        side_markers=(fmt.ANCHOR_MARKER.encode(), fmt.CHIP_READY_MARKER.encode()),
        version=str(STRACE_VERSION).encode(),
        fields=tuple(f.encode() for f in REQUIRED_FIELDS),
        kinds=tuple(_FIELD_KINDS[f].encode() for f in REQUIRED_FIELDS),
        ts_field=REQUIRED_FIELDS.index("ts"),
        dur_field=REQUIRED_FIELDS.index("dur"),
        clk=(fmt.CLK_ATTR.encode(), fmt.CLK_DEVICE.encode(), fmt.CLK_HOST.encode()),
        int_keys=tuple(k.encode() for k in PROMOTED_INT_ATTRS),
        text_keys=tuple(k.encode() for k in PROMOTED_TEXT_ATTRS),
    )


_Scanned = tuple[dict, int]  # the scanner's result for a piece, and the piece's size


def _scanned(scanner: Any, chunks: Iterable[_Piece]) -> Iterator[_Scanned | int]:
    """Each piece scanned (the scan copies what it keeps, so the piece's buffer is free again at once)."""
    line_base = 0
    for data in chunks:
        if isinstance(data, int):
            line_base += data
            yield data
            continue
        scan = scanner.scan(data, line_base, SCAN_THREADS, SCAN_MIN_PART_BYTES)
        n_bytes = len(data)
        del data
        line_base += scan["n_lines"]
        yield scan, n_bytes


def _read_ahead(items: Iterator[_T]) -> Iterator[_T]:
    """The items of ``items`` (never None), the next one made on a worker thread while the caller uses this one.

    The scanner releases the GIL, so reading and scanning piece k+1 overlaps
    with building and writing the rows of piece k; one piece is in flight.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="strace-scan") as pool:
        pending = pool.submit(next, items, None)
        while (item := pending.result()) is not None:
            pending = pool.submit(next, items, None)
            yield item


class _Assembler:
    """Turns the scanner's buffers for one piece into a :class:`_Chunk`; its islands go to :func:`_parse_chunk`."""

    def __init__(self, file: str, dropped: dict[str, int]):
        self.file, self.dropped = file, dropped

    def __call__(self, scan: dict, n_bytes: int) -> _Chunk:
        tables = [self._part_table(part) for part in scan["parts"] if part["rows"]]
        islands = self._islands(scan)
        table = _in_line_order(tables, islands.table)
        records_found = sum(t.num_rows for t in tables) + islands.records_found
        return _Chunk(table, islands.anchors, islands.chips, records_found, scan["n_lines"], _binary_line(scan), n_bytes)

    def _islands(self, scan: dict) -> _Chunk:
        """What the Python reader makes of the lines the scanner left, numbered as in the log."""
        text = memoryview(scan["islands"])
        if not len(text):
            return _Chunk(PARQUET_SCHEMA.empty_table(), ANCHOR_SCHEMA.empty_table(), CHIP_SCHEMA.empty_table(), 0, 0, None, 0)
        part = _parse_chunk(text, self.file, 0, self.dropped)
        if part.table.num_rows:
            numbers = np.frombuffer(scan["island_lines"], np.int64)
            line = numbers[part.table.column("line").to_numpy() - 1]
            part = part._replace(table=part.table.set_column(SPAN_COLUMNS.index("line"), "line", pa.array(line)))
        return part

    def _part_table(self, part: dict) -> pa.Table:
        """One thread's rows, wrapping the scanner's buffers (no copy)."""
        n = part["rows"]
        columns = {"line": _fixed(pa.int64(), n, part["line"])}
        for field, buffers in zip(REQUIRED_FIELDS[1:], part["fields"], strict=True):
            column = _FIELD_COLUMNS[field]
            kind = SPAN_SCHEMA.field(column).type
            columns[column] = _text(n, *buffers) if kind == pa.string() else _fixed(kind, n, buffers)
        columns["clk"] = _text(n, *part["clk"])
        for column, (data, valid) in zip(PROMOTED_INT_ATTRS.values(), part["int_attrs"], strict=True):
            columns[column] = _fixed(pa.int64(), n, data, valid)
        for column, (offsets, data, valid) in zip(PROMOTED_TEXT_ATTRS.values(), part["text_attrs"], strict=True):
            columns[column] = _text(n, offsets, data, valid)
        map_offsets, key_offsets, keys, value_offsets, values = part["attrs"]
        pairs = part["pairs"]
        offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(map_offsets)])
        columns["attrs"] = pa.MapArray.from_arrays(
            offsets, _text(pairs, key_offsets, keys), _text(pairs, value_offsets, values), type=ATTRS_TYPE
        )
        columns.update(_constant_columns(self.file, n))
        return pa.table([columns[name] for name in SPAN_COLUMNS], schema=PARQUET_SCHEMA)


def _fixed(kind: pa.DataType, n: int, data: Any, valid: Any = None) -> pa.Array:
    return pa.Array.from_buffers(kind, n, [None if valid is None else pa.py_buffer(valid), pa.py_buffer(data)])


def _text(n: int, offsets: Any, data: Any, valid: Any = None) -> pa.Array:
    if n == 0:
        return pa.array([], pa.string())
    return pa.Array.from_buffers(
        pa.string(), n, [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _constant_columns(file: str, n: int) -> dict[str, pa.Array]:
    """The columns that hold one value on every row of a log, each a dictionary of one entry (nothing per row to hash or write)."""
    zeros = pa.py_buffer(np.zeros(n, np.int32))
    columns = {}
    for name, value in (("source", _SOURCE), ("file", file), ("cat", ""), ("ph", _PHASE)):
        data = value.encode()
        entry = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(np.array([0, len(data)], np.int32)), pa.py_buffer(data)])
        columns[name] = pa.DictionaryArray.from_buffers(DICTIONARY_TYPE, n, [None, zeros], dictionary=entry)
    return columns


def _binary_line(scan: dict) -> int | None:
    """The line _as_utf8 names for the piece: the first U+FFFD after invalid bytes are replaced, or the first NUL."""
    found = []
    if scan["invalid_line"]:
        found.append(min(line for line in (scan["invalid_line"], scan["fffd_line"]) if line))
    if scan["nul_line"]:
        found.append(scan["nul_line"])
    return min(found) if found else None


# Above this many places to insert rows at, one gather is cheaper than slicing.
_MAX_SPLICES = 64


def _in_line_order(tables: list[pa.Table], inserted: pa.Table) -> pa.Table:
    """``tables`` (rows in line order) with the rows of ``inserted`` (other lines, in order) put in their places."""
    base = pa.concat_tables(tables) if tables else PARQUET_SCHEMA.empty_table()
    if not inserted.num_rows:
        return base
    lines = np.concatenate([chunk.to_numpy() for chunk in base.column("line").chunks] + [np.empty(0, np.int64)])
    at = np.searchsorted(lines, inserted.column("line").to_numpy())
    places, first = np.unique(at, return_index=True)
    if len(places) > _MAX_SPLICES:
        both = pa.concat_tables([base, inserted])
        order = np.argsort(np.concatenate([lines, inserted.column("line").to_numpy()]), kind="stable")
        return both.take(pa.array(order))
    pieces, done = [], 0
    for place, start, stop in zip(places, first, [*first[1:], len(at)], strict=True):
        pieces += [base.slice(done, place - done), inserted.slice(start, stop - start)]
        done = place
    return pa.concat_tables([*pieces, base.slice(done)])
