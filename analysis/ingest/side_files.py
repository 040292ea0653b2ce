"""The JSON side files of an artifact directory: ``performance_summary.json`` and ``faults.json``.

They are small, but they are input like any other, parsed by the rules of
:mod:`dsprof.profiler.chrome_json`: a file larger than :data:`MAX_BYTES`, not
JSON, nested deeper than the parser takes, holding a number out of range, or
not a JSON object is an InputError naming it (and the line, for JSON that does
not parse); integers stay exact, other numbers are floats; NaN/Infinity values (Python's ``json``
writes them for a figure that could not be computed) are read as null and
said in ``Trace.notes``.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from dsprof.analysis.store.spans import Trace
from dsprof.errors import InputError
from dsprof.profiler import artifacts
from dsprof.profiler.chrome_json import BAD_VALUE, TOO_DEEP, decode_event, parser_error

# Side files are small; a bigger one is not what the runtime writes.
MAX_BYTES = 16 << 20
# Figures are used as Python floats (a number past float range is out of range).
_DECODER = msgspec.json.Decoder()


def read_side_file(path: Path) -> Trace:
    """``performance_summary.json`` / ``faults.json`` as a Trace carrying only that file."""
    content, nulled = load_json_object(path, expected=f"{path.name} as written by the runtime")
    trace = Trace(files=[str(path)])
    if path.name == artifacts.PERFORMANCE_SUMMARY:
        trace.performance_summary = content
    else:
        trace.faults = content
    if nulled:
        trace.notes.append(f"{path}: {nulled} NaN/Infinity value(s) read as null (not JSON)")
    return trace


def load_json_object(path: Path, *, expected: str) -> tuple[dict, int]:
    """A JSON object from a small file, and how many NaN/Infinity values were read as null; one line naming the file on any problem."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise InputError(path, f"larger than {MAX_BYTES >> 20} MiB", expected=expected)
    content, reason, nulled, _ = decode_event(raw, _DECODER)
    if reason == TOO_DEEP:
        raise InputError(path, "JSON nested too deeply", expected=expected)
    if reason == BAD_VALUE:
        raise InputError(path, "a number out of range", expected=expected)
    if reason is not None:
        message, offset = parser_error(raw)
        raise InputError(path, f"invalid JSON: {message}", line=raw.count(b"\n", 0, offset) + 1, expected=expected)
    if not isinstance(content, dict):
        raise InputError(path, "not a JSON object", expected=expected)
    return content, nulled
