"""summary.json (the model and its schema: :mod:`dsprof.analysis.summary`, docs/SUMMARY_SCHEMA.md)."""

from __future__ import annotations

import json
from pathlib import Path

from dsprof.analysis.summary import Summary
from dsprof.fileio import atomic_write_text


def write_summary_json(summary: Summary, path: str | Path) -> Path:
    """Write the summary with stable key order; ``NaN`` is refused (the schema uses null)."""
    return atomic_write_text(path, json.dumps(summary, indent=2, allow_nan=False) + "\n")
