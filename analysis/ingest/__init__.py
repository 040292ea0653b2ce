"""Read any mix of dsprof inputs into one :class:`~dsprof.analysis.store.spans.Trace`.

:func:`read_paths` decides what each path is (:func:`plan_inputs`, before any
is read) and hands it to its reader (docs/FORMATS.md, "Which reader reads a
path"). With a ``sink``, text logs hand their span tables to it chunk by chunk
(:class:`~dsprof.analysis.ingest.sink.SpanSink`), so a log of any size is read
in bounded memory. The JSON readers (SA_PROFILE, Chrome, Kineto) are imported
where a JSON input is met: ``dsprof ingest`` of a text log, whose start-up is a
third of its time on a small log, loads none of them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from dsprof.analysis.ingest.kineto_join import RunIndex
from dsprof.analysis.ingest.side_files import read_side_file
from dsprof.analysis.ingest.sink import SpanSink
from dsprof.analysis.ingest.strace_log import read_strace_log
from dsprof.analysis.store.spans import ANCHOR_SCHEMA, PARQUET_SCHEMA, Trace, empty_spans, merge_traces
from dsprof.errors import InputError
from dsprof.profiler import artifacts
from dsprof.profiler.chrome_json import DEFAULT_LIMITS, GZIP_MAGIC, JsonLimits
from dsprof.progress import Progress

__all__ = ["Input", "Progress", "SpanSink", "fragment_source", "is_text_log", "plan_inputs", "read_paths", "read_strace_log"]

SIDE_FILES = (artifacts.PERFORMANCE_SUMMARY, artifacts.FAULTS)

# What a path is read as (the reader chosen by :func:`plan_inputs`).
STRACE_LOG, SA_PROFILE, CHROME_TRACE, SIDE_FILE, KINETO = "strace_log", "sa_profile", "chrome_trace", "side_file", "kineto"


class Input(NamedTuple):
    """One input to read: its path and the reader it goes to."""

    kind: str
    path: Path


def read_paths(
    paths: Sequence[str | os.PathLike] | str | os.PathLike,
    progress: Progress = None,
    sink: SpanSink | None = None,
    limits: JsonLimits = DEFAULT_LIMITS,
    logs: bool = True,
    step_marker: str | None = None,
) -> Trace:
    """Read every path (see the module docstring) and merge the results.

    Every path is looked at before any is read (:func:`plan_inputs`): a missing one is refused at once, and the
    STRACE runs a Kineto join needs are gathered only when there are Kineto traces to join.
    ``limits`` bound JSON input; ``logs=False`` leaves text logs out (the cluster engine reads them elsewhere);
    ``step_marker``: the ``record_function`` label of a Kineto trace's steps (default ``ProfilerStep#N``).
    """
    plan = plan_inputs([paths] if isinstance(paths, (str, os.PathLike)) else paths, limits, logs)
    kineto = [item.path for item in plan if item.kind == KINETO]  # the ranks of one job, read together
    index = RunIndex(sink) if sink is not None and kineto else None  # the STRACE runs handed to the sink, for the join
    traces = [_read_input(item, progress, sink if index is None else index, limits) for item in plan if item.kind != KINETO]
    if kineto:
        in_memory = RunIndex()
        for trace in traces:
            in_memory.add(trace.spans)
        runs = pa.concat_tables([in_memory.table(), *([index.table()] if index is not None else [])])
        anchors = pa.concat_tables([ANCHOR_SCHEMA.empty_table(), *(t.anchors for t in traces)])
        traces.append(_kineto_job(kineto, step_marker, limits, progress, sink, runs, anchors))
    return merge_traces(traces)


def plan_inputs(paths: Sequence[str | os.PathLike], limits: JsonLimits = DEFAULT_LIMITS, logs: bool = True) -> list[Input]:
    """What each path is read as, in order, directories looked into (docs/FORMATS.md, "Which reader reads a path").

    Nothing is read but the few head bytes that tell JSON formats apart; the same input named twice is read once.
    InputError for a path that does not exist, or a directory holding no dsprof input.
    """
    plan: list[Input] = []
    seen: set[Path] = set()
    for path in map(Path, paths):
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        plan += _plan_directory(path, limits, logs) if path.is_dir() else _plan_file(path, limits, logs)
    return plan


def _read_input(item: Input, progress: Progress, sink: SpanSink | None, limits: JsonLimits) -> Trace:
    """Read one input of the plan (not a Kineto trace: those are read together, as a job)."""
    if item.kind == SIDE_FILE:
        return read_side_file(item.path)
    if item.kind == SA_PROFILE:
        from dsprof.analysis.ingest.sa_profile import read_sa_profile

        return read_sa_profile(item.path, progress=progress, limits=limits, sink=sink)
    if item.kind == CHROME_TRACE:
        from dsprof.analysis.ingest.chrome import read_chrome_trace

        return read_chrome_trace(item.path, progress=progress, limits=limits, sink=sink)
    if progress is not None:
        progress(f"reading {item.path}")
    return read_strace_log(item.path, progress=progress, sink=sink)


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
    from dsprof.analysis.ingest.kineto import SOURCE, read_kineto_traces
    from dsprof.analysis.ingest.kineto_join import join_device_timeline

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
    from dsprof.analysis.ingest.sa_profile import fragment_home

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


def _plan_file(path: Path, limits: JsonLimits, logs: bool) -> list[Input]:
    if not path.exists():
        if artifacts.fragments_dir(path).is_dir():  # an SA_PROFILE .json output whose merge was never written
            return [Input(SA_PROFILE, path)]
        raise InputError(path, "no such file or directory")
    if path.name in SIDE_FILES:
        return [Input(SIDE_FILE, path)]
    json_trace = path.suffix != ".jsonl" and (path.suffix in (".json", ".gz") or _starts_with_gzip_magic(path))
    serving_merge = json_trace and _is_sa_profile_merge(path)
    if path.suffix == ".jsonl" or serving_merge:
        return [Input(SA_PROFILE, path)]
    if json_trace:
        return [Input(KINETO if _is_kineto(path, limits) else CHROME_TRACE, path)]
    return [Input(STRACE_LOG, path)] if logs else []


def _plan_directory(path: Path, limits: JsonLimits, logs: bool) -> list[Input]:
    plan = [Input(STRACE_LOG, log) for log in sorted(path.glob("*.log")) if logs and log.is_file()]
    serving = _sa_profile_output(path)
    if serving is not None:
        plan.append(Input(SA_PROFILE, serving))
    chrome = {p for p in [*path.glob("*.trace.json"), *path.glob("*.trace.json.gz")] if p.is_file() and p.name != artifacts.MERGED_TRACE}
    ranks = [
        p
        for p in sorted([*path.glob("*.json"), *path.glob("*.json.gz")])
        if p.is_file() and p.name not in (*SIDE_FILES, artifacts.MERGED_TRACE)
    ]
    profiles = path / artifacts.TORCH_PROFILER_DIR  # dsprof run --torch-profiler: one Kineto trace per rank
    if profiles.is_dir():
        ranks += sorted(p for p in profiles.iterdir() if p.is_file() and artifacts.TORCH_PROFILE_PATTERN.match(p.name))
    kineto = [Input(KINETO, p) for p in ranks if _is_kineto(p, limits)]
    plan += [Input(CHROME_TRACE, p) for p in sorted(chrome - {item.path for item in kineto})]
    plan += [Input(SIDE_FILE, path / name) for name in SIDE_FILES if (path / name).is_file()]
    if not plan and not kineto and logs:
        raise InputError(
            path,
            "directory holds no dsprof inputs",
            expected="*.log, serving-trace/, trace.json, fragments/, trace.<pid>.jsonl or PyTorch-profiler *.json",
        )
    return plan + kineto


def _is_kineto(path: Path, limits: JsonLimits) -> bool:
    from dsprof.analysis.ingest.kineto import is_kineto

    return is_kineto(path, limits)


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
