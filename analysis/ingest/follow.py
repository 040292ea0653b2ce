"""Following a growing STRACE log: each poll parses only the bytes written since the last one.

A :class:`LogFollower` hands on the new bytes only up to the start of the last
line that opens with '[': no record spans such a cut (:mod:`.strace_pieces`), so
a record torn at the current end of the file waits for its rest. The bytes go
through the reader ``read_strace_log`` uses, lines numbered on from the file's
count, so the rows equal those of a whole-file read; :meth:`LogFollower.finish`
parses the rest as a whole-file read would at the file's end. Rotation,
truncation and what is refused: docs/WATCH.md, "What it reads".
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from dsprof.analysis.ingest.followed_file import FollowedFile
from dsprof.analysis.ingest.strace_log import LogTally, parsed_pieces, refuse_binary
from dsprof.analysis.ingest.strace_pieces import HEAD_BYTES, MAX_LINE_BYTES, PIECE_BYTES, SkippedLines, mapped_pieces
from dsprof.analysis.store.spans import Trace

# Bytes read from one file in one poll, at most: a follower that starts on a big log catches up piece by piece.
POLL_BYTES = PIECE_BYTES
# Held-back bytes without a line opening with '[' that are handed on anyway (cut as the whole-file reader cuts).
HOLD_LIMIT = PIECE_BYTES + MAX_LINE_BYTES


class LogFollower:
    """One followed text log (see the module docstring); :meth:`poll` returns the span tables of the new records."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.name = str(path)
        self.counts = LogTally()
        self._file: FollowedFile | None = None
        self.total_read = 0  # bytes read from every file this path has named (rotations, truncations)
        self._held = bytearray()  # read but not parsed yet: from the last line opening with '['
        self._line_base = 0  # lines of the open file parsed so far
        self._head_checked = False
        self.finished = False  # finish() was called: nothing more is read
        self.identities: set[tuple[int, int]] = set()  # (device, inode) of every file followed under this path

    def poll(self) -> list[pa.Table]:
        """Read what was written since the last poll; the span tables of the records now complete."""
        tables: list[pa.Table] = []
        if self.finished:
            return tables
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            current = None  # renamed away, the new file not made yet: keep reading the old one
        if self._file is not None and current is not None and not self._file.named_by(current):
            self._drain(tables)  # rotated: the old file to its end, then the new one
            self._close()
        if self._file is None:
            if current is None:
                return tables
            self._open()
        assert self._file is not None
        if self._file.rewritten():
            self._parse(bytes(self._held), tables)
            self.counts.notes.append(
                f"{self.name}: truncated or rewritten after {self._file.read:,} bytes were read; read again from its start"
            )
            self._file.restart()
            self._restart()
        self._read_new(tables, final=False)
        return tables

    def finish(self) -> list[pa.Table]:
        """The tables of everything left (a torn last record too), as a whole-file read ends; the file is closed."""
        tables = self.poll()
        if self._file is not None:
            self._drain(tables)
            self._close()
        self.finished = True
        return tables

    def trace(self) -> Trace:
        """A Trace of what was followed, without its spans (they went to the caller): the fields a whole-file read fills."""
        return self.counts.trace(self.name)

    def _open(self) -> None:
        self._file = FollowedFile(self.path, expected="a text log")
        assert self._file.identity is not None
        self.identities.add(self._file.identity)
        self._restart()

    def _restart(self) -> None:
        """From the open file's start: nothing held, lines counted from 1."""
        self._held, self._line_base, self._head_checked = bytearray(), 0, False

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None

    def _drain(self, tables: list[pa.Table]) -> None:
        """Read the open file to its end and parse all of it (its last record, torn or not, included)."""
        while self._read_new(tables, final=False):
            pass
        self._read_new(tables, final=True)

    def _read_new(self, tables: list[pa.Table], final: bool) -> int:
        """Read up to POLL_BYTES more and parse what is complete (``final``: everything held); the bytes read."""
        assert self._file is not None
        data = self._file.read_more(POLL_BYTES)
        self.total_read += len(data)
        self._held += data
        if not self._head_checked and self._held:
            refuse_binary(bytes(self._held[:HEAD_BYTES]), self.name)
            self._head_checked = True
        cut = len(self._held) if final or len(self._held) >= HOLD_LIMIT else self._held.rfind(b"\n[") + 1
        if cut > 0:
            ready = bytes(self._held[:cut])
            del self._held[:cut]
            self._parse(ready, tables)
        return len(data)

    def _parse(self, data: bytes, tables: list[pa.Table]) -> None:
        """Parse complete bytes with the whole-file reader's functions, lines numbered on from the file's count."""
        if not data:
            return
        for part in parsed_pieces(mapped_pieces(data), self.name, self._line_base):
            self.counts.add(part)
            if isinstance(part, SkippedLines):
                self._line_base += part.count
                continue
            if part.table.num_rows:
                tables.append(part.table)
            self._line_base += part.n_lines


__all__ = ["LogFollower"]
