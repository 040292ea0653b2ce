"""Following SA_PROFILE fragments while their job runs: each poll converts only the lines appended since the last one.

A :class:`FragmentFollower` follows a fragments directory (every
``trace.<pid>.jsonl`` in it, those that appear later too: the directory is
listed at most once a second) or one fragment
named directly. Each fragment's new bytes are handed on up to their last
newline, so a line torn at the current end of the file waits for its rest.
Complete lines go through the reader ``analyze`` uses
(:class:`~dsprof.analysis.ingest.sa_profile.FragmentBatch`: the same line
decoding, span conversion and counts of malformed lines), numbered on from the
fragment's count, so the rows equal those of a whole-file read.

* A fragment replaced by another file (removed and made again: a new main
  process removes the stale fragments of an earlier run) is read to its end,
  its last line handed on as a whole read ends, and the new file is read from
  its start. One rewritten in place — shorter than what was read, or its first
  bytes changed (a file made again on a reused inode) — is read again from its
  start, after its held line is handed on; a note says so.
* A line longer than ``JsonLimits.max_event_bytes`` is counted
  (``overlong_line``) and skipped to its newline, never held whole.
* ``B``/``E`` events pair within one poll's lines only (SA_PROFILE writes
  complete ``X`` events; the final outputs read the fragments whole).
* :meth:`FragmentFollower.finish` hands on everything left, a torn last line
  too (counted as ``analyze`` counts it).
"""

from __future__ import annotations

import io
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from dsprof.analysis.ingest.follow import POLL_BYTES
from dsprof.analysis.ingest.sa_profile import FragmentBatch
from dsprof.analysis.spans import Trace, merge_traces
from dsprof.errors import InputError
from dsprof.profiler import artifacts
from dsprof.profiler.chrome_json import DEFAULT_LIMITS, JsonLimits, LineBatch, line_batches

# A fragment's first bytes, kept and compared every poll: changed, the file was written again from its start.
HEAD_BYTES = 4096
# A fragments directory is listed at most this often (seconds): a new fragment means a new process, and a job
# may have thousands; the fragments already open are read every poll.
LIST_INTERVAL_S = 1.0


@dataclass
class _Fragment:
    """One fragment file being read: where reading stands, and the start of a line not complete yet."""

    path: Path
    handle: BinaryIO
    identity: tuple[int, int]  # (device, inode)
    read: int = 0  # bytes read from the file
    lines: int = 0  # lines handed on
    held: bytearray = field(default_factory=bytearray)
    head: bytes = b""  # the file's first bytes, up to HEAD_BYTES
    skipping: bool = False  # inside an overlong line: its bytes are dropped up to its newline


class FragmentFollower:
    """The fragments of ``source`` (a fragments directory, or one ``.jsonl``); :meth:`poll` converts their new lines."""

    def __init__(self, source: str | os.PathLike, limits: JsonLimits = DEFAULT_LIMITS, list_interval_s: float = LIST_INTERVAL_S):
        self.source = Path(source)
        self.limits = limits
        self.list_interval_s = list_interval_s
        self.counts = Trace()  # what was handed on, less its rows: lines read, lines dropped by reason, names, notes
        self.total_read = 0  # bytes read from every fragment file
        self._open: dict[Path, _Fragment] = {}
        self._listing: list[Path] = []
        self._listed_at: float | None = None  # time.monotonic() of the last listing
        self.finished = False  # finish() was called: nothing more is read

    def poll(self) -> Trace:
        """Read what every fragment got since the last poll; the rows of its complete lines (their counts in ``counts``)."""
        if self.finished:
            return Trace()
        batch = FragmentBatch(self.limits)
        for path in dict.fromkeys([*self._listed(), *self._open]):
            self._poll_one(path, batch)
        return self._converted(batch)

    def finish(self) -> Trace:
        """The rows of everything left, a torn last line too, as a whole-file read ends; the files are closed."""
        self._listed_at = None  # every fragment there now, however recently the directory was listed
        tail = self.poll()
        batch = FragmentBatch(self.limits)
        for fragment in list(self._open.values()):
            self._drain(fragment, batch)
            self._close(fragment)
        self.finished = True
        return merge_traces([tail, self._converted(batch)])

    def close(self) -> None:
        """Close the fragments open (the watch was given up); nothing more is read."""
        self.finished = True
        for fragment in list(self._open.values()):
            self._close(fragment)

    def _listed(self) -> list[Path]:
        if self.source.suffix == ".jsonl":
            return [self.source] if self.source.is_file() else []
        now = time.monotonic()
        if self._listed_at is None or now - self._listed_at >= self.list_interval_s:
            self._listing, self._listed_at = artifacts.fragment_files(self.source), now
        return self._listing

    def _poll_one(self, path: Path, batch: FragmentBatch) -> None:
        """A replaced fragment is read to its end first; a truncated one again from its start; then the new bytes."""
        fragment = self._open.get(path)
        try:
            status = os.stat(path)
        except FileNotFoundError:
            status = None
        if fragment is not None and (status is None or (status.st_dev, status.st_ino) != fragment.identity):
            self._drain(fragment, batch)
            self._close(fragment)
            fragment = None
        if status is None:
            return
        fragment = fragment or self._opened(path)
        if self._rewritten(fragment):
            self._hand_on(fragment, bytes(fragment.held), batch)
            self.counts.notes.append(f"{path}: rewritten after {fragment.read:,} bytes were read; read again from its start")
            self._close(fragment)
            fragment = self._opened(path)
        self._read_new(fragment, batch, final=False)

    @staticmethod
    def _rewritten(fragment: _Fragment) -> bool:
        """Whether the open file is shorter than what was read, or its first bytes are no longer those read."""
        if os.fstat(fragment.handle.fileno()).st_size < fragment.read:
            return True
        return bool(fragment.head) and os.pread(fragment.handle.fileno(), len(fragment.head), 0) != fragment.head

    def _opened(self, path: Path) -> _Fragment:
        try:
            handle = path.open("rb")
        except OSError as exc:
            raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
        status = os.fstat(handle.fileno())
        self._open[path] = _Fragment(path, handle, (status.st_dev, status.st_ino))
        return self._open[path]

    def _close(self, fragment: _Fragment) -> None:
        fragment.handle.close()
        del self._open[fragment.path]

    def _drain(self, fragment: _Fragment, batch: FragmentBatch) -> None:
        """Read the fragment to its end and hand on all of it (its last line, torn or not, included)."""
        while self._read_new(fragment, batch, final=False):
            pass
        self._read_new(fragment, batch, final=True)

    def _read_new(self, fragment: _Fragment, batch: FragmentBatch, final: bool) -> int:
        """Read up to POLL_BYTES more and hand on the complete lines (``final``: everything held); the bytes read."""
        data = fragment.handle.read(POLL_BYTES)
        got = len(data)
        if len(fragment.head) < HEAD_BYTES:
            fragment.head += data[: HEAD_BYTES - len(fragment.head)]
        fragment.read += got
        self.total_read += got
        if fragment.skipping:
            newline = data.find(b"\n")
            fragment.skipping = newline < 0
            data = b"" if newline < 0 else data[newline + 1 :]
        fragment.held += data
        cut = len(fragment.held) if final else fragment.held.rfind(b"\n") + 1
        if cut > 0:
            ready = bytes(fragment.held[:cut])
            del fragment.held[:cut]
            self._hand_on(fragment, ready, batch)
        if len(fragment.held) > self.limits.max_event_bytes:  # as line_batches does: counted once, skipped to its newline
            fragment.lines += 1
            batch.add_lines(str(fragment.path), [LineBatch(fragment.lines, [b""], overlong=[fragment.lines])])
            fragment.held, fragment.skipping = bytearray(), True
        return got

    def _hand_on(self, fragment: _Fragment, ready: bytes, batch: FragmentBatch) -> None:
        """Decode whole lines (a last one without its newline only at the end) into the batch, numbered on."""
        if not ready:
            return
        batch.add_lines(str(fragment.path), line_batches(io.BytesIO(ready), self.limits, first_line=fragment.lines + 1))
        fragment.lines += ready.count(b"\n") + (not ready.endswith(b"\n"))

    def _converted(self, batch: FragmentBatch) -> Trace:
        """The batch's rows; its counts, names and notes are added to ``counts``."""
        if not batch.files:
            return Trace()
        trace = batch.convert()
        for reason, count in trace.dropped.items():
            self.counts.count(reason, count)
        self.counts.records_read += trace.records_read
        self.counts.process_names.update(trace.process_names)
        self.counts.thread_names.update(trace.thread_names)
        self.counts.notes.extend(trace.notes)
        return trace


__all__ = ["FragmentFollower"]
