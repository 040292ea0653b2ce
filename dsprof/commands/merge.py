"""``dsprof merge``: merge SA_PROFILE fragments into the trace they belong to."""

from __future__ import annotations

import os
from collections.abc import Callable

from dsprof.commands.printing import Printer, safe_lines, safe_progress
from dsprof.profiler.sa_profile import merge_fragments


def merge_command(output: str | os.PathLike, *, progress: Callable[[str], None] | None = None, out: Printer = print) -> None:
    """Merge the fragments of the SA_PROFILE output ``output`` (a directory, or a path ending in .json), and say what was merged."""
    progress, out = safe_progress(progress), safe_lines(out)
    result = merge_fragments(output, progress=progress, require_fragments=True)
    out(
        f"merged {result.events} events from {result.fragments} fragment(s) into {result.path}"
        f" ({result.skipped_lines} malformed line(s) skipped)"
    )
