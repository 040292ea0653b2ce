"""The compiled STRACE scanner (``_strace_scan.c``): glue to the reader.

The scanner reads the lines whose records all follow the plain grammar and
hands back the rest ("islands": torn, continued or garbled records, other
versions, anchors, chip_process lines), which :func:`~dsprof.analysis.ingest.strace_lines.parse_piece`
reads exactly as the pure-Python reader does; the two are put back together
in line order, so the result is the Python reader's, row for row
(tests/test_ingest_fast.py).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from dsprof.analysis.ingest.strace_lines import ParsedPiece, parse_piece
from dsprof.analysis.ingest.strace_pieces import Piece, SkippedLines
from dsprof.analysis.ingest.strace_records import FIELD_COLUMNS, Drops, constant_columns
from dsprof.analysis.store.spans import (
    ANCHOR_SCHEMA,
    ATTRS_TYPE,
    CHIP_SCHEMA,
    PARQUET_SCHEMA,
    PROMOTED_INT_ATTRS,
    PROMOTED_TEXT_ATTRS,
    SPAN_COLUMNS,
    SPAN_SCHEMA,
)
from dsprof.compiled import use_compiled
from dsprof.profiler import strace_format as fmt
from dsprof.profiler.strace_format import FIELD_KINDS, REQUIRED_FIELDS, STRACE_MARKER, STRACE_VERSION, VALUE_FIELDS

try:
    from dsprof.analysis.ingest import _strace_scan  # type: ignore[attr-defined]
except ImportError:  # not built here (no C compiler at install time): the Python reader does all
    _strace_scan = None
_BUILT: ModuleType | None = _strace_scan

# Threads of one scan: the piece is shared out at lines that open with '[', in parts of at least SCAN_MIN_PART_BYTES.
SCAN_THREADS = max(1, min(len(os.sched_getaffinity(0)), 16))
SCAN_MIN_PART_BYTES = 1 << 20

_T = TypeVar("_T")


def compiled_module() -> Any | None:
    """The compiled scanner's module, or None: not built, not importable, or ``PURE_PYTHON_ENV`` asks for Python."""
    return use_compiled(_BUILT)


def compiled_scanner() -> Any | None:
    """The compiled scanner, or None (see :func:`compiled_module`)."""
    module = compiled_module()
    return None if module is None else scanner_of(module)


@functools.cache
def scanner_of(module: Any) -> Any:
    """A Scanner told the format's vocabulary (from strace_format and spans, never spelled out in C)."""
    return module.Scanner(
        marker=STRACE_MARKER.encode(),
        side_markers=(fmt.ANCHOR_MARKER.encode(), fmt.CHIP_READY_MARKER.encode()),
        version=str(STRACE_VERSION).encode(),
        fields=tuple(f.encode() for f in REQUIRED_FIELDS),
        kinds=tuple(FIELD_KINDS[f].encode() for f in REQUIRED_FIELDS),
        ts_field=REQUIRED_FIELDS.index(fmt.TS_FIELD),
        dur_field=REQUIRED_FIELDS.index(fmt.DUR_FIELD),
        clk=(fmt.CLK_ATTR.encode(), fmt.CLK_DEVICE.encode(), fmt.CLK_HOST.encode()),
        int_keys=tuple(k.encode() for k in PROMOTED_INT_ATTRS),
        text_keys=tuple(k.encode() for k in PROMOTED_TEXT_ATTRS),
    )


def scanned_pieces(scanner: Any, pieces: Iterable[Piece], file: str, line_base: int = 0) -> Iterator[ParsedPiece | SkippedLines]:
    """Each piece read by ``scanner``, with what it dropped (or the count of overlong lines skipped).

    ``line_base``: lines of the file before the first piece (a follower hands on a file's new bytes only).
    """
    assemble = _Assembler(file)
    for scanned in _read_ahead(_scanned(scanner, pieces, line_base)):
        yield scanned if isinstance(scanned, SkippedLines) else assemble(*scanned)


_Scanned = tuple[dict, int]  # the scanner's result for a piece, and the piece's size


def _scanned(scanner: Any, chunks: Iterable[Piece], line_base: int) -> Iterator[_Scanned | SkippedLines]:
    """Each piece scanned (the scan copies what it keeps, so the piece's buffer is free again at once)."""
    for data in chunks:
        if isinstance(data, SkippedLines):
            line_base += data.count
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
    The scanner never runs on the main thread: a SIGINT interrupts the main
    thread's wait here at once, and leaving the pool waits only for the piece
    in flight (tests/test_ingest_streams.py).
    """
    with ThreadPoolExecutor(1, thread_name_prefix="strace-scan") as pool:
        pending = pool.submit(next, items, None)
        while (item := pending.result()) is not None:
            pending = pool.submit(next, items, None)
            yield item


class _Assembler:
    """Turns the scanner's buffers for one piece into a :class:`ParsedPiece`; its islands go to :func:`parse_piece`."""

    def __init__(self, file: str):
        self.file = file

    def __call__(self, scan: dict, n_bytes: int) -> ParsedPiece:
        tables = [self._part_table(part) for part in scan["parts"] if part["rows"]]
        islands = self._islands(scan)
        table = _in_line_order(tables, islands.table)
        records_found = sum(t.num_rows for t in tables) + islands.records_found
        return ParsedPiece(
            table, islands.anchors, islands.chips, records_found, scan["n_lines"], _binary_line(scan), n_bytes, islands.drops
        )

    def _islands(self, scan: dict) -> ParsedPiece:
        """What the Python reader makes of the lines the scanner left, numbered as in the log."""
        text = memoryview(scan["islands"])
        if not len(text):
            return ParsedPiece(PARQUET_SCHEMA.empty_table(), ANCHOR_SCHEMA.empty_table(), CHIP_SCHEMA.empty_table(), 0, 0, None, 0, Drops())
        part = parse_piece(text, self.file, 0)
        numbers = np.frombuffer(scan["island_lines"], np.int64)
        if part.table.num_rows:
            line = numbers[part.table.column("line").to_numpy() - 1]
            part = part._replace(table=part.table.set_column(SPAN_COLUMNS.index("line"), "line", pa.array(line)))
        return part._replace(drops=part.drops.renumbered(lambda at: int(numbers[at - 1])))

    def _part_table(self, part: dict) -> pa.Table:
        """One thread's rows, wrapping the scanner's buffers (no copy)."""
        n = part["rows"]
        columns = {"line": _fixed(pa.int64(), n, part["line"])}
        for field, buffers in zip(VALUE_FIELDS, part["fields"], strict=True):
            column = FIELD_COLUMNS[field]
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
        columns.update(constant_columns(self.file, n))
        return pa.table([columns[name] for name in SPAN_COLUMNS], schema=PARQUET_SCHEMA)


def _fixed(kind: pa.DataType, n: int, data: Any, valid: Any = None) -> pa.Array:
    return pa.Array.from_buffers(kind, n, [None if valid is None else pa.py_buffer(valid), pa.py_buffer(data)])


def _text(n: int, offsets: Any, data: Any, valid: Any = None) -> pa.Array:
    if n == 0:
        return pa.array([], pa.string())
    return pa.Array.from_buffers(
        pa.string(), n, [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)]
    )


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
