"""The report's lists of late items and its charts, as the page's script reads them: from the summary alone."""

from __future__ import annotations

from collections.abc import Sequence

from dsprof.analysis.outputs.findings import cause_text, item_line, own_rank, value, worst_first
from dsprof.analysis.summary import Summary
from dsprof.analysis.summary_schema import LateItem


def list_items(items: list[dict]) -> list[dict]:
    """Late items for the page: what sorting and zooming need, and the findings line of each."""
    out = []
    for item in items:  # one per late start / tail step: summary-sized
        causes = item.get("ranks") or [item]
        out.append(
            {
                "step": item.get("step"),
                "rank": item.get("rank"),
                "late_rank": item.get("late_rank"),
                "role": item.get("role"),
                "phase": item.get("phase"),
                "mechanism": item.get("mechanism") or "unattributed",
                "excess_ms": item.get("excess_ms") or 0.0,
                "victims": sorted({r for c in causes if c.get("role") == "victim" and (r := own_rank(c)) is not None}),
                "text": item_line(item),
                "also": [f"rank {value(own_rank(c))}: {cause_text(c)}" for c in causes[1:]],
            }
        )
    return out


def chart_data(summary: Summary) -> dict:
    per_step = summary.get("per_step") or []
    late = summary.get("late_starts") or {}
    tails = summary.get("tail_steps") or {}

    def worst_by_step(items: Sequence[LateItem]) -> dict[int, str]:
        lines: dict[int, str] = {}
        for item in worst_first(items):
            lines.setdefault(int(item["step"]), item_line(item))
        return lines

    slow = summary.get("slow_steps")
    median = slow["median_interval_ms"] if slow else None
    trends = summary.get("trends")
    windows = trends["windows"] if trends else []
    return {
        "step": [row.get("step") for row in per_step],
        "interval_ms": [row.get("interval_ms") for row in per_step],
        "slow_threshold_ms": None if median is None or not slow else round(median + slow["threshold_ms"], 3),
        "slow_lines": worst_by_step(slow["items"] if slow else []),
        "trends": {
            "window_steps": trends["window_steps"] if trends else None,
            "first_step": [w["first_step"] for w in windows],
            "last_step": [w["last_step"] for w in windows],
            "interval_p50_ms": [w["step_interval_p50_ms"] for w in windows],
            "interval_p99_ms": [w["step_interval_p99_ms"] for w in windows],
            "end_skew_p99_ms": [w["runner_end_skew_p99_ms"] for w in windows],
            "slow_steps": [w["slow_steps"] for w in windows],
            "what_if_saved_ms": [w["what_if_saved_ms"] for w in windows],
        },
        "start_skew_ms": [row.get("runner_start_skew_ms") for row in per_step],
        "end_skew_ms": [row.get("runner_end_skew_ms") for row in per_step],
        "late_threshold_ms": late.get("threshold_ms"),
        "tail_threshold_ms": tails.get("threshold_ms"),
        "late_lines": worst_by_step(late.get("items") or []),
        "tail_lines": worst_by_step(tails.get("items") or []),
        "device_time": _device_time(summary),
    }


def _device_time(summary: Summary) -> dict | None:
    """The device-time breakdown per step and rank as chart columns (None: the source has none)."""
    block = summary.get("device_time")
    if not block:
        return None
    rows = block["per_step"]
    return {
        "step": [str(row["step"]) for row in rows],
        "rank": [f"rank {row['rank']}" for row in rows],
        **{key: [row[key] for row in rows] for key in ("compute_ms", "non_compute_ms", "idle_ms")},
    }
