"""Change points of one figure's series over the run history (docs/GATE_RULES.md, "Gating on history").

Candidates come from ruptures' ``KernelCPD`` on the series divided by its own
run-to-run noise (read robustly from successive differences, never below the
figure's resolution); each is then tested with a pooled t-test (scipy), and a
caller that tests many figures divides its alpha among them
(history.find_changes). The method, and why ruptures: docs/GATE_RULES.md,
"Change points", "Why ruptures", and ``benchmarks/bench_history.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ALPHA = 0.001
# The penalty per change point, in units of log(n) · noise²: BIC's 2 · log(n), times a margin against heavy-tailed CI noise.
PENALTY_PER_LOG_N = 4.0
# A noise estimate is never below this share of the series' typical size, nor below the summary's resolution.
RELATIVE_NOISE_FLOOR = 0.002
RESOLUTION = 0.001
MIN_RUNS = 3
MIN_LEVEL_RUNS = 3


@dataclass(frozen=True)
class ChangePoint:
    """A change in a series: the first position of the new level, its size and its significance."""

    index: int  # position in the series of the first run after the change
    before: float  # mean of the segment before
    after: float  # mean of the segment after
    pvalue: float

    @property
    def change(self) -> float:
        return self.after - self.before

    @property
    def relative(self) -> float | None:
        """The change as a share of the level before; None when that level is zero."""
        return self.change / abs(self.before) if self.before else None


def noise_scale(values: np.ndarray, resolution: float = RESOLUTION) -> float:
    """Run-to-run noise of a series, robust to steps and outliers, with a floor (never zero, never below ``resolution``)."""
    typical = float(np.median(np.abs(values))) if values.size else 0.0
    floor = max(resolution, RELATIVE_NOISE_FLOOR * typical)
    if values.size < 2:
        return floor
    differences = np.diff(values)
    mad = float(np.median(np.abs(differences - np.median(differences))))
    return max(1.4826 * mad / math.sqrt(2.0), floor)


def change_points(values: np.ndarray | list[float], *, alpha: float = ALPHA, resolution: float = RESOLUTION) -> list[ChangePoint]:
    """The significant change points of a series (oldest first), empty for fewer than :data:`MIN_RUNS` values.

    ``resolution`` is the smallest step the figure can take (1 for a count): a
    count that moves from 0 to 1 is not a level change however flat it was.
    """
    series = np.asarray(values, dtype=np.float64)
    if series.size < MIN_RUNS or not np.all(np.isfinite(series)):
        return []
    scale = noise_scale(series, resolution)
    standardized = ((series - np.median(series)) / scale).reshape(-1, 1)
    penalty = PENALTY_PER_LOG_N * math.log(series.size)
    import ruptures  # 4 s of imports (scipy): only where a history is checked, not on every command's start

    edges = [0, *ruptures.KernelCPD(kernel="linear", min_size=1).fit(standardized).predict(pen=penalty)]
    while len(edges) > 2:
        pvalues = _pvalues(series, edges, scale)
        weakest = int(np.argmax(pvalues))
        if pvalues[weakest] < alpha:
            break
        del edges[weakest + 1]  # merge the two segments it separates, then test the rest again
    if len(edges) <= 2:
        return []
    pvalues = _pvalues(series, edges, scale)
    means = [float(series[a:b].mean()) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    return [ChangePoint(edges[i + 1], means[i], means[i + 1], float(pvalues[i])) for i in range(len(edges) - 2)]


def _pvalues(series: np.ndarray, edges: list[int], floor: float) -> np.ndarray:
    """Per inner edge, the two-sided p-value that the segments on each side share a mean.

    A pooled t-test: the noise is the spread within all segments (never below
    ``floor``), so a segment of one run is tested as well as a long one. A level
    held for fewer than :data:`MIN_LEVEL_RUNS` runs, other than the newest, is
    noise (outliers, a bad hour of the CI host, a history's first runs), not a
    level: its edges get p = 1. Only the newest segment may be that short, so
    the newest run alone can start a change.
    """
    bounds = np.asarray(edges)
    sizes = np.diff(bounds)
    segment = np.repeat(np.arange(sizes.size), sizes)
    means = np.bincount(segment, weights=series) / sizes
    residual = float(np.sum((series - means[segment]) ** 2))
    dof = max(series.size - sizes.size, 1)
    noise = max(math.sqrt(residual / dof), floor)
    t = np.abs(np.diff(means)) / (noise * np.sqrt(1.0 / sizes[:-1] + 1.0 / sizes[1:]))
    from scipy import stats

    pvalues = 2.0 * stats.t.sf(t, df=dof)
    brief = np.flatnonzero(sizes[:-1] < MIN_LEVEL_RUNS)  # short levels other than the newest
    pvalues[brief] = 1.0
    pvalues[brief[brief > 0] - 1] = 1.0
    return pvalues
