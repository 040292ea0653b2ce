"""Read any mix of dsprof inputs into one :class:`~dsprof.analysis.store.spans.Trace`.

:func:`read_paths` decides what each path is and hands it to its reader
(docs/FORMATS.md, "Which reader reads a path"). With a ``sink``, text logs hand
their span tables to it chunk by chunk
(:class:`~dsprof.analysis.ingest.sink.SpanSink`), so a log of any size is read
in bounded memory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from dsprof.analysis.ingest.chrome import read_chrome_trace
from dsprof.analysis.ingest.json_stream import GZIP_MAGIC
from dsprof.analysis.ingest.kineto import SOURCE, is_kineto, read_kineto_traces
from dsprof.analysis.ingest.kineto_join import RunIndex, join_device_timeline
from dsprof.analysis.ingest.sa_profile import fragment_home, read_sa_profile
from dsprof.analysis.ingest.side_files import read_side_file
from dsprof.analysis.ingest.sink import SpanSink
from dsprof.analysis.ingest.strace_log import read_strace_log
from dsprof.analysis.store.spans import ANCHOR_SCHEMA, PARQUET_SCHEMA, Trace, empty_spans, merge_traces
from dsprof.errors import InputError
from dsprof.profiler import artifacts
from dsprof.profiler.chrome_json import DEFAULT_LIMITS, JsonLimits
from dsprof.progress import Progress

__all__ = ["Progress", "SpanSink", "fragment_source", "is_text_log", "read_paths", "read_strace_log"]

SIDE_FILES = (artifacts.PERFORMANCE_SUMMARY, artifacts.FAULTS)


def read_paths(
    paths: Sequence[str | os.PathLike] | str | os.PathLike,
    progress: Progress = None,
    sink: SpanSink | None = None,
    limits: JsonLimits = DEFAULT_LIMITS,
    logs: bool = True,
    step_marker: str | None = None,
) -> Trace:
    """Read every path (see the module docstring) and merge the results.

    ``limits`` bound JSON input; ``logs=False`` leaves text logs out (the cluster engine reads them elsewhere);
    ``step_marker``: the ``record_function`` label of a Kineto trace's steps (default ``ProfilerStep#N``).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    traces: list[Trace] = []
    seen: set[Path] = set()
    kineto: list[Path] = []  # the ranks of one job, read together
    index = RunIndex(sink) if sink is not None else None  # the STRACE runs handed to the sink, for the Kineto join
    for path in map(Path, paths):
        if path.resolve() in seen:  # the same input named twice is read once
            continue
        seen.add(path.resolve())
        traces.extend(_read_one(path, progress, index, limits, logs, kineto))
    if kineto:
        in_memory = RunIndex()
        for trace in traces:
            in_memory.add(trace.spans)
        runs = pa.concat_tables([in_memory.table(), *([index.table()] if index is not None else [])])
        anchors = pa.concat_tables([ANCHOR_SCHEMA.empty_table(), *(t.anchors for t in traces)])
        traces.append(_kineto_job(kineto, step_marker, limits, progress, sink, runs, anchors))
    return merge_traces(traces)


def _kineto_job(
    paths: list[Path],
    step_marker: str | None,
    limits: JsonLimits,
    progress: Progress,
    sink: SpanSink | None,
    runs: pa.Table,
    anchors: pa.Table,
) -> Trace:
    """The Kineto files' runs, or where STRACE ``runs`` were read, their device timeline (:mod:`.kineto_join`);
    handed to ``sink`` when there is one (they are a few rows per step)."""
    alone = not runs.num_rows  # no STRACE runs to join: the rows can go to the sink as they are made
    trace = read_kineto_traces(sorted(set(paths)), step_marker=step_marker, limits=limits, progress=progress, sink=sink if alone else None)
    joined = None if alone else join_device_timeline(trace, runs, anchors)
    trace = joined if joined is not None else trace
    if sink is not None and trace.spans.num_rows:
        sink.add(trace.spans.cast(PARQUET_SCHEMA))
        trace.spans_written[SOURCE] = trace.spans_written.get(SOURCE, 0) + trace.spans.num_rows
        trace.spans = empty_spans()
    return trace


def is_text_log(path: Path) -> bool:
    """Whether a file is read as a STRACE text log (not JSON, not a side file)."""
    return path.name not in SIDE_FILES and path.suffix not in (".json", ".jsonl", ".gz") and not _starts_with_gzip_magic(path)


def fragment_source(path: Path) -> Path | None:
    """Where a path's SA_PROFILE fragments are written while its job runs, as read_paths finds them; None: none yet.

    A directory's SA_PROFILE output (:func:`_sa_profile_output`) or a ``.json``
    output, and there :func:`~.sa_profile.fragment_home`; a fragment named
    directly. ``dsprof watch`` follows them (:mod:`.fragment_follow`).
    """
    if path.suffix == ".jsonl":
        return path if path.is_file() else None
    output = _sa_profile_output(path) if path.is_dir() else path if path.suffix == ".json" else None
    home = fragment_home(output) if output is not None else None
    return home if home is not None and artifacts.fragment_files(home) else None


def _sa_profile_output(directory: Path) -> Path | None:
    """The SA_PROFILE output of a directory read whole: its ``serving-trace/``, else itself where it holds one."""
    serving = directory / artifacts.SERVING_TRACE_DIR
    if serving.is_dir():
        return serving
    holds = (directory / artifacts.MERGED_TRACE).is_file() or (directory / artifacts.FRAGMENTS_DIR).is_dir()
    return directory if holds or artifacts.fragment_files(directory) else None


def _read_one(path: Path, progress: Progress, sink: SpanSink | None, limits: JsonLimits, logs: bool, kineto: list[Path]) -> list[Trace]:
    if not path.exists():
        if artifacts.fragments_dir(path).is_dir():  # an SA_PROFILE .json output whose merge was never written
            return [read_sa_profile(path, progress=progress, limits=limits, sink=sink)]
        raise InputError(path, "no such file or directory")
    if path.is_dir():
        return _read_directory(path, progress, sink, limits, logs, kineto)
    if path.name in SIDE_FILES:
        return [read_side_file(path)]
    json_trace = path.suffix != ".jsonl" and (path.suffix in (".json", ".gz") or _starts_with_gzip_magic(path))
    serving_merge = json_trace and _is_sa_profile_merge(path)
    if json_trace and not serving_merge and is_kineto(path, limits):
        kineto.append(path)  # read with the job's other ranks, which says "reading" for each
        return []
    if progress is not None:
        progress(f"reading {path}")
    if path.suffix == ".jsonl" or serving_merge:
        return [read_sa_profile(path, limits=limits, sink=sink)]
    if json_trace:
        return [read_chrome_trace(path, limits=limits, sink=sink)]
    return [read_strace_log(path, progress=progress, sink=sink)] if logs else []


def _read_directory(
    path: Path, progress: Progress, sink: SpanSink | None, limits: JsonLimits, logs: bool, kineto: list[Path]
) -> list[Trace]:
    traces = []
    for log in sorted(path.glob("*.log")) if logs else []:
        if log.is_file():
            if progress is not None:
                progress(f"reading {log}")
            traces.append(read_strace_log(log, progress=progress, sink=sink))
    serving = _sa_profile_output(path)
    if serving is not None:
        traces.append(read_sa_profile(serving, progress=progress, limits=limits, sink=sink))
    chrome = {p for p in [*path.glob("*.trace.json"), *path.glob("*.trace.json.gz")] if p.is_file() and p.name != artifacts.MERGED_TRACE}
    ranks = [
        p
        for p in sorted([*path.glob("*.json"), *path.glob("*.json.gz")])
        if p.is_file() and p.name not in (*SIDE_FILES, artifacts.MERGED_TRACE)
    ]
    profiles = path / artifacts.TORCH_PROFILER_DIR  # dsprof run --torch-profiler: one Kineto trace per rank
    if profiles.is_dir():
        ranks += sorted(p for p in profiles.iterdir() if p.is_file() and artifacts.TORCH_PROFILE_PATTERN.match(p.name))
    for json_file in ranks:
        if is_kineto(json_file, limits):
            kineto.append(json_file)
            chrome.discard(json_file)
    for trace_file in sorted(chrome):
        traces.append(read_chrome_trace(trace_file, progress=progress, limits=limits, sink=sink))
    for name in SIDE_FILES:
        if (path / name).is_file():
            traces.append(read_side_file(path / name))
    if not traces and not any(path in (p.parent, p.parent.parent) for p in kineto) and logs:
        raise InputError(
            path,
            "directory holds no dsprof inputs",
            expected="*.log, serving-trace/, trace.json, fragments/, trace.<pid>.jsonl or PyTorch-profiler *.json",
        )
    return traces


def _is_sa_profile_merge(path: Path) -> bool:
    in_output_dir = path.name == artifacts.MERGED_TRACE and (
        (path.parent / artifacts.FRAGMENTS_DIR).is_dir() or path.parent.name == artifacts.SERVING_TRACE_DIR
    )
    return in_output_dir or artifacts.fragments_dir(path).is_dir()


def _starts_with_gzip_magic(path: Path) -> bool:
    """Whether a regular file opens with gzip's magic bytes.

    A pipe, FIFO or device (``/dev/stdin``) is never looked into: what this
    read would be gone for the reader. It is read as a text log unless its name
    says JSON.
    """
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return False
        with path.open("rb") as handle:
            return handle.read(2) == GZIP_MAGIC
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
