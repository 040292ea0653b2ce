"""``dsprof history``: a run history in a DuckDB store, its change points, and its trend page (docs/GATE_RULES.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dsprof.analysis.outputs.trend_page import write_trend_page
from dsprof.analysis.policy.history import DEFAULT_NEWEST, HistoryCheck, add_run, check_history
from dsprof.analysis.summary import summary_path
from dsprof.commands.printing import Printer
from dsprof.fileio import atomic_write_text, check_input_file


def history_add_command(
    store: str | os.PathLike, run: str | os.PathLike, *, label: str | None = None, commit: str | None = None, out: Printer = print
) -> int:
    """Add a run (artifact dir or summary.json) to the store; a summary stored already changes nothing."""
    check_input_file(summary_path(run), expected="summary.json or an artifact directory holding one")
    index, added = add_run(store, run, label=label, commit=commit)
    out(f"{'added' if added else 'already stored'}: run {index} in {store}")
    return 0


def format_check(check: HistoryCheck) -> str:
    """One line per change point (regressions in the newest runs first marked), then the verdict line."""
    regressions = set(check.regressions)
    lines = [f"{'REGRESSION' if c in regressions else 'change':10} {c.describe()}" for c in check.change_points]
    runs = len(check.history.runs)
    lines.append(
        f"history: {runs} run(s), {len(check.checked)} figure(s), {len(check.change_points)} change point(s), "
        f"{len(regressions)} regression(s) in the newest {min(check.newest, runs)} run(s)"
    )
    return "\n".join(lines)


def write_check_json(check: HistoryCheck, path: str | os.PathLike) -> Path:
    """``{"change_points": [...]}`` (docs/GATE_RULES.md), written atomically."""
    document = {"runs": len(check.history.runs), "newest": check.newest, "change_points": [c.to_json() for c in check.change_points]}
    return atomic_write_text(path, json.dumps(document, indent=2, allow_nan=False) + "\n")


def history_check_command(
    store: str | os.PathLike,
    *,
    figures: list[str] | None = None,
    json_path: str | os.PathLike | None = None,
    newest: int = DEFAULT_NEWEST,
    out: Printer = print,
) -> int:
    """Print the change points; exit status 1 when a regression lies in the newest ``newest`` runs, else 0."""
    check = check_history(store, figures=figures, newest=newest)
    if json_path is not None:
        write_check_json(check, json_path)
    out(format_check(check))
    return 1 if check.regressions else 0


def history_report_command(store: str | os.PathLike, output: str | os.PathLike, *, out: Printer = print) -> int:
    """Write the trend page of a store."""
    check = check_history(store)
    write_trend_page(check, output)
    out(f"trend page: {output}")
    return 0
