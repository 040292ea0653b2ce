"""What ``analyze``, ``report``, ``run`` and ``watch`` share: the inputs read (into memory, or onto disk as a span
dataset), the analysis, the outputs written. Not a command: commands import it, never each other.

Inputs whose spans would take more than about :data:`SPILL_BYTES` of memory
(text logs by their size; JSON traces, whose rows take several times their
text, weighted by :data:`JSON_WEIGHT`) are read into a span dataset on disk
(Parquet, :mod:`dsprof.analysis.store.dataset`) instead of memory, and analysed out
of core; ``spans_dir`` keeps that dataset for later queries.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from dsprof.analysis.analyze import DEFAULT_THRESHOLD_MS, AnalysisResult, analyze_trace, check_threshold
from dsprof.analysis.cluster.ray_engine import read_and_aggregate
from dsprof.analysis.ingest import SIDE_FILES, read_paths
from dsprof.analysis.ingest.onto_disk import read_onto
from dsprof.analysis.outputs.chrome_trace import COMBINED_SPAN_BUDGET, write_chrome_trace
from dsprof.analysis.outputs.html_report import write_html_report
from dsprof.analysis.outputs.summary_json import write_summary_json
from dsprof.analysis.outputs.summary_md import write_summary_md
from dsprof.analysis.store.dataset import SpanDatasetWriter, open_dataset
from dsprof.analysis.store.dataset_check import corrupt_part
from dsprof.analysis.store.spans import Trace
from dsprof.analysis.summary import Summary
from dsprof.analysis.window import Window, WindowSpec
from dsprof.analysis.window_cut import cut_trace
from dsprof.commands.choices import ENGINES
from dsprof.errors import DsprofError, InputError
from dsprof.output_set import output_set
from dsprof.profiler import artifacts
from dsprof.progress import Progress
from dsprof.tempdirs import make_owned_dir, remove_owned_dir

# Inputs bigger than this are analysed out of core (a span dataset on disk).
SPILL_BYTES = 256 << 20
# A byte of Chrome / SA_PROFILE JSON weighs this many bytes of text log (its rows in memory: ~12x the JSON, a log's ~1.5x);
# a gzip-compressed one, GZIP_WEIGHT times more again.
JSON_WEIGHT = 8
GZIP_WEIGHT = 10
_JSON_SUFFIXES = (".json", ".jsonl", ".gz")
# What the memory error tells the user to do; a command without --memory-limit (watch) says what it can do instead.
MEMORY_REMEDY = "raise --memory-limit, or analyse a window of the run (--steps A:B, --since, --until)"
FALLBACK_OUT_DIR = Path("dsprof-analysis")
SPILL_PREFIX = "dsprof-spans-"  # temporary span datasets, removed on success, error and interrupt


@dataclass
class AnalyzeOutcome:
    """The analysis and the files written."""

    result: AnalysisResult
    outputs: dict[str, Path] = field(default_factory=dict)

    @property
    def summary(self) -> Summary:
        return self.result.summary


def default_out_dir(paths: Sequence[str | os.PathLike]) -> Path:
    """Where outputs go without ``-o``: beside the inputs when one artifact directory is given, else ``./dsprof-analysis``.

    A span dataset is not an artifact directory: its outputs would mix with its parts.
    """
    if len(paths) == 1:
        only = Path(paths[0])
        if only.is_dir() and not (only / artifacts.SPAN_DATASET_MANIFEST).exists():
            return only
    return FALLBACK_OUT_DIR


def analyze_paths(
    paths: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike | None,
    *,
    threshold_ms: float = DEFAULT_THRESHOLD_MS,
    expect_ranks: int | None = None,
    memory_limit: int | None = None,
    spans_dir: str | os.PathLike | None = None,
    engine: str = "embedded",
    address: str | None = None,
    steps: tuple[int, int] | None = None,
    window: WindowSpec | None = None,
    step_marker: str | None = None,
    progress: Progress = None,
    memory_remedy: str = MEMORY_REMEDY,
) -> AnalyzeOutcome:
    """Analyse artifacts (dirs, logs, traces); with ``out_dir``, write the outputs there.

    ``engine``: ``embedded`` (DuckDB in this process, out of core for big
    inputs) or ``ray`` (ingest and the span-sized aggregation as Ray tasks on
    the cluster at ``address``; docs/CLUSTER.md). Inputs without a single span
    (and no serving summary) are an InputError. ``window`` (or just ``steps``):
    analyse that window of the run only (:mod:`dsprof.analysis.window_cut`). ``step_marker``: the label of a
    Kineto trace's steps (default ``ProfilerStep#N``). ``memory_remedy``: what the error of exhausted memory advises.
    """
    check_threshold(threshold_ms)
    if engine not in ENGINES:
        raise DsprofError(f"unknown engine {engine!r} (expected one of: {', '.join(ENGINES)})")
    if window is None and steps is not None:
        window = WindowSpec(steps=steps)
    if window is not None and engine == "ray":
        raise DsprofError("--steps, --since and --until need --engine embedded (the Ray engine reads the whole run)")
    invocations = None
    spill: Path | None = None
    try:
        if engine == "ray":
            spill = None if spans_dir is not None else make_owned_dir(SPILL_PREFIX)
            dataset = Path(spans_dir) if spans_dir is not None else spill
            assert dataset is not None
            trace, invocations = read_and_aggregate(paths, dataset, address=address, memory_limit=memory_limit, progress=progress)
        else:
            trace, spill = read_inputs(paths, spans_dir=spans_dir, step_marker=step_marker, progress=progress)
        placed = None
        if window is not None:
            trace, placed, spill = read_window(trace, window, spill, progress=progress)
        require_something_to_analyse(trace, paths)
        with explained_query_errors(trace, memory_remedy):
            result = analyze_trace(
                trace,
                threshold_ms=threshold_ms,
                expect_ranks=expect_ranks,
                memory_limit=memory_limit,
                invocations=invocations,
                window=placed,
                progress=progress,
            )
            kept = spans_dir if spans_dir is not None else _dataset_input(paths)
            if kept is not None:  # where report and export find the spans again
                result.summary["inputs"]["span_dataset"] = str(kept)
            outcome = AnalyzeOutcome(result)
            if out_dir is not None:
                outcome.outputs = write_outputs(result, Path(out_dir), progress=progress)
        return outcome
    except MemoryError as exc:  # in reading the inputs: the analysis itself says so through explained_query_errors
        raise memory_error(exc, memory_remedy) from None
    finally:
        remove_owned_dir(spill)


def read_window(
    trace: Trace, window: WindowSpec, spill: Path | None, *, drawing: bool = False, progress: Progress = None
) -> tuple[Trace, Window, Path | None]:
    """``trace`` cut to ``window`` (only the row groups of a span dataset it needs are read), the window placed,
    and the temporary dataset to remove afterwards: ``spill`` (the one ``trace`` was read into) is removed once cut."""
    with explained_query_errors(trace):
        cut, placed, facts = cut_trace(trace, window, drawing=drawing, progress=progress)
    if facts.invocations == 0:
        remove_owned_dir(facts.spill)
        what = ", ".join(trace.files[:3]) + (", ..." if len(trace.files) > 3 else "") or "the inputs"
        raise DsprofError(
            f"{what}: no run of the trace lies in the window {placed.describe()} (no runtime root has its step there or starts then)"
        )
    remove_owned_dir(spill)
    if progress:
        cut_steps = f", {facts.partial_steps:,} steps it cut left out" if facts.partial_steps else ""
        progress(f"window {placed.describe()}: {facts.invocations:,} invocations, {cut.span_count:,} spans kept{cut_steps}")
    return cut, placed, facts.spill


def _dataset_input(paths: Sequence[str | os.PathLike]) -> str | os.PathLike | None:
    """The span dataset analysed, when that is the one input."""
    return paths[0] if len(paths) == 1 and (Path(paths[0]) / artifacts.SPAN_DATASET_MANIFEST).is_file() else None


@contextlib.contextmanager
def explained_query_errors(trace: Trace, memory_remedy: str = MEMORY_REMEDY) -> Iterator[None]:
    """DuckDB errors as one line: a span dataset part whose data is corrupt is named, exhausted memory said so.

    A part's footer and schema are checked before the first query
    (:mod:`dsprof.analysis.store.dataset_check`); damage inside its pages shows only
    when the query reads them, so the parts are searched for it then. Any
    other error is a bug and keeps its traceback.
    """
    try:
        yield
    except (duckdb.OutOfMemoryException, MemoryError) as exc:  # MemoryError: numpy's and Arrow's allocations too
        raise memory_error(exc, memory_remedy) from None
    except duckdb.Error:
        culprit = corrupt_part(trace.span_files)
        if culprit is None:
            raise
        raise culprit from None


def memory_error(exc: BaseException, memory_remedy: str = MEMORY_REMEDY) -> DsprofError:
    """Exhausted memory as one line: what failed to allocate, and what to do about it."""
    text = str(exc).strip()
    detail = text.splitlines()[0][:200] if text else f"{type(exc).__name__}: out of memory"
    return DsprofError(f"the analysis needs more memory than its limit ({detail}): {memory_remedy}")


def read_inputs(
    paths: Sequence[str | os.PathLike],
    *,
    spans_dir: str | os.PathLike | None = None,
    step_marker: str | None = None,
    progress: Progress = None,
) -> tuple[Trace, Path | None]:
    """Read ``paths``; big text logs go to a span dataset (``spans_dir``, else a temporary one returned for removal)."""
    if _dataset_input(paths) is not None:
        return open_dataset(paths[0]), None
    temporary = None
    if spans_dir is None and spill_weight(paths) > SPILL_BYTES:
        temporary = make_owned_dir(SPILL_PREFIX)
    target = spans_dir if spans_dir is not None else temporary
    if target is None:
        return read_paths(paths, progress=progress, step_marker=step_marker), None
    try:
        trace = read_onto(paths, target, lambda: SpanDatasetWriter(target), folder=Path(target), progress=progress, step_marker=step_marker)
    except BaseException:  # an error, Ctrl-C or SIGTERM: the temporary dataset goes with it
        remove_owned_dir(temporary)
        raise
    return trace, temporary


def spill_weight(paths: Sequence[str | os.PathLike]) -> int:
    """What reading ``paths`` into memory would weigh, in bytes of text log (see :data:`JSON_WEIGHT`).

    Directories: their ``*.log``, and the JSON where the readers look for it
    (beside the logs, ``serving-trace/``, ``fragments/``); a merge and its
    fragments both count, which only makes a spill likelier.
    """
    total = 0
    for path in map(Path, paths):
        files = _input_files(path) if path.is_dir() else [path]
        total += sum(_weight(file) for file in files)
    return total


def _input_files(directory: Path) -> list[Path]:
    folders = [directory, directory / artifacts.SERVING_TRACE_DIR, directory / artifacts.FRAGMENTS_DIR]
    folders.append(directory / artifacts.SERVING_TRACE_DIR / artifacts.FRAGMENTS_DIR)
    folders.append(directory / artifacts.TORCH_PROFILER_DIR)
    return [file for folder in folders if folder.is_dir() for file in folder.iterdir() if file.suffix in (".log", *_JSON_SUFFIXES)]


def _weight(file: Path) -> int:
    """A regular file's size, weighted by its kind (a pipe or device counts nothing: its size is unknown)."""
    try:
        info = file.stat()
    except OSError:
        return 0  # the reader says what is wrong with it
    if not stat.S_ISREG(info.st_mode) or file.name in SIDE_FILES:
        return 0
    if file.suffix not in _JSON_SUFFIXES:
        return info.st_size
    return info.st_size * JSON_WEIGHT * (GZIP_WEIGHT if file.suffix == ".gz" else 1)


def require_something_to_analyse(trace: Trace, paths: Sequence[str | os.PathLike]) -> None:
    """Refuse inputs that yielded no span and no serving summary: a table of n/a would hide the mistake.

    A partial artifact (a crashed run, a torn log) still has spans and is
    analysed as far as it goes; this only catches the wrong file or a run that
    was not profiled.
    """
    if trace.span_count or isinstance(trace.performance_summary, dict):
        return
    named = trace.files or [str(p) for p in paths]
    dropped = ", ".join(f"{reason} {count}" for reason, count in sorted(trace.dropped.items()) if count)
    what = "no spans to analyse" + (f" ({trace.dropped_total} record(s) dropped: {dropped})" if dropped else "")
    raise InputError(", ".join(named), what, expected="[STRACE] records, SA_PROFILE fragments or Chrome trace events")


def write_outputs(result: AnalysisResult, out_dir: Path, progress: Progress = None) -> dict[str, Path]:
    """summary.json, summary.md, combined-swimlane.json and report.html in ``out_dir``, as one set.

    They are staged and moved into place together (:mod:`dsprof.output_set`):
    after an error or an interrupt the previous outputs are all still there,
    and a concurrent analysis into the same directory leaves one whole set.
    """
    with output_set(out_dir) as outputs:
        write_summary_json(result.summary, outputs.path(artifacts.SUMMARY_JSON))
        write_summary_md(result.summary, outputs.path(artifacts.SUMMARY_MD))
        if progress:
            progress(f"writing {out_dir / artifacts.COMBINED_SWIMLANE}")
        write_chrome_trace(result, outputs.path(artifacts.COMBINED_SWIMLANE), span_budget=COMBINED_SPAN_BUDGET, progress=progress)
        if progress:
            progress(f"writing {out_dir / artifacts.REPORT_HTML}")
        write_html_report(result, outputs.path(artifacts.REPORT_HTML))
    return {name: outputs.target(name) for name in outputs.names}
