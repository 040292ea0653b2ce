"""summary.json (schema ``dsprof.summary/1``, docs/SUMMARY_SCHEMA.md)."""

from __future__ import annotations

import json
from pathlib import Path


def write_summary_json(summary: dict, path: str | Path) -> Path:
    """Write the summary with stable key order; ``NaN`` is refused (the schema uses null)."""
    path = Path(path)
    path.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    return path
