"""``dsprof run``: the bundled runtime with both profilers on, then the analysis.

A run that fails (a crashed rank, an injected fault) still leaves a log and
fragments behind, and those are analysed as far as they go: the point of the
toolkit is to explain bad runs, not only good ones.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsprof.analysis.outputs.console import format_console_summary
from dsprof.analysis.summary import Summary
from dsprof.commands.analysis_job import AnalyzeOutcome, analyze_paths
from dsprof.commands.printing import Printer, note_line, print_err, safe_lines, safe_progress
from dsprof.errors import DsprofError
from dsprof.profiler import artifacts
from dsprof.progress import Progress
from dsprof.runtime.config import RuntimeConfig
from dsprof.runtime.launch import RunOutcome, run_workload


@dataclass
class ProfileRunResult:
    """The runtime's outcome, the analysis (when one was possible) and what went wrong."""

    out_dir: Path
    outcome: RunOutcome
    analysis: AnalyzeOutcome | None
    problems: list[str] = field(default_factory=list)

    @property
    def summary(self) -> Summary | None:
        return None if self.analysis is None else self.analysis.summary

    @property
    def valid(self) -> bool:
        return bool(self.summary and (self.summary.get("validation") or {}).get("valid"))

    @property
    def exit_code(self) -> int:
        """0 when the runtime succeeded and the swimlane is valid, else 1."""
        return 0 if self.outcome.exit_status == 0 and self.valid else 1

    def output(self, name: str) -> Path | None:
        """An output file the analysis wrote (e.g. ``report.html``), if it did."""
        return None if self.analysis is None else self.analysis.outputs.get(name)


def profile_run(config: RuntimeConfig, out_dir: str | Path, *, threshold_ms: float = 5.0, progress: Progress = None) -> ProfileRunResult:
    """Run ``config`` into ``out_dir`` and analyse it."""
    out_dir = Path(out_dir)
    config = config if config.profile else dataclasses.replace(config, profile=True)  # nothing to explain without traces
    outcome = run_workload(config, out_dir, progress=progress)
    problems = []
    if outcome.exit_status != 0:
        rank = "" if outcome.failed_rank is None else f" on rank {outcome.failed_rank}"
        problems.append(f"runtime failed{rank} (exit status {outcome.exit_status}): {outcome.message}")
    if progress:
        progress(f"analysing {out_dir}")
    try:
        analysis = analyze_paths([out_dir], out_dir, threshold_ms=threshold_ms, expect_ranks=config.ranks, progress=progress)
    except DsprofError as exc:
        if outcome.exit_status == 0:
            raise
        problems.append(f"nothing analysable after the failure: {exc}")
        return ProfileRunResult(out_dir, outcome, None, problems)
    validation = analysis.summary.get("validation") or {}
    if not validation.get("valid"):
        problems.append("swimlane not valid: " + ("; ".join(validation.get("problems", [])) or "see summary.md"))
    return ProfileRunResult(out_dir, outcome, analysis, problems)


def default_run_dir(preset: str, kind: str = "") -> Path:
    """``runs/<preset>[-<kind>]-<timestamp>``: where a run's artifacts go without ``-o``."""
    return Path("runs") / f"{preset}{'-' + kind if kind else ''}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_command(
    preset: str = "demo",
    *,
    out_dir: str | Path | None = None,
    threshold_ms: float = 5.0,
    progress: Progress = None,
    out: Printer = print,
    err: Printer = print_err,
    live: bool = False,
    **settings: Any,
) -> int:
    """``dsprof run``: profile a run of ``preset`` with ``settings`` (RuntimeConfig fields, None: the preset's) and print what came of it.

    Prints the findings, what went wrong (on ``err``), the report and the
    artifact directory (default ``runs/<preset>-<timestamp>``); returns the
    exit status (:attr:`ProfileRunResult.exit_code`). ``live``: the run is
    followed while it runs (:func:`live_run`).
    """
    config = RuntimeConfig.from_preset(preset, **settings)
    if out_dir is None:
        out_dir = default_run_dir(preset)
    progress, out, err = safe_progress(progress), safe_lines(out), safe_lines(err)
    if live:
        return live_run(config, Path(out_dir), threshold_ms=threshold_ms, out=out, err=err)
    result = profile_run(config, out_dir, threshold_ms=threshold_ms, progress=progress)
    if result.summary is not None:
        out(format_console_summary(result.summary))
    for line in result.problems:
        err(note_line(line))
    report = result.output(artifacts.REPORT_HTML)
    if report is not None:
        out(f"report: {report}")
    out(f"artifacts: {result.out_dir}")
    return result.exit_code


def live_run(config: RuntimeConfig, out_dir: Path, *, threshold_ms: float = 5.0, out: Printer = print, err: Printer = print_err) -> int:
    """``dsprof run --live``: the runtime here, ``dsprof watch`` of its run directory in a child process beside it.

    A child, not a thread: the runtime forks its ranks, which must not inherit
    a thread in the middle of a query. The watch draws its live view on this
    terminal (or prints its findings in a pipe), ends when the runtime has
    written performance_summary.json, and writes ``analyze``'s outputs into
    the run directory. Exit status as ``dsprof run``'s (1 also when the watch
    could not write its outputs).
    """
    config = config if config.profile else dataclasses.replace(config, profile=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / artifacts.SERVER_LOG).unlink(missing_ok=True)  # the runtime truncates it anyway: no stale bytes are followed
    (out_dir / artifacts.PERFORMANCE_SUMMARY).unlink(missing_ok=True)  # nor is an old run's end taken for this one's
    (out_dir / artifacts.SERVER_LOG).touch()
    watch = [sys.executable, "-m", "dsprof.cli.main", "watch", str(out_dir), "-o", str(out_dir)]
    watch += ["--threshold-ms", str(threshold_ms), "--expect-ranks", str(config.ranks)]
    watcher = subprocess.Popen(watch)
    try:
        outcome = run_workload(config, out_dir)
    except BaseException:
        watcher.terminate()  # SIGTERM: the watch writes what it saw and ends
        watcher.wait()
        raise
    watched = watcher.wait()
    problems = []
    if outcome.exit_status != 0:
        rank = "" if outcome.failed_rank is None else f" on rank {outcome.failed_rank}"
        problems.append(f"runtime failed{rank} (exit status {outcome.exit_status}): {outcome.message}")
    summary_path = out_dir / artifacts.SUMMARY_JSON
    valid = watched == 0 and summary_path.is_file() and bool(json.loads(summary_path.read_text()).get("validation", {}).get("valid"))
    if watched != 0:
        problems.append(f"dsprof watch ended with exit status {watched}")
    elif not valid:
        problems.append(f"swimlane not valid: see {out_dir / artifacts.SUMMARY_MD}")
    for line in problems:
        err(note_line(line))
    out(f"artifacts: {out_dir}")
    return 0 if outcome.exit_status == 0 and valid else 1
