"""``dsprof report`` and ``dsprof export``: draw an analysed artifact directory.

Both take every figure and verdict from the directory's ``summary.json`` (what
``analyze`` wrote, with the threshold and expected ranks it used); only the
layout of the spans is rebuilt from the inputs, so a report or export never
disagrees with the summary, gate and diff.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from dsprof.analysis.analyze import AnalysisResult, layout_only
from dsprof.analysis.outputs.chrome_trace import write_chrome_trace
from dsprof.analysis.outputs.html_report import write_html_report
from dsprof.analysis.outputs.perfetto_proto import write_perfetto_proto
from dsprof.analysis.summary import load_summary
from dsprof.commands.analyze import read_inputs
from dsprof.errors import DsprofError, InputError
from dsprof.profiler import artifacts

Progress = Callable[[str], None] | None
# export format -> its default file name in the artifact directory
PERFETTO_PROTO, PERFETTO_JSON = "perfetto", "perfetto-json"
EXPORT_FORMATS = (PERFETTO_PROTO, PERFETTO_JSON)
_DEFAULT_NAMES = {PERFETTO_PROTO: artifacts.PERFETTO_PROTO, PERFETTO_JSON: artifacts.PERFETTO_JSON}


def _analysed(artifact_dir: str | os.PathLike, progress: Progress) -> tuple[AnalysisResult, Path | None]:
    artifact_dir = Path(artifact_dir)
    if not artifact_dir.is_dir():
        raise InputError(artifact_dir, "not a directory", expected="an artifact directory analysed by dsprof analyze")
    summary = load_summary(artifact_dir)
    trace, spill = read_inputs([artifact_dir], progress=progress)
    return layout_only(trace, summary), spill


def report_from_dir(artifact_dir: str | os.PathLike, output: str | os.PathLike | None = None, *, progress: Progress = None) -> Path:
    """Write the report of an analysed artifact directory (``DIR/report.html`` by default)."""
    output = Path(output) if output is not None else Path(artifact_dir) / artifacts.REPORT_HTML
    result, spill = _analysed(artifact_dir, progress)
    try:
        if progress:
            progress(f"writing {output}")
        return write_html_report(result, output)
    finally:
        result.engine.close()
        _remove(spill)


def export_format(output: str | os.PathLike | None) -> str:
    """The format an output name asks for: ``.json`` / ``.json.gz`` -> Chrome JSON, anything else the native protobuf."""
    if output is None:
        return PERFETTO_PROTO
    name = Path(output).name.lower()
    return PERFETTO_JSON if name.endswith((".json", ".json.gz")) else PERFETTO_PROTO


def export_from_dir(
    artifact_dir: str | os.PathLike, output: str | os.PathLike | None = None, *, format: str | None = None, progress: Progress = None
) -> Path:
    """Export an analysed artifact directory for Perfetto.

    ``perfetto`` writes Perfetto's native protobuf trace (``.pftrace``),
    ``perfetto-json`` Chrome trace JSON (``.json``, or ``.json.gz`` compressed);
    without a format, the output's name decides (default: the protobuf).
    """
    format = format or export_format(output)
    if format not in EXPORT_FORMATS:
        raise DsprofError(f"unknown export format {format!r} (expected one of: {', '.join(EXPORT_FORMATS)})")
    output = Path(output) if output is not None else Path(artifact_dir) / _DEFAULT_NAMES[format]
    result, spill = _analysed(artifact_dir, progress)
    try:
        if progress:
            progress(f"writing {output}")
        if format == PERFETTO_PROTO:
            return write_perfetto_proto(result, output, progress=progress)
        return write_chrome_trace(result, output, progress=progress)
    finally:
        result.engine.close()
        _remove(spill)


def _remove(spill: Path | None) -> None:
    if spill is not None:
        shutil.rmtree(spill, ignore_errors=True)
