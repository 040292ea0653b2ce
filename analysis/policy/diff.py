"""Compare the figures of two runs, or of two groups of repeated runs.

A change only means something when it is larger than the spread between runs
of the same code on the same machine, so each figure is judged against the
noise band of repeated runs, or, with one run per side, against the runs' own
noise floors. What a reader needs first comes first: the verdicts that changed,
then the headline figures (:data:`HEADLINE`), then the other figures that moved,
worse ones first. The order, the noise rules, which direction is better per
figure family and how failed runs are treated: docs/GATE_RULES.md, "Comparing runs".
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from dsprof.analysis.summary import Unavailable, UnknownFigure, figure_unit, is_number, resolve, summary_with_path
from dsprof.textsafe import terminal_safe

# Sections whose leaves are run identity or raw counts of inputs, not figures.
_SKIPPED_TOP = {"schema", "dsprof_version", "inputs", "workload", "per_step", "exit_status"}
# Leaves that are settings or identifiers (a rank number has no magnitude to diff).
_IDENTIFIERS = {"threshold_ms", "rank", "step"}

HIGHER = "higher"
LOWER = "lower"
# Figure families by the direction that is better (figure paths as flatten_figures names them).
_HIGHER_IS_BETTER = (
    "serving.throughput_tok_s",
    "serving.tokens_returned",
    "serving.acceptance_rate",
    "pipeline.achieved_depth.*",
    "pipeline.overlap_share",
    "pipeline.pairs_overlapped",
)
_LOWER_IS_BETTER = (  # besides every time figure
    "late_starts.count",
    "tail_steps.count",
    "tail_steps.straggler.share",
    "tail_cost.share_of_decode_wall",
    "slow_steps.count",
    "what_if.share_of_decode_wall",
    "what_if.by_rank.*",
    "pipeline.violations",
    "pipeline.claim_order_violations",
    "validation.left_out_invocations",
)
_TIME_UNITS = {"ms", "s", "us", "ns"}
# What a reader of a diff looks at first: listed in this order whether they moved or not.
HEADLINE = (
    "what_if.share_of_decode_wall",
    "slow_steps.count",
    "tail_steps.straggler.share",
    "step_interval_ms.p50",
    "pipeline.cadence_p50_ms",
    "serving.throughput_tok_s",
)
# Time figures of one step (besides the percentiles of the figures blocks), or sums of findings that are each
# above their run's noise floor: a change smaller than that floor is within one run's noise.
_PER_STEP_MS = (
    "noise.*",
    "verdict.noise_floor_ms",
    "pipeline.cadence_p50_ms",
    "slow_steps.median_interval_ms",
    "what_if.total_saved_ms",
    "what_if.by_rank.*",
    "what_if.by_mechanism.*",
)
NOISE_FLOOR = "noise.floor_ms"


def _bad_status(value: Any) -> bool:
    return value not in (0, None)


def _bad_straggler(value: Any) -> bool:
    return value not in ("none", None)


# Verdict-like leaves, compared as labels; each with the test for its bad value (None: no better or worse).
_VERDICTS: dict[str, Callable[[Any], bool] | None] = {
    "verdict.status": lambda value: value not in ("healthy", None),
    "exit_status": _bad_status,
    "validation.valid": lambda value: value is False,
    "pipeline.serialized": lambda value: value is True,
    "tail_steps.straggler.verdict": _bad_straggler,
    "tail_steps.straggler.mechanism": None,
    "tail_steps.same_device": None,
    "serving.partial": lambda value: value is True,
}
# A relative change against a baseline under 10 units of the summary's resolution
# (0.01 ms; a count of 10), or one beyond ±1000%, says that the baseline was near
# zero, not how large the change is: the absolute change alone is shown then.
_TINY_BASELINE_UNITS = 10
_RESOLUTION = 0.001  # the schema's three decimals
_MAX_RELATIVE = 10.0


def figure_direction(figure: str) -> str:
    """``higher`` or ``lower`` when that direction is better for the figure, '' when neither is."""
    if any(fnmatchcase(figure, pattern) for pattern in _HIGHER_IS_BETTER):
        return HIGHER
    if figure_unit(figure) in _TIME_UNITS or any(fnmatchcase(figure, pattern) for pattern in _LOWER_IS_BETTER):
        return LOWER
    return ""


@dataclass
class FigureChange:
    """One numeric figure on both sides: mean, spread and change."""

    figure: str
    a_mean: float | None
    b_mean: float | None
    a_stdev: float | None
    b_stdev: float | None
    a_runs: int
    b_runs: int
    change: float | None  # b_mean - a_mean
    relative: float | None  # change / |a_mean|; None when a_mean is 0, tiny or absent
    beyond_noise: bool | None  # None: no noise estimate (no repeats on either side)
    counted: bool = False  # every value is an integer count (printed without decimals)
    direction: str = ""  # HIGHER, LOWER or '' (see figure_direction)
    failed_side: str = ""  # "A" or "B" when only that side holds a failed run: not comparable

    @property
    def assessment(self) -> str:
        """``worse``, ``better``, or '' (no direction, no change, or a failed run on one side only)."""
        if not self.direction or not self.change or self.failed_side:
            return ""
        return "better" if (self.change > 0) == (self.direction == HIGHER) else "worse"

    @property
    def state(self) -> str:
        """beyond noise | within noise | changed (no noise estimate) | unchanged | only in A | only in B."""
        if self.change is None:
            return "only in A" if self.b_mean is None else "only in B"
        if self.beyond_noise:
            return "beyond noise"
        if not self.change:
            return "unchanged"
        return "within noise" if self.beyond_noise is False else "changed"

    @property
    def folded(self) -> bool:
        """Left out of the default listing: nothing to see beyond a count."""
        return self.state in ("unchanged", "within noise")


@dataclass
class LabelChange:
    """A non-numeric figure (verdicts, flags) whose value differs between sides."""

    figure: str
    a_values: list[Any]
    b_values: list[Any]
    assessment: str = ""  # worse | better | '' (no direction, or the same share of bad runs)


@dataclass
class DiffResult:
    """Everything ``format_diff`` prints; also usable from Python."""

    a_paths: list[str]
    b_paths: list[str]
    figures: list[FigureChange]
    labels: list[LabelChange]
    workload_differences: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    a_summaries: list[tuple[dict, str | None]] = field(default_factory=list)
    b_summaries: list[tuple[dict, str | None]] = field(default_factory=list)

    @property
    def has_noise_estimate(self) -> bool:
        return len(self.a_paths) > 1 or len(self.b_paths) > 1

    @property
    def flagged(self) -> list[FigureChange]:
        return [f for f in self.figures if f.beyond_noise]

    @property
    def regressions(self) -> list[LabelChange | FigureChange]:
        """Verdicts that changed for the worse and figures beyond noise in their worse direction."""
        return [*(label for label in self.labels if label.assessment == "worse"), *(f for f in self.flagged if f.assessment == "worse")]


def run_failure(summary: dict) -> str | None:
    """Why a run failed (its exit status, or why its figures are partial); None for a run that completed."""
    run = summary["run"] if isinstance(summary.get("run"), dict) else {}
    status = run.get("exit_status", summary.get("exit_status"))
    if _bad_status(status):
        message = run.get("message")
        shown = status if isinstance(status, int) and abs(status) < 1 << 16 else "out of range"
        return f"exit status {shown}" + (f": {message}" if isinstance(message, str) and message else "")
    serving = summary["serving"] if isinstance(summary.get("serving"), dict) else {}
    if serving.get("partial") is True:
        return f"partial figures: {serving.get('partial_reason') or 'reason not given'}"
    return None


def _failed_side(a: list[dict], b: list[dict]) -> str:
    """``A`` or ``B`` when only that side holds a failed run, else ''."""
    a_failed = any(run_failure(s) is not None for s in a)
    b_failed = any(run_failure(s) is not None for s in b)
    return "" if a_failed == b_failed else "A" if a_failed else "B"


def flatten_figures(summary: dict, *, per_rank: bool = False) -> dict[str, int | float]:
    """Finite numeric leaves of a summary by dotted path (``figures.`` prefix dropped).

    Percentile blocks' ``count``, the ``threshold_ms`` setting and rank/step
    identifiers are left out: they are sample sizes, options and names, not
    measurements. Lists (items, per_step) are not figures either.
    """
    flat: dict[str, int | float] = {}
    roots: list[tuple[list[str], Any]] = []
    for key, value in summary.items():
        if key in _SKIPPED_TOP:
            continue
        if key == "figures" and isinstance(value, dict):
            roots.extend(([str(name)], block) for name, block in value.items() if per_rank or name != "per_rank")
        elif key == "pipeline" and isinstance(value, dict) and not per_rank:
            roots.append(([key], {k: v for k, v in value.items() if k not in ("cadence_ms", "achieved_depth")}))
        else:
            roots.append(([str(key)], value))
    stack = list(reversed(roots))  # iterative: a deeply nested summary cannot exhaust the stack
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, dict):
            percentile_block = "p50" in node
            children = [
                ([*prefix, str(k)], v) for k, v in node.items() if k not in _IDENTIFIERS and not (percentile_block and k == "count")
            ]
            stack.extend(reversed(children))
        elif is_number(node):
            flat[".".join(prefix)] = node
    return flat


def _label(summary: dict, path: str) -> Any:
    """A verdict's value; None when the summary (an older or partial one) does not have it."""
    try:
        ((_, value),) = resolve(summary, path)
    except UnknownFigure:
        return None
    return None if isinstance(value, Unavailable) else value


def _mean(values: list[float]) -> float:
    """The mean without overflow: each term is divided first, so finite inputs give a finite mean."""
    return math.fsum(v / len(values) for v in values)


def _stdev(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    try:
        return statistics.stdev(values)
    except OverflowError:  # a spread beyond the float range: no noise band can be told apart from it
        return math.inf


def _band(values: list[float]) -> tuple[float, float]:
    mean = _mean(values)
    spread = 2 * (_stdev(values) or 0.0)
    return min(mean - spread, min(values)), max(mean + spread, max(values))


def _as_list(side: Any) -> list:
    if isinstance(side, (str, Path, dict)):
        return [side]
    return list(side)


def _relative(change: float | None, a_mean: float | None, counted: bool) -> float | None:
    """``change / |A|``, or None when A is zero or so small that the ratio would say more about A than the change."""
    if change is None or a_mean is None or abs(a_mean) < _TINY_BASELINE_UNITS * (1 if counted else _RESOLUTION):
        return None
    relative = change / abs(a_mean)
    return relative if abs(relative) <= _MAX_RELATIVE else None


def _figure_change(name: str, a_values: list, b_values: list, repeats: bool, floor_ms: float | None = None) -> FigureChange:
    """One figure on both sides; ``floor_ms``: the single runs' noise floor, for a per-step time figure."""
    a_mean = _mean(a_values) if a_values else None
    b_mean = _mean(b_values) if b_values else None
    change = b_mean - a_mean if a_mean is not None and b_mean is not None else None
    counted = all(isinstance(v, int) for v in (*a_values, *b_values))
    beyond: bool | None = None
    if repeats and a_mean is not None and b_mean is not None:
        a_low, a_high = _band(a_values)
        b_low, b_high = _band(b_values)
        beyond = not (a_low <= b_mean <= a_high) and not (b_low <= a_mean <= b_high)
    elif change and floor_ms is not None and abs(change) < floor_ms:
        beyond = False  # one run per side: within the runs' own noise floor
    return FigureChange(
        figure=name,
        a_mean=a_mean,
        b_mean=b_mean,
        a_stdev=_stdev(a_values),
        b_stdev=_stdev(b_values),
        a_runs=len(a_values),
        b_runs=len(b_values),
        change=change,
        relative=_relative(change, a_mean, counted),
        beyond_noise=beyond,
        counted=counted,
        direction=figure_direction(name),
    )


def _label_change(path: str, a_values: list, b_values: list, failed_side: str = "") -> LabelChange:
    """A verdict that differs, assessed by the share of runs on each side holding its bad value.

    Against a failed run, only what the failure itself made worse counts: a failed
    B is never better, and a B compared with a failed A is never worse.
    """
    bad = _VERDICTS[path]
    assessment = ""
    if bad is not None:
        a_bad = sum(map(bad, a_values)) / len(a_values)
        b_bad = sum(map(bad, b_values)) / len(b_values)
        assessment = "worse" if b_bad > a_bad else "better" if b_bad < a_bad else ""
    if (failed_side, assessment) in (("B", "better"), ("A", "worse")):
        assessment = ""
    return LabelChange(path, a_values, b_values, assessment)


def diff_summaries(a: Any, b: Any, *, per_rank: bool = False) -> DiffResult:
    """Compare run(s) ``a`` with run(s) ``b``.

    Each side is a summary dict, a ``summary.json`` path or artifact dir, or a
    sequence of those (repeated runs of the same configuration).
    """
    a_loaded = [summary_with_path(s) for s in _as_list(a)]
    b_loaded = [summary_with_path(s) for s in _as_list(b)]
    if not a_loaded or not b_loaded:
        raise ValueError("each side of a diff needs at least one summary")
    a_flat = [flatten_figures(s, per_rank=per_rank) for s, _ in a_loaded]
    b_flat = [flatten_figures(s, per_rank=per_rank) for s, _ in b_loaded]
    names = list(dict.fromkeys(k for flat in (*a_flat, *b_flat) for k in flat))
    repeats = len(a_flat) > 1 or len(b_flat) > 1
    failed_side = _failed_side([s for s, _ in a_loaded], [s for s, _ in b_loaded])
    floor_ms = None if repeats else _single_run_floor(a_flat[0], b_flat[0])
    blocks = {name for s, _ in (*a_loaded, *b_loaded) if isinstance(s.get("figures"), dict) for name in s["figures"]}
    figures = [
        _figure_change(
            name,
            [f[name] for f in a_flat if name in f],
            [f[name] for f in b_flat if name in f],
            repeats,
            floor_ms if _per_step_ms(name, blocks) else None,
        )
        for name in names
    ]
    for figure in figures:
        figure.failed_side = failed_side
    labels = []
    for path in _VERDICTS:
        a_values = [_label(s, path) for s, _ in a_loaded]
        b_values = [_label(s, path) for s, _ in b_loaded]
        if set(map(repr, a_values)) != set(map(repr, b_values)):
            labels.append(_label_change(path, a_values, b_values, failed_side))
    workload_differences = {}
    a_workload = _workload(a_loaded[0][0])
    b_workload = _workload(b_loaded[0][0])
    for key in dict.fromkeys([*a_workload, *b_workload]):
        if a_workload.get(key) != b_workload.get(key):
            workload_differences[key] = (a_workload.get(key), b_workload.get(key))
    return DiffResult(
        a_paths=[p or "<dict>" for _, p in a_loaded],
        b_paths=[p or "<dict>" for _, p in b_loaded],
        figures=figures,
        labels=labels,
        workload_differences=workload_differences,
        a_summaries=a_loaded,
        b_summaries=b_loaded,
    )


def _single_run_floor(a: dict[str, int | float], b: dict[str, int | float]) -> float | None:
    """The larger of two single runs' noise floors; None when either run has none (an older summary)."""
    floors = [flat.get(NOISE_FLOOR) for flat in (a, b)]
    return max(float(f) for f in floors if f is not None) if all(f is not None for f in floors) else None


def _per_step_ms(name: str, blocks: set[str]) -> bool:
    """A time figure of one step (a percentile of a figures block, and :data:`_PER_STEP_MS`)."""
    block = name.split(".", 1)[0]
    return (block in blocks and figure_unit(name) == "ms") or any(fnmatchcase(name, pattern) for pattern in _PER_STEP_MS)


def _workload(summary: dict) -> dict:
    """The summary's workload settings; a summary from another producer may lack them or hold another shape."""
    workload = summary.get("workload")
    return workload if isinstance(workload, dict) else {}


# --------------------------------------------------------------------------- text


def _number(value: float, counted: bool, sign: bool = False) -> str:
    """Counts print as integers, measurements with the schema's three decimals (huge ones in exponent form)."""
    plus = "+" if sign else ""
    if not math.isfinite(value) or abs(value) >= 1e15:
        return f"{value:{plus}.6g}"
    return f"{value:{plus}.0f}" if counted and float(value).is_integer() else f"{value:{plus}.3f}"


def _side(mean: float | None, stdev: float | None, counted: bool) -> str:
    if mean is None:
        return "-"
    return _number(mean, counted) if stdev is None else f"{_number(mean, counted)} ± {_number(stdev, False)}"


def _verdict_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=repr)


def _values(values: Sequence[Any]) -> str:
    """One value when every run agrees, else each run's value."""
    shown = [_verdict_value(v) for v in values]
    return shown[0] if len(set(shown)) == 1 else "[" + ", ".join(shown) + "]"


def _figure_row(f: FigureChange, show_all: bool) -> tuple[str, ...]:
    """Figure, both sides, change, relative change, runs per side, and the marker (state when not implied, worse/better)."""
    change = "-" if f.change is None else _number(f.change, f.counted, sign=True)
    relative = "-" if f.relative is None else f"{f.relative:+.1%}"
    state = f.state if show_all or f.state.startswith("only") else ""
    failed = f"{f.failed_side} failed: not compared" if f.failed_side and f.direction and f.change else ""
    marker = ", ".join(part for part in (state, "" if f.folded else f.assessment or failed) if part)
    return (
        f.figure,
        _side(f.a_mean, f.a_stdev, f.counted),
        _side(f.b_mean, f.b_stdev, f.counted),
        change,
        relative,
        f"{f.a_runs}/{f.b_runs}",
        marker,
    )


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows under a header, columns aligned (figure left, numbers right); cells made terminal-safe first."""
    header = ("figure", "A", "B", "change", "rel", "n", "")
    cells = [tuple(terminal_safe(cell) for cell in row) for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  " + "  ".join(cell.ljust(widths[i]) if i in (0, 6) else cell.rjust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in cells
    ]


_ORDER = {"worse": 0, "better": 1, "": 2}


def format_diff(result: DiffResult, *, show_all: bool = False) -> str:
    """Verdict changes, then the figures that moved (worse first), then what was folded."""
    lines = [f"A: {', '.join(result.a_paths)} (n={len(result.a_paths)})", f"B: {', '.join(result.b_paths)} (n={len(result.b_paths)})"]
    for key, (a_value, b_value) in result.workload_differences.items():
        lines.append(f"note: workload {key} differs: A={a_value!r} B={b_value!r}")
    failures = [
        (side, path, run_failure(s)) for side, loaded in (("A", result.a_summaries), ("B", result.b_summaries)) for s, path in loaded
    ]
    lines.extend(f"failed run ({side}): {path or '<dict>'}: {why}" for side, path, why in failures if why is not None)
    lines.append("")
    if result.labels:
        lines.append("verdicts that changed (A -> B):")
        for label in sorted(result.labels, key=lambda item: _ORDER[item.assessment]):
            marker = f"  [{label.assessment}]" if label.assessment else ""
            lines.append(f"  {label.figure}: {_values(label.a_values)} -> {_values(label.b_values)}{marker}")
    else:
        lines.append("verdicts: none changed")
    lines.append("")
    by_name = {f.figure: f for f in result.figures}
    headline = [by_name[name] for name in HEADLINE if name in by_name]
    if headline:
        lines.append("headline figures:")
        lines.extend(_table([_figure_row(f, show_all=True) for f in headline]))
        lines.append("")
    listed = [f for f in result.figures if (show_all or not f.folded) and f.figure not in HEADLINE]
    listed.sort(key=lambda f: (f.folded, _ORDER[f.assessment]))
    if result.has_noise_estimate:
        title = "figures beyond noise" if not show_all else "figures"
        lines.append(f"{title} (A, B: mean ± stdev; n: runs per side A/B):")
    else:
        lines.append("figures that changed (one run per side: no noise estimate):" if not show_all else "figures:")
    lines.extend(_table([_figure_row(f, show_all) for f in listed]) if listed else ["  none"])
    lines.append("")
    lines.append(_footer(result, show_all))
    return "\n".join(terminal_safe(line) for line in lines)


def _footer(result: DiffResult, show_all: bool) -> str:
    """What was folded and how to see it; with repeats, the noise rule; without, how to get one."""
    below_headline = [f for f in result.figures if f.figure not in HEADLINE]
    unchanged = sum(f.state == "unchanged" for f in below_headline)
    within = sum(f.state == "within noise" for f in below_headline)
    if result.has_noise_estimate:
        worse = sum(f.assessment == "worse" for f in result.flagged)
        text = f"{len(result.flagged)} figure(s) beyond run-to-run noise, {worse} of them worse (band: mean ± 2·stdev, widened to min..max)"
        folded = f"{within} within noise, {unchanged} unchanged"
    else:
        text = "one run per side: changes are shown without a noise estimate (give A1,A2,A3 to get one)"
        folded = (f"{within} within the runs' noise floor, " if within else "") + f"{unchanged} unchanged"
    return text if show_all else f"{text}; folded: {folded} (--all lists them)"
