"""A Chrome trace JSON document read as a stream: the events of its ``traceEvents`` array, a batch at a time.

A merged ``trace.json`` or a Kineto trace may be gigabytes, gzip-compressed; it
is never loaded whole. The array is cut into events with NumPy
(:func:`~dsprof.profiler.chrome_json.scan_structure`) and a buffer's events are
parsed by msgspec in one call, with no Python object per event beyond what the
parser makes, so memory holds about two chunks and one event. What is read,
refused and counted: docs/FORMATS.md, "Chrome JSON as dsprof reads it".
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from dsprof.errors import InputError
from dsprof.profiler.chrome_json import (
    BAD_VALUE,
    DEFAULT_LIMITS,
    EVENTS_DECODER,
    GZIP_MAGIC,
    NOT_OBJECT,
    READ_BYTES,
    TOO_DEEP,
    VALUE_DECODER,
    JsonLimits,
    TraceEvent,
    decode_event,
    int64_of,
    is_utf8,
    parser_error,
    scan_structure,
    string_delimiters,
)

EXPECTED = 'a Chrome trace: a list of events or {"traceEvents": [...]}'
_WHITESPACE = re.compile(rb"[ \t\r\n]*")
_COMMA_AFTER = re.compile(rb"[ \t\r\n]*,")
_SCALAR = re.compile(rb'[^ \t\r\n,\]}\[{:"]*')
_COMMA, _CLOSE_ARRAY, _OPEN_ARRAY, _OPEN_OBJECT, _CLOSE_OBJECT, _QUOTE, _COLON = b',][{}":'


# top-level members a Kineto trace describes its process with (rank, world size, process groups; host)
KEPT_MEMBERS = ("distributedInfo", "host_name", "deviceProperties")


@dataclass
class EventBatch:
    """The events parsed from one buffer: ``index`` holds each one's position in ``traceEvents``."""

    events: list[TraceEvent]
    index: np.ndarray
    records: int  # array elements read, kept or not
    dropped: dict[str, int] = field(default_factory=dict)
    nulled: int = 0  # NaN/Infinity values read as null


class ChromeDocument:
    """One Chrome trace JSON document; :meth:`batches` reads it (see the module docstring).

    After (or while) reading: ``base_ns`` is ``baseTimeNanoseconds`` (None
    until seen), ``base_before_events`` whether it came before
    ``traceEvents``, ``other_data`` the ``otherData`` member (a dict, or None),
    ``notes`` what a reader should be told (a truncated document), ``cut_line``
    the line a truncated document ends on (None when it is whole),
    ``kept`` the members of :data:`KEPT_MEMBERS` that the document has.
    """

    def __init__(self, path: Path, limits: JsonLimits = DEFAULT_LIMITS):
        self.path = path
        self.limits = limits
        self.base_ns: int | None = None
        self.base_before_events = False
        self.other_data: dict[str, Any] | None = None
        self.cut_line: int | None = None
        self.kept: dict[str, Any] = {}
        self.notes: list[str] = []
        self._input: _Input | None = None
        self._buf = b""
        self._pos = 0
        self._lines_before = 0  # newlines in the part of the input already dropped from the buffer
        self._eof = False
        self._events_started = False
        self._head_only = False

    def batches(self) -> Iterator[EventBatch]:
        """Every event of ``traceEvents``, a buffer at a time; raises InputError as described above."""
        self._input = _Input(self.path, self.limits)
        try:
            yield from self._document()
        finally:
            self._input.close()

    def head(self) -> dict[str, Any] | None:
        """Read only the members before ``traceEvents`` (cheap whatever the size); returns ``otherData`` if among them."""
        self._head_only = True
        for _ in self.batches():
            pass
        return self.other_data

    # -- the document's top level --------------------------------------------------------------

    def _document(self) -> Iterator[EventBatch]:
        first = self._peek()
        if first is None:
            raise InputError(self.path, "empty file, no JSON document", expected=EXPECTED)
        try:
            if first == _OPEN_ARRAY:  # the JSON Array Format: the events alone
                self._pos += 1
                self.base_ns, self.base_before_events = 0, True
                if self._head_only:
                    return
                yield from self._events()
            elif first == _OPEN_OBJECT:
                self._pos += 1
                yield from self._members()
            else:
                raise self._error("JSON is not a Chrome trace", self._pos, expected=EXPECTED)
        except _EndOfInput as cut:
            if not self._events_started:
                raise self._error("the document ends early", self._pos, expected=EXPECTED) from None
            cause = "gzip stream cut short" if self._input is not None and self._input.cut_short else "truncated"
            self.notes.append(f"{self.path}: the document ends early{cut.where} ({cause}); the events before the cut were read")
            if first != _OPEN_ARRAY or self.cut_line is not None:  # the Array Format may end without ']': then nothing is lost
                self.cut_line = self._end_line()
            return
        if not self._head_only and self._peek() is not None:
            raise self._error("trailing data after the JSON document", self._pos)

    def _members(self) -> Iterator[EventBatch]:
        """The members of the top-level object; ``traceEvents`` is streamed, the others read whole."""
        if self._next() == _CLOSE_OBJECT:
            raise self._error("JSON is not a Chrome trace (an empty object)", self._pos, expected=EXPECTED)
        while True:
            if self._next() != _QUOTE:
                raise self._error("invalid JSON: expected a member name", self._pos)
            key = self._decode_value(self._value_text("a member name"), "a member name")
            if self._next() != _COLON:
                raise self._error("invalid JSON: expected ':' after a member name", self._pos)
            self._pos += 1
            if key == "traceEvents":
                if self._events_started:
                    raise self._error("traceEvents appears twice", self._pos)
                if self._next() != _OPEN_ARRAY:
                    raise self._error("traceEvents is not a list", self._pos, expected=EXPECTED)
                if self._head_only:
                    return
                self._pos += 1
                self.base_before_events = self.base_ns is not None
                yield from self._events()
            else:
                self._member_value(str(key))
            follows = self._next()
            self._pos += 1
            if follows == _CLOSE_OBJECT:
                break
            if follows != _COMMA:
                raise self._error("invalid JSON: expected ',' or '}' after a member", self._pos - 1)
        if not self._events_started:
            raise self._error("JSON is not a Chrome trace (it has no traceEvents)", self._pos, expected=EXPECTED)

    def _member_value(self, key: str) -> None:
        """Read one member other than traceEvents: keep baseTimeNanoseconds and otherData."""
        self._next()
        at = self._pos
        value = self._decode_value(self._value_text(f"member {key!r}"), f"member {key!r}", at)
        if key == "baseTimeNanoseconds":
            self.base_ns = self._base_time(value, at)
        elif key == "otherData" and isinstance(value, dict):
            self.other_data = value
        elif key in KEPT_MEMBERS:
            self.kept[key] = value

    def _base_time(self, value: Any, at: int) -> int:
        """baseTimeNanoseconds as an int64: an integer, an integral decimal or integer text."""
        base = int64_of(value)
        if base is None:
            raise self._error(f"baseTimeNanoseconds is not an integer in int64 range: {str(value)[:40]}", at)
        return base

    def _decode_value(self, text: bytes, what: str, at: int | None = None) -> Any:
        value, reason, _, _ = decode_event(text, VALUE_DECODER)
        if reason is not None:
            at = self._pos - len(text) if at is None else at
            problem = "nested too deeply" if reason == TOO_DEEP else "a number out of range" if reason == BAD_VALUE else "invalid JSON"
            raise self._error(f"{what}: {problem}", at, expected=EXPECTED)
        return value

    def _value_text(self, what: str) -> bytes:
        """The text of the JSON value at the read position, which the read position then passes."""
        while True:
            end = _value_end(self._buf, self._pos, self._eof)
            if end is not None:
                text = self._buf[self._pos : end]
                self._pos = end
                return text
            if len(self._buf) - self._pos > self.limits.max_event_bytes:
                raise self._error(
                    f"{what} is larger than {self.limits.max_event_bytes} bytes",
                    self._pos,
                    expected="at most JsonLimits.max_event_bytes per member",
                )
            if not self._fill():
                raise _EndOfInput(f" inside {what}")

    # -- the traceEvents array ----------------------------------------------------------------

    def _events(self) -> Iterator[EventBatch]:
        """Batches of the array's events, from just after its '[' to just after its ']'."""
        self._events_started = True
        index = 0
        while True:
            if self._peek() is None:  # whitespace is skipped as a stream: it never piles up in the buffer
                raise _EndOfInput(" inside traceEvents")
            if len(self._buf) - self._pos < READ_BYTES:
                self._fill()
            batch = self._whole_events(index)
            if batch is not None:
                index += batch.records
                yield batch
                continue
            data = np.frombuffer(self._buf, np.uint8)[self._pos :]
            positions, chars, depth, _ = scan_structure(data)
            below = np.flatnonzero(depth < 0)
            close = int(below[0]) if len(below) else None
            if close is not None and chars[close] != _CLOSE_ARRAY:
                raise self._error("invalid JSON: '}' where traceEvents should close with ']'", self._pos + int(positions[close]))
            upto = close if close is not None else len(positions)
            ends = positions[:upto][(chars[:upto] == _COMMA) & (depth[:upto] == 0)]
            if close is not None:
                ends = np.append(ends, positions[close])
            if not len(ends):  # no whole event in the buffer
                if len(data) > self.limits.max_event_bytes:
                    raise self._error(
                        f"event {index} is larger than {self.limits.max_event_bytes} bytes",
                        self._pos,
                        expected="at most JsonLimits.max_event_bytes per event",
                    )
                if not self._fill():
                    yield from self._last_events(index)
                    raise _EndOfInput(" inside traceEvents")
                continue
            batch = self._parse(ends, index, closed=close is not None)
            index += batch.records
            self._pos += int(ends[-1]) + 1
            yield batch
            if close is not None:
                return

    def _whole_events(self, index: int) -> EventBatch | None:
        """The events up to the last ``}`` followed by a comma in the next chunk of the buffer, parsed in one call; None if that fails.

        No scan is needed: the text from the read position (where an event
        starts) to such a ``}``, put in brackets, parses as a list of events
        only if that ``}`` ends an event of traceEvents — a JSON parser's state
        after a prefix does not depend on what follows. The text is tried at
        the last two such braces; a buffer that does not parse (an event that is
        not an object, NaN, deep nesting, a brace inside a string) is cut by
        scanning instead.
        """
        limit = min(len(self._buf), self._pos + READ_BYTES)
        cut = self._buf.rfind(b"}", self._pos, limit)
        for _ in range(2):
            comma = _COMMA_AFTER.match(self._buf, cut + 1) if cut >= 0 else None
            if comma is not None:
                text = b"[" + self._buf[self._pos : cut + 1] + b"]"
                try:
                    events = EVENTS_DECODER.decode(text)
                except (msgspec.DecodeError, RecursionError, ArithmeticError):
                    return None
                if not is_utf8(text):
                    return None
                self._pos = comma.end()
                return EventBatch(events, np.arange(index, index + len(events), dtype=np.int64), len(events))
            cut = self._buf.rfind(b"}", self._pos, cut) if cut > 0 else -1
        return None

    def _parse(self, ends: np.ndarray, index: int, closed: bool) -> EventBatch:
        """The events between the read position and each end (a comma or the array's ']')."""
        text = b"[" + self._buf[self._pos : self._pos + int(ends[-1])] + b"]"
        try:
            events = EVENTS_DECODER.decode(text)
        except (msgspec.DecodeError, RecursionError, ArithmeticError):
            pass
        else:
            if len(events) == len(ends) and is_utf8(text):
                return EventBatch(events, np.arange(index, index + len(events), dtype=np.int64), len(events))
        starts = np.append(0, ends[:-1] + 1).tolist()
        batch = EventBatch([], np.zeros(0, np.int64), 0)
        where: list[int] = []
        for k, (start, end) in enumerate(zip(starts, ends.tolist(), strict=True)):
            text = self._buf[self._pos + start : self._pos + end]
            if not text.strip():
                if closed and k == len(starts) - 1:
                    continue  # `[]`, or a trailing comma before ']' (the Chrome format writes one)
                raise self._error("invalid JSON: an empty element in traceEvents", self._pos + start)
            self._take(text, index + batch.records, self._pos + start, batch, where)
        batch.index = np.array(where, np.int64)
        return batch

    def _take(self, text: bytes, index: int, at: int, batch: EventBatch, where: list[int]) -> None:
        """Parse one event into ``batch``, or count it, or raise for text that is not JSON."""
        batch.records += 1
        event, reason, nulled, _ = decode_event(text)
        if reason is None:
            batch.events.append(event)
            where.append(index)
            batch.nulled += nulled
        elif reason == NOT_OBJECT:
            batch.dropped["bad_event"] = batch.dropped.get("bad_event", 0) + 1
        elif reason == BAD_VALUE:
            batch.dropped["bad_value"] = batch.dropped.get("bad_value", 0) + 1
        elif reason == TOO_DEEP:
            raise self._error(f"event {index} is nested too deeply", at, expected="JSON the parser can take")
        else:
            message, offset = parser_error(text)
            offset = offset or len(text) - len(text.lstrip())  # where the parser stopped, else where the event starts
            raise self._error(f"invalid JSON in event {index}: {message}", at + offset, expected=EXPECTED)

    def _last_events(self, index: int) -> Iterator[EventBatch]:
        """The input ended inside traceEvents: keep a last whole event (the Chrome format allows a missing ']')."""
        text = self._buf[self._pos :].strip()
        self._pos = len(self._buf)
        if not text:
            return
        event, reason, nulled, _ = decode_event(text)
        if reason is None:
            yield EventBatch([event], np.array([index], np.int64), 1, nulled=nulled)
        else:
            self.cut_line = self._end_line()
            yield EventBatch([], np.zeros(0, np.int64), 1, dropped={"torn_event": 1})

    # -- the buffer ---------------------------------------------------------------------------------

    def _fill(self) -> bool:
        """Append the next chunk of input after the unread part of the buffer; False at its end."""
        if self._eof or self._input is None:
            return False
        chunk = self._input.read(READ_BYTES)
        if not chunk:
            self._eof = True
            return False
        self._lines_before += self._buf.count(b"\n", 0, self._pos)
        self._buf = self._buf[self._pos :] + chunk
        self._pos = 0
        return True

    def _next(self) -> int:
        """Like :meth:`_peek`, inside the document: the end of input there is a cut (:class:`_EndOfInput`)."""
        byte = self._peek()
        if byte is None:
            raise _EndOfInput("")
        return byte

    def _peek(self) -> int | None:
        """The next byte that is not whitespace (the read position moves to it); None at the end."""
        while True:
            match = _WHITESPACE.match(self._buf, self._pos)
            self._pos = match.end() if match else self._pos
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return None

    def _end_line(self) -> int:
        """The line the input ends on."""
        return self._lines_before + self._buf.count(b"\n") + 1

    def _error(self, what: str, at: int, expected: str | None = None) -> InputError:
        line = self._lines_before + self._buf.count(b"\n", 0, min(at, len(self._buf))) + 1
        return InputError(self.path, what, line=line, expected=expected)


class _EndOfInput(Exception):
    """The input ended inside the document; ``where`` says where, for the note."""

    def __init__(self, where: str):
        super().__init__(where)
        self.where = where


class _Input:
    """The document's bytes: the file, or its gzip stream inflated a piece at a time and held to the limits."""

    def __init__(self, path: Path, limits: JsonLimits):
        self.path = path
        try:
            self._file = path.open("rb")
            self.compressed = self._file.read(2) == GZIP_MAGIC
            self._file.seek(0)
            size = os.fstat(self._file.fileno()).st_size
        except OSError as exc:
            raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
        self._stream: Any = gzip.GzipFile(fileobj=self._file, mode="rb") if self.compressed else self._file
        self._ratio = limits.max_gzip_ratio
        self._allowed = max(limits.max_gzip_ratio * size, limits.gzip_allowance_bytes)
        self.bytes_read = 0
        self.cut_short = False

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes (fewer only at the end of the input)."""
        if not self.compressed:
            try:
                data = self._stream.read(size)
            except OSError as exc:
                raise InputError(self.path, f"cannot read: {exc.strerror or exc}") from None
            self.bytes_read += len(data)
            return data
        pieces: list[bytes] = []
        got = 0
        while got < size and not self.cut_short:
            piece = self._inflate(size - got)
            if not piece:
                break
            pieces.append(piece)
            got += len(piece)
        return b"".join(pieces)

    def _inflate(self, size: int) -> bytes:
        """One piece of the gzip stream (read1: what came before a cut-short stream's end is never lost)."""
        try:
            data = self._stream.read1(size)
        except EOFError:  # a gzip stream that stops before its end marker: read up to the cut
            self.cut_short = True
            return b""
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise InputError(self.path, f"corrupt gzip data: {exc}", expected="a gzip-compressed JSON trace") from None
        except OSError as exc:
            raise InputError(self.path, f"cannot read: {exc.strerror or exc}") from None
        self.bytes_read += len(data)
        if self.bytes_read > self._allowed:
            raise InputError(
                self.path,
                f"gzip data expands more than {self._ratio} times its size (past {self._allowed >> 20} MiB): a gzip bomb?",
                expected="JsonLimits.max_gzip_ratio / gzip_allowance_bytes raised for a real trace this compressible",
            )
        return data

    def close(self) -> None:
        self._stream.close()
        self._file.close()


def _value_end(buf: bytes, pos: int, at_eof: bool) -> int | None:
    """Where the JSON value starting at ``buf[pos]`` ends (exclusive), or None if the buffer holds only part of it.

    Looks at a growing window, so that a small value at the head of a big
    buffer costs little.
    """
    first = buf[pos]
    if first not in (_OPEN_OBJECT, _OPEN_ARRAY, _QUOTE):
        match = _SCALAR.match(buf, pos)
        end = match.end() if match else pos
        if end == pos:  # a byte no value starts with: let the parser name it
            return pos + 1
        return end if end < len(buf) or at_eof else None
    window = 1 << 16
    while True:
        data = np.frombuffer(buf, np.uint8, count=min(window, len(buf) - pos), offset=pos)
        if first == _QUOTE:
            delimiters = string_delimiters(data)
            if len(delimiters) > 1:
                return pos + int(delimiters[1]) + 1
        else:
            positions, _, depth, _ = scan_structure(data)
            closed = np.flatnonzero(depth <= 0)
            if len(closed):
                return pos + int(positions[closed[0]]) + 1
        if pos + window >= len(buf):
            return None
        window *= 4
