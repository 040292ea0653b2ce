"""Reading inputs onto disk a piece at a time: the spans go to a writer as the readers make them.

What ``dsprof ingest`` and an ``analyze`` of inputs too big for memory share
(the span dataset, or one span table file): memory stays that of one piece.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.ingest import read_paths
from dsprof.analysis.store.spans import SPAN_SCHEMA, Trace
from dsprof.progress import Progress


class SpanWriter(Protocol):
    """Where the spans go: the span dataset's writer or a span table file's."""

    @property
    def span_files(self) -> list[Path]: ...

    def add(self, table: pa.Table) -> None: ...

    def finish(self, trace: Trace) -> Path: ...

    def abort(self) -> None: ...


def read_onto(
    paths: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    make_writer: Callable[[], SpanWriter],
    *,
    folder: Path,
    progress: Progress = None,
    step_marker: str | None = None,
) -> Trace:
    """Read ``paths`` (see :func:`~dsprof.analysis.ingest.read_paths`) into the writer of ``output`` that ``make_writer`` makes.

    Returns the Trace with its spans on disk: ``spans`` is empty,
    ``spans_written`` counts what was written by source, and ``span_files``
    lists the Parquet files. After an error the writer is aborted and the
    folders up to ``folder`` that the write created are removed where empty:
    nothing half-written is left.
    """
    made = _missing_folders(folder)
    try:
        return _read_into(paths, output, make_writer(), progress, step_marker)
    except BaseException:
        _remove_empty(made)
        raise


def _read_into(
    paths: Sequence[str | os.PathLike], output: str | os.PathLike, writer: SpanWriter, progress: Progress, step_marker: str | None
) -> Trace:
    counting = _CountingSink(writer)
    try:
        trace = read_paths(paths, progress=progress, sink=counting, step_marker=step_marker)
        counting.add(trace.spans)  # the readers that do not stream
        trace.spans = SPAN_SCHEMA.empty_table()
        trace.spans_written = dict(sorted(counting.by_source.items()))
        if progress is not None:
            progress(f"finishing {output}")
        writer.finish(trace)
    except BaseException:
        writer.abort()
        raise
    trace.span_files = writer.span_files
    return trace


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its ancestors that do not exist yet, deepest first: what writing there creates."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders a write created, deepest first, where nothing else was put in them."""
    for folder in folders:
        with contextlib.suppress(OSError):  # not empty (someone else's files) or already gone
            folder.rmdir()


class _CountingSink:
    """Hands tables on to a writer, counting their rows by source."""

    def __init__(self, writer: SpanWriter):
        self.writer = writer
        self.by_source: dict[str, int] = {}

    def add(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        for entry in pc.value_counts(table.column("source")).to_pylist():  # a few sources
            self.by_source[str(entry["values"])] = self.by_source.get(str(entry["values"]), 0) + entry["counts"]
        self.writer.add(table)
