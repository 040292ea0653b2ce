"""SA_PROFILE recorder (docs/FORMATS.md, "SA_PROFILE"): serving-level Chrome-trace fragments, one per process.

Switched on by ``SA_PROFILE_OUTPUT`` / ``SA_PROFILE_LEVEL`` (read at import) or
by :func:`configure`. Events are buffered and written in batches of whole lines
(docs/FORMATS.md says what a kill loses). Fork safety: the buffer lock is held
across ``fork`` and the child starts with an empty buffer, a new lock and no
open fragment, so it never writes the parent's pending events. Children of
:mod:`multiprocessing` flush at exit through a finaliser; a bare ``os.fork``
child that leaves with ``os._exit`` must call :func:`flush` (or :func:`shutdown`) first.
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import multiprocessing.util
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Self

import msgspec

from dsprof.errors import DsprofError, InputError
from dsprof.fileio import atomic_output
from dsprof.profiler import artifacts
from dsprof.profiler.chrome_json import (
    BAD_JSON,
    BAD_VALUE,
    DEFAULT_LIMITS,
    EVENT_DECODER,
    MERGE_RECORD,
    NON_FINITE_VALUES,
    NOT_OBJECT,
    OVERLONG_LINE,
    TOO_DEEP,
    JsonLimits,
    LineBatch,
    decode_event,
    line_batches,
)
from dsprof.profiler.strace import NOOP_SPAN

ENV_OUTPUT = "SA_PROFILE_OUTPUT"
ENV_LEVEL = "SA_PROFILE_LEVEL"
DEFAULT_LEVEL = "e2e"
# The event categories (SPEC §1), in the order their lanes are drawn: one request span per request, the
# serving loop, the scheduler's rounds, the workers, the executor and the kernels.
CAT_REQUEST, CAT_SERVING, CAT_SCHEDULER, CAT_WORKER, CAT_EXECUTOR, CAT_KERNEL = (
    "request",
    "serving",
    "scheduler",
    "worker",
    "executor",
    "kernel",
)
CATEGORIES = (CAT_REQUEST, CAT_SERVING, CAT_SCHEDULER, CAT_WORKER, CAT_EXECUTOR, CAT_KERNEL)
# Categories each level records; "verbose" records every category.
LEVEL_CATEGORIES: dict[str, frozenset[str] | None] = {
    "e2e": frozenset({CAT_REQUEST, CAT_SERVING, CAT_SCHEDULER, CAT_WORKER, CAT_EXECUTOR}),
    "kernel": frozenset({CAT_KERNEL}),
    "verbose": None,
}
FLUSH_EVERY_EVENTS = 256
FLUSH_INTERVAL_S = 1.0


def _parse_levels(levels: str | Iterable[str]) -> frozenset[str] | None:
    """The categories recorded at ``levels`` (None = every category)."""
    names = levels.split(",") if isinstance(levels, str) else list(levels)
    names = [n.strip().lower() for n in names if n.strip()]
    if not names:
        names = [DEFAULT_LEVEL]
    unknown = [n for n in names if n not in LEVEL_CATEGORIES]
    if unknown:
        raise DsprofError(f"{ENV_LEVEL}: unknown level {unknown[0]!r} (expected a comma-separated list of e2e, kernel, verbose)")
    categories: set[str] = set()
    for name in names:
        level_categories = LEVEL_CATEGORIES[name]
        if level_categories is None:
            return None
        categories |= level_categories
    return frozenset(categories)


def _json_safe(value: object) -> object:
    """A JSON-serialisable copy: ints stay ints, non-finite floats and other objects become str."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return str(value)


# Built once: json.dumps with non-default options would build an encoder per event.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=str)


def _dumps(event: dict) -> str:
    try:
        return _ENCODER.encode(event)
    except (TypeError, ValueError):  # NaN/inf, or dict keys json cannot take
        return _ENCODER.encode(_json_safe(event))


class _Recorder:
    """Process-wide recorder state; one instance, reset in forked children."""

    def __init__(self) -> None:
        self.active = False
        self.categories: frozenset[str] | None = None
        self.output: Path | None = None
        self.fragments: Path | None = None
        self.flush_every = FLUSH_EVERY_EVENTS
        self.flush_interval_s = FLUSH_INTERVAL_S
        self._reset_process_state()

    def _reset_process_state(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.buffer: list[str] = []
        self.fd: int | None = None
        self.last_flush = time.monotonic()

    def after_fork_in_child(self) -> None:
        # The inherited fd points at the parent's fragment: close it, never write it.
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self._reset_process_state()

    def add(self, line: str) -> None:
        with self.lock:
            self.buffer.append(line)
            if len(self.buffer) >= self.flush_every or time.monotonic() - self.last_flush >= self.flush_interval_s:
                self._flush_locked()

    def flush(self) -> None:
        with self.lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if os.getpid() != self.pid:  # forked without the at-fork hooks (e.g. from C)
            self.after_fork_in_child()
            return
        self.last_flush = time.monotonic()
        if not self.buffer or self.fragments is None:
            self.buffer.clear()
            return
        if self.fd is None:
            self.fd = self._open_fragment(self.fragments)
        data = memoryview(("\n".join(self.buffer) + "\n").encode())
        self.buffer.clear()
        while data:  # one write in practice; continue after a short write (one writer per file)
            data = data[os.write(self.fd, data) :]

    def _open_fragment(self, fragments: Path) -> int:
        fragments.mkdir(parents=True, exist_ok=True)
        path = fragments / artifacts.fragment_name(self.pid)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        # A recycled pid may find a fragment whose last line was torn by a kill;
        # start on a fresh line so that torn line does not swallow our first event.
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as existing:
                existing.seek(size - 1)
                if existing.read(1) != b"\n":
                    os.write(fd, b"\n")
        return fd

    def close(self) -> None:
        with self.lock:
            self._flush_locked()
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None


_rec = _Recorder()


def _before_fork() -> None:
    _rec.lock.acquire()


def _after_fork_in_parent() -> None:
    _rec.lock.release()


def _after_fork_in_child() -> None:
    _rec.after_fork_in_child()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
atexit.register(_rec.flush)


def _register_multiprocessing_exit_flush(recorder: _Recorder) -> None:
    # multiprocessing children leave with os._exit (no atexit) after running their
    # finalisers; the registry is cleared at child start, so register from its after-fork hook.
    multiprocessing.util.Finalize(recorder, recorder.flush, exitpriority=100)


multiprocessing.util.register_after_fork(_rec, _register_multiprocessing_exit_flush)


def configure(
    output: str | os.PathLike | None = None,
    levels: str | Iterable[str] | None = None,
    *,
    main: bool = False,
    flush_every: int = FLUSH_EVERY_EVENTS,
    flush_interval_s: float = FLUSH_INTERVAL_S,
) -> bool:
    """Start (or stop) recording; returns whether recording is on.

    ``output=None`` reads ``SA_PROFILE_OUTPUT`` (unset = off); ``levels=None``
    reads ``SA_PROFILE_LEVEL`` (default ``e2e``). ``main=True`` marks the main
    process of a run: it removes fragments an earlier run left behind.
    """
    if output is None:
        output = os.environ.get(ENV_OUTPUT) or None
    if levels is None:
        levels = os.environ.get(ENV_LEVEL) or DEFAULT_LEVEL
    categories = _parse_levels(levels)
    _rec.close()
    with _rec.lock:
        _rec.active = output is not None
        _rec.output = Path(output) if output is not None else None
        _rec.fragments = artifacts.fragments_dir(output) if output is not None else None
        _rec.categories = categories
        _rec.flush_every = max(1, int(flush_every))
        _rec.flush_interval_s = float(flush_interval_s)
    if _rec.fragments is not None and main:
        _remove_stale_fragments(_rec.fragments)
    return _rec.active


def _remove_stale_fragments(directory: Path) -> None:
    """Delete an earlier run's fragments, so that a merge never mixes two runs (docs/FORMATS.md, "SA_PROFILE")."""
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        if artifacts.FRAGMENT_PATTERN.match(entry.name):
            entry.unlink(missing_ok=True)


def is_active() -> bool:
    return _rec.active


def enabled(cat: str) -> bool:
    """Whether events of category ``cat`` are recorded at the configured levels."""
    return _rec.active and (_rec.categories is None or cat in _rec.categories)


_perf_counter_ns = time.perf_counter_ns


def _now_us() -> int:
    """Timestamps as docs/FORMATS.md ("SA_PROFILE") has them: integer µs of the host monotonic clock that STRACE uses in ns."""
    return _perf_counter_ns() // 1000


def _add_event(event: dict) -> None:
    _rec.add(_dumps(event))


class _Span:
    """An open SA_PROFILE span; ``set(**args)`` adds args before it closes."""

    __slots__ = ("args", "cat", "name", "ts_us")

    def __init__(self, name: str, cat: str, args: dict):
        self.name = name
        self.cat = cat
        self.args = args

    def set(self, **args) -> None:
        self.args.update(args)

    def __enter__(self) -> Self:
        self.ts_us = _now_us()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_rest: object) -> None:
        end_us = _now_us()
        if not _rec.active:
            return
        if exc_type is not None:
            self.args["error"] = exc_type.__name__
        _add_event(
            {
                "name": self.name,
                "cat": self.cat,
                "ph": "X",
                "ts": self.ts_us,
                "dur": end_us - self.ts_us,
                "pid": _rec.pid,
                "tid": threading.get_native_id(),
                "args": self.args,
            }
        )


def span(name: str, cat: str, **args):
    """Context manager recording a complete (``ph: X``) event when the category is enabled."""
    if not enabled(cat):
        return NOOP_SPAN
    return _Span(name, cat, args)


def traced(name: str | None = None, cat: str = "serving", **args) -> Callable:
    """Decorator: record each call of the function as a span (name defaults to its qualname)."""

    def decorate(func: Callable) -> Callable:
        span_name = name or func.__qualname__

        @functools.wraps(func)
        def wrapper(*f_args, **f_kwargs):
            if not enabled(cat):
                return func(*f_args, **f_kwargs)
            with _Span(span_name, cat, dict(args)):
                return func(*f_args, **f_kwargs)

        return wrapper

    return decorate


def instant(name: str, cat: str, **args) -> None:
    """Record an instant (``ph: i``, thread scope) event now."""
    if not enabled(cat):
        return
    _add_event(
        {"name": name, "cat": cat, "ph": "i", "s": "t", "ts": _now_us(), "pid": _rec.pid, "tid": threading.get_native_id(), "args": args}
    )


def complete(name: str, cat: str, ts_us: int, dur_us: int, *, tid: int | None = None, **args) -> None:
    """Record a span measured elsewhere (``ts_us`` on the perf_counter µs clock)."""
    if not enabled(cat):
        return
    _add_event(
        {
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": int(ts_us),
            "dur": int(dur_us),
            "pid": _rec.pid,
            "tid": threading.get_native_id() if tid is None else tid,
            "args": args,
        }
    )


def _metadata(kind: str, value: str) -> None:
    if not _rec.active:
        return
    _add_event({"name": kind, "ph": "M", "pid": _rec.pid, "tid": threading.get_native_id(), "args": {"name": value}})


def set_process_name(name: str) -> None:
    _metadata("process_name", name)


def set_thread_name(name: str) -> None:
    _metadata("thread_name", name)


def flush() -> None:
    """Write the buffered events of this process to its fragment now."""
    _rec.flush()


def shutdown() -> None:
    """Flush, close this process's fragment and stop recording."""
    _rec.close()
    with _rec.lock:
        _rec.active = False


@dataclass(frozen=True)
class MergeResult:
    """What a merge did: events written, lines skipped (by reason), NaN/Infinity values nulled."""

    path: Path
    events: int
    skipped_lines: int
    fragments: int
    dropped: dict[str, int] = field(default_factory=dict)
    non_finite_values: int = 0


# The merge's counts are known only at its end; they go into a space kept for them in
# the head of trace.json (JSON allows the padding), so that readers find them first.
_MERGE_COUNTS = ("events", BAD_JSON, NOT_OBJECT, TOO_DEEP, OVERLONG_LINE, BAD_VALUE, NON_FINITE_VALUES)
_SKIP_REASONS = _MERGE_COUNTS[1:-1]
_COUNTS_WIDTH = len(json.dumps(dict.fromkeys(_MERGE_COUNTS, 2**63 - 1), separators=(",", ":")))


def merge_fragments(
    output: str | os.PathLike,
    progress: Callable[[str], None] | None = None,
    *,
    require_fragments: bool = False,
    limits: JsonLimits = DEFAULT_LIMITS,
) -> MergeResult:
    """Merge every fragment of ``output`` into its ``trace.json``, a batch of lines at a time.

    Exactly the files the reader takes are merged (``trace.<pid>.jsonl``,
    :func:`dsprof.profiler.artifacts.fragment_files`), each as it was when
    the merge began (its size then). A line is kept when the reader would
    read an event from it (:func:`dsprof.profiler.chrome_json.decode_event`);
    others are skipped and counted by reason (``skipped_lines``, ``dropped``),
    never fatal; NaN/Infinity values are written as null and counted. The
    fragments merged (name and size) and the counts are recorded in the
    merge's ``otherData`` (see :data:`~dsprof.profiler.chrome_json.MERGE_RECORD`).

    ``trace.json`` is replaced atomically, and never by an empty merge: when
    the fragments hold no event (only garbage), or there are no fragments and
    a ``trace.json`` exists, :class:`InputError` is raised and the old file
    stays. A run that recorded nothing and has no merge yet gets an empty
    trace, unless ``require_fragments`` (the CLI): then it is an error too.
    """
    if _rec.active:
        _rec.flush()
    directory = artifacts.fragments_dir(output)
    paths = artifacts.fragment_files(directory)
    target = artifacts.merged_path(output)
    kept = f"; {target} left as it was" if target.exists() else ""
    if not paths and (require_fragments or target.exists()):
        raise InputError(directory, f"no SA_PROFILE fragments to merge{kept}", expected="trace.<pid>.jsonl files")
    sizes = {path.name: path.stat().st_size for path in paths}
    counts = dict.fromkeys(_MERGE_COUNTS, 0)
    with atomic_output(target) as out:
        out.write(b'{"otherData":{"' + MERGE_RECORD.encode() + b'":{"fragments":' + json.dumps(sizes).encode() + b',"counts":')
        counts_at = out.tell()
        out.write(b" " * _COUNTS_WIDTH + b'}},\n"traceEvents":[')
        separator = b"\n"
        for index, path in enumerate(paths, 1):
            before = dict(counts)
            try:
                with path.open("rb") as fragment:
                    for batch in line_batches(fragment, limits, size=sizes[path.name]):
                        separator = _write_events(batch, out, separator, counts)
            except OSError as exc:
                raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
            if progress is not None:
                skipped = sum(counts[k] - before[k] for k in _SKIP_REASONS)
                progress(
                    f"merged fragment {index}/{len(paths)}: {path.name} ({counts['events'] - before['events']} events, {skipped} skipped)"
                )
        if paths and not counts["events"]:
            raise InputError(directory, f"no fragment line is a JSON event{kept}", expected="one Chrome trace event per line")
        out.write(b"\n]}\n")
        out.seek(counts_at)
        out.write(json.dumps(counts, separators=(",", ":")).encode().ljust(_COUNTS_WIDTH))
    dropped = {k: counts[k] for k in _SKIP_REASONS if counts[k]}
    return MergeResult(
        path=target,
        events=counts["events"],
        skipped_lines=sum(dropped.values()),
        fragments=len(paths),
        dropped=dropped,
        non_finite_values=counts[NON_FINITE_VALUES],
    )


def _write_events(batch: LineBatch, out: BinaryIO, separator: bytes, counts: dict[str, int]) -> bytes:
    """Write the event lines of a batch (after ``separator``), count the others; returns the next separator."""
    counts[OVERLONG_LINE] += len(batch.overlong)
    if not batch.overlong and batch.utf8:
        try:  # the common case: every line is an event, written as it is
            for line in batch.lines:
                EVENT_DECODER.decode(line)
            out.write(separator + b",\n".join(batch.lines))
            counts["events"] += len(batch.lines)
            return b",\n" if batch.lines else separator
        except (msgspec.DecodeError, RecursionError, ArithmeticError):
            pass
    pieces: list[bytes] = []
    for line in batch.lines:
        decoded = decode_event(line)
        if decoded.reason is None:
            pieces += [separator, decoded.text]
            separator = b",\n"
            counts[NON_FINITE_VALUES] += decoded.nulled
        elif line.strip():
            counts[decoded.reason] += 1
    counts["events"] += len(pieces) // 2
    out.write(b"".join(pieces))
    return separator


if os.environ.get(ENV_OUTPUT):
    configure()
