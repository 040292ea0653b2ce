"""Compare the figures of two runs, or of two groups of repeated runs.

A change only means something when it is larger than the spread between runs
of the same code on the same machine. When a side has repeated runs, each
figure's noise band on that side is ``[min(mean - 2·stdev, min), max(mean +
2·stdev, max)]`` (sample stdev). A change is flagged as beyond noise when each
side's mean lies outside the other side's band (a side with one run has a band
of zero width at its value). With no repeats on either side there is no noise
estimate, and nothing is flagged: the table still shows the change.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from dsprof.analysis.gate import ABSENT, load_summary, resolve

# Sections whose leaves are run identity or raw counts of inputs, not figures.
_SKIPPED_TOP = {"schema", "dsprof_version", "inputs", "workload", "per_step", "exit_status"}
# Leaves that are settings or identifiers (a rank number has no magnitude to diff).
_IDENTIFIERS = {"threshold_ms", "rank", "step"}
# Leaves compared as labels (equal or not) rather than as numbers (exit_status too:
# a status code has no magnitude).
_LABELS = (
    "exit_status",
    "validation.valid",
    "pipeline.serialized",
    "tail_steps.same_device",
    "tail_steps.straggler.verdict",
)


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
    relative: float | None  # change / |a_mean|; None when a_mean is 0 or absent
    beyond_noise: bool | None  # None: no noise estimate (no repeats on either side)
    counted: bool = False  # every value is an integer count (printed without decimals)


@dataclass
class LabelChange:
    """A non-numeric figure (verdicts, flags) whose value differs between sides."""

    figure: str
    a_values: list[Any]
    b_values: list[Any]


@dataclass
class DiffResult:
    """Everything ``format_diff`` prints; also usable from Python."""

    a_paths: list[str]
    b_paths: list[str]
    figures: list[FigureChange]
    labels: list[LabelChange]
    workload_differences: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    @property
    def flagged(self) -> list[FigureChange]:
        return [f for f in self.figures if f.beyond_noise]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def flatten_figures(summary: dict, *, per_rank: bool = False) -> dict[str, int | float]:
    """Numeric leaves of a summary by dotted path (``figures.`` prefix dropped).

    Percentile blocks' ``count``, the ``threshold_ms`` setting and rank/step
    identifiers are left out: they are sample sizes, options and names, not
    measurements.
    """
    flat: dict[str, float] = {}

    def walk(node: Any, prefix: list[str]) -> None:
        if isinstance(node, dict):
            percentile_block = "p50" in node
            for key, value in node.items():
                if key in _IDENTIFIERS or (percentile_block and key == "count"):
                    continue
                walk(value, [*prefix, str(key)])
        elif _is_number(node):
            flat[".".join(prefix)] = node

    for key, value in summary.items():
        if key in _SKIPPED_TOP:
            continue
        if key == "figures" and isinstance(value, dict):
            for name, block in value.items():
                if name == "per_rank" and not per_rank:
                    continue
                walk(block, [name])
        elif key == "pipeline" and isinstance(value, dict) and not per_rank:
            walk({k: v for k, v in value.items() if k not in ("cadence_ms", "achieved_depth")}, [key])
        else:
            walk(value, [key])
    return flat


def _label(summary: dict, path: str) -> Any:
    (_, value), = resolve(summary, path)
    return None if value is ABSENT else value


def _band(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    spread = 2 * statistics.stdev(values) if len(values) > 1 else 0.0
    return min(mean - spread, min(values)), max(mean + spread, max(values))


def _as_list(side: Any) -> list:
    if isinstance(side, (str, Path, dict)):
        return [side]
    return list(side)


def diff_summaries(a: Any, b: Any, *, per_rank: bool = False) -> DiffResult:
    """Compare run(s) ``a`` with run(s) ``b``.

    Each side is a summary dict, a ``summary.json`` path or artifact dir, or a
    sequence of those (repeated runs of the same configuration).
    """
    a_loaded = [load_summary(s) for s in _as_list(a)]
    b_loaded = [load_summary(s) for s in _as_list(b)]
    if not a_loaded or not b_loaded:
        raise ValueError("each side of a diff needs at least one summary")
    a_flat = [flatten_figures(s, per_rank=per_rank) for s, _ in a_loaded]
    b_flat = [flatten_figures(s, per_rank=per_rank) for s, _ in b_loaded]
    names = list(dict.fromkeys(k for flat in (*a_flat, *b_flat) for k in flat))
    repeats = len(a_flat) > 1 or len(b_flat) > 1
    figures = []
    for name in names:
        a_values = [f[name] for f in a_flat if name in f]
        b_values = [f[name] for f in b_flat if name in f]
        a_mean = statistics.fmean(a_values) if a_values else None
        b_mean = statistics.fmean(b_values) if b_values else None
        change = b_mean - a_mean if a_values and b_values else None
        relative = change / abs(a_mean) if change is not None and a_mean != 0 else None
        beyond: bool | None = None
        if repeats and a_values and b_values:
            a_low, a_high = _band(a_values)
            b_low, b_high = _band(b_values)
            beyond = not (a_low <= b_mean <= a_high) and not (b_low <= a_mean <= b_high)
        figures.append(FigureChange(
            figure=name,
            a_mean=a_mean,
            b_mean=b_mean,
            a_stdev=statistics.stdev(a_values) if len(a_values) > 1 else None,
            b_stdev=statistics.stdev(b_values) if len(b_values) > 1 else None,
            a_runs=len(a_values),
            b_runs=len(b_values),
            change=change,
            relative=relative,
            beyond_noise=beyond,
            counted=all(isinstance(v, int) for v in (*a_values, *b_values)),
        ))
    labels = []
    for path in _LABELS:
        a_values = [_label(s, path) for s, _ in a_loaded]
        b_values = [_label(s, path) for s, _ in b_loaded]
        if set(map(repr, a_values)) != set(map(repr, b_values)):
            labels.append(LabelChange(path, a_values, b_values))
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
    )


def _workload(summary: dict) -> dict:
    """The summary's workload settings; a summary from another producer may lack them or hold another shape."""
    workload = summary.get("workload")
    return workload if isinstance(workload, dict) else {}


def _number(value: float, counted: bool, sign: bool = False) -> str:
    """Counts print as integers, measurements with the schema's three decimals."""
    plus = "+" if sign else ""
    return f"{value:{plus}.0f}" if counted and float(value).is_integer() else f"{value:{plus}.3f}"


def _side(mean: float | None, stdev: float | None, runs: int, counted: bool) -> str:
    if mean is None:
        return "-"
    if runs > 1:
        return f"{_number(mean, counted)} ± {stdev:.3f} (n={runs})"
    return _number(mean, counted)


def format_diff(result: DiffResult, *, only_changed: bool = False) -> str:
    """A side-by-side table: A, B, change, relative change, noise flag."""
    rows = []
    for f in result.figures:
        if only_changed and (f.change is None or f.change == 0):
            continue
        change = "-" if f.change is None else _number(f.change, f.counted, sign=True)
        relative = "-" if f.relative is None else f"{f.relative:+.1%}"
        flag = {True: "BEYOND NOISE", False: "within noise", None: ""}[f.beyond_noise]
        rows.append((f.figure, _side(f.a_mean, f.a_stdev, f.a_runs, f.counted),
                     _side(f.b_mean, f.b_stdev, f.b_runs, f.counted),
                     change, relative, flag))
    header = ("figure", "A", "B", "change", "rel", "noise")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"A: {', '.join(result.a_paths)}", f"B: {', '.join(result.b_paths)}"]
    for key, (a_value, b_value) in result.workload_differences.items():
        lines.append(f"note: workload {key} differs: A={a_value!r} B={b_value!r}")
    lines.append("")
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)).rstrip())
    for label in result.labels:
        lines.append(f"{label.figure}: A={_values(label.a_values)} B={_values(label.b_values)}")
    if any(f.beyond_noise is not None for f in result.figures):
        lines.append(f"{len(result.flagged)} figure(s) changed beyond run-to-run noise "
                     "(band: mean ± 2·stdev, widened to min..max)")
    else:
        lines.append("no repeated runs: changes are shown without a noise estimate")
    return "\n".join(lines)


def _values(values: Sequence[Any]) -> str:
    unique = list(dict.fromkeys(map(repr, values)))
    return unique[0] if len(unique) == 1 else "[" + ", ".join(map(repr, values)) + "]"
