"""Reader for SA_PROFILE serving traces (docs/FORMATS.md, "SA_PROFILE"): fragment JSONL files and the merged trace.json.

It reads either the merge or the fragments beside it, never both, so no event is
read twice; a stale merge is passed over for the fragments. Lines are decoded by
:mod:`dsprof.profiler.chrome_json`, the rules ``dsprof merge`` keeps lines by,
and converted by :class:`~dsprof.analysis.ingest.chrome.SpanBuilder`. Which
paths it takes, when a merge is stale, and what it counts: docs/FORMATS.md,
"SA_PROFILE as dsprof reads it".
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import numpy as np

from dsprof.analysis.ingest.chrome import SpanBuilder, nulled_note, read_document
from dsprof.analysis.ingest.json_stream import ChromeDocument
from dsprof.analysis.ingest.sink import SpanSink
from dsprof.analysis.store.spans import Trace, merge_traces
from dsprof.errors import InputError
from dsprof.profiler import artifacts
from dsprof.profiler.chrome_json import (
    BAD_JSON,
    DEFAULT_LIMITS,
    EVENT_DECODER,
    MERGE_RECORD,
    NON_FINITE_VALUES,
    NOT_OBJECT,
    OVERLONG_LINE,
    JsonLimits,
    LineBatch,
    TraceEvent,
    decode_event,
    line_batches,
)
from dsprof.progress import Progress

SOURCE = "sa_profile"
# Fragments smaller than this are decoded one by one and converted together, many at a time: converted
# on its own, each cost milliseconds whatever its size (100k one-event fragments ran past 120 s).
SMALL_FRAGMENT_BYTES = 1 << 20
# A batch of small fragments is converted once it holds this many events, or this many fragments.
BATCH_EVENTS = 1 << 16
BATCH_FRAGMENTS = 1 << 12


def read_sa_profile(
    path: str | os.PathLike, progress: Progress = None, *, limits: JsonLimits = DEFAULT_LIMITS, sink: SpanSink | None = None
) -> Trace:
    """Read an SA_PROFILE output dir, fragments dir, fragment or merged trace into one Trace."""
    path = Path(path)
    files, note = sa_profile_source(path, limits)
    if not files:
        if not path.exists():
            raise InputError(path, "no such file or directory")
        raise InputError(path, "no SA_PROFILE trace here", expected="trace.json or fragments/trace.<pid>.jsonl")
    traces = [Trace(notes=[note] if note else [])]
    small = FragmentBatch(limits, sink)
    garbage = small.garbage
    for file in files:
        if file.suffix == ".jsonl" and _size(file) < SMALL_FRAGMENT_BYTES:
            small.add(file)
            if small.full():
                traces.append(small.convert(progress))
            continue
        if small.files:  # in file order
            traces.append(small.convert(progress))
        if progress is not None:
            progress(f"reading {file}")
        if file.suffix != ".jsonl":
            traces.append(read_merge(file, limits, sink))
            continue
        trace, first_bad = _read_fragment(file, limits, sink)
        if first_bad is not None:  # no line is an event: its lines are counted, and it is refused if every fragment is like it
            garbage.append(_garbage_fragment(file, first_bad))
            trace.notes.append(_garbage_note(file))
        traces.append(trace)
    if small.files:
        traces.append(small.convert(progress))
    if garbage and len(garbage) == len(files):
        raise garbage[0]
    return merge_traces(traces)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None


def fragment_home(path: Path) -> Path:
    """Where the fragments of an SA_PROFILE output directory or ``.json`` output lie (written or still to come).

    A directory's ``fragments/``, else the directory itself; a ``.json``
    output's ``<path>.fragments/``, but a merged ``trace.json``'s the
    ``fragments/`` beside it. One rule for reading whole and for following live
    (:func:`dsprof.analysis.ingest.fragment_source`).
    """
    if path.is_dir():
        return path / artifacts.FRAGMENTS_DIR if (path / artifacts.FRAGMENTS_DIR).is_dir() else path
    beside = path.name == artifacts.MERGED_TRACE and artifacts.fragments_dir(path.parent).is_dir()
    return artifacts.fragments_dir(path.parent if beside else path)


def sa_profile_source(path: Path, limits: JsonLimits = DEFAULT_LIMITS) -> tuple[list[Path], str]:
    """The files to read for an SA_PROFILE path ([] if none) and, where there was a choice, a note on why these."""
    if path.is_file() and path.suffix == ".jsonl":
        return [path], ""
    fragments = artifacts.fragment_files(fragment_home(path)) if path.exists() or path.suffix == ".json" else []
    merged = path / artifacts.MERGED_TRACE if path.is_dir() else path
    if merged.is_file():
        return _merge_or_fragments(merged, fragments, limits)
    why = f"no merged {artifacts.MERGED_TRACE}" if path.is_dir() else "the merge was never written"
    return fragments, f"read {len(fragments)} fragment(s) of {path}: {why}" if fragments else ""


def _merge_or_fragments(merged: Path, fragments: list[Path], limits: JsonLimits) -> tuple[list[Path], str]:
    """The merge unless fragments beside it hold newer events (see the module docstring)."""
    if not fragments:
        return [merged], ""
    try:
        other_data = ChromeDocument(merged, limits).head()
    except InputError as error:
        return fragments, f"read {len(fragments)} fragment(s) instead of {merged}: the merge is unreadable ({error})"
    stale = _staleness(merged, fragments, other_data)
    if stale:
        return fragments, f"read {len(fragments)} fragment(s) instead of {merged}: the merge is stale ({stale})"
    return [merged], f"read {merged}: the merge is up to date with the {len(fragments)} fragment(s) beside it"


def _staleness(merged: Path, fragments: list[Path], other_data: dict[str, Any] | None) -> str:
    """Why the fragments hold events the merge does not ("" if they do not)."""
    record = other_data.get(MERGE_RECORD) if isinstance(other_data, dict) else None
    taken = record.get("fragments") if isinstance(record, dict) else None
    if isinstance(taken, dict):
        for fragment in fragments:
            size = fragment.stat().st_size
            if fragment.name not in taken:
                return f"{fragment.name} is not in it"
            if taken[fragment.name] != size:
                return f"{fragment.name} is {size} bytes, {taken[fragment.name]} when merged"
        return ""
    merged_at = merged.stat().st_mtime_ns
    newer = [f.name for f in fragments if f.stat().st_mtime_ns > merged_at]
    return f"{newer[0]} was written after it (a merge that does not record its fragments)" if newer else ""


def read_merge(path: Path, limits: JsonLimits = DEFAULT_LIMITS, sink: SpanSink | None = None) -> Trace:
    """A merged trace.json; the lines dsprof's merge skipped are counted as dropped here."""
    trace, document = read_document(path, SOURCE, limits, sink)
    record = document.other_data.get(MERGE_RECORD) if isinstance(document.other_data, dict) else None
    counts = record.get("counts") if isinstance(record, dict) else None
    if isinstance(counts, dict):
        for reason, count in counts.items():
            if reason == NON_FINITE_VALUES and type(count) is int and count:
                trace.notes.append(f"{path}: the merge read {count} NaN/Infinity value(s) of its fragments as null")
            elif reason != "events" and type(count) is int and count > 0:
                trace.count(str(reason), count)
    return trace


def read_fragment(path: Path, limits: JsonLimits = DEFAULT_LIMITS, sink: SpanSink | None = None) -> Trace:
    """One ``trace.<pid>.jsonl`` fragment: one event per line, bad lines counted (see the module docstring)."""
    trace, first_bad = _read_fragment(path, limits, sink)
    if first_bad is not None:
        raise _garbage_fragment(path, first_bad)
    return trace


def _garbage_note(path: Path) -> str:
    return f"{path}: skipped, no line is a JSON event"


def _garbage_fragment(path: Path, first_bad: int) -> InputError:
    return InputError(path, "no line is a JSON event", line=first_bad, expected="one Chrome trace event per line")


def _read_fragment(path: Path, limits: JsonLimits, sink: SpanSink | None) -> tuple[Trace, int | None]:
    """A fragment's Trace, and its first bad line when none of its lines is an event (else None)."""
    builder = SpanBuilder(str(path), SOURCE, sink=sink)
    first_bad: int | None = None
    events_found = 0
    try:
        with path.open("rb") as handle:
            for batch in line_batches(handle, limits):
                lines = _decode_lines(batch)
                events_found += len(lines.events)
                first_bad = first_bad or lines.first_bad
                builder.add(lines.events, lines.where, skipped=lines.skipped, nulled=lines.nulled)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    return builder.finish(), first_bad if not events_found else None


class _Lines(NamedTuple):
    """What a batch of fragment lines held: events (and their line numbers), lines skipped by reason, NaN values nulled."""

    events: list[TraceEvent]
    where: np.ndarray
    skipped: dict[str, int]
    nulled: int = 0
    first_bad: int | None = None


def _decode_lines(batch: LineBatch) -> _Lines:
    """Decode a batch of lines: all in one go when every line is an event, else line by line by the full rules."""
    if not batch.overlong and batch.utf8:
        decode = EVENT_DECODER.decode
        try:  # the common case
            events = [decode(line) for line in batch.lines]
            return _Lines(events, np.arange(batch.first_line, batch.first_line + len(events), dtype=np.int64), {})
        except (msgspec.DecodeError, RecursionError, ArithmeticError):
            pass
    events, where, nulled = [], [], 0
    skipped = {OVERLONG_LINE: len(batch.overlong)} if batch.overlong else {}
    first_bad = batch.overlong[0] if batch.overlong else None
    for number, line in enumerate(batch.lines, batch.first_line):
        if not line.strip():
            continue
        decoded = decode_event(line)
        if decoded.reason is None:
            events.append(decoded.value)
            where.append(number)
            nulled += decoded.nulled
        else:
            reason = BAD_JSON if decoded.reason == NOT_OBJECT else decoded.reason
            skipped[reason] = skipped.get(reason, 0) + 1
            first_bad = first_bad or number
    return _Lines(events, np.array(where, np.int64), skipped, nulled, first_bad)


class FragmentBatch:
    """Fragment lines decoded a fragment at a time and converted together by one SpanBuilder (their rows keep their file).

    What each fragment held is decided per fragment as :func:`_read_fragment`
    does (its lines, its NaN note, whether no line is an event); only the
    conversion to span rows, whose cost is mostly per call, is shared. Small
    whole fragments come through :meth:`add`; the new lines of followed
    fragments (:mod:`.fragment_follow`) through :meth:`add_lines`.
    """

    def __init__(self, limits: JsonLimits = DEFAULT_LIMITS, sink: SpanSink | None = None):
        self.limits, self.sink = limits, sink
        self.garbage: list[InputError] = []  # fragments none of whose lines is an event
        self._clear()

    def _clear(self) -> None:
        self.files: list[str] = []
        self.events: list[TraceEvent] = []
        self.where: list[np.ndarray] = []
        self.file_of: list[np.ndarray] = []
        self.skipped: dict[str, int] = {}
        self.notes: list[str] = []

    def full(self) -> bool:
        return len(self.events) >= BATCH_EVENTS or len(self.files) >= BATCH_FRAGMENTS

    def add(self, path: Path) -> None:
        """Decode one whole fragment into the batch."""
        try:
            with path.open("rb") as handle:
                found, first_bad = self.add_lines(str(path), line_batches(handle, self.limits))
        except OSError as exc:
            raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
        if not found and first_bad is not None:
            self.garbage.append(_garbage_fragment(path, first_bad))
            self.notes.append(_garbage_note(path))

    def add_lines(self, name: str, batches: Iterable[LineBatch]) -> tuple[int, int | None]:
        """Decode lines of the fragment ``name`` into the batch; how many were events, and its first bad line (None: none)."""
        index, found, nulled = len(self.files), 0, 0
        first_bad: int | None = None
        self.files.append(name)
        for batch in batches:
            lines = _decode_lines(batch)
            found += len(lines.events)
            first_bad = first_bad or lines.first_bad
            nulled += lines.nulled
            self.events.extend(lines.events)
            self.where.append(lines.where)
            self.file_of.append(np.full(len(lines.events), index, np.int32))
            for reason, count in lines.skipped.items():
                self.skipped[reason] = self.skipped.get(reason, 0) + count
        if nulled:
            self.notes.append(nulled_note(name, nulled))
        return found, first_bad

    def convert(self, progress: Progress = None) -> Trace:
        """The batch's Trace (its rows to the sink when there is one); the batch is empty again."""
        if progress is not None:
            more = f" .. {self.files[-1]}" if len(self.files) > 1 else ""
            progress(f"reading {self.files[0]}{more} ({len(self.files)} fragment(s))")
        builder = SpanBuilder(self.files, SOURCE, sink=self.sink)
        where = np.concatenate(self.where) if self.where else np.zeros(0, np.int64)
        file_of = np.concatenate(self.file_of) if self.file_of else np.zeros(0, np.int32)
        builder.add(self.events, where, skipped=self.skipped, file_of=file_of)
        trace = builder.finish()
        trace.notes.extend(self.notes)
        self._clear()
        return trace
