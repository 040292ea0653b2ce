"""``dsprof ingest``: read traces and write their spans to disk, in bounded memory.

The output is either the span dataset (a directory: Parquet parts by time
window and ``dataset.json``, see :mod:`dsprof.analysis.store.dataset`), which the
analysis reads out of core, or one span table file (``.parquet``, ``.csv``,
``.jsonl``, see :mod:`dsprof.analysis.outputs.span_table`). Text logs stream
through the writer a piece at a time; the spans of the JSON readers (SA_PROFILE,
Chrome), which read whole files, are written after them.
"""

from __future__ import annotations

import functools
import gc
import importlib.abc
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.ingest.onto_disk import SpanWriter, read_onto
from dsprof.analysis.store.dataset import MANIFEST, SpanDatasetWriter
from dsprof.analysis.store.spans import Trace
from dsprof.commands.printing import Printer, safe_lines, safe_progress
from dsprof.progress import Progress


def is_dataset_output(output: str | os.PathLike) -> bool:
    """Whether ``output`` names the span dataset (a directory) rather than a span table file.

    A directory is named with a trailing separator (``out/``), or exists, or
    has no extension at all.
    """
    text = os.fspath(output)
    return text.endswith(("/", os.sep)) or Path(text).is_dir() or not Path(text).suffix


def ingest_command(
    paths: Sequence[str | os.PathLike], output: str | os.PathLike, *, progress: Progress = None, out: Printer = print
) -> None:
    """``dsprof ingest``: write the spans of ``paths`` to ``output`` and print what was read, kept and dropped.

    Made for a process of its own (the CLI's): it turns the cyclic garbage
    collector off (the readers make no reference cycles worth collecting, and
    it would only take CPU from them), freezes what is left when it is done
    (the interpreter's collection at exit took 25 ms of a 0.7 s ingest), and
    keeps pandas out.
    """
    gc.disable()
    keep_pandas_out()
    progress, out = safe_progress(progress), safe_lines(out)
    trace = ingest_paths(paths, output, progress=progress)
    out(format_ingest_report(trace))
    out(output_description(output, trace))
    gc.freeze()


def ingest_paths(
    paths: Sequence[str | os.PathLike], output: str | os.PathLike, progress: Progress = None, step_marker: str | None = None
) -> Trace:
    """Read ``paths`` (see :func:`~dsprof.analysis.ingest.read_paths`) and write their spans to ``output``.

    Returns the Trace with its spans on disk: ``spans`` is empty,
    ``spans_written`` counts what was written by source, and ``span_files``
    lists the Parquet files (those of the dataset, or the one ``.parquet``).
    A bad output extension fails before anything is read; after an error no
    dataset manifest and no partial file is left.
    """
    folder = Path(output) if is_dataset_output(output) else Path(output).parent
    return read_onto(paths, output, functools.partial(span_writer, output), folder=folder, progress=progress, step_marker=step_marker)


def span_writer(output: str | os.PathLike) -> SpanWriter:
    """The writer of ``output``: the span dataset, or one span table file."""
    if is_dataset_output(output):
        return SpanDatasetWriter(output)
    from dsprof.analysis.outputs.span_table import SpanTableWriter  # its CSV and JSON writers: for a file output only

    return SpanTableWriter(output)


def format_ingest_report(trace: Trace) -> str:
    """What was read, kept and dropped (by reason), for the ``dsprof ingest`` printout."""
    by_source = dict(trace.spans_written)
    if trace.spans.num_rows:
        for entry in pc.value_counts(trace.spans.column("source")).to_pylist():
            by_source[entry["values"]] = by_source.get(entry["values"], 0) + entry["counts"]
    lines = [f"files read: {len(trace.files)}"]
    if trace.lines_read:
        lines.append(f"log lines read: {trace.lines_read:,}")
    lines.append(f"records read: {trace.records_read:,}")
    detail = ", ".join(f"{source} {count:,}" for source, count in sorted(by_source.items()))
    lines.append(f"spans kept: {sum(by_source.values()):,}" + (f" ({detail})" if detail else ""))
    lines.append(f"clock anchors: {trace.anchors.num_rows:,}; chip processes: {trace.chip_devices.num_rows:,}")
    lines.append(f"dropped: {trace.dropped_total:,}")
    for reason, count in sorted(trace.dropped.items()):
        lines.append(f"  {reason}: {count:,}")
    return "\n".join(lines)


def output_description(output: str | os.PathLike, trace: Trace) -> str:
    """The last line of the printout: where the spans went."""
    if is_dataset_output(output):
        return f"span dataset: {output} ({len(trace.span_files)} Parquet file(s), manifest {Path(output) / MANIFEST})"
    return f"span table: {output}"


class _NoPandas(importlib.abc.MetaPathFinder):
    """Refuses the import of pandas (used once, see :func:`keep_pandas_out`)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is not used by dsprof ingest")


def keep_pandas_out() -> None:
    """Stop pyarrow from importing pandas in this process (``dsprof ingest`` needs none of it).

    pyarrow imports pandas on its first array conversion, only to check
    whether the input is a pandas object; that import costs more start-up
    time than reading a small log. The check is made here once, with the
    import refused, and pyarrow remembers the answer; should anything later
    ask pyarrow for a real pandas conversion, pyarrow imports pandas then.
    """
    if "pandas" in sys.modules:
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(finder)
