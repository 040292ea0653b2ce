"""What ``dsprof watch`` prints of a window summary: the terminal's live view, and one line per new finding in a pipe.

Both read the window's summary only (the same sections ``dsprof analyze``
writes) and word findings with :mod:`.findings`, so a late step reads the same
live and after the fact. Text from traces is made terminal-safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dsprof.analysis.outputs.findings import LATE_LISTS, item_line, value, verdict_text, worst_first
from dsprof.analysis.summary import Summary
from dsprof.analysis.units import PERCENTILES
from dsprof.textsafe import terminal_safe

# The window's figures the live view shows (ms): skew at both ends of the device run, and the step interval.
VIEW_FIGURES = ("runner_start_skew_ms", "runner_end_skew_ms", "step_interval_ms")
# The window's serving figures the live view shows (the summary's ``serving`` block), with their units.
VIEW_SERVING = (
    ("requests", "requests", ""),
    ("tokens_returned", "tokens", ""),
    ("batch_elapsed_s", "elapsed", " s"),
    ("throughput_tok_s", "throughput", " tok/s"),
    ("effective_tpot_ms", "TPOT", " ms"),
    ("acceptance_rate", "acceptance", ""),
)
VIEW_LIST_LIMIT = 6
CLEAR_SCREEN = "\x1b[H\x1b[2J"


def window_steps(summary: Summary) -> tuple[int, int] | None:
    """The first and last decode step of a window summary (None: no step yet)."""
    steps = [row["step"] for row in summary.get("per_step") or [] if isinstance(row.get("step"), int)]
    return (min(steps), max(steps)) if steps else None


def straggler_of(summary: Summary) -> dict[str, Any]:
    """The straggler block of the tail steps (empty when there is none)."""
    tails: Mapping[str, Any] = summary.get("tail_steps") or {}
    straggler = tails.get("straggler")
    return straggler if isinstance(straggler, dict) else {}


class FindingLines:
    """One line per finding, each said once across refreshes: a late item by (list, step, rank), the verdict when it changes.

    What was said is kept for the window's steps only, so a job of any length holds no more.

    A step's finding is said once the window has a later step: its cause may
    be seen in the next step (the bind of the next run), so it is final then.
    """

    def __init__(self) -> None:
        self.said: set[tuple[str, int, int]] = set()
        self.straggler: tuple[Any, Any] | None = None

    def new_lines(self, summary: Summary, final: bool = False) -> list[str]:
        """The findings of this window not said before (``final``: the job ended, its last step is final too)."""
        steps = window_steps(summary)
        if steps is None:
            return []
        # a step before the window is never shown again (a step number met again after a restart is a new step)
        self.said = {said for said in self.said if said[1] >= steps[0]}
        found: list[tuple[int, str]] = []
        for key, title in LATE_LISTS:
            block: Mapping[str, Any] = summary.get(key) or {}  # type: ignore[assignment]
            for item in block.get("items") or []:
                step, rank = item.get("step"), item.get("rank")
                if item.get("noise") or not isinstance(step, int) or (step >= steps[1] and not final) or (key, step, rank) in self.said:
                    continue  # noise is no finding
                self.said.add((key, step, rank))
                found.append((step, f"{title[:-1]}: {item_line(item)}"))
        lines = [terminal_safe(line) for _, line in sorted(found, key=lambda pair: pair[0])]
        straggler = straggler_of(summary)
        current = None if straggler.get("rank") is None else (straggler.get("rank"), straggler.get("mechanism"))
        if current != self.straggler and (current is not None or self.straggler is not None):
            lines.append(terminal_safe(f"straggler: {straggler.get('verdict') if current is not None else 'none'}"))
        self.straggler = current
        return lines


def serving_line(summary: Summary) -> str:
    """The window's serving figures on one line, those it has (its request spans); "" when it has none."""
    serving: Mapping[str, Any] = summary.get("serving") or {}
    if serving.get("requests") is None:
        return ""
    shown = [f"{label} {value(serving.get(key), unit)}" for key, label, unit in VIEW_SERVING if serving.get(key) is not None]
    return "serving    " + " · ".join(shown)


def fit_width(line: str, width: int | None) -> str:
    """``line`` cut to ``width`` characters, its end marked ``…`` where cut (None: as it is)."""
    return line if width is None or len(line) <= width else line[: max(width - 1, 0)] + "…"


def format_live_view(
    summary: Summary | None, *, bytes_read: int, alerts: Sequence[str] = (), clock: str = "", width: int | None = None
) -> str:
    """The terminal view of one refresh: the window, the verdict, its serving and step figures, its late steps with causes, alerts.

    ``width``: the terminal's columns; every line is cut to fit, so that a long cause never wraps and scrolls the view.
    """
    return "\n".join(fit_width(line, width) for line in _view_lines(summary, bytes_read, alerts, clock))


def _view_lines(summary: Summary | None, bytes_read: int, alerts: Sequence[str], clock: str) -> list[str]:
    head = f"dsprof watch · {bytes_read / 2**20:,.1f} MiB read" + (f" · {clock}" if clock else "")
    steps = None if summary is None else window_steps(summary)
    if summary is None or steps is None:
        return [terminal_safe(head), "waiting for complete decode steps…"]
    ranks = len((summary.get("figures") or {}).get("per_rank") or {})
    lines = [f"{head} · steps {steps[0]}–{steps[1]} ({len(summary.get('per_step') or [])} steps, {ranks} ranks)", ""]
    lines += [f"verdict    {verdict}" for verdict in [verdict_text(summary)] if verdict]
    straggler = straggler_of(summary).get("verdict") or "none"
    lines.append(f"straggler  {straggler}")
    lines += [line for line in [serving_line(summary)] if line]
    lines += ["", "{:<24} {:>9} {:>9} {:>9} {:>9} {:>6}".format("window figure (ms)", "p50", "p95", "p99", "max", "count")]
    figures: Mapping[str, Any] = summary.get("figures") or {}
    for name in VIEW_FIGURES:
        block = figures.get(name) or {}
        lines.append(
            "{:<24} {:>9} {:>9} {:>9} {:>9} {:>6}".format(name, *(value(block.get(k)) for k, _ in PERCENTILES), block.get("count", 0))
        )
    for key, title in LATE_LISTS:
        late: Mapping[str, Any] = summary.get(key) or {}  # type: ignore[assignment]
        every = worst_first(late.get("items") or [])  # noise items are not shown nor counted
        items = sorted(every[:VIEW_LIST_LIMIT], key=lambda i: i.get("step") or 0)
        lines += ["", f"{title} in the window: {len(every)}"] + [f"  {item_line(i)}" for i in items]
        lines += [f"  … {len(every) - len(items)} more"] if len(every) > len(items) else []
    if alerts:
        lines += ["", "alerts:"] + [f"  {line}" for line in alerts]
    return [terminal_safe(line) for line in lines]
