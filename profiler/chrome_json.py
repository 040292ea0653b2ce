"""Chrome trace events as JSON text: how dsprof decodes one event, and the limits it holds input to.

The merge (:func:`dsprof.profiler.sa_profile.merge_fragments`) and the readers
(:mod:`dsprof.analysis.ingest`) must agree on which lines are events, so both
decode them here. Rules and limits: docs/FORMATS.md, "One event as JSON text".
:func:`string_delimiters` and :func:`scan_structure` find a JSON text's string
quotes, and its brackets and commas outside strings, with NumPy a whole buffer
at a time: the document reader cuts a ``traceEvents`` array into events with
them, and the ``NaN`` rewrite checks that a token is not inside a string.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, BinaryIO, NamedTuple

import msgspec
import numpy as np

# Why an event (or a line) could not be used; the names the readers count by.
BAD_JSON = "bad_json"
NOT_OBJECT = "not_object"
TOO_DEEP = "too_deep"
BAD_VALUE = "bad_value"
OVERLONG_LINE = "overlong_line"
# The first bytes of a gzip stream: a JSON trace gzipped is read as one, whatever its name.
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class JsonLimits:
    """What one piece of JSON input may take before it is refused.

    ``max_event_bytes``: one fragment line or one event of a document (longer
    lines are skipped and counted as ``overlong_line``; a longer event in a
    document is an error). ``max_gzip_ratio`` / ``gzip_allowance_bytes``: a gzip
    stream may expand to ``max_gzip_ratio`` times its compressed size, or to
    ``gzip_allowance_bytes`` if that is more; past that it is taken for a gzip
    bomb and refused (real traces compress 5-30 times).
    """

    max_event_bytes: int = 16 << 20
    max_gzip_ratio: int = 100
    gzip_allowance_bytes: int = 256 << 20


DEFAULT_LIMITS = JsonLimits()
# Bytes read at a time: a batch of lines or of events is about this big.
READ_BYTES = 4 << 20


class TraceEvent(msgspec.Struct, gc=False):
    """The members of a Chrome trace event that dsprof reads; others are skipped by the parser.

    Each member is what the JSON held (any type, validated by the readers);
    ``UNSET`` where absent, which the readers tell apart from ``null``.
    ``args`` stays unparsed (:class:`msgspec.Raw`, its exact JSON text, checked
    to be JSON), so that the readers cut it into attributes a batch at a time.
    """

    name: Any = msgspec.UNSET
    cat: Any = msgspec.UNSET
    ph: Any = msgspec.UNSET
    ts: Any = msgspec.UNSET
    dur: Any = msgspec.UNSET
    pid: Any = msgspec.UNSET
    tid: Any = msgspec.UNSET
    args: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


EVENT_DECODER = msgspec.json.Decoder(TraceEvent, float_hook=Decimal)
EVENTS_DECODER = msgspec.json.Decoder(list[TraceEvent], float_hook=Decimal)
VALUE_DECODER = msgspec.json.Decoder(float_hook=Decimal)
MEMBERS_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])
# Numbers are written as their exact decimal text, never through a binary float.
JSON_ENCODER = msgspec.json.Encoder(decimal_format="number")

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_INT64_TEXT = re.compile(r"-?[0-9]{1,19}")
_NON_FINITE = re.compile(rb"-?Infinity|NaN")
_BYTE_OFFSET = re.compile(r"\(byte (\d+)\)")
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_STRUCTURAL = np.zeros(256, bool)
_STRUCTURAL[list(b"{}[],:")] = True
_DEPTH_STEP = np.zeros(256, np.int8)
_DEPTH_STEP[list(b"{[")] = 1
_DEPTH_STEP[list(b"}]")] = -1


@dataclass
class LineBatch:
    """Whole lines of a JSON-lines file: ``lines[0]`` is line ``first_line`` (1-based).

    A line longer than ``JsonLimits.max_event_bytes`` is replaced by ``b""``
    and its number listed in ``overlong``, so numbering stays right and memory
    bounded.
    """

    first_line: int
    lines: list[bytes]
    overlong: list[int] = field(default_factory=list)
    utf8: bool = True  # every line is UTF-8 (else each line must be checked: see decode_event)


def line_batches(
    handle: BinaryIO,
    limits: JsonLimits = DEFAULT_LIMITS,
    size: int | None = None,
    chunk_bytes: int = READ_BYTES,
    first_line: int = 1,
) -> Iterator[LineBatch]:
    """The lines of ``handle`` (its first ``size`` bytes, if given) a chunk at a time; the last line may lack its newline (a torn write).

    ``first_line``: the number of the handle's first line (a follower hands on the lines after those it read before).
    """
    number, tail, skipping = first_line, b"", False  # skipping: inside an overlong line, drop bytes up to its newline
    left = -1 if size is None else size
    while left and (chunk := handle.read(chunk_bytes if left < 0 else min(chunk_bytes, left))):
        left = left - len(chunk) if left > 0 else left
        if skipping:
            newline = chunk.find(b"\n")
            if newline < 0:
                continue
            chunk, skipping = chunk[newline + 1 :], False
        data = tail + chunk if tail else chunk
        cut = data.rfind(b"\n")
        tail = data[cut + 1 :]
        if cut >= 0:
            batch = _bounded(LineBatch(number, data[:cut].split(b"\n"), utf8=is_utf8(memoryview(data)[:cut])), limits)
            number += len(batch.lines)
            yield batch
        if len(tail) > limits.max_event_bytes:
            yield LineBatch(number, [b""], overlong=[number])
            number, tail, skipping = number + 1, b"", True
    if tail:
        yield _bounded(LineBatch(number, [tail], utf8=is_utf8(tail)), limits)


def is_utf8(data: bytes | memoryview) -> bool:
    """Whether ``data`` is UTF-8 text. The parser checks the strings it builds, not those it skips or keeps raw."""
    try:
        str(data, "utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _bounded(batch: LineBatch, limits: JsonLimits) -> LineBatch:
    """Blank out (and count) the lines of a batch that are longer than the limit."""
    if batch.lines and max(map(len, batch.lines)) > limits.max_event_bytes:
        batch.overlong = [batch.first_line + i for i, line in enumerate(batch.lines) if len(line) > limits.max_event_bytes]
        batch.lines = [b"" if len(line) > limits.max_event_bytes else line for line in batch.lines]
    return batch


class Decoded(NamedTuple):
    """What :func:`decode_event` made of a text: the value, or why not (``reason``).

    ``nulled`` counts NaN/Infinity values read as null, and ``text`` is the
    JSON that was parsed: the input, or the input with those values nulled.
    """

    value: Any
    reason: str | None
    nulled: int = 0
    text: bytes = b""


def decode_event(text: bytes, decoder: msgspec.json.Decoder = EVENT_DECODER) -> Decoded:
    """Decode one event (or, with another decoder, one value) by the rules of the module docstring."""
    if not is_utf8(text):
        return Decoded(None, BAD_JSON)
    try:
        return Decoded(decoder.decode(text), None, 0, text)
    except RecursionError:
        return Decoded(None, TOO_DEEP)
    except ArithmeticError:  # an exponent past what Decimal holds
        return Decoded(None, BAD_VALUE)
    except msgspec.ValidationError:
        return Decoded(None, _validation_reason(text))
    except msgspec.DecodeError:
        pass
    if b"NaN" not in text and b"Infinity" not in text:
        return Decoded(None, BAD_JSON)
    fixed, nulled = null_non_finite(text)
    if not nulled:
        return Decoded(None, BAD_JSON)
    decoded = decode_event(fixed, decoder)
    return decoded._replace(nulled=nulled) if decoded.reason is None else decoded


def parser_error(text: bytes) -> tuple[str, int]:
    """What the parser says is wrong with ``text``, and the byte offset where it stopped (0 if it does not say)."""
    try:
        VALUE_DECODER.decode(text)
    except msgspec.DecodeError as exc:
        match = _BYTE_OFFSET.search(str(exc))
        return _BYTE_OFFSET.sub("", str(exc)).strip(), int(match.group(1)) if match else 0
    except (RecursionError, ArithmeticError) as exc:
        return type(exc).__name__, 0
    return "not JSON", 0


def _validation_reason(text: bytes) -> str:
    """Why valid JSON did not decode as an event: not an object, or a number out of range."""
    try:
        value = VALUE_DECODER.decode(text)
    except (msgspec.DecodeError, ArithmeticError):
        return BAD_VALUE
    except RecursionError:
        return TOO_DEEP
    return BAD_VALUE if isinstance(value, dict) else NOT_OBJECT


def null_non_finite(text: bytes) -> tuple[bytes, int]:
    """``text`` with every NaN/Infinity/-Infinity token outside strings replaced by ``null``, and how many."""
    hits = [(m.start(), m.end()) for m in _NON_FINITE.finditer(text)]
    if not hits:
        return text, 0
    spans = np.array(hits, np.int64)
    delimiters = string_delimiters(np.frombuffer(text, np.uint8))
    outside = np.searchsorted(delimiters, spans[:, 0]) % 2 == 0
    spans = spans[outside]
    if not len(spans):
        return text, 0
    pieces, last = [], 0
    for start, end in spans.tolist():  # one piece per replaced token: bounded by the event's size
        pieces += [text[last:start], b"null"]
        last = end
    pieces.append(text[last:])
    return b"".join(pieces), len(spans)


def string_delimiters(data: np.ndarray) -> np.ndarray:
    """Positions of the quotes that open or close strings in ``data`` (uint8), which starts outside a string.

    A quote is escaped when an odd run of backslashes precedes it. Outside
    strings a backslash is not JSON at all; text like that fails to parse
    later, so it does not matter how it is cut here.
    """
    quotes = np.flatnonzero(data == _QUOTE)
    if not len(quotes):
        return quotes
    backslashes = np.flatnonzero(data == _BACKSLASH)
    if not len(backslashes):
        return quotes
    run_start = np.ones(len(backslashes), bool)
    run_start[1:] = np.diff(backslashes) != 1
    starts = backslashes[run_start]
    ends = np.append(backslashes[np.flatnonzero(run_start)[1:] - 1], backslashes[-1])
    escaped = np.zeros(len(data) + 1, bool)
    escaped[ends[(ends - starts) % 2 == 0] + 1] = True  # odd run length: the next byte is escaped
    return quotes[~escaped[quotes]]


class Structure(NamedTuple):
    """Where a JSON text's structure is (see :func:`scan_structure`)."""

    positions: np.ndarray  # of the brackets, commas and colons outside strings
    chars: np.ndarray  # their bytes
    depth: np.ndarray  # the nesting depth after each
    delimiters: np.ndarray  # positions of the quotes that open and close strings


def scan_structure(data: np.ndarray) -> Structure:
    """The brackets, commas and colons of ``data`` (uint8, starting outside any string and value) that lie outside strings.

    The depth after each is counted from 0 at the start of ``data`` (``{``/``[``
    add one, ``}``/``]`` take one away). Bracket kinds are not matched here;
    the parser checks each piece cut at these positions.
    """
    delimiters = string_delimiters(data)
    candidates = np.flatnonzero(_STRUCTURAL[data])
    if len(delimiters):
        candidates = candidates[np.searchsorted(delimiters, candidates) % 2 == 0]
    chars = data[candidates]
    return Structure(candidates, chars, np.cumsum(_DEPTH_STEP[chars], dtype=np.int64), delimiters)


def int64_of(value: Any) -> int | None:
    """``value`` as an int64 when it is one: an int, an integral decimal, or integer text, within int64 range; else None."""
    if (
        type(value) is str
        and _INT64_TEXT.fullmatch(value)
        or isinstance(value, Decimal)
        and value.is_finite()
        and value.adjusted() <= 18
        and value == value.to_integral_value()
    ):
        value = int(value)
    return value if type(value) is int and INT64_MIN <= value <= INT64_MAX else None


def json_text(value: Any) -> str:
    """Compact JSON text of a decoded value (numbers with their exact digits)."""
    return JSON_ENCODER.encode(value).decode()


def compact_json(text: bytes | msgspec.Raw) -> str:
    """Valid JSON text without the whitespace between its tokens (strings and number digits kept exactly)."""
    return msgspec.json.format(bytes(text), indent=-1).decode()


# -- the record dsprof's merge keeps in a merged trace.json ---------------------------------------
#
# ``merge_fragments`` writes ``{"otherData": {MERGE_RECORD: {...}}, "traceEvents": [...]}`` with
# MERGE_RECORD holding ``fragments`` ({file name: bytes merged}, each fragment as it was when the
# merge began) and ``counts`` ({"events": n, <dropped reason>: n, ..., NON_FINITE_VALUES: n}).
# Readers use the first to tell whether the merge is still up to date with the fragments beside
# it, and report the second's dropped counts as their own.
MERGE_RECORD = "dsprof.sa_profile_merge"
NON_FINITE_VALUES = "non_finite_values"
