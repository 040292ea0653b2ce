"""summary.md: the verification block to paste into a pull request — findings first.

Text taken from traces (device names, span names, problems) is escaped for
markdown and HTML, since the block is pasted into pull requests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dsprof.analysis.outputs.findings import LATE_LISTS, item_line, value, verdict_lines, worst_first
from dsprof.analysis.summary import Summary
from dsprof.analysis.summary_schema import PercentileFigure
from dsprof.analysis.units import PERCENTILES
from dsprof.fileio import atomic_write_text
from dsprof.textsafe import terminal_safe

# The workload fields a reviewer needs to recognise the run; model sizes and
# other knobs stay in summary.json. A workload with none of these (another
# producer's) is shown whole.
WORKLOAD_SHAPE_KEYS = (
    "preset",
    "ranks",
    "dp",
    "ep",
    "tp",
    "requests",
    "prompt_tokens",
    "output_tokens",
    "rounds",
    "metadata",
    "depth",
    "device_phases",
    "inject",
    "seed",
)
# The percentile figures shown in the printed table and in summary.md (the rest stay in summary.json).
HEADLINE_FIGURES: tuple[PercentileFigure, ...] = (
    "step_interval_ms",
    "runner_start_skew_ms",
    "runner_end_skew_ms",
    "runner_to_validate_gap_ms",
    "validate_ms",
    "bind_ms",
    "root_ms",
)
LIST_LIMIT = 10
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|<>&~])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_MENTION = re.compile(r"@(?=[A-Za-z0-9])")


def md(text: object) -> str:
    """Trace text made inert in markdown and HTML.

    Specials are backslash-escaped, control bytes shown as \\xNN, bidirectional
    overrides and line separators as visible escapes (:func:`terminal_safe`),
    and ``@name`` broken with a zero-width space so that pasting the block into
    a pull request notifies nobody.
    """
    escaped = _MARKDOWN_SPECIAL.sub(r"\\\1", str(text))
    escaped = _MENTION.sub("@&#8203;", _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", escaped))
    return terminal_safe(escaped)


def format_summary_md(summary: Summary) -> str:
    """Markdown: verdicts, worst late steps with causes, serving figures, skew percentiles, validation, workload."""
    lines = ["## dsprof verification", ""]
    lines += [f"- **{label}**: {md(text)}" for label, text in verdict_lines(summary)]
    lines += _late_lists(summary)
    lines += _worst_windows(summary)
    serving = summary.get("serving") or {}
    lines += [
        "",
        (
            f"Tokens: {value(serving.get('tokens_returned'))} / {value(serving.get('tokens_expected'))} expected; "
            f"batch {value(serving.get('batch_elapsed_s'), ' s')}; throughput {value(serving.get('throughput_tok_s'), ' tok/s')}; "
            f"effective TPOT {value(serving.get('effective_tpot_ms'), ' ms')}"
            + (f"; acceptance {serving['acceptance_rate']}" if serving.get("acceptance_rate") is not None else "")
            + (f" — **partial**: {md(serving.get('partial_reason'))}" if serving.get("partial") else "")
        ),
    ]
    lines += ["", "| figure | p50 ms | p95 ms | p99 ms | max ms | count |", "|---|---|---|---|---|---|"]
    figures = summary.get("figures") or {}
    for name in HEADLINE_FIGURES:
        block: Mapping[str, Any] = figures.get(name) or {}
        cells = " | ".join(value(block.get(key)) for key, _ in PERCENTILES)
        lines.append(f"| {name} | {cells} | {block.get('count', 0)} |")
    validation = summary.get("validation") or {}
    lines += [
        "",
        f"Validation: {validation.get('decode_steps')} decode steps × {validation.get('ranks')} ranks = "
        f"{validation.get('rank_roots')} rank roots (steps numbered by {validation.get('step_numbering', 'position')})",
    ]
    workload = summary.get("workload") or {}
    if workload:
        shape = {k: workload[k] for k in WORKLOAD_SHAPE_KEYS if workload.get(k) not in (None, [], "")} or workload
        lines.append("Workload: " + md(", ".join(f"{k}={value(v)}" for k, v in shape.items())))
    return "\n".join(lines) + "\n"


def _late_lists(summary: Summary) -> list[str]:
    lines: list[str] = []
    for key, title in LATE_LISTS:
        block: dict = summary.get(key) or {}  # type: ignore[assignment]
        items = worst_first(block.get("items") or [])
        if not items:
            continue
        lines += ["", f"{title.capitalize()} (> {block.get('threshold_ms')} ms), worst first:"]
        lines += [f"- {md(item_line(item))}" for item in items[:LIST_LIMIT]]
        if len(items) > LIST_LIMIT:
            lines.append(f"- … {len(items) - LIST_LIMIT} more in summary.json and report.html")
    return lines


def _worst_windows(summary: Summary) -> list[str]:
    """The windows of the run where the most was lost (what-if saving, then slow steps)."""
    trends = summary.get("trends")
    if not trends:
        return []
    windows = {w["window"]: w for w in trends["windows"]}
    worst = [windows[i] for i in trends["worst"] if i in windows]
    if not worst:
        return []
    lines = ["", f"Worst windows ({trends['window_steps']} steps each):"]
    for w in worst:
        lines.append(
            f"- steps {w['first_step']}–{w['last_step']} (from {value(w['start_s'], ' s')}): "
            f"what-if {value(w['what_if_saved_ms'], ' ms')}, {w['slow_steps']} slow steps, "
            f"step interval p99 {value(w['step_interval_p99_ms'], ' ms')}"
        )
    return lines


def write_summary_md(summary: Summary, path: str | Path) -> Path:
    """Write the block a reviewer pastes into a pull request (``dsprof run`` also prints it)."""
    return atomic_write_text(path, format_summary_md(summary))
