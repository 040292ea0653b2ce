"""Reader for STRACE host-span records in any text log (docs/FORMATS.md, "STRACE").

The log is cut into pieces of about ``strace_pieces.PIECE_BYTES`` where a line
opens with '[' (no record can span such a cut), so the time taken grows linearly
with the log and memory stays bounded by a few pieces. Each piece is read by the
compiled scanner where it is built (:mod:`.compiled`), else by the Python reader
(:mod:`.strace_lines`, which defines the result: both give the same rows, drops
and counts on any input, tests/test_ingest_fast.py). Reading rules and drop
counts: docs/FORMATS.md, "STRACE as dsprof reads it".
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from dsprof.analysis.ingest import strace_pieces
from dsprof.analysis.ingest.compiled import compiled_module, compiled_scanner, scanned_pieces
from dsprof.analysis.ingest.sink import SpanSink
from dsprof.analysis.ingest.strace_lines import ParsedPiece, as_utf8, parse_piece
from dsprof.analysis.ingest.strace_pieces import (
    HEAD_BYTES,
    HeadThenRest,
    Piece,
    SkippedLines,
    log_pieces,
    map_file,
    mapped_pieces,
    read_head,
)
from dsprof.analysis.ingest.strace_records import Drops
from dsprof.analysis.store.spans import ANCHOR_SCHEMA, CHIP_SCHEMA, SPAN_SCHEMA, Trace
from dsprof.compiled import PURE_PYTHON_ENV
from dsprof.errors import InputError
from dsprof.profiler.strace_format import ANCHOR_MARKER, CHIP_READY_MARKER, STRACE_MARKER
from dsprof.progress import Progress

_MARKERS = tuple(marker.encode() for marker in (STRACE_MARKER, ANCHOR_MARKER, CHIP_READY_MARKER))

__all__ = ["PURE_PYTHON_ENV", "SpanSink", "compiled_module", "compiled_scanner", "parse_strace_bytes", "parsed_pieces", "read_strace_log"]


def read_strace_log(path: str | os.PathLike, progress: Progress = None, sink: SpanSink | None = None) -> Trace:
    """Read every STRACE record, clock anchor and chip_process line of a text log.

    The file is read and parsed a chunk at a time (see :func:`~dsprof.analysis.ingest.strace_pieces.log_pieces`), so
    time grows linearly with its size and memory holds one chunk plus the rows
    (or, with a ``sink``, one chunk's rows: each chunk's span table goes to it).
    """
    path = Path(path)
    try:
        with path.open("rb") as log_file:
            size = os.fstat(log_file.fileno()).st_size
            mapped = map_file(log_file)
            if mapped is None:  # a pipe, a device, or empty
                head = read_head(log_file)
                refuse_binary(head, str(path))
                return _parse_pieces(log_pieces(HeadThenRest(head, log_file)), str(path), size, progress, sink)
            try:
                refuse_binary(mapped.head(), str(path))
                return _parse_pieces(mapped_pieces(mapped), str(path), size, progress, sink)
            finally:
                mapped.close()
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None


def parse_strace_bytes(data: bytes, file: str, progress: Progress = None) -> Trace:
    """Parse a whole log held in memory; ``file`` names it in rows and errors."""
    refuse_binary(data[:HEAD_BYTES], file)
    return _parse_pieces(mapped_pieces(data), file, len(data), progress, None)


def refuse_binary(head: bytes, file: str) -> None:
    """Refuse a file whose head holds a NUL byte and no record: binary, not a log (/dev/zero, an image).

    Said at once, before a binary file of any size (or an endless device) is
    read through; a log damaged further on is still read for what it holds.
    """
    if b"\0" not in head or any(marker in head for marker in _MARKERS):
        return
    _, line = as_utf8(memoryview(head))
    raise InputError(file, "binary data, not a text log", line=line, expected="a text log with [STRACE] records")


def _parse_pieces(pieces: Iterable[Piece], file: str, size: int, progress: Progress, sink: SpanSink | None) -> Trace:
    """Parse each piece of a log and stack the results (lines numbered across pieces)."""
    tally = LogTally()
    tables: list[pa.Table] = []
    bytes_done = 0
    for part in parsed_pieces(pieces, file):
        tally.add(part)
        if isinstance(part, SkippedLines):  # counted, no rows
            continue
        if sink is None:
            tables.append(part.table)
        elif part.table.num_rows:
            sink.add(part.table)
        bytes_done += part.n_bytes
        if progress is not None and size > strace_pieces.PIECE_BYTES:
            progress(f"{file}: {bytes_done / 2**20:,.0f}/{size / 2**20:,.0f} MiB, {tally.lines:,} lines")
    trace = tally.trace(file)
    trace.spans = pa.concat_tables(tables).cast(SPAN_SCHEMA) if tables else SPAN_SCHEMA.empty_table()
    return trace


@dataclass
class LogTally:
    """What reading a log keeps beside its rows: the side tables and the counts behind ``Trace``'s fields.

    One home for a whole-file read (:func:`read_strace_log`) and a follower
    (:mod:`.follow`), so both count records, lines and drops alike.
    """

    anchors: list[pa.Table] = field(default_factory=list)
    chips: list[pa.Table] = field(default_factory=list)
    drops: Drops = field(default_factory=Drops)
    records_found: int = 0
    lines: int = 0
    binary_at: int | None = None  # the first line of binary data seen, should no record be found at all
    notes: list[str] = field(default_factory=list)

    def add(self, part: ParsedPiece | SkippedLines) -> None:
        """Count one result of :func:`parsed_pieces` (a parsed piece, or a count of overlong lines skipped)."""
        if isinstance(part, SkippedLines):
            self.drops.count("overlong_line", part.count)
            self.lines += part.count
            return
        if part.anchors.num_rows:
            self.anchors.append(part.anchors)
        if part.chips.num_rows:
            self.chips.append(part.chips)
        self.records_found += part.records_found
        self.drops.add(part.drops)
        if self.binary_at is None and part.binary_at is not None:
            self.binary_at = self.lines + part.binary_at
        self.lines += part.n_lines

    def trace(self, file: str) -> Trace:
        """A Trace of the log without its spans; binary data with no record in it is refused, as at the head."""
        trace = Trace(files=[file])
        trace.anchors = pa.concat_tables(self.anchors) if self.anchors else ANCHOR_SCHEMA.empty_table()
        trace.chip_devices = pa.concat_tables(self.chips) if self.chips else CHIP_SCHEMA.empty_table()
        found_anything = self.records_found or trace.anchors.num_rows or trace.chip_devices.num_rows
        if not found_anything and self.binary_at is not None:
            raise InputError(file, "binary data, not a text log", line=self.binary_at, expected="a text log with [STRACE] records")
        trace.dropped = {k: v for k, v in sorted(self.drops.counts.items()) if v}
        trace.drop_sites = {reason: f"{file}:{line}" for reason, line in sorted(self.drops.first_lines.items())}
        side_drops = trace.dropped.get("bad_anchor", 0) + trace.dropped.get("bad_chip_process", 0)
        trace.records_read = self.records_found + trace.anchors.num_rows + trace.chip_devices.num_rows + side_drops
        trace.lines_read = self.lines
        trace.notes = list(self.notes)
        return trace


def parsed_pieces(chunks: Iterable[Piece], file: str, line_base: int = 0) -> Iterator[ParsedPiece | SkippedLines]:
    """Each piece parsed, with what it dropped (or the count of overlong lines skipped), by the compiled scanner where it is available.

    Lines are numbered from ``line_base`` + 1: a follower (:mod:`.follow`) parses a file's new bytes, numbered as in the whole file.
    """
    scanner = compiled_scanner()
    if scanner is None:
        yield from _python_pieces(chunks, file, line_base)
    else:
        yield from scanned_pieces(scanner, chunks, file, line_base)


def _python_pieces(chunks: Iterable[Piece], file: str, line_base: int) -> Iterator[ParsedPiece | SkippedLines]:
    """The pure-Python reader: each piece parsed by :func:`parse_piece`."""
    for data in chunks:
        if isinstance(data, SkippedLines):
            line_base += data.count
            yield data
            continue
        part = parse_piece(data, file, line_base)
        del data  # so that the next piece may reuse its buffer
        line_base += part.n_lines
        yield part
