"""Findings in words: one line per late item, worst first, and the run's verdicts.

The one formatter behind summary.md, the ``dsprof run`` / ``dsprof analyze``
printout and report.html, so the three say the same thing. Everything here
reads the summary; nothing recomputes a figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast

from dsprof.analysis.summary import Summary
from dsprof.analysis.summary_schema import Cause

# an item of a late list: typed (LateItem) where the summary's section is, any mapping where it is read by key name
ItemT = TypeVar("ItemT", bound=Mapping[str, Any])

MECHANISM_WORDS = {
    "device": "device",
    "host_cpu": "host CPU",
    "run_queue": "run queue",
    "gc": "GC",
    "carried_over": "carried over",
    "peer_wait": "peer wait",
    "unattributed": "unattributed",
}


def value(number: object, unit: str = "") -> str:
    """A summary value for people: ``n/a`` where the figure could not be computed (null)."""
    if number is None:
        return "n/a"
    if isinstance(number, bool):
        return "yes" if number else "no"
    return f"{number}{unit}"


def own_rank(item: Cause | Mapping[str, Any]) -> int | None:
    """The rank a cause is about: a tail's or late start's cell names it ``late_rank`` (its ``rank`` is the peer it
    waited for); a slow step's rows name it ``rank``."""
    late = item.get("late_rank")
    return late if late is not None else item.get("rank")


def cause_text(item: Cause | Mapping[str, Any]) -> str:
    """``gc: 48.700 ms collection in native_fence_wait`` — the mechanism and its evidence in one phrase."""
    mechanism = item.get("mechanism") or "unattributed"
    detail = item.get("detail") or ""
    if mechanism == "carried_over" and item.get("from_step") is not None:
        return f"carried over from step {item['from_step']}: {detail}"
    if mechanism == "peer_wait":
        return f"peer wait: rank {value(own_rank(item))} {detail}"
    return f"{mechanism}: {detail}"


# The lists of late items in every output, in the order a reader needs them: a slow step costs every rank.
LATE_LISTS = (("slow_steps", "slow steps"), ("tail_steps", "tail steps"), ("late_starts", "late starts"))


def item_line(item: Mapping[str, Any]) -> str:
    """``step 69 · rank 6 (cpu:6) · +50.914 ms · gc: 48.700 ms collection in native_fence_wait``.

    A slow step adds where the others waited for its culprit
    (``· held 7 ranks at device_wall.forward.a2a_wait``); a cause with lateness
    carried over beside it says so.
    """
    line = (
        f"step {item.get('step')} · rank {item.get('rank')} ({item.get('device')}) · +{value(item.get('excess_ms'))} ms · "
        f"{cause_text(item)}"
    )
    carried = item.get("carried_over")
    if isinstance(carried, dict):
        line += f" (and {value(carried.get('evidence_ms'))} ms carried over from step {carried.get('from_step')})"
    path = item.get("critical_path")
    if isinstance(path, dict):
        victims = sum(1 for cause in item.get("ranks") or [] if cause.get("role") == "victim")
        line += f" · held {victims} rank{'s' if victims != 1 else ''} at {path.get('via')}" if victims else f" · {path.get('via')}"
    return line


def worst_first(items: Sequence[ItemT]) -> list[ItemT]:
    """The findings (items above the noise floor) ordered by excess, largest first (then by step)."""
    found = [i for i in items if not i.get("noise")]
    return sorted(found, key=lambda i: (-(i.get("excess_ms") or 0.0), i.get("step") or 0, i.get("rank") or 0))


def verdict_text(summary: Summary) -> str | None:
    """``degraded: rank 1 (cpu:1) costs 15.6% …``: the run's one verdict (older summaries have none)."""
    verdict: Mapping[str, Any] = summary.get("verdict") or {}
    status, headline = verdict.get("status"), str(verdict.get("headline") or "")
    if not status:
        return None
    return headline if headline.startswith(str(status)) else f"{status}: {headline}"


def window_text(summary: Summary) -> str | None:
    """``steps 1000:1999, since +5m``: the window of the run the figures cover (``inputs.window``), None for the whole run."""
    block: Mapping[str, Any] = (summary.get("inputs") or {}).get("window") or {}
    steps = block.get("steps")
    said = [f"steps {steps[0]}:{steps[1]}"] if isinstance(steps, list) and len(steps) == 2 else []
    said += [f"{side} {block[side]}" for side in ("since", "until") if block.get(side)]
    if not said:
        return None
    partial = block.get("partial_steps_left_out") or 0
    cut = f"; {partial} step{'s' if partial != 1 else ''} it cut left out whole" if partial else ""
    return ", ".join(said) + " only (figures of this window of the run" + cut + ")"


def dropped_text(summary: Summary) -> str | None:
    """``1 torn_record (server.log:12), 2 missing_field (server.log:40)``: the records not used, by reason, and the first
    place of each (``inputs.dropped``, ``inputs.dropped_at``); None when nothing was dropped."""
    inputs: Mapping[str, Any] = summary.get("inputs") or {}
    at: Mapping[str, str] = inputs.get("dropped_at") or {}
    counts = sorted((reason, n) for reason, n in (inputs.get("dropped") or {}).items() if n)
    return ", ".join(f"{n:,} {reason}" + (f" (first at {at[reason]})" if reason in at else "") for reason, n in counts) or None


def verdict_lines(summary: Summary) -> list[tuple[str, str]]:
    """(label, text) of each verdict: validity, the run's outcome, pipeline, straggler, tail cost."""
    validation = summary.get("validation") or {}
    pipeline = summary.get("pipeline") or {}
    tails = summary.get("tail_steps") or {}
    cost = summary.get("tail_cost") or {}
    dropped = sum((summary.get("inputs") or {}).get("dropped", {}).values())
    said = f", {dropped:,} record{'s' if dropped != 1 else ''} dropped" if dropped else ""
    lines = [
        ("swimlane", "valid" + said if validation.get("valid") else "NOT valid: " + "; ".join(validation.get("problems") or []) + said)
    ]
    damage = dropped_text(summary)
    if damage:
        lines.append(("dropped", damage))
    window = window_text(summary)
    if window:
        lines.insert(0, ("window", window))
    verdict = verdict_text(summary)
    if verdict:
        lines.insert(0, ("verdict", verdict))
    lines.append(("run", run_outcome(summary)))
    serialized = pipeline.get("serialized")
    pipe = "n/a" if serialized is None else ("SERIALIZED" if serialized else "healthy")
    lines.append(("pipeline", f"{pipe}: {pipeline.get('diagnosis') or 'not checked'}"))
    straggler = (tails.get("straggler") or {}).get("verdict") or "none"
    lines.append(("straggler", straggler))
    what_if: Mapping[str, Any] = summary.get("what_if") or {}
    if what_if.get("total_saved_ms") is not None:
        share = what_if.get("share_of_decode_wall")
        mechanisms = sorted((what_if.get("by_mechanism") or {}).items(), key=lambda kv: -kv[1])
        lines.append(
            (
                "what-if",
                f"{what_if['total_saved_ms']} ms"
                + (f" ({100 * share:.1f}% of the decode wall time)" if share is not None else "")
                + " saved without the causes found"
                + (
                    "; " + ", ".join(f"{MECHANISM_WORDS.get(m, m)} {ms} ms" for m, ms in mechanisms if ms)
                    if any(ms for _, ms in mechanisms)
                    else ""
                ),
            )
        )
    if cost.get("total_ms") is not None:
        share = cost.get("share_of_decode_wall")
        lines.append(
            (
                "tail cost",
                f"{cost['total_ms']} ms"
                + (f" ({100 * share:.1f}% of the decode wall time)" if share is not None else "")
                + " — saved had no rank ended later than the median",
            )
        )
    late_lists = (("slow_steps", "slow steps"), ("late_starts", "late starts"), ("tail_steps", "tail steps"))
    counts = [(title, _late_counts(cast(Mapping[str, Any], summary.get(key) or {}))) for key, title in late_lists]
    lines.append(
        ("late", ", ".join(f"{found} {title}" + (f" (+{noise} within noise)" if noise else "") for title, (found, noise) in counts))
    )
    return lines


def _late_counts(block: Mapping[str, Any]) -> tuple[int, int]:
    """(findings, items within noise) of one late list."""
    items = block.get("items") or []
    noise = sum(1 for item in items if item.get("noise"))
    return int(block.get("count", len(items))) - noise, noise


def run_outcome(summary: Summary) -> str:
    """``exit status 0`` or, after a crash, which rank failed and why."""
    run: dict = dict(summary.get("run") or {})
    status = run.get("exit_status", summary.get("exit_status"))
    text = f"exit status {value(status)}"
    if status not in (None, 0) and run.get("message"):
        return f"{text}: {run['message']}"
    if run.get("failed_rank") is not None:
        device = f" ({run['failed_device']})" if run.get("failed_device") else ""
        text += f"; rank {run['failed_rank']}{device} failed"
    return text
