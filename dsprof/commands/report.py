"""``dsprof report`` and ``dsprof export``: draw an analysed artifact directory.

Both take every figure and verdict from the directory's ``summary.json`` (what
``analyze`` wrote, with the threshold and expected ranks it used); only the
layout of the spans is rebuilt from the inputs, so a report or export never
disagrees with the summary, gate and diff.

The spans come from, first found: the paths given (``--inputs``), the span
dataset ``analyze --spans`` kept (``inputs.span_dataset``), the input files the
summary names (``inputs.files``), or the directory itself. What a summary names
is a record, not an instruction: it is read only where it resolves inside the
directory (links followed), so a crafted summary cannot point ``report`` at any
file it likes. After ``analyze RUN -o OUT``, ``report OUT --inputs RUN`` reads
them; named inputs outside, or moved, get one line naming ``--inputs``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from dsprof.analysis.analyze import AnalysisResult, layout_only
from dsprof.analysis.outputs.chrome_trace import write_chrome_trace
from dsprof.analysis.outputs.html_report import write_html_report
from dsprof.analysis.outputs.perfetto_proto import write_perfetto_proto
from dsprof.analysis.summary import Summary, load_summary, summary_path
from dsprof.analysis.window import WindowSpec, parse_window
from dsprof.commands.analysis_job import explained_query_errors, read_inputs, read_window
from dsprof.commands.choices import EXPORT_FORMATS, PERFETTO_JSON, PERFETTO_PROTO
from dsprof.commands.printing import Printer, print_err, safe_lines, safe_progress
from dsprof.errors import DsprofError, InputError
from dsprof.fileio import check_input_file
from dsprof.profiler import artifacts
from dsprof.progress import Progress
from dsprof.tempdirs import remove_owned_dir

_DEFAULT_NAMES = {PERFETTO_PROTO: artifacts.PERFETTO_PROTO, PERFETTO_JSON: artifacts.PERFETTO_JSON}

# report and export have no --memory-limit: a drawing that runs out of memory draws less
DRAWING_MEMORY_REMEDY = "draw a window of the run (--steps A:B, --since, --until)"


InputPaths = Sequence[str | os.PathLike] | None


def _analysed(
    artifact_dir: str | os.PathLike, inputs: InputPaths, window: WindowSpec | None, progress: Progress, note: Printer
) -> tuple[AnalysisResult, Path | None]:
    artifact_dir = Path(artifact_dir)
    if not artifact_dir.is_dir():
        raise InputError(artifact_dir, "not a directory", expected="an artifact directory analysed by dsprof analyze")
    check_input_file(summary_path(artifact_dir), expected="summary.json written by dsprof analyze")
    summary = load_summary(artifact_dir)
    sources = span_sources(artifact_dir, summary, inputs)
    for source in sources:  # a FIFO or a device would block the drawing (analyze, asked for one, reads a pipe)
        check_input_file(source, expected="a trace file or a directory of them")
    note(f"reading the spans from {', '.join(map(str, sources))}")
    window = window or analysed_window(summary)
    trace, spill = read_inputs(sources, progress=progress)
    try:
        placed = None
        if window is not None:
            trace, placed, spill = read_window(trace, window, spill, drawing=True, progress=progress)
            note(f"drawing only the window {placed.describe()}")
        with explained_query_errors(trace, DRAWING_MEMORY_REMEDY):
            return layout_only(trace, summary, window=placed), spill
    except BaseException:
        remove_owned_dir(spill)
        raise


def analysed_window(summary: Summary) -> WindowSpec | None:
    """The window ``analyze`` was given (``inputs.window``), so that a report of its directory draws the same steps."""
    block = (summary.get("inputs") or {}).get("window")
    if not isinstance(block, dict):
        return None
    steps = block.get("steps")
    text = f"{steps[0]}:{steps[1]}" if isinstance(steps, list) and len(steps) == 2 else None
    since, until = block.get("since"), block.get("until")
    return parse_window(text, since if isinstance(since, str) else None, until if isinstance(until, str) else None)


def span_sources(artifact_dir: Path, summary: Summary, inputs: InputPaths = None) -> list[Path]:
    """Where the spans of an analysed directory are read from (see the module docstring)."""
    if inputs:
        missing = [Path(p) for p in inputs if not Path(p).exists()]
        if missing:
            raise InputError(missing[0], "no such file or directory", expected="the inputs the summary was analysed from")
        return [Path(p) for p in inputs]
    recorded = summary.get("inputs") or {}
    dataset = Path(recorded["span_dataset"]) if isinstance(recorded.get("span_dataset"), str) else None
    files = [Path(f) for f in recorded.get("files") or [] if isinstance(f, str)]
    outside = [f for f in [*([dataset] if dataset else []), *files] if not _inside(f, artifact_dir)]
    if dataset is not None and dataset not in outside and (dataset / artifacts.SPAN_DATASET_MANIFEST).is_file():
        return [dataset]
    if files and all(f not in outside and f.exists() for f in files):
        return files
    if _holds_inputs(artifact_dir):
        return [artifact_dir]
    raise _no_inputs(artifact_dir, outside, files, dataset)


def _no_inputs(artifact_dir: Path, outside: list[Path], files: list[Path], dataset: Path | None) -> InputError:
    """Why nothing can be read, naming ``--inputs``: inputs named outside the directory, inputs gone, or none named."""
    if outside:
        more = f" and {len(outside) - 1} more" if len(outside) > 1 else ""
        return InputError(
            artifact_dir / artifacts.SUMMARY_JSON,
            f"names inputs outside {artifact_dir} ({outside[0]}{more}), which are read only when given: --inputs PATH (repeatable)",
        )
    gone = next((f for f in files if not f.exists()), None) if files else dataset
    if gone is None:
        return InputError(artifact_dir, "holds no dsprof inputs and its summary names none", expected="--inputs PATH... naming them")
    return InputError(
        artifact_dir / artifacts.SUMMARY_JSON,
        f"the inputs it was analysed from have moved ({gone} is gone); point at them with --inputs PATH (repeatable)",
    )


def _inside(path: Path, directory: Path) -> bool:
    """Whether ``path`` resolves (links followed) inside ``directory``: a summary's inputs are a record, not an instruction
    to read any file the summary names."""
    try:
        return path.resolve().is_relative_to(directory.resolve())
    except (OSError, ValueError):  # a loop of links, a NUL in the name
        return False


def _holds_inputs(directory: Path) -> bool:
    """Whether a directory has something ``read_inputs`` reads spans from (not just the outputs of analyze)."""
    return (
        any(directory.glob("*.log"))
        or (directory / artifacts.SERVING_TRACE_DIR).is_dir()
        or (directory / artifacts.MERGED_TRACE).is_file()
        or (directory / artifacts.FRAGMENTS_DIR).is_dir()
        or bool(artifacts.fragment_files(directory))
        or (directory / artifacts.SPAN_DATASET_MANIFEST).is_file()
        or any(directory.glob("*.trace.json*"))
    )


def report_from_dir(
    artifact_dir: str | os.PathLike,
    output: str | os.PathLike | None = None,
    *,
    inputs: InputPaths = None,
    progress: Progress = None,
    note: Printer = print_err,
    steps: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> Path:
    """Write the report of an analysed artifact directory (``DIR/report.html`` by default); ``note`` says where the spans came from.

    ``steps``, ``since``, ``until``: draw only that window of the run (the options' text; the figures stay the summary's).
    """
    window = parse_window(steps, since, until)
    output = Path(output) if output is not None else Path(artifact_dir) / artifacts.REPORT_HTML
    progress, note = safe_progress(progress), safe_lines(note)
    result, spill = _analysed(artifact_dir, inputs, window, progress, note)
    try:
        if progress:
            progress(f"writing {output}")
        return write_html_report(result, output)
    finally:
        result.engine.close()
        remove_owned_dir(spill)


def export_format(output: str | os.PathLike | None) -> str:
    """The format an output name asks for: ``.json`` / ``.json.gz`` -> Chrome JSON, anything else the native protobuf."""
    if output is None:
        return PERFETTO_PROTO
    name = Path(output).name.lower()
    return PERFETTO_JSON if name.endswith((".json", ".json.gz")) else PERFETTO_PROTO


def export_from_dir(
    artifact_dir: str | os.PathLike,
    output: str | os.PathLike | None = None,
    *,
    format: str | None = None,
    inputs: InputPaths = None,
    progress: Progress = None,
    note: Printer = print_err,
    steps: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> Path:
    """Export an analysed artifact directory for Perfetto.

    ``perfetto`` writes Perfetto's native protobuf trace (``.pftrace``),
    ``perfetto-json`` Chrome trace JSON (``.json``, or ``.json.gz`` compressed);
    without a format, the output's name decides (default: the protobuf).
    ``steps``, ``since``, ``until``: only that window of the run (as for the report).
    """
    window = parse_window(steps, since, until)
    format = format or export_format(output)
    if format not in EXPORT_FORMATS:
        raise DsprofError(f"unknown export format {format!r} (expected one of: {', '.join(EXPORT_FORMATS)})")
    _refuse_mismatched_name(output, format)
    output = Path(output) if output is not None else Path(artifact_dir) / _DEFAULT_NAMES[format]
    progress, note = safe_progress(progress), safe_lines(note)
    result, spill = _analysed(artifact_dir, inputs, window, progress, note)
    try:
        if progress:
            progress(f"writing {output}")
        if format == PERFETTO_PROTO:
            return write_perfetto_proto(result, output, progress=progress)
        return write_chrome_trace(result, output, progress=progress)
    finally:
        result.engine.close()
        remove_owned_dir(spill)


_PROTOBUF_SUFFIXES = (".pftrace", ".perfetto-trace", ".pb")


def _refuse_mismatched_name(output: str | os.PathLike | None, format: str) -> None:
    """A format that contradicts the output's name (protobuf into ``x.json``) is refused before anything is read."""
    if output is None:
        return
    name = Path(output).name.lower()
    if format == PERFETTO_PROTO and export_format(output) == PERFETTO_JSON:
        raise DsprofError(
            f"{output}: --format {PERFETTO_PROTO} writes a protobuf trace, not JSON (name it .pftrace, or use --format {PERFETTO_JSON})"
        )
    if format == PERFETTO_JSON and name.endswith(_PROTOBUF_SUFFIXES):
        raise DsprofError(
            f"{output}: --format {PERFETTO_JSON} writes JSON, not a protobuf trace (name it .json or .json.gz, or use --format {PERFETTO_PROTO})"
        )
