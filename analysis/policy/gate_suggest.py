"""Suggested gate rules from healthy runs (``dsprof gate --suggest``): the facts every healthy run has, and effect-size limits.

Effect sizes are shares of the decode wall time (what the what-if replay would
save, the straggler's share, the tail cost) and the share of slow steps; each
limit is the worst healthy value times a margin, never below a floor (a share
that is 0 on every healthy run would otherwise fail the first run with any
noise). Raw timings (skews, cadence) are left out: on a shared machine they
move with load, not with the code. The output is a rules file
(docs/GATE_RULES.md) with a comment per rule saying what it protects and which
healthy values it came from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dsprof.textsafe import toml_string

DEFAULT_MARGIN = 1.5
MAX_MARGIN = 1000.0  # far beyond any sane headroom; keeps value × margin finite for every value _values takes
LARGEST_VALUE = 2.0**63  # a summary's counts and shares are far below; beyond it the arithmetic overflows


@dataclass(frozen=True)
class ShareLimit:
    """A share of the decode wall time whose healthy maximum (× margin, at least ``floor``) becomes the limit."""

    path: str
    name: str
    protects: str
    floor: float


SHARE_LIMITS = (
    ShareLimit(
        "what_if.share_of_decode_wall",
        "the what-if replay saves little",
        "late work that costs the run time: the share of the decode wall time the what-if replay saves by removing every flagged excess",
        0.05,
    ),
    ShareLimit(
        "tail_steps.straggler.share",
        "no rank keeps the others waiting",
        "a straggler: the share of the decode wall time the worst rank's late work costs the others",
        0.08,
    ),
    ShareLimit(
        "tail_cost.share_of_decode_wall",
        "tail steps cost little",
        "tail latency: the time that would be saved had no rank ended a step later than the median",
        0.1,
    ),
)
SLOW_STEP_FLOOR = 0.15  # of the decode steps
OVERLAP_SLACK = 0.1  # below the worst healthy overlap share


def _values(summaries: Sequence[dict], path: str) -> list | None:
    """The figure at ``path`` in every summary, or None when one of them lacks a number there (or one as huge as 1e308)."""
    from dsprof.analysis.summary import is_number  # summary.json's reader: the CLI imports this module for MAX_MARGIN alone

    values = []
    for summary in summaries:
        node: object = summary
        for key in path.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        if not is_number(node) or abs(node) > LARGEST_VALUE:  # type: ignore[arg-type]  # is_number: an int or a float
            return None
        values.append(node)
    return values


def _up(value: float) -> float:
    """Rounded up to three decimals (the schema's resolution)."""
    return math.ceil(value * 1000 - 1e-9) / 1000


def _shown(values: list) -> str:
    return ", ".join(f"{v:g}" for v in values)


def _rule(protects: str, name: str, check: str, source: str = "") -> list[str]:
    """A rule with its comments: what it protects, then where its limit came from."""
    return [
        f"# Protects against {protects}.",
        *([f"# {source}"] if source else []),
        "[[rule]]",
        f'name = "{name}"',
        f'check = "{check}"',
        "",
    ]


def _facts(summaries: Sequence[dict]) -> list[str]:
    """Rules for what every healthy run has: a clean exit, a valid swimlane, every token, a pipelined run."""
    lines = _rule("a crash or a failed rank", "runtime exited cleanly", "exit_status == 0")
    lines += _rule("torn or missing steps or ranks", "swimlane is valid", "validation.valid == true")
    returned, expected = _values(summaries, "serving.tokens_returned"), _values(summaries, "serving.tokens_expected")
    if returned and expected and returned == expected:
        lines += _rule("lost output tokens", "every expected output token came back", "serving.tokens_returned == serving.tokens_expected")
    if all((s.get("pipeline") or {}).get("serialized") is False for s in summaries):
        lines += _rule(
            "a serialized pipeline (fewer than half the adjacent pairs overlap)",
            "pipeline is not serialized",
            "pipeline.serialized == false",
        )
    return lines


def _effect_sizes(summaries: Sequence[dict], margin: float) -> list[str]:
    lines: list[str] = []
    for limit in SHARE_LIMITS:
        values = _values(summaries, limit.path)
        if values is None:
            lines += [f"# not suggested: {limit.path} is not a number (below 2^63) in every run", ""]
            continue
        bound = _up(max(max(values) * margin, limit.floor))
        source = f"Healthy: {_shown(values)}; limit = max × {margin:g}, at least {limit.floor:g}."
        lines += _rule(limit.protects, limit.name, f"{limit.path} <= {bound:g}", source)
    slow, steps = _values(summaries, "slow_steps.count"), _values(summaries, "validation.decode_steps")
    if slow is not None and steps is not None and all(steps):
        shares = [s / n for s, n in zip(slow, steps, strict=True)]
        bound = _up(max(max(shares) * margin, SLOW_STEP_FLOOR))
        lines += [
            f"# healthy: slow steps {_shown(slow)} of {_shown(steps)} steps; limit = max share × {margin:g}, at least {SLOW_STEP_FLOOR:g}"
        ]
        lines += _rule(
            "step intervals: steps later than the median interval by more than the threshold",
            "few slow steps",
            f"slow_steps.count <= {bound:g} * validation.decode_steps",
        )
    overlap = _values(summaries, "pipeline.overlap_share")
    if overlap is not None:
        worst = min(overlap)
        bound = math.floor(max(worst - max((1 - worst) * (margin - 1), OVERLAP_SLACK), 0.5) * 1000) / 1000
        source = f"Healthy: {_shown(overlap)}; limit = min − max((1 − min) × {margin - 1:g}, {OVERLAP_SLACK:g}), at least 0.5."
        lines += _rule(
            "a lost pipeline depth: bind(N+1) no longer under runner_run(N) on adjacent pairs",
            "bind(N+1) overlaps runner_run(N)",
            f"pipeline.overlap_share >= {bound:g}",
            source,
        )
    return lines


def suggest_rules(summaries: Sequence[dict], *, margin: float = DEFAULT_MARGIN, sources: Sequence[str] = ()) -> str:
    """A rules file for runs like ``summaries`` (healthy runs of one configuration on the machine that will gate)."""
    if not summaries:
        raise ValueError("suggesting rules needs at least one healthy summary")
    if not (math.isfinite(margin) and 1 <= margin <= MAX_MARGIN):
        raise ValueError(f"the margin must be a number from 1 to {MAX_MARGIN:g}, not {margin}")
    head = [
        f"# Suggested by dsprof gate --suggest from {len(summaries)} healthy run(s), margin {margin:g}.",
        *(f"#   {toml_string(source)}" for source in sources),  # a path may hold a newline: quoted, it cannot start a table
        "# Check that each limit is one you want (docs/GATE_RULES.md); more healthy runs give safer limits.",
        "",
    ]
    return "\n".join([*head, *_facts(summaries), *_effect_sizes(summaries, margin)]).rstrip() + "\n"
