"""``dsprof gate``: check a summary against gate rules, and tell CI (docs/GATE_RULES.md).

:func:`gate` is the library call (evaluate, then write the JSON verdict and
JUnit XML when asked); :func:`gate_command` is what the CLI runs: the text
verdict and, on GitHub Actions (``GITHUB_ACTIONS=true``), an ``::error``
annotation per failed rule and a table in ``$GITHUB_STEP_SUMMARY``. A gate that
cannot judge (bad rules, unreadable summary) says so there too before the error
reaches the caller, so a red CI step always carries its reason.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from dsprof.analysis.outputs.gate_outputs import (
    format_step_summary,
    format_step_summary_error,
    format_verdict,
    github_annotations,
    github_error_annotation,
    write_junit,
    write_verdict_json,
)
from dsprof.analysis.policy.gate import GateVerdict, evaluate_gate
from dsprof.analysis.policy.gate_suggest import DEFAULT_MARGIN, suggest_rules
from dsprof.analysis.summary import summary_path, summary_with_path
from dsprof.commands.printing import Printer, os_error_message
from dsprof.errors import DsprofError
from dsprof.fileio import atomic_append_text, check_input_file

__all__ = ["gate", "gate_command", "suggest_command"]


def gate(
    summary_or_dir: str | Path | dict,
    rules_path: str | Path,
    *,
    baseline: str | Path | dict | None = None,
    junit: str | Path | None = None,
    verdict_path: str | Path | None = None,
    history: str | Path | None = None,
) -> GateVerdict:
    """Check a summary against a rules file (and a run history); optionally write a JSON verdict and JUnit XML (atomically)."""
    for named in (summary_or_dir, rules_path, baseline):
        if isinstance(named, (str, os.PathLike)):
            check_input_file(summary_path(named) if named is not rules_path else named, expected="a regular file")
    verdict = evaluate_gate(summary_or_dir, rules_path, baseline=baseline, history=history)
    if verdict_path is not None:
        write_verdict_json(verdict, verdict_path)
    if junit is not None:
        write_junit(verdict, junit)
    return verdict


def gate_command(
    summary_or_dir: str | Path,
    rules_path: str | Path,
    *,
    baseline: str | Path | None = None,
    junit: str | Path | None = None,
    verdict_path: str | Path | None = None,
    history: str | Path | None = None,
    out: Printer = print,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run the gate and print its verdict; returns the exit status (0 passed, 1 failed).

    ``environ`` (default ``os.environ``) says whether this is GitHub Actions and
    where its step summary is. Errors propagate after the GitHub report.
    """
    environ = os.environ if environ is None else environ
    on_github = environ.get("GITHUB_ACTIONS") == "true"
    step_summary = environ.get("GITHUB_STEP_SUMMARY") if on_github else None
    try:
        verdict = gate(summary_or_dir, rules_path, baseline=baseline, junit=junit, verdict_path=verdict_path, history=history)
    except (DsprofError, OSError) as exc:
        if on_github:
            _report_error_to_github(exc, step_summary, out)
        raise
    out(format_verdict(verdict))
    if on_github:
        for annotation in github_annotations(verdict):
            out(annotation)
        if step_summary:
            atomic_append_text(step_summary, format_step_summary(verdict))
    return verdict.exit_code


def _report_error_to_github(exc: DsprofError | OSError, step_summary: str | None, out: Printer) -> None:
    """An ``::error`` annotation and a step-summary line for a gate that could not judge."""
    message = os_error_message(exc) if isinstance(exc, OSError) else str(exc)
    out(github_error_annotation(message))
    if step_summary:
        try:
            atomic_append_text(step_summary, format_step_summary_error(message))
        except (OSError, DsprofError):
            pass  # the step summary is a courtesy: the error that stopped the gate is the one to report


def suggest_command(summaries: Sequence[str | Path], *, margin: float = DEFAULT_MARGIN, out: Printer = print) -> int:
    """``dsprof gate --suggest``: print rules whose limits come from these healthy runs' summaries (docs/GATE_RULES.md)."""
    loaded = [summary_with_path(s) for s in summaries]
    try:
        text = suggest_rules([s for s, _ in loaded], margin=margin, sources=[p or "<dict>" for _, p in loaded])
    except ValueError as exc:
        raise DsprofError(str(exc)) from None
    out(text.rstrip("\n"))
    return 0
