"""A text log cut into pieces that each parse on their own (the STRACE reader's unit of work).

A file is memory-mapped a window at a time and its pieces are views of it
(:func:`mapped_pieces`); a pipe is read into a reused buffer (:func:`log_pieces`),
with the same cuts. Either way the reader's memory, and its address space,
stay bounded by a few pieces whatever the log's size.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

# Bytes parsed at a time (cut at a line boundary); bounds the temporaries of a big log.
PIECE_BYTES = 64 << 20
# Longest line kept: a longer one (a binary blob, /dev/zero) is skipped and counted
# as ``overlong_line``, and reading goes on, so memory stays bounded whatever the input.
MAX_LINE_BYTES = 1 << 20

# Bytes of a file mapped at a time (at least a piece's worth more): the address space a read holds, whatever the
# log's size (a whole 4 GB log mapped at once would not fit under a 4 GB address-space cap with the analysis beside it).
MAP_BYTES = 256 << 20

# Bytes at the head of a log looked at before it is parsed (a binary file is refused from them).
HEAD_BYTES = 1 << 20


@dataclass(frozen=True)
class SkippedLines:
    """Overlong lines a splitter skipped: no rows, only their count (``overlong_line``)."""

    count: int


# What the splitters yield: a piece of the log, or the lines they skipped as overlong.
Piece = memoryview | SkippedLines


class MappedLog:
    """A regular file mapped a window at a time: :meth:`window` maps the stretch asked for where the window in hand
    does not hold it. A window let go is unmapped once no piece refers to it any longer."""

    def __init__(self, log_file: BinaryIO, size: int):
        self.size = size
        self._fd = log_file.fileno()
        self._window: mmap.mmap | None = None
        self._base = 0  # the file offset of the window's first byte
        self._dropped = 0  # the window's bytes whose pages were let go (behind the reader)
        self.window(0, min(size, HEAD_BYTES))

    def __len__(self) -> int:
        return self.size

    def window(self, start: int, end: int) -> tuple[mmap.mmap, int]:
        """A mapping that holds file bytes [start, end), and the file offset of its first byte."""
        if self._window is None or start < self._base or end > self._base + len(self._window):
            base = start - start % mmap.ALLOCATIONGRANULARITY
            length = min(max(MAP_BYTES, end - base), self.size - base)
            self._window = mmap.mmap(self._fd, length, access=mmap.ACCESS_READ, offset=base)
            self._window.madvise(mmap.MADV_SEQUENTIAL)
            self._base, self._dropped = base, 0
        return self._window, self._base

    def head(self) -> bytes:
        window, _ = self.window(0, min(self.size, HEAD_BYTES))
        return window[: min(self.size, HEAD_BYTES)]

    def drop_before(self, offset: int) -> None:
        """Let the window's pages before file ``offset`` go from this process's memory (read again from the file if needed)."""
        if self._window is not None and offset > self._base:
            self._dropped = _drop_pages(self._window, self._dropped, min(offset - self._base, len(self._window)))

    def close(self) -> None:
        if self._window is not None:
            with contextlib.suppress(BufferError):  # a view still held: the map goes with it
                self._window.close()
            self._window = None


def map_file(log_file: BinaryIO) -> MappedLog | None:
    """The file mapped a window at a time (read-only, read ahead), or None where it cannot be (a pipe, a device, empty)."""
    try:
        status = os.fstat(log_file.fileno())
        if not stat.S_ISREG(status.st_mode) or status.st_size == 0:
            return None
        return MappedLog(log_file, status.st_size)
    except (OSError, ValueError):
        return None


def log_pieces(log_file: io.BufferedIOBase | io.RawIOBase) -> Iterator[Piece]:
    """The log in pieces of about PIECE_BYTES, each cut just before a line that opens with '['.

    No record spans such a cut: a record only ever continues onto a line that
    does not open with '[' (a log prefix or a new marker), and the rest of a
    marker cut by a newline (``ACE] v=1``) does not open with '[' either. So
    every piece parses on its own exactly as it would within the whole log.
    A piece without such a line grows by at most MAX_LINE_BYTES; then it is cut
    at its last newline, and a line longer than that is skipped (an ``int``
    is yielded for it), so the buffer never outgrows PIECE_BYTES + MAX_LINE_BYTES.

    Pieces are read into one buffer, reused as long as nothing parsed from
    the previous piece still refers to it (the rows are copies), which saves
    faulting in fresh memory for every piece.
    """
    limit = PIECE_BYTES + MAX_LINE_BYTES
    piece, kept = bytearray(PIECE_BYTES), 0  # kept: bytes after the last cut, moved to the front
    skipping = False  # inside an overlong line: drop bytes up to its newline
    while True:
        if kept == len(piece):  # no cut in the whole buffer yet: make room for more
            piece.extend(bytes(min(PIECE_BYTES, limit - len(piece))))
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
                yield SkippedLines(1)
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


def mapped_pieces(data: MappedLog | bytes) -> Iterator[Piece]:
    """The pieces :func:`log_pieces` cuts the same log into, as views of the log mapped in memory: no copy.

    The same steps as log_pieces, on file offsets: the buffer is the stretch of the
    log from ``start``, ``kept`` bytes of it already "read", at most
    ``capacity`` bytes (grown as log_pieces grows its buffer). Pages of a mapped
    file behind the reader are dropped, so its memory stays bounded.
    """
    size = len(data)
    limit = PIECE_BYTES + MAX_LINE_BYTES
    capacity, start, kept, skipping = PIECE_BYTES, 0, 0, False
    while True:
        if kept == capacity:
            capacity += min(PIECE_BYTES, limit - capacity)
        got = min(capacity - kept, size - start - kept)
        if got <= 0:
            if kept and not skipping:
                buffer, base = _window(data, start, start + kept)
                yield memoryview(buffer)[start - base : start - base + kept]
            return
        filled = kept + got
        buffer, base = _window(data, start, start + filled)
        at, upto = start - base, start - base + filled  # the stretch, as offsets in the window
        if skipping:
            newline = buffer.find(b"\n", at, upto)
            skipping = newline < 0
            start, kept = (start + filled, 0) if skipping else (base + newline + 1, upto - newline - 1)
            if isinstance(data, MappedLog):  # the skipped bytes were read through: let their pages go
                data.drop_before(start)
            continue
        cut = buffer.rfind(b"\n[", at, upto) + 1
        if cut == 0 and filled >= limit:
            cut = buffer.rfind(b"\n", at, upto) + 1
            if cut == 0:
                yield SkippedLines(1)
                skipping, start, kept = True, start + filled, 0
                continue
        if cut == 0:
            kept = filled
            continue
        yield memoryview(buffer)[at:cut]
        if isinstance(data, MappedLog):
            data.drop_before(base + cut)
        start, kept = base + cut, upto - cut


def _window(data: MappedLog | bytes, start: int, end: int) -> tuple[mmap.mmap | bytes, int]:
    return data.window(start, end) if isinstance(data, MappedLog) else (data, 0)


def _drop_pages(mapped: mmap.mmap, done: int, upto: int) -> int:
    """Let the pages of [done, upto) go from this process's memory (they are read again from the file if needed)."""
    upto -= upto % mmap.PAGESIZE
    if upto > done:
        mapped.madvise(mmap.MADV_DONTNEED, done, upto - done)
    return max(done, upto)


def read_head(log_file: io.BufferedIOBase) -> bytes:
    """The first HEAD_BYTES of a stream (fewer only at its end)."""
    parts, got = [], 0
    while got < HEAD_BYTES and (part := log_file.read(HEAD_BYTES - got)):
        parts.append(part)
        got += len(part)
    return b"".join(parts)


class HeadThenRest(io.RawIOBase):
    """A stream whose head was already read (:func:`read_head`): that head, then the rest of the stream."""

    def __init__(self, head: bytes, rest: io.BufferedIOBase):
        super().__init__()
        self._head, self._at, self._rest = head, 0, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._at < len(self._head):
            with memoryview(buffer) as view:
                n = min(len(view), len(self._head) - self._at)
                view[:n] = self._head[self._at : self._at + n]
            self._at += n
            return n
        return self._rest.readinto(buffer)
