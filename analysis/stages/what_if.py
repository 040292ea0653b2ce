"""What the late steps cost: the what-if saving of every cause, and the tail cost (docs/FIGURES.md "What-if").

Each cause found (culprit rank, step, mechanism, evidence) says which phase of
which run took longer than it should have. The replay
(:mod:`dsprof.analysis.stages.replay`) takes that excess off the phase — a host
phase's own time, or the device work segments that grew, in proportion to how
much each grew over the other ranks — and lets every later event move as far
as its dependencies allow. The saving is how much earlier the last token
would have come. Per cause, each is removed alone; per mechanism, per rank and
in total, all of them together (two faults in one step on two ranks save
little alone and much together, as in a real A/B run).

Tail cost (the older figure, docs/FIGURES.md) stays beside it: Σ_s (max_r end − median_r end)
of runner_run, which cannot see a slowdown that every rank shares.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from dsprof.analysis.stages.noise import Findings
from dsprof.analysis.stages.replay import (
    BIND_END,
    BIND_TS,
    FENCE_TS,
    HOST_EVENTS,
    MARGIN_STEPS,
    RUNNER_END,
    RUNNER_TS,
    VALIDATE_END,
    VALIDATE_TS,
    DecodeRuns,
    Removal,
    Replayer,
    ReplayWindow,
    RunEnds,
    WindowTooSmall,
    slot_predecessors,
)
from dsprof.analysis.stages.runner import stage
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.summary_schema import LateStart, SlowStep, TailCost, TailStep, WhatIfItem
from dsprof.analysis.summary_schema import WhatIf as WhatIfSection
from dsprof.analysis.units import ns_to_ms
from dsprof.profiler import strace_format as fmt

# causes that are another cause's consequence: removing them alone changes nothing the replay does not already see
_NOT_OWN = (fmt.MECH_CARRIED_OVER, fmt.MECH_PEER_WAIT)
_HOST_TARGET = {
    fmt.PHASE_BIND: BIND_END,
    "before bind": BIND_TS,
    "launch": RUNNER_TS,
    fmt.PHASE_FENCE_WAIT: RUNNER_END,
    fmt.PHASE_RUNNER: RUNNER_END,
    fmt.PHASE_VALIDATE: VALIDATE_END,
}
# ranks whose causes are also replayed together (the rest: the sum of their causes' savings)
JOINT_RANKS = 8
# per-cause replays: at most this many columns at once, over causes at most this many steps apart (a replay of one
# cause runs tens of steps before it converges: causes 25 steps apart replayed one by one cost 3x as much as together)
_CAUSES_PER_BATCH = 64
_BATCH_STEPS = 256


@dataclass(frozen=True)
class OwnCause:
    """One culprit cause the replay can take away."""

    step: int
    rank: int
    phase: str
    mechanism: str
    evidence_ns: float


def own_causes(late_starts: list[LateStart], tail_steps: list[TailStep], slow_steps: list[SlowStep]) -> list[OwnCause]:
    """Every culprit cause above the noise floor, each counted once: per (step, rank, phase) the largest evidence."""
    found: dict[tuple[int, int, str], OwnCause] = {}
    tail_ranks: list[LateStart] = [{**c, "step": t["step"]} for t in tail_steps for c in t.get("ranks", [])]
    causes: list[LateStart | SlowStep] = [*late_starts, *tail_ranks, *slow_steps]
    for cause in causes:  # one per late item: the findings themselves
        rank = cause.get("rank")
        if cause.get("role") != "culprit" or cause.get("mechanism") in _NOT_OWN or rank is None or cause.get("noise"):
            continue
        phase = str(cause.get("phase") or "")
        phase = fmt.PHASE_DEVICE_WALL if phase.startswith(fmt.PHASE_DEVICE_WALL) else phase
        step = cause.get("evidence_step", cause["step"])
        item = OwnCause(int(step), int(rank), phase, str(cause["mechanism"]), float(cause.get("evidence_ms") or 0) * 1e6)
        key = (item.step, item.rank, item.phase)
        if item.evidence_ns > 0 and (key not in found or item.evidence_ns > found[key].evidence_ns):
            found[key] = item
    return sorted(found.values(), key=lambda c: (c.step, c.rank, c.phase))


# steps a window of the replay model replays (and holds, with its margins): the stage's memory is sized by it
WINDOW_STEPS = 4096


@dataclass
class RunGrid:
    """What every window of the replay model shares: the run's ranks and steps, and the few per-run figures a window
    cannot see by itself (which run last used a slot, the last validate ends)."""

    rank_values: np.ndarray
    step_values: np.ndarray
    slot_after: np.ndarray  # [ranks, steps] step index of the run's slot predecessor (-1: none)
    validate: np.ndarray  # [ranks, steps] validate end (NaN where absent)
    ends: RunEnds
    waits: int  # the most collective waits of any run
    origin_ns: int  # the earliest decode root: host times count from it

    @property
    def steps(self) -> int:
        return len(self.step_values)


def load_run_grid(engine: Engine) -> RunGrid:
    """The grid of (rank, step) and what a window needs from outside it.

    Host times count from the earliest decode root, so that they stay exact as floats (a Kineto
    trace's times are wall-clock nanoseconds, past 2**53). The validate end is the run's token
    (``token_ns``: the same, except on a source without validate, whose token is its run's end).
    """
    origin_ns = int(engine.scalar("SELECT min(root_ts_ns) FROM decode") or 0)  # a literal below: a subquery per use costs planning
    table = engine.arrow(f"""SELECT rank, step, coalesce(slot_id, position % 2) AS slot, token_ns - {origin_ns} AS validate_end_ns,
                                    runner_ts_ns IS NOT NULL AS has_runner FROM decode""")
    rank_values, rank_index = np.unique(table.column("rank").to_numpy(zero_copy_only=False), return_inverse=True)
    step_values, step_index = np.unique(table.column("step").to_numpy(zero_copy_only=False), return_inverse=True)
    shape = (len(rank_values), len(step_values))
    slot = np.zeros(shape, np.int64)
    slot[rank_index, step_index] = table.column("slot").fill_null(0).to_numpy()
    validate = np.full(shape, np.nan)
    validate[rank_index, step_index] = table.column("validate_end_ns").cast(pa.float64()).fill_null(np.nan).to_numpy()
    run = np.zeros(shape, bool)
    run[rank_index, step_index] = True
    runner = np.zeros(shape, bool)
    runner[rank_index, step_index] = table.column("has_runner").fill_null(False).to_numpy(zero_copy_only=False)
    del table
    has = ~np.isnan(validate)
    last_step = _last_index(has)
    last_validate = np.where(last_step >= 0, validate[np.arange(shape[0]), np.maximum(last_step, 0)], np.nan)
    end_ns = float(np.nanmax(validate)) if has.any() else 0.0
    waits = engine.scalar("SELECT max(wait_index) + 1 FROM collectives") or 0
    ends = RunEnds(last_step, last_validate, end_ns, _last_index(runner), _last_index(run))
    return RunGrid(rank_values, step_values, slot_predecessors(slot), validate, ends, int(waits), origin_ns)


def _last_index(mask: np.ndarray) -> np.ndarray:
    """[rows]: the last column index where each row of ``mask`` holds (-1: none)."""
    return np.where(mask.any(axis=1), mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1), -1)


def load_decode_runs(engine: Engine, grid: RunGrid, lo: int, hi: int) -> DecodeRuns:
    """The decode runs of step indices [lo, hi) as replay arrays (times as in :func:`load_run_grid`)."""
    columns = {e: "token" if e == "validate_end" else e for e in HOST_EVENTS}
    within = f"step BETWEEN {int(grid.step_values[lo])} AND {int(grid.step_values[hi - 1])}"
    table = engine.arrow(f"""SELECT rank, step, device_ts_ns, device_wall_ns,
                                    {", ".join(f"{column}_ns - {grid.origin_ns} AS {e}_ns" for e, column in columns.items())}
                             FROM decode WHERE {within}""")
    rank_index = np.searchsorted(grid.rank_values, table.column("rank").to_numpy(zero_copy_only=False))
    step_index = np.searchsorted(grid.step_values, table.column("step").to_numpy(zero_copy_only=False)) - lo
    shape = (len(grid.rank_values), hi - lo)

    def on_grid(values: np.ndarray) -> np.ndarray:
        out = np.full(shape, np.nan)
        out[rank_index, step_index] = values
        return out

    def column(name: str) -> np.ndarray:
        return table.column(name).cast(pa.float64()).fill_null(np.nan).to_numpy()

    host = np.full((*shape, len(HOST_EVENTS)), np.nan)  # filled in place: no grid per event beside the stacked one
    for event_index, e in enumerate(HOST_EVENTS):
        host[rank_index, step_index, event_index] = column(f"{e}_ns")
    device_start = on_grid(column("runner_ts_ns") + column("device_ts_ns"))
    device_end = device_start + on_grid(column("device_wall_ns"))
    waits = _waits(engine, grid, lo, hi, within)
    slot_after = grid.slot_after[:, lo:hi]
    ranks = np.arange(shape[0])[:, None]
    slot_after_validate = np.where(slot_after >= 0, grid.validate[ranks, np.maximum(slot_after, 0)], np.nan)
    return DecodeRuns(host, device_start, device_end, waits[0], waits[1], slot_after, slot_after_validate, waits[2], waits[3], lo)


def _waits(engine: Engine, grid: RunGrid, lo: int, hi: int, within: str) -> list[np.ndarray]:
    """[rank, step, k] of each run's k-th collective wait, from ``collectives``: arrival, duration, ahead, release."""
    table = engine.arrow(f"""SELECT rank, step, wait_index, CAST(arrival_ns - {grid.origin_ns} AS DOUBLE) AS arrival,
                                    CAST(wait_ns AS DOUBLE) AS wait, CAST(ahead_ns AS DOUBLE) AS ahead,
                                    CAST(CASE WHEN aligned THEN last_arrival_ns - {grid.origin_ns} END AS DOUBLE) AS release
                             FROM collectives WHERE {within}""")
    out = [np.full((len(grid.rank_values), hi - lo, grid.waits), np.nan) for _ in range(4)]
    if table.num_rows:
        r = np.searchsorted(grid.rank_values, table.column("rank").to_numpy())
        j = np.searchsorted(grid.step_values, table.column("step").to_numpy()) - lo
        k = table.column("wait_index").to_numpy()
        for array, name in zip(out, ("arrival", "wait", "ahead", "release"), strict=True):
            array[r, j, k] = table.column(name).fill_null(np.nan).to_numpy()
    return out


def _segments(runs: DecodeRuns) -> tuple[np.ndarray, np.ndarray]:
    """[rank, step, k]: the device work before collective k (the last: after the last collective), and where it starts."""
    waits = runs.wait_ns.shape[2]
    # filled in place: at 64 x 100k each [rank, step, k] array is hundreds of MB, and concatenations made two more
    starts = np.empty((*runs.shape, waits + 1))
    starts[:, :, 0] = runs.device_start
    np.add(runs.wait_start, runs.wait_ns, out=starts[:, :, 1:])
    segments = np.empty_like(starts)  # the ends first, then less the starts
    segments[:, :, :waits] = runs.wait_start
    segments[:, :, waits] = runs.device_end
    segments -= starts
    # a run with fewer waits: its last segment is after its own last wait
    count = (~np.isnan(runs.wait_ns)).sum(axis=2)
    last_start = np.take_along_axis(starts, count[:, :, None], axis=2)[:, :, 0]
    segments[:, :, waits] = np.nan
    np.put_along_axis(segments, count[:, :, None], (runs.device_end - last_start)[:, :, None], axis=2)
    return segments, starts


class CauseWindow:
    """One window of the run's replay model, and the removals that take away the causes of its steps.

    Step indices are the run's (``j``); arrays are the window's (``j - offset``).
    A removal may touch only what the window holds: a cause whose phase or
    collection reaches past its margins raises :class:`WindowTooSmall`.
    """

    def __init__(self, runs: DecodeRuns, core: tuple[int, int], run: WhatIf):
        self.runs, self.run = runs, run
        self.offset, self.end = runs.first_step, runs.first_step + runs.shape[1]
        self.model = ReplayWindow(runs, core)  # its replay model: chains, device slacks, collectives
        self.segments, self.segment_starts = _segments(runs)

    @functools.cached_property
    def covered(self) -> np.ndarray:
        """[ranks, 2]: per rank, the time span within which every event and device program is of a run the window
        holds (read off its first and last three steps; worked out when a removal is first checked against it)."""
        runs, ranks = self.runs, self.runs.shape[0]

        def edge(steps: slice) -> np.ndarray:
            times = np.concatenate([runs.host[:, steps], runs.device_start[:, steps, None], runs.device_end[:, steps, None]], axis=2)
            return times.reshape(ranks, -1)

        # NaN where a rank has no run at the edge: nothing of it is covered
        first = np.fmax.reduce(edge(slice(0, 3)), axis=1) if self.offset > 0 else np.full(ranks, -np.inf)
        last = np.fmin.reduce(edge(slice(-3, None)), axis=1) if self.end < self.run.steps else np.full(ranks, np.inf)
        return np.stack([np.nan_to_num(first, nan=np.inf), np.nan_to_num(last, nan=-np.inf)], axis=1)

    def _within(self, r: int, lo: float, hi: float) -> None:
        if not (self.covered[r, 0] <= lo and hi <= self.covered[r, 1]):
            raise WindowTooSmall(f"rank index {r}: [{lo}, {hi}] reaches past the window's runs")

    def segment_excess(self, r: int, j: int) -> np.ndarray:
        """How much longer each device work segment of run (r, j) took than the median of the other ranks'."""
        others = np.delete(self.segments[:, j - self.offset], r, axis=0)
        if not len(others):
            return np.zeros(self.segments.shape[2])
        with np.errstate(all="ignore"):
            typical = np.nanmedian(others, axis=0)
        return np.clip(np.nan_to_num(self.segments[r, j - self.offset] - typical), 0, None)

    def lag(self, r: int, j: int, kind: int) -> float:
        return self.model.lag(r, j - self.offset, kind)

    def removals(self, cause: OwnCause, r: int, j: int, column: int) -> list[Removal]:
        """The removals that take ``cause``'s excess (rank index r, step index j) away."""
        has_device = bool(self.model.has_device[r, j - self.offset])
        if cause.mechanism == fmt.MECH_GC and r in self.run.collections:
            found = self._collection_removals(r, j, cause, column)
            if found:
                return found
        if cause.phase == fmt.PHASE_DEVICE_WALL and has_device:
            # the device's excess over the other ranks: in its work segments, or in leaving its collectives after
            # the release (its own threads stalled there: a collection, or a CPU taken from them)
            work = self.segment_excess(r, j)
            exits = np.array([self._exit_excess(r, j, k) for k in range(self.runs.wait_ns.shape[2])])
            total = float(work.sum() + exits.sum())
            if total <= 0:
                return []
            share = min(cause.evidence_ns, total) / total
            return [
                *(Removal(column, r, j, "device", share * e, k) for k, e in enumerate(work) if e > 0),
                *(Removal(column, r, j, "exit", share * e, k) for k, e in enumerate(exits) if e > 0),
            ]
        target = _HOST_TARGET.get(cause.phase, RUNNER_END)
        own = Removal(column, r, j, target, min(max(cause.evidence_ns, self.lag_excess(r, j, target)), self.lag(r, j, target)))
        if cause.mechanism == fmt.MECH_HOST_CPU and self.run.device_on_host[r]:
            return [own, *self._device_stall_removals(r, *self.phase_window(r, j, cause.phase), column)]
        return [own]

    def _device_stall_removals(self, r: int, lo: float, hi: float, column: int) -> list[Removal]:
        """Host work that holds the interpreter lock also stalls a device that is a thread of the same process.

        What such a device lost inside [lo, hi] — its work segments and its
        exits from collectives, beyond the other ranks' — goes with the work.
        """
        return self._device_removals(r, lo, hi, column, lambda overlap, excess, size: min(overlap, excess))

    def _device_removals(self, r: int, lo: float, hi: float, column: int, amount: Callable[[float, float, float], float]) -> list[Removal]:
        """Removals from rank r's device work segments and collective exits that [lo, hi] overlaps.

        ``amount(overlap, excess over the other ranks, size)`` says how much of each to take.
        """
        self._within(r, lo, hi)
        removals: list[Removal] = []
        seg_start = self.segment_starts[r]
        seg_overlap = np.minimum(seg_start + self.segments[r], hi) - np.maximum(seg_start, lo)
        for jj, k in zip(*np.nonzero(np.nan_to_num(seg_overlap) > 0), strict=True):
            j = int(jj) + self.offset
            ns = amount(float(seg_overlap[jj, k]), float(self.segment_excess(r, j)[k]), float(self.segments[r, jj, k]))
            if ns > 0:
                removals.append(Removal(column, r, j, "device", ns, int(k)))
        exit_overlap = np.minimum(self.runs.wait_start[r] + self.runs.wait_ns[r], hi) - np.maximum(self.model.exit_start[r], lo)
        for jj, k in zip(*np.nonzero(np.nan_to_num(exit_overlap) > 0), strict=True):
            j = int(jj) + self.offset
            ns = amount(float(exit_overlap[jj, k]), self._exit_excess(r, j, int(k)), np.inf)
            if ns > 0:
                removals.append(Removal(column, r, j, "exit", ns, int(k)))
        return removals

    def lag_excess(self, r: int, j: int, kind: int) -> float:
        """How much longer one host event's lag was than the other ranks' median at that step: the phase's excess.

        Taking the phase back to typical, not only the evidence, is what
        "the cause's excess were zero" means: a collection comes with the
        allocations that provoked it, which a run without it does not do either.
        """
        positions = self.model.chains.event_index[:, j - self.offset, kind]
        others = np.flatnonzero((positions >= 0) & (np.arange(len(positions)) != r))
        lags = self.model.lags(others, positions[others])
        own = self.lag(r, j, kind)
        return max(0.0, own - float(np.median(lags))) if len(lags) else 0.0

    def cited_collections(self, r: int, j: int, phase: str) -> np.ndarray:
        """[n, 2]: the collections of rank r's process that overlap ``phase`` of its run at step index j."""
        lo, hi = self.phase_window(r, j, phase)
        gcs = self.run.collections[r]
        return gcs[(gcs[:, 0] < hi) & (gcs[:, 1] > lo)]

    def phase_window(self, r: int, j: int, phase: str) -> tuple[float, float]:
        """Where on the host axis the cause's phase of run (r, j) lay."""
        local = j - self.offset
        host = self.runs.host[r, local]
        windows = {
            fmt.PHASE_BIND: (host[BIND_TS], host[BIND_END]),
            "before bind": (host[BIND_TS] - self.lag(r, j, BIND_TS), host[BIND_TS]),
            "launch": (host[BIND_END], host[RUNNER_TS]),
            fmt.PHASE_FENCE_WAIT: (host[FENCE_TS], host[RUNNER_END]),
            fmt.PHASE_DEVICE_WALL: (self.runs.device_start[r, local], self.runs.device_end[r, local]),
            fmt.PHASE_VALIDATE: (host[VALIDATE_TS], host[VALIDATE_END]),
        }
        return windows.get(phase, (host[RUNNER_TS], host[RUNNER_END]))

    def _collection_removals(self, r: int, j: int, cause: OwnCause, column: int) -> list[Removal]:
        """Take the cause's collections away wherever they held the rank: its host thread and its device programs.

        A collection stops every thread of the process (it holds the GIL), so
        one collection can lengthen a host phase of one run and the device
        work of the next; removing it removes it from both.
        """
        hit = self.cited_collections(r, j, cause.phase)
        removals: list[Removal] = []
        chains = self.model.chains
        m = chains.length[r]
        kind, step = chains.kind[r, :m], chains.step[r, :m]
        lag = self.model.lags(np.full(m, r), np.arange(m))
        t = self.runs.host[r, step, kind]
        taken = self.run.collections_taken.setdefault(column, set())
        for g0, g1 in hit:  # the few collections of one cause
            if (r, g0) in taken:  # one collection is removed once, however many causes cite it
                continue
            taken.add((r, g0))
            self._within(r, g0, g1)
            overlap = np.minimum(t, g1) - np.maximum(t - lag, g0)
            for i in np.flatnonzero(overlap > 0):
                at = int(step[i]) + self.offset
                amount = min(max(float(overlap[i]), self.lag_excess(r, at, int(kind[i]))), float(lag[i]))
                removals.append(Removal(column, r, at, int(kind[i]), amount))
            # what the collection touched goes back to typical (the allocations that provoked it come with it)
            removals += self._device_removals(r, g0, g1, column, lambda overlap, excess, size: min(max(overlap, excess), size))
        return removals + self._rest_of_phase(r, j, cause, column, removals)

    def _exit_excess(self, r: int, j: int, k: int) -> float:
        """How much later rank r left collective k of step j than the other ranks' median exit lag after the release."""
        local = j - self.offset
        exit_lag = self.runs.wait_start[:, local, k] + self.runs.wait_ns[:, local, k] - self.model.exit_start[:, local, k]
        others = np.delete(exit_lag, r)
        others = others[~np.isnan(others)]
        return max(0.0, float(exit_lag[r] - np.median(others))) if len(others) and not np.isnan(exit_lag[r]) else 0.0

    def _rest_of_phase(self, r: int, j: int, cause: OwnCause, column: int, removals: list[Removal]) -> list[Removal]:
        """What is left of the cause's host phase excess once its collections are gone (the allocations that provoked them)."""
        target = _HOST_TARGET.get(cause.phase)
        if target is None:
            return []
        taken = sum(x.ns for x in removals if x.step == j and x.target == target)
        rest = min(self.lag_excess(r, j, target), self.lag(r, j, target)) - taken
        return [Removal(column, r, j, target, rest)] if rest > 0 else []


class WhatIf:
    """Removals of causes from one run's replay model, and their replay, one window of steps at a time."""

    def __init__(self, engine: Engine, grid: RunGrid, device_on_host: np.ndarray | None = None, window_steps: int = WINDOW_STEPS):
        self.engine, self.grid, self.window_steps = engine, grid, window_steps
        self.steps = grid.steps
        self.rank_of = {int(r): i for i, r in enumerate(grid.rank_values)}
        self.step_of = {int(s): j for j, s in enumerate(grid.step_values)}
        # per rank index: its device is a thread of the rank process (a CPU device: its spans carry host evidence)
        self.device_on_host = np.zeros(len(grid.rank_values), bool) if device_on_host is None else device_on_host
        self.collections: dict[int, np.ndarray] = {}  # rank index -> [n, 2] GC start and end (ns)
        self.collections_taken: dict[int, set[tuple[int, float]]] = {}  # per scenario column, while building its removals
        self._windows: dict[int, CauseWindow] = {}  # the two windows used last, by number, the latest last
        self.replayer = Replayer(lambda j: self.window(j).model, self.steps, grid.ends)

    def window(self, j: int) -> CauseWindow:
        """The window whose core holds step index j (built from the engine when first asked for; two are kept)."""
        number = j // self.window_steps
        window = self._windows.pop(number, None)
        if window is None:
            lo, hi = number * self.window_steps, min(self.steps, (number + 1) * self.window_steps)
            start, end = max(0, lo - MARGIN_STEPS), min(self.steps, hi + MARGIN_STEPS)
            if len(self._windows) >= 2:
                del self._windows[next(iter(self._windows))]  # the one used longest ago
            window = CauseWindow(load_decode_runs(self.engine, self.grid, start, end), (lo, hi), self)
        self._windows[number] = window  # the most recently used last
        return window

    def removals(self, cause: OwnCause, column: int) -> list[Removal]:
        """The removals that take ``cause``'s excess away (none when its run is not in the model)."""
        r, j = self.rank_of.get(cause.rank), self.step_of.get(cause.step)
        if r is None or j is None:
            return []
        return self.window(j).removals(cause, r, j, column)

    def add_collections(self, ranks: np.ndarray, windows: np.ndarray) -> None:
        """The garbage collections of each rank's process: ``windows[i]`` = (start, end) ns on ``ranks[i]``."""
        for rank, index in self.rank_of.items():  # one per rank
            self.collections[index] = windows[ranks == rank]

    def once_per_collection(self, causes: list[OwnCause]) -> list[OwnCause]:
        """Causes that cite one collection (a bind's GC is late start s and tail s-1) count once, at the earliest step."""
        seen: set[tuple[int, float]] = set()
        kept = []
        for cause in sorted(causes, key=lambda c: (c.step, c.rank, c.phase)):  # one per cause
            r, j = self.rank_of.get(cause.rank), self.step_of.get(cause.step)
            if cause.mechanism != fmt.MECH_GC or r is None or j is None or r not in self.collections:
                kept.append(cause)
                continue
            cited = {(r, float(g0)) for g0 in self.window(j).cited_collections(r, j, cause.phase)[:, 0]}
            if not cited or not cited <= seen:
                kept.append(cause)
            seen |= cited
        return kept

    def saved_ns(self, scenarios: list[list[OwnCause]]) -> np.ndarray:
        """Per scenario (a set of causes removed together), the decode wall time saved."""
        self.collections_taken = {}
        removals = [removal for column, causes in enumerate(scenarios) for c in causes for removal in self.removals(c, column)]
        steps = [removal.step for removal in removals]
        first = max(0, min(steps, default=0) - 2)
        return -self.replayer.replay(removals, len(scenarios), first).end_shift_ns


@stage("what_if", reads=("decode", "collectives", "gc", "processes"), in_summary=True)
def what_if_section(engine: Engine, findings: Findings) -> WhatIfSection:
    """The ``what_if`` block of summary.json: the findings' own causes replayed away."""
    causes = own_causes(findings.late_starts, findings.tail_steps, findings.slow_steps)
    wall_ns = engine.scalar("SELECT max(root_end_ns) - min(root_ts_ns) FROM decode")
    if not wall_ns:
        return WhatIfSection(
            decode_wall_ms=None,
            replayed_wall_ms=None,
            total_saved_ms=None,
            share_of_decode_wall=None,
            by_mechanism={},
            by_rank={},
            items=[],
        )
    try:
        return _replayed(engine, causes, wall_ns, WINDOW_STEPS)
    except WindowTooSmall:  # a rank idle for longer than a window's margins, a long collection: the run in one window
        return _replayed(engine, causes, wall_ns, None)


def _replayed(engine: Engine, causes: list[OwnCause], wall_ns: int, window_steps: int | None) -> WhatIfSection:
    """The what-if section, replaying windows of ``window_steps`` (None: the whole run in one)."""
    grid = load_run_grid(engine)
    on_host = {int(r) for (r,) in engine.rows("SELECT DISTINCT rank FROM decode WHERE device_cpu_ns IS NOT NULL")}
    device_on_host = np.array([int(r) in on_host for r in grid.rank_values], bool)
    model = WhatIf(engine, grid, device_on_host, window_steps or max(1, grid.steps))
    gcs = engine.arrow("SELECT p.rank, g.gc_ts_ns, g.gc_end_ns FROM gc g JOIN processes p USING (pid) ORDER BY p.rank, g.gc_ts_ns")
    model.add_collections(
        gcs.column("rank").to_numpy(), np.stack([gcs.column(c).to_numpy().astype(float) for c in ("gc_ts_ns", "gc_end_ns")], axis=1)
    )
    causes = model.once_per_collection(causes)
    mechanisms = sorted({c.mechanism for c in causes})
    ranks = _ranks_replayed_together(causes, model)
    joint = [
        [],
        causes,
        *([c for c in causes if c.mechanism == m] for m in mechanisms),
        *([c for c in causes if c.rank == r] for r in ranks),
    ]
    saved = model.saved_ns(joint)
    alone = np.concatenate([model.saved_ns([[c] for c in batch]) for batch in _batches(causes)] or [np.zeros(0)])
    items = [
        WhatIfItem(step=c.step, rank=c.rank, mechanism=c.mechanism, phase=c.phase, saved_ms=_ms(s))
        for c, s in sorted(zip(causes, alone, strict=True), key=lambda pair: (-pair[1], pair[0].step, pair[0].rank))
    ]
    return WhatIfSection(
        decode_wall_ms=ns_to_ms(wall_ns),
        replayed_wall_ms=ns_to_ms(wall_ns - saved[0]),
        total_saved_ms=_ms(saved[1]),
        share_of_decode_wall=round(max(0.0, float(saved[1])) / wall_ns, 4),
        by_mechanism={m: _ms(s) for m, s in zip(mechanisms, saved[2 : 2 + len(mechanisms)], strict=True)},
        by_rank=_by_rank(causes, alone, dict(zip(ranks, saved[2 + len(mechanisms) :], strict=True))),
        items=items,
    )


def _ranks_replayed_together(causes: list[OwnCause], model: WhatIf) -> list[int]:
    """The ranks whose causes are replayed together for ``by_rank``: those that cost the most, at most :data:`JOINT_RANKS`.

    A rank's causes removed together can save more (or less) than the sum of
    each alone; the few ranks that matter get that joint figure, and the rest
    (a long tail of single scheduling hiccups on a big job) the sum of their items.
    """
    ranks = sorted({c.rank for c in causes})
    if len(ranks) <= JOINT_RANKS:
        return ranks
    evidence: dict[int, float] = {}
    for cause in causes:  # one per cause
        evidence[cause.rank] = evidence.get(cause.rank, 0.0) + cause.evidence_ns
    return sorted(sorted(ranks, key=lambda r: (-evidence[r], r))[:JOINT_RANKS])


def _by_rank(causes: list[OwnCause], alone: np.ndarray, together: dict[int, float]) -> dict[str, float]:
    """Per rank: its causes replayed together where that was done, else the sum of each alone."""
    summed: dict[int, float] = {}
    for cause, saved in zip(causes, alone, strict=True):  # one per cause
        summed[cause.rank] = summed.get(cause.rank, 0.0) + max(0.0, float(saved))
    return {str(r): _ms(together.get(r, summed[r])) for r in sorted(summed)}


def _batches(causes: list[OwnCause]) -> list[list[OwnCause]]:
    """Causes replayed together, one column each: neighbours in steps, so that each column is live most of the replay."""
    batches: list[list[OwnCause]] = []
    for cause in causes:  # in step order
        if batches and len(batches[-1]) < _CAUSES_PER_BATCH and cause.step - batches[-1][0].step < _BATCH_STEPS:
            batches[-1].append(cause)
        else:
            batches.append([cause])
    return batches


def _ms(saved_ns: float) -> float:
    return ns_to_ms(max(0.0, float(saved_ns)))


@stage("tail_cost", reads=("decode",), in_summary=True)
def tail_cost(engine: Engine) -> TailCost:
    """Σ_s (max_r end − median_r end) of runner_run, and its share of the decode wall time (docs/FIGURES.md)."""
    row = engine.rows("""SELECT sum(max_end - median_end), (SELECT max(root_end_ns) - min(root_ts_ns) FROM decode)
                         FROM (SELECT max(runner_end_ns) AS max_end, median(runner_end_ns) AS median_end FROM decode
                               WHERE runner_ts_ns IS NOT NULL GROUP BY step)""")[0]
    total_ns, wall_ns = row
    if total_ns is None:
        return TailCost(total_ms=None, share_of_decode_wall=None, decode_wall_ms=None)
    return TailCost(
        total_ms=ns_to_ms(total_ns),
        share_of_decode_wall=round(total_ns / wall_ns, 4) if wall_ns else None,
        decode_wall_ms=ns_to_ms(wall_ns),
    )
