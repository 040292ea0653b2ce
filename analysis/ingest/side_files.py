"""The JSON side files of an artifact directory: ``performance_summary.json`` and ``faults.json``.

They are small, but they are input like any other: a file that is not a JSON
object, or that nests deeper than :data:`MAX_DEPTH`, is an InputError naming
it; integers stay exact.
"""

from __future__ import annotations

import json
from pathlib import Path

from dsprof.analysis.spans import Trace
from dsprof.errors import InputError
from dsprof.profiler import artifacts

# Side files are small; a bigger one is not what the runtime writes.
MAX_BYTES = 16 << 20


def read_side_file(path: Path) -> Trace:
    """``performance_summary.json`` / ``faults.json`` as a Trace carrying only that file."""
    content = load_json_object(path, expected=f"{path.name} as written by the runtime")
    trace = Trace(files=[str(path)])
    if path.name == artifacts.PERFORMANCE_SUMMARY:
        trace.performance_summary = content
    else:
        trace.faults = content
    return trace


def load_json_object(path: Path, *, expected: str) -> dict:
    """A JSON object from a small file: one line naming the file on any problem."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise InputError(path, f"larger than {MAX_BYTES >> 20} MiB", expected=expected)
    try:
        content = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InputError(path, f"invalid JSON: {exc.msg}", line=exc.lineno, expected=expected) from None
    except UnicodeDecodeError:
        raise InputError(path, "not UTF-8 text", expected=expected) from None
    except RecursionError:
        raise InputError(path, "JSON nested too deeply", expected=expected) from None
    if not isinstance(content, dict):
        raise InputError(path, "not a JSON object", expected=expected)
    return content
