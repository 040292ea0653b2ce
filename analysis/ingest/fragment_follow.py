"""Following SA_PROFILE fragments while their job runs: each poll converts only the lines appended since the last one.

A :class:`FragmentFollower` follows a fragments directory (those fragments that
appear later too) or one fragment. New bytes are handed on up to their last
newline, and complete lines go through the reader ``analyze`` uses
(:class:`~dsprof.analysis.ingest.sa_profile.FragmentBatch`), numbered on from
the fragment's count, so the rows equal those of a whole-file read;
:meth:`FragmentFollower.finish` hands on the rest, a torn last line too.
Replaced and rewritten fragments, the descriptor cap, long lines:
docs/WATCH.md, "What it reads".
"""

from __future__ import annotations

import io
import os
import resource
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from dsprof.analysis.ingest.follow import POLL_BYTES
from dsprof.analysis.ingest.followed_file import FollowedFile
from dsprof.analysis.ingest.sa_profile import FragmentBatch
from dsprof.analysis.store.spans import Trace, merge_traces
from dsprof.profiler import artifacts
from dsprof.profiler.chrome_json import DEFAULT_LIMITS, JsonLimits, LineBatch, line_batches

# A fragments directory is listed at most this often (seconds): a new fragment means a new process, and a job
# may have thousands; the fragments already open are read every poll.
LIST_INTERVAL_S = 1.0
# Fragments holding a descriptor at most (fewer under a low descriptor limit: open_budget), whatever the number of processes.
MAX_OPEN = 64
EXPECTED = "an SA_PROFILE fragment (trace.<pid>.jsonl)"


@dataclass
class _Fragment:
    """One fragment file being read: where reading stands, and the start of a line not complete yet."""

    file: FollowedFile
    lines: int = 0  # lines handed on
    held: bytearray = field(default_factory=bytearray)
    skipping: bool = False  # inside an overlong line: its bytes are dropped up to its newline

    def restart(self) -> None:
        """From the file's start: no line handed on, nothing held."""
        self.lines, self.held, self.skipping = 0, bytearray(), False


def open_budget() -> int:
    """MAX_OPEN, or a quarter of the process's descriptor limit where lower: the rest is for the logs, DuckDB, outputs."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_OPEN if soft == resource.RLIM_INFINITY else max(1, min(MAX_OPEN, soft // 4))


class FragmentFollower:
    """The fragments of ``source`` (a fragments directory, or one ``.jsonl``); :meth:`poll` converts their new lines."""

    def __init__(
        self,
        source: str | os.PathLike,
        limits: JsonLimits = DEFAULT_LIMITS,
        list_interval_s: float = LIST_INTERVAL_S,
        max_open: int | None = None,
    ):
        self.source = Path(source)
        self.limits = limits
        self.list_interval_s = list_interval_s
        self.max_open = open_budget() if max_open is None else max_open
        self.counts = Trace()  # what was handed on, less its rows: lines read, lines dropped by reason, names, notes
        self.total_read = 0  # bytes read from every fragment file
        self._fragments: dict[Path, _Fragment] = {}  # every fragment followed
        self._open: OrderedDict[Path, None] = OrderedDict()  # those holding a descriptor, the one grown longest ago first
        self._listing: list[Path] = []
        self._listed_at: float | None = None  # time.monotonic() of the last listing
        self.finished = False  # finish() was called: nothing more is read

    def poll(self) -> Trace:
        """Read what every fragment got since the last poll; the rows of its complete lines (their counts in ``counts``)."""
        if self.finished:
            return Trace()
        batch = FragmentBatch(self.limits)
        for path in dict.fromkeys([*self._listed(), *self._fragments]):
            self._poll_one(path, batch)
        return self._converted(batch)

    def finish(self) -> Trace:
        """The rows of everything left, a torn last line too, as a whole-file read ends; the files are closed."""
        self._listed_at = None  # every fragment there now, however recently the directory was listed
        tail = self.poll()
        batch = FragmentBatch(self.limits)
        for fragment in list(self._fragments.values()):
            if fragment.file.handle is None:
                self._reopen(fragment, batch)
            self._end(fragment, batch)
        self.finished = True
        return merge_traces([tail, self._converted(batch)])

    def close(self) -> None:
        """Close the fragments open (the watch was given up); nothing more is read."""
        self.finished = True
        for fragment in list(self._fragments.values()):
            self._forget(fragment)

    def _listed(self) -> list[Path]:
        if self.source.suffix == ".jsonl":
            return [self.source] if self.source.is_file() else []
        now = time.monotonic()
        if self._listed_at is None or now - self._listed_at >= self.list_interval_s:
            self._listing, self._listed_at = artifacts.fragment_files(self.source), now
        return self._listing

    def _poll_one(self, path: Path, batch: FragmentBatch) -> None:
        """A replaced fragment is read to its end first; a rewritten one again from its start; then the new bytes."""
        fragment = self._fragments.get(path)
        try:
            status = os.stat(path)
        except FileNotFoundError:
            status = None
        if fragment is not None and not fragment.file.named_by(status):
            self._end(fragment, batch)
            fragment = None
        if status is None:
            return
        if fragment is None:
            fragment = self._fragments[path] = _Fragment(FollowedFile(path, EXPECTED))
        elif fragment.file.handle is None:
            if status.st_size == fragment.file.read:
                return  # nothing new: its descriptor is not taken again
            self._reopen(fragment, batch)
        elif fragment.file.rewritten():
            self._read_again(fragment, batch, fragment.file.read)
        if self._read_new(fragment, batch, final=False) or path not in self._open:
            self._used(fragment)

    def _reopen(self, fragment: _Fragment, batch: FragmentBatch) -> None:
        """Take a descriptor on a fragment again; one rewritten meanwhile is read again from its start."""
        read = fragment.file.read
        if not fragment.file.open():
            self._read_again(fragment, batch, read)
        self._used(fragment)

    def _read_again(self, fragment: _Fragment, batch: FragmentBatch, read: int) -> None:
        """Hand on the held line, note the rewrite (``read`` bytes had been read), and read the file from its start."""
        self._hand_on(fragment, bytes(fragment.held), batch)
        self.counts.notes.append(f"{fragment.file.path}: rewritten after {read:,} bytes were read; read again from its start")
        fragment.file.restart()
        fragment.restart()

    def _used(self, fragment: _Fragment) -> None:
        """Mark the fragment grown last; past ``max_open`` descriptors, the one grown longest ago lets its go."""
        self._open[fragment.file.path] = None
        self._open.move_to_end(fragment.file.path)
        while len(self._open) > self.max_open:
            idle, _ = self._open.popitem(last=False)
            self._fragments[idle].file.close()

    def _end(self, fragment: _Fragment, batch: FragmentBatch) -> None:
        """Read the fragment to its end if it holds a descriptor, hand on all that is held, and forget it."""
        if fragment.file.handle is not None:
            while self._read_new(fragment, batch, final=False):
                pass
        self._hand_on(fragment, bytes(fragment.held), batch)
        self._forget(fragment)

    def _forget(self, fragment: _Fragment) -> None:
        fragment.file.close()
        self._open.pop(fragment.file.path, None)
        del self._fragments[fragment.file.path]

    def _read_new(self, fragment: _Fragment, batch: FragmentBatch, final: bool) -> int:
        """Read up to POLL_BYTES more and hand on the complete lines (``final``: everything held); the bytes read."""
        data = fragment.file.read_more(POLL_BYTES)
        got = len(data)
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
            batch.add_lines(str(fragment.file.path), [LineBatch(fragment.lines, [b""], overlong=[fragment.lines])])
            fragment.held, fragment.skipping = bytearray(), True
        return got

    def _hand_on(self, fragment: _Fragment, ready: bytes, batch: FragmentBatch) -> None:
        """Decode whole lines (a last one without its newline only at the end) into the batch, numbered on."""
        if not ready:
            return
        batch.add_lines(str(fragment.file.path), line_batches(io.BytesIO(ready), self.limits, first_line=fragment.lines + 1))
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
