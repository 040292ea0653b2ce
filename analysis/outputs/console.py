"""The summary printed by ``dsprof run`` and ``dsprof analyze``: one formatter for both.

Findings first (verdicts, the worst late steps with their causes), then the
figures. Text taken from traces is made safe for a terminal: no escape
sequence from a trace reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsprof.analysis.outputs.findings import LATE_LISTS, item_line, value, verdict_lines, worst_first
from dsprof.analysis.outputs.summary_md import HEADLINE_FIGURES
from dsprof.analysis.summary import Summary
from dsprof.analysis.units import PERCENTILES
from dsprof.textsafe import terminal_safe

LIST_LIMIT = 5


def format_console_summary(summary: Summary) -> str:
    """A readable fixed-width summary for the terminal."""
    lines = [f"{label:<10} {text}" for label, text in verdict_lines(summary)]
    for key, title in LATE_LISTS:
        block: Mapping[str, Any] = summary.get(key) or {}  # type: ignore[assignment]
        items = worst_first(block.get("items") or [])
        if items:
            lines += ["", f"worst {title}:"] + [f"  {item_line(item)}" for item in items[:LIST_LIMIT]]
            if len(items) > LIST_LIMIT:
                lines.append(f"  … {len(items) - LIST_LIMIT} more (summary.md, report.html)")
    serving = summary.get("serving") or {}
    lines += [
        "",
        f"tokens {value(serving.get('tokens_returned'))}/{value(serving.get('tokens_expected'))}; "
        f"batch {value(serving.get('batch_elapsed_s'), ' s')}; throughput {value(serving.get('throughput_tok_s'), ' tok/s')}; "
        f"effective TPOT {value(serving.get('effective_tpot_ms'), ' ms')}"
        + (f" — PARTIAL: {serving.get('partial_reason')}" if serving.get("partial") else ""),
        "",
    ]
    lines.append("{:<28} {:>10} {:>10} {:>10} {:>10} {:>7}".format("figure (ms)", "p50", "p95", "p99", "max", "count"))
    figures = summary.get("figures") or {}
    for name in HEADLINE_FIGURES:
        block = figures.get(name) or {}
        lines.append(
            "{:<28} {:>10} {:>10} {:>10} {:>10} {:>7}".format(
                name, *(value(block.get(key)) for key, _ in PERCENTILES), block.get("count", 0)
            )
        )
    return "\n".join(terminal_safe(line) for line in "\n".join(lines).split("\n"))
