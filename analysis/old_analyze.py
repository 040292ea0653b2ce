"""``analyze``: read artifacts, build the swimlane, compute every figure, write the outputs.

Each step is a separate module (swimlane, validation, skew, tails, pipeline,
serving); this one only wires them together and assembles ``summary.json``
(schema in docs/SUMMARY_SCHEMA.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dsprof
from dsprof.analysis.ingest import read_paths
from dsprof.analysis.outputs.summary_md import HEADLINE_FIGURES, format_value
from dsprof.analysis.pipeline import pipeline_figures
from dsprof.analysis.serving import serving_figures
from dsprof.analysis.skew import PERCENTILES, skew_figures
from dsprof.analysis.spans import Trace
from dsprof.analysis.swimlane import Swimlane, build_swimlane
from dsprof.analysis.tails import tail_figures
from dsprof.analysis.validation import validate
from dsprof.errors import InputError

SUMMARY_SCHEMA = "dsprof.summary/1"


@dataclass
class AnalysisResult:
    summary: dict
    swimlane: Swimlane
    trace: Trace
    outputs: dict[str, Path] = field(default_factory=dict)


def analyze(
    paths: Sequence[str | os.PathLike] | str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    threshold_ms: float = 5.0,
    expect_ranks: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> AnalysisResult:
    """Analyse artifacts (dirs, logs, traces); with ``out_dir``, write summary.json, summary.md,
    combined-swimlane.json and report.html there. Inputs without a single span are an InputError."""
    trace = read_paths(paths, progress=progress)
    _require_something_to_analyse(trace, paths)
    result = analyze_trace(trace, threshold_ms=threshold_ms, expect_ranks=expect_ranks, progress=progress)
    if out_dir is not None:
        result.outputs = write_outputs(result, Path(out_dir), progress=progress)
    return result


def analyze_artifact_dir(
    artifact_dir: str | os.PathLike,
    *,
    threshold_ms: float = 5.0,
    progress: Callable[[str], None] | None = None,
) -> AnalysisResult:
    """Analyse one artifact directory without writing anything (what ``report`` and ``export`` start from)."""
    artifact_dir = Path(artifact_dir)
    if not artifact_dir.is_dir():
        raise InputError(artifact_dir, "not a directory", expected="an artifact directory written by dsprof run")
    return analyze([artifact_dir], None, threshold_ms=threshold_ms, progress=progress)


def _require_something_to_analyse(trace: Trace, paths) -> None:
    """Refuse inputs that yielded no span and no serving summary: a table of n/a would hide the mistake.

    A partial artifact (a crashed run, a torn log) still has spans and is
    analysed as far as it goes; this only catches the wrong file or a run that
    was not profiled.
    """
    if len(trace.spans) or isinstance(trace.extras.get("performance_summary"), dict):
        return
    named = trace.files or [str(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    dropped = ", ".join(f"{reason} {count}" for reason, count in sorted(trace.dropped.items()) if count)
    what = "no spans to analyse" + (f" ({trace.dropped_total} record(s) dropped: {dropped})" if dropped else "")
    raise InputError(", ".join(named), what,
                     expected="[STRACE] records, SA_PROFILE fragments or Chrome trace events")


def analyze_trace(
    trace: Trace,
    *,
    threshold_ms: float = 5.0,
    expect_ranks: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> AnalysisResult:
    """Every figure of an already-read trace (no files written)."""
    swimlane = build_swimlane(trace, progress=progress)
    roots = swimlane.roots
    if progress:
        progress("figures: skew, tails, pipeline, serving")
    figures, step_list, steps = skew_figures(roots)
    late_block, tail_block, _, _ = tail_figures(roots, steps, threshold_ms)
    performance = trace.extras.get("performance_summary")
    performance = performance if isinstance(performance, dict) else {}
    summary = {
        "schema": SUMMARY_SCHEMA,
        "dsprof_version": dsprof.__version__,
        "inputs": {
            "files": [str(f) for f in trace.files],
            "records_read": int(trace.records_read),
            "spans": int(len(trace.spans)),
            "dropped": {str(k): int(v) for k, v in trace.dropped.items()},
        },
        "workload": performance.get("workload"),
        "exit_status": performance.get("exit_status"),
        "validation": validate(swimlane, expect_ranks=expect_ranks, dropped=trace.dropped),
        "figures": figures,
        "per_step": step_list,
        "late_starts": late_block,
        "tail_steps": tail_block,
        "pipeline": pipeline_figures(roots),
        "serving": serving_figures(trace),
    }
    return AnalysisResult(summary=summary, swimlane=swimlane, trace=trace)


def write_outputs(result: AnalysisResult, out_dir: Path, progress: Callable[[str], None] | None = None) -> dict[str, Path]:
    """summary.json, summary.md, combined-swimlane.json and report.html in ``out_dir``."""
    from dsprof.analysis.outputs.combined_swimlane import write_combined_swimlane
    from dsprof.analysis.outputs.html_report import REPORT_NAME, write_html_report
    from dsprof.analysis.outputs.summary_json import write_summary_json
    from dsprof.analysis.outputs.summary_md import write_summary_md

    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = {
        "summary.json": write_summary_json(result.summary, out_dir / "summary.json"),
        "summary.md": write_summary_md(result.summary, out_dir / "summary.md"),
    }
    if progress:
        progress(f"writing {out_dir / 'combined-swimlane.json'}")
    outputs["combined-swimlane.json"] = write_combined_swimlane(
        result.swimlane,
        out_dir / "combined-swimlane.json",
        process_names=result.trace.extras.get("process_names"),
        thread_names=result.trace.extras.get("thread_names"),
    )
    if progress:
        progress(f"writing {out_dir / REPORT_NAME}")
    outputs[REPORT_NAME] = write_html_report(result.swimlane, result.summary, out_dir / REPORT_NAME)
    return outputs


def format_summary_table(summary: dict) -> str:
    """A readable fixed-width table of the headline figures, for the CLI printout."""
    validation = summary["validation"]
    figures = summary["figures"]
    serving = summary["serving"]
    pipeline = summary["pipeline"]
    tails = summary["tail_steps"]
    late = summary["late_starts"]
    rows: list[tuple[str, str]] = [
        ("valid", "yes" if validation["valid"] else "NO: " + "; ".join(validation["problems"])),
        ("ranks / decode steps / rank roots", f"{validation['ranks']} / {validation['decode_steps']} / {validation['rank_roots']}"),
        ("exit status", format_value(summary.get("exit_status"))),
        ("tokens returned / expected", f"{format_value(serving['tokens_returned'])} / {format_value(serving['tokens_expected'])}"),
        ("batch elapsed", format_value(serving["batch_elapsed_s"], " s")),
        ("throughput", format_value(serving["throughput_tok_s"], " tok/s")),
        ("effective TPOT", format_value(serving["effective_tpot_ms"], " ms")),
    ]
    table = ["{:<36} {}".format(k, v) for k, v in rows]
    table.append("")
    table.append("{:<28} {:>10} {:>10} {:>10} {:>10} {:>7}".format("figure (ms)", "p50", "p95", "p99", "max", "count"))
    for name in HEADLINE_FIGURES:
        block = figures[name]
        cells = [format_value(block[key]) for key, _ in PERCENTILES]
        table.append("{:<28} {:>10} {:>10} {:>10} {:>10} {:>7}".format(name, *cells, block["count"]))
    table.append("")
    table.append(f"late starts (> {late['threshold_ms']} ms): {late['count']}")
    table.append(f"tail steps (> {tails['threshold_ms']} ms): {tails['count']}; straggler: {tails['straggler']['verdict']}")
    for item in tails["items"][:5]:
        table.append(f"  step {item['step']}: rank {item['rank']} ({item['device']}) +{item['excess_ms']} ms, {item['phase']}")
    table.append(f"pipeline: {pipeline['diagnosis']}")
    return "\n".join(table)
