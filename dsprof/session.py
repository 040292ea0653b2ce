"""One profiled run: the bundled runtime with both profilers on, then the analysis.

This is what ``dsprof run`` calls. A run that fails (a crashed rank, an injected
fault) still leaves a log and fragments behind, and those are analysed as far
as they go: the point of the toolkit is to explain bad runs, not only good ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dsprof.errors import DsprofError

Progress = Callable[[str], None]


@dataclass
class ProfileRunResult:
    """The runtime's outcome, the analysis (when one was possible) and what went wrong."""

    out_dir: Path
    outcome: Any  # dsprof.runtime.launch.RunOutcome
    analysis: Any | None  # dsprof.analysis.analyze.AnalysisResult
    problems: list[str] = field(default_factory=list)

    @property
    def summary(self) -> dict | None:
        return None if self.analysis is None else self.analysis.summary

    @property
    def valid(self) -> bool:
        return bool(self.summary and self.summary.get("validation", {}).get("valid"))

    @property
    def runtime_ok(self) -> bool:
        return self.outcome.exit_status == 0

    @property
    def exit_code(self) -> int:
        """0 when the runtime succeeded and the swimlane is valid, else 1."""
        return 0 if self.runtime_ok and self.valid else 1

    @property
    def summary_md(self) -> Path | None:
        path = self.out_dir / "summary.md"
        return path if self.analysis is not None and path.exists() else None

    @property
    def report_path(self) -> Path | None:
        path = self.out_dir / "report.html"
        return path if self.analysis is not None and path.exists() else None


def profile_run(
    config: Any,
    out_dir: str | Path,
    *,
    threshold_ms: float = 5.0,
    progress: Progress | None = None,
) -> ProfileRunResult:
    """Run ``config`` (a :class:`~dsprof.runtime.config.RuntimeConfig`) into ``out_dir`` and analyse it."""
    from dsprof.analysis.analyze import analyze
    from dsprof.runtime.launch import run_workload

    out_dir = Path(out_dir)
    config = _with_profiling(config)
    outcome = run_workload(config, out_dir, progress=progress)
    problems = []
    if outcome.exit_status != 0:
        rank = "" if outcome.failed_rank is None else f" on rank {outcome.failed_rank}"
        problems.append(f"runtime failed{rank} (exit status {outcome.exit_status}): {outcome.message}")
    if progress:
        progress(f"analysing {out_dir}")
    try:
        analysis = analyze([out_dir], out_dir, threshold_ms=threshold_ms, expect_ranks=config.ranks,
                           progress=progress)
    except DsprofError as exc:
        if outcome.exit_status == 0:
            raise
        problems.append(f"nothing analysable after the failure: {exc}")
        return ProfileRunResult(out_dir, outcome, None, problems)
    validation = analysis.summary.get("validation", {})
    if not validation.get("valid"):
        reasons = "; ".join(validation.get("problems", [])) or "see summary.md"
        problems.append(f"swimlane not valid: {reasons}")
    return ProfileRunResult(out_dir, outcome, analysis, problems)


def _with_profiling(config: Any) -> Any:
    """Both profilers on: a ``dsprof run`` without traces would have nothing to explain."""
    if getattr(config, "profile", True):
        return config
    return dataclasses.replace(config, profile=True)
