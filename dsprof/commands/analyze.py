"""``dsprof analyze``: read artifacts, compute every figure, write summary.json, summary.md,
combined-swimlane.json and report.html (:mod:`dsprof.commands.analysis_job` does the work)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from dsprof.analysis.analyze import DEFAULT_THRESHOLD_MS
from dsprof.analysis.cluster.ray_engine import check_address
from dsprof.analysis.outputs.console import format_console_summary
from dsprof.analysis.store.memory_limit import parse_memory_limit
from dsprof.analysis.window import parse_window
from dsprof.commands.analysis_job import analyze_paths, default_out_dir
from dsprof.commands.printing import Printer, safe_lines, safe_progress
from dsprof.progress import Progress


def analyze_command(
    paths: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike | None = None,
    *,
    threshold_ms: float = DEFAULT_THRESHOLD_MS,
    expect_ranks: int | None = None,
    memory_limit: str | None = None,
    spans_dir: str | os.PathLike | None = None,
    engine: str = "embedded",
    address: str | None = None,
    step_marker: str | None = None,
    steps: str | None = None,
    since: str | None = None,
    until: str | None = None,
    progress: Progress = None,
    out: Printer = print,
) -> None:
    """``dsprof analyze``: analyse ``paths`` into ``out_dir`` (default: :func:`default_out_dir`), print the findings and the files.

    ``memory_limit`` and the window's options are the options' text (``4GB``, ``25%``; ``1000:1999``, ``+5m``),
    checked before any input is read.
    """
    limit = None if memory_limit is None else parse_memory_limit(memory_limit)
    window = parse_window(steps, since, until)
    progress, out = safe_progress(progress), safe_lines(out)
    if engine == "ray":
        check_address(address)  # its form, before any input is read; whether it answers, when Ray starts
    outcome = analyze_paths(
        paths,
        default_out_dir(paths) if out_dir is None else out_dir,
        threshold_ms=threshold_ms,
        expect_ranks=expect_ranks,
        memory_limit=limit,
        spans_dir=spans_dir,
        engine=engine,
        address=address,
        window=window,
        step_marker=step_marker,
        progress=progress,
    )
    try:
        out(format_console_summary(outcome.summary))
        for name, path in outcome.outputs.items():
            out(f"{name}: {path}")
    finally:
        outcome.result.engine.close()  # its spill folder goes with it
