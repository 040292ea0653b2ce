"""Read any mix of dsprof inputs into one :class:`~dsprof.analysis.spans.Trace`.

:func:`read_paths` decides what each path is:

* a directory is read for what it holds: every ``*.log`` (STRACE text logs,
  e.g. the runtime's ``server.log``); the SA_PROFILE trace under
  ``serving-trace/`` or in the directory itself (``trace.json`` preferred,
  else the fragments — never both, so no event is read twice); Kineto traces
  named ``*.trace.json`` / ``*.trace.json.gz``; and ``performance_summary.json``
  / ``faults.json``, loaded into ``Trace.extras["performance_summary"]`` /
  ``Trace.extras["faults"]``. A directory holding none of these is an error;
* a ``.jsonl`` file is an SA_PROFILE fragment;
* a ``.json`` / ``.gz`` file (or one starting with gzip magic bytes) is a
  Chrome trace — read as SA_PROFILE (``source="sa_profile"``) when it is an
  SA_PROFILE merge (named ``trace.json`` beside a ``fragments/`` directory or
  inside ``serving-trace/``, or a ``.json`` output path with
  ``<path>.fragments/`` beside it), else as a generic Chrome/Kineto trace; an
  SA_PROFILE ``.json`` output path that was never merged is read from its
  fragments;
* ``performance_summary.json`` / ``faults.json`` given directly go to extras;
* any other file is a text log searched for STRACE records.

Extras after merging: ``lines_read`` (text-log lines, summed),
``process_names`` / ``thread_names`` (Chrome ``M`` metadata, merged),
``performance_summary`` / ``faults`` (from the first path that has them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from dsprof.analysis.ingest.chrome import GZIP_MAGIC, read_chrome_trace
from dsprof.analysis.ingest.sa_profile import FRAGMENTS_DIR, MERGED_NAME, read_sa_profile
from dsprof.analysis.ingest.strace_log import read_strace_log
from dsprof.analysis.spans import Trace, concat_spans
from dsprof.errors import InputError

__all__ = [
    "read_paths",
    "read_strace_log",
    "read_sa_profile",
    "read_chrome_trace",
    "ingest_to_file",
    "format_ingest_report",
    "merge_traces",
]

SERVING_TRACE_DIR = "serving-trace"
# Side files of an artifact directory and the extras key each is loaded into.
SIDE_FILES = {"performance_summary.json": "performance_summary", "faults.json": "faults"}

Progress = Callable[[str], None] | None


def read_paths(paths: Sequence[str | os.PathLike], progress: Progress = None) -> Trace:
    """Read every path (see the module docstring) and merge the results."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    traces: list[Trace] = []
    seen: set[Path] = set()
    for path in map(Path, paths):
        if path.resolve() in seen:  # the same input named twice is read once
            continue
        seen.add(path.resolve())
        traces.extend(_read_one(path, progress))
    return merge_traces(traces)


def ingest_to_file(paths: Sequence[str | os.PathLike], output: str | os.PathLike, progress: Progress = None) -> Trace:
    """Read ``paths`` and write their span table to ``output`` (format from its extension)."""
    from dsprof.analysis.outputs.span_table import check_span_table_path, write_span_table

    check_span_table_path(output)  # fail before reading a large input
    trace = read_paths(paths, progress=progress)
    if progress is not None:
        progress(f"writing {len(trace.spans):,} spans to {output}")
    write_span_table(trace.spans, output)
    return trace


def format_ingest_report(trace: Trace) -> str:
    """What was read, kept and dropped (by reason), for the ``dsprof ingest`` printout."""
    lines = [f"files read: {len(trace.files)}"]
    if "lines_read" in trace.extras:
        lines.append(f"log lines read: {trace.extras['lines_read']:,}")
    lines.append(f"records read: {trace.records_read:,}")
    by_source = trace.spans["source"].value_counts().sort_index() if len(trace.spans) else pd.Series(dtype="int64")
    detail = ", ".join(f"{source} {count:,}" for source, count in by_source.items())
    lines.append(f"spans kept: {len(trace.spans):,}" + (f" ({detail})" if detail else ""))
    lines.append(f"clock anchors: {len(trace.anchors):,}; chip processes: {len(trace.chip_devices):,}")
    lines.append(f"dropped: {trace.dropped_total:,}")
    for reason, count in sorted(trace.dropped.items()):
        lines.append(f"  {reason}: {count:,}")
    return "\n".join(lines)


def merge_traces(traces: Sequence[Trace]) -> Trace:
    """One Trace from several: spans, anchors and chip devices stacked, counters summed."""
    merged = Trace()
    if not traces:
        return merged
    merged.spans = concat_spans([t.spans for t in traces])
    merged.anchors = _concat_frames([t.anchors for t in traces], merged.anchors)
    merged.chip_devices = _concat_frames([t.chip_devices for t in traces], merged.chip_devices)
    for trace in traces:
        for reason, count in trace.dropped.items():
            merged.dropped[reason] = merged.dropped.get(reason, 0) + count
        merged.records_read += trace.records_read
        merged.files.extend(trace.files)
        for key, value in trace.extras.items():
            if key == "lines_read":
                merged.extras[key] = merged.extras.get(key, 0) + value
            elif key in ("process_names", "thread_names"):
                merged.extras.setdefault(key, {}).update(value)
            else:
                merged.extras.setdefault(key, value)
    return merged


def _concat_frames(frames: list[pd.DataFrame], empty: pd.DataFrame) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    if not frames:
        return empty
    return pd.concat(frames, ignore_index=True).astype(empty.dtypes.to_dict())


def _read_one(path: Path, progress: Progress) -> list[Trace]:
    if not path.exists():
        if _fragments_beside(path).is_dir():  # an SA_PROFILE .json output whose merge was never written
            return [read_sa_profile(path, progress=progress)]
        raise InputError(path, "no such file or directory")
    if path.is_dir():
        return _read_directory(path, progress)
    if path.name in SIDE_FILES:
        return [_side_file(path)]
    if progress is not None:
        progress(f"reading {path}")
    if path.suffix == ".jsonl":
        return [read_sa_profile(path)]
    if path.suffix in (".json", ".gz") or _starts_with_gzip_magic(path):
        if _is_sa_profile_merge(path):
            return [read_sa_profile(path)]
        return [read_chrome_trace(path)]
    return [read_strace_log(path, progress=progress)]


def _read_directory(path: Path, progress: Progress) -> list[Trace]:
    traces = []
    for log in sorted(path.glob("*.log")):
        if log.is_file():
            if progress is not None:
                progress(f"reading {log}")
            traces.append(read_strace_log(log, progress=progress))
    serving = path / SERVING_TRACE_DIR
    if serving.is_dir():
        traces.append(read_sa_profile(serving, progress=progress))
    elif (path / MERGED_NAME).is_file() or (path / FRAGMENTS_DIR).is_dir() or any(path.glob("*.jsonl")):
        traces.append(read_sa_profile(path, progress=progress))
    for kineto in sorted([*path.glob("*.trace.json"), *path.glob("*.trace.json.gz")]):
        if kineto.is_file() and kineto.name != MERGED_NAME:
            traces.append(read_chrome_trace(kineto, progress=progress))
    for name in SIDE_FILES:
        if (path / name).is_file():
            traces.append(_side_file(path / name))
    if not traces:
        raise InputError(path, "directory holds no dsprof inputs", expected="*.log, serving-trace/, trace.json, fragments/ or *.jsonl")
    return traces


def _side_file(path: Path) -> Trace:
    """performance_summary.json / faults.json as an extras-only Trace (integers stay exact)."""
    try:
        content = json.loads(path.read_bytes())
    except json.JSONDecodeError as exc:
        raise InputError(path, f"invalid JSON: {exc.msg}", line=exc.lineno) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read: {exc}") from None
    if not isinstance(content, dict):
        raise InputError(path, "not a JSON object", expected=f"{path.name} as written by the runtime")
    return Trace(files=[str(path)], extras={SIDE_FILES[path.name]: content})


def _is_sa_profile_merge(path: Path) -> bool:
    in_output_dir = path.name == MERGED_NAME and ((path.parent / FRAGMENTS_DIR).is_dir() or path.parent.name == SERVING_TRACE_DIR)
    return in_output_dir or _fragments_beside(path).is_dir()


def _fragments_beside(path: Path) -> Path:
    """Where SA_PROFILE puts the fragments of a ``.json`` output path."""
    return path.with_name(path.name + ".fragments")


def _starts_with_gzip_magic(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(2) == GZIP_MAGIC
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
