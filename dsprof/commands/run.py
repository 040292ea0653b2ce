"""``dsprof run``: the bundled runtime with both profilers on, then the analysis.

A run that fails (a crashed rank, an injected fault) still leaves a log and
fragments behind, and those are analysed as far as they go: the point of the
toolkit is to explain bad runs, not only good ones.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsprof.analysis.outputs.console import format_console_summary
from dsprof.analysis.summary import Summary
from dsprof.commands.analyze import AnalyzeOutcome, analyze_paths
from dsprof.commands.printing import Printer, note_line, print_err, safe_lines, safe_progress
from dsprof.errors import DsprofError
from dsprof.profiler import artifacts
from dsprof.runtime.config import RuntimeConfig
from dsprof.runtime.launch import RunOutcome, run_workload

Progress = Callable[[str], None] | None


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
    **settings: Any,
) -> int:
    """``dsprof run``: profile a run of ``preset`` with ``settings`` (RuntimeConfig fields, None: the preset's) and print what came of it.

    Prints the findings, what went wrong (on ``err``), the report and the
    artifact directory (default ``runs/<preset>-<timestamp>``); returns the
    exit status (:attr:`ProfileRunResult.exit_code`).
    """
    config = RuntimeConfig.from_preset(preset, **settings)
    if out_dir is None:
        out_dir = default_run_dir(preset)
    progress, out, err = safe_progress(progress), safe_lines(out), safe_lines(err)
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
