"""summary.json (the model and its schema: :mod:`dsprof.analysis.summary`, docs/SUMMARY_SCHEMA.md)."""

from __future__ import annotations

import json
from pathlib import Path

from dsprof.analysis.summary import Summary
from dsprof.fileio import atomic_output

# text encoded and written at a time: a million-step per_step list is never one string in memory
_WRITE_CHARS = 1 << 20


def write_summary_json(summary: Summary, path: str | Path) -> Path:
    """Write the summary with stable key order; ``NaN`` is refused (the schema uses null).

    The bytes are ``json.dumps(summary, indent=2) + "\\n"``, encoded a piece at a time.
    """
    encoder = json.JSONEncoder(indent=2, allow_nan=False)
    with atomic_output(path) as handle:
        pending: list[str] = []
        size = 0
        for piece in encoder.iterencode(summary):  # small pieces of text, joined into blocks
            pending.append(piece)
            size += len(piece)
            if size >= _WRITE_CHARS:
                handle.write("".join(pending).encode("utf-8"))
                pending, size = [], 0
        pending.append("\n")
        handle.write("".join(pending).encode("utf-8"))
    return Path(path)
