"""Replaying a decode run through its dependencies, with chosen excesses removed (docs/FIGURES.md "What-if").

The model (one rank's host thread and device stream, coupled across ranks):

* **host chain** — every host event of a rank (bind start/end, runner_run
  start, claim_release start/end, fence-wait start, runner_run end, validate
  start/end), in the thread's own order: an event happens a measured lag after
  the one before it on the thread. runner_run's end also waits for its device
  program's end; bind also waits for the end of the earlier run that held its
  ping-pong slot (depth-2 slot reuse).
* **device chain** — a run's program starts after its launch (runner_run start)
  and after the previous program on the stream; it is a sequence of work
  segments separated by collective waits (``*_wait`` device spans).
* **collectives** — at each collective every rank leaves when the last one
  arrives. Arrival order is the ``collectives`` table's
  (:mod:`dsprof.analysis.stages.collectives`): on the host axis where the
  device clock is aligned with it, else from the waits themselves (all ranks
  leave together, so a rank that waited w less arrived w later).

Every event e with dependencies d happens at ``max_d t(d) + lag``; the
measured times give, for each dependency, its slack ``max_d t(d) − t(d)`` (0
for the one that held e). A replay propagates changes: ``Δe = max_d (Δd −
slack_d) − removed(e)``. With nothing removed every Δ is 0, so the faithful
replay reproduces the measured times exactly; removing an excess moves later
events earlier only as far as no other dependency holds them. A chain's first
event keeps its measured time, and so does a run started after an idle gap of
more than :data:`PIN_GAP_NS` (no dependency explains it).

Scenarios (columns) are replayed together, vectorised over ranks; a column
stops as soon as every rank's frontier has moved by the same amount and no
removal of it lies ahead: from there on everything moves by that amount.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# host event kinds, in the order a thread passes them within one run; ends sort before starts at equal times
HOST_EVENTS = ("bind_ts", "bind_end", "runner_ts", "claim_ts", "claim_end", "fence_ts", "runner_end", "validate_ts", "validate_end")
BIND_TS, BIND_END, RUNNER_TS, CLAIM_TS, CLAIM_END, FENCE_TS, RUNNER_END, VALIDATE_TS, VALIDATE_END = range(len(HOST_EVENTS))
_IS_END = np.array([name.endswith("_end") for name in HOST_EVENTS])
# a run whose bind starts this long after anything on its thread was not held by the thread: it keeps its time
PIN_GAP_NS = 1_000_000_000
_FREE = np.inf  # the slack of a dependency that did not exist
_PINNED = 1e13  # stands for an infinite slack inside the running sums (10,000 s: far beyond any lag, exact in float64)
_RING = 4  # runs of a rank whose events later events may still depend on (depth 2, plus margin)


@dataclass
class DecodeRuns:
    """Measured times of every decode run, ``[rank, step]`` arrays of ns (NaN where absent)."""

    host: np.ndarray  # [ranks, steps, len(HOST_EVENTS)]
    device_start: np.ndarray  # [ranks, steps]: device program start on the host axis
    device_end: np.ndarray  # [ranks, steps]
    # collective waits in start order: arrival (host axis) and duration, [ranks, steps, waits]; NaN past a run's own count
    wait_start: np.ndarray
    wait_ns: np.ndarray
    slot: np.ndarray  # [ranks, steps]: ping-pong slot (int)
    # [ranks, steps, waits], from ``collectives``: how long before the last arrival the rank arrived (``ahead_ns``),
    # and the last arrival where the instance is aligned (NaN where not: its ranks all left together); a Replayer
    # takes both over (where a run has no such wait: _FREE and NaN)
    wait_ahead: np.ndarray
    wait_release: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.host.shape[0], self.host.shape[1]


@dataclass
class Removal:
    """Take ``ns`` off one event of one run in one scenario column.

    ``target`` is a host event kind, ``device`` with ``segment`` the device
    work segment (0 = before the first collective; the last = after the last),
    or ``exit`` with ``segment`` the collective whose exit the rank was late to.
    """

    column: int
    rank: int
    step: int
    target: int | str
    ns: float
    segment: int = 0


@dataclass
class _HostChains:
    """Each rank's host events in thread order, padded to one length (kind -1 past a rank's end).

    Only where each event sits is kept (5 bytes an event): its measured time
    is ``DecodeRuns.host[rank, step, kind]``, and its slack and lag come from
    the times of its dependencies (:meth:`Replayer.timing`), 16 bytes an event
    less (0.9 GB at 64 x 100k).
    """

    kind: np.ndarray  # [ranks, n] int
    step: np.ndarray  # [ranks, n] int
    # per run, not per event (only two kinds of event have an extra dependency): the slack of runner_run end's device
    # end and of bind start's slot predecessor (_FREE: none), and which step index that predecessor is (-1: none)
    end_slack: np.ndarray  # [ranks, steps]
    bind_slack: np.ndarray  # [ranks, steps]
    bind_after: np.ndarray  # [ranks, steps] int
    runner_index: np.ndarray  # [ranks, steps] index of each run's runner_run start in its chain (-1: absent)
    length: np.ndarray  # [ranks]
    event_index: np.ndarray  # [ranks, steps, kinds]: where each event sits in its chain (-1: absent)

    def position_of(self, rank: int, step: int, kind: int) -> int:
        return int(self.event_index[rank, step, kind])


@dataclass
class ReplayResult:
    """Per column: how far the decode wall's end moved (ns, <= 0 when time was saved)."""

    end_shift_ns: np.ndarray
    converged_at: list[int | None] = field(default_factory=list)


def _host_chains(runs: DecodeRuns) -> _HostChains:
    """Every rank's chain, filled one rank at a time into arrays sized once (memory: the chains, plus one rank's work)."""
    ranks, steps = runs.shape
    lengths = (~np.isnan(runs.host)).sum(axis=(1, 2)).astype(np.int64)
    n = int(lengths.max(initial=0))
    out = _HostChains(
        kind=np.full((ranks, n), -1, np.int8),
        step=np.zeros((ranks, n), np.int32),
        end_slack=np.full((ranks, steps), _FREE),
        bind_slack=np.full((ranks, steps), _FREE),
        bind_after=np.full((ranks, steps), -1, np.int32),
        runner_index=np.full((ranks, steps), -1, np.int64),
        length=lengths,
        event_index=np.full((ranks, steps, len(HOST_EVENTS)), -1, np.int32),
    )
    for r in range(ranks):  # one pass per rank; the work inside is vectorised over the rank's events
        flat = np.flatnonzero(~np.isnan(runs.host[r].reshape(-1)))  # step-major, kinds in order within a step
        t = runs.host[r].reshape(-1)[flat]
        step, kind = (flat // len(HOST_EVENTS)).astype(np.int32), (flat % len(HOST_EVENTS)).astype(np.int8)
        del flat
        order = np.lexsort((kind, ~_IS_END[kind], t))
        _chain_slacks(out, r, t[order], kind[order], step[order], runs)
    return out


def _chain_slacks(out: _HostChains, r: int, t: np.ndarray, kind: np.ndarray, step: np.ndarray, runs: DecodeRuns) -> None:
    """Rank ``r``'s chain, and the slack of each run's extra dependencies: the device end, the slot's previous run."""
    m = len(t)
    out.kind[r, :m], out.step[r, :m] = kind, step
    previous = np.concatenate(([np.nan], t[:-1]))
    extra = np.full(m, np.nan)
    extra_step = np.full(m, -1, np.int32)
    ends = np.flatnonzero(kind == RUNNER_END)
    extra[ends] = runs.device_end[r, step[ends]]
    extra_step[ends] = step[ends]
    binds = np.flatnonzero(kind == BIND_TS)
    slot_previous = _slot_predecessor(runs.slot[r])
    binds = binds[slot_previous[step[binds]] >= 0]
    extra_step[binds] = slot_previous[step[binds]]
    extra[binds] = runs.host[r, extra_step[binds], VALIDATE_END]
    extra[extra > t] = np.nan  # a dependency that had not happened yet did not hold the event
    extra[extra == previous] = np.nan  # the thread's previous event itself: already a dependency
    no_extra = np.isnan(extra)
    extra_step[no_extra] = -1
    slack_extra = np.where(no_extra, _FREE, np.fmax(previous, extra) - extra)
    out.end_slack[r, step[ends]] = slack_extra[ends]
    every_bind = np.flatnonzero(kind == BIND_TS)
    out.bind_slack[r, step[every_bind]] = slack_extra[every_bind]
    out.bind_after[r, step[every_bind]] = extra_step[every_bind]
    runner = np.flatnonzero(kind == RUNNER_TS)
    out.runner_index[r, step[runner]] = runner
    out.event_index[r, step, kind] = np.arange(m, dtype=np.int32)


def _slot_predecessor(slot: np.ndarray) -> np.ndarray:
    """For each step index, the previous step index that used the same slot (-1: none)."""
    previous = np.full(len(slot), -1, np.int64)
    last: dict[int, int] = {}
    for j, s in enumerate(slot.tolist()):  # one entry per step of one rank
        previous[j] = last.get(s, -1)
        last[s] = j
    return previous


class Replayer:
    """Replays the decode runs for a set of scenario columns (see the module docstring)."""

    def __init__(self, runs: DecodeRuns):
        self.runs = runs
        self.chains = _host_chains(runs)
        ranks, steps = runs.shape
        self.ranks, self.steps = ranks, steps
        self._device_slacks()
        last_validate = runs.host[:, :, VALIDATE_END]
        self.end_ns = float(np.nanmax(last_validate)) if np.isfinite(last_validate).any() else 0.0

    def _device_slacks(self) -> None:
        runs = self.runs
        start, end = runs.device_start, runs.device_end
        runner = runs.host[:, :, RUNNER_TS]
        previous_end = np.concatenate([np.full((self.ranks, 1), np.nan), end[:, :-1]], axis=1)
        previous_end[previous_end > start] = np.nan
        latest = np.fmax(runner, previous_end)
        self.device_slack_launch = np.where(np.isnan(runner), _FREE, latest - runner)
        self.device_slack_previous = np.where(np.isnan(previous_end), _FREE, latest - previous_end)
        self._collective_slacks(runs)
        self.has_device = ~np.isnan(start) & ~np.isnan(end)

    def _collective_slacks(self, runs: DecodeRuns) -> None:
        """How much earlier than the last arrival each rank reached each collective, and when its exit began.

        Both come from the ``collectives`` table (analysis/stages/collectives.py):
        where the device clocks are aligned with the host, a rank that left late
        (its thread stalled after the release) keeps that as its own exit lag.
        """
        present = ~np.isnan(runs.wait_ns)
        self.coupled = present.all(axis=0)  # [steps, waits]: a collective couples the ranks that all have it
        # the runs' own arrays, taken over (nothing else reads them; at 64 x 100k each is hundreds of MB)
        self.arrival_slack = runs.wait_ahead
        self.arrival_slack[~present] = _FREE
        # the part of each wait after the release, on ranks whose exit can be told apart from the others'
        self.exit_start = runs.wait_release
        self.exit_start[~present] = np.nan

    def timing(self, rows: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Of the host events at chain positions ``index`` of ranks ``rows``: the slack of the thread's previous
        event (_FREE: none, or a pinned start), and the lag after the latest dependency (what a removal can take).

        The latest dependency is the previous event on the thread, or the run's
        extra one where it held the event (``end_slack``/``bind_after`` say
        where it did); a bind after an idle gap of :data:`PIN_GAP_NS` that no
        extra dependency explains is pinned (lag 0).
        """
        chains, host = self.chains, self.runs.host
        kind, step = chains.kind[rows, index], chains.step[rows, index]
        t = host[rows, step, kind]
        before = np.maximum(index - 1, 0)
        previous = np.where(index > 0, host[rows, chains.step[rows, before], chains.kind[rows, before]], np.nan)
        extra = np.full(t.shape, np.nan)
        device = (kind == RUNNER_END) & np.isfinite(chains.end_slack[rows, step])
        extra[device] = self.runs.device_end[rows[device], step[device]]
        after = np.where(kind == BIND_TS, chains.bind_after[rows, step], -1)
        slot = after >= 0
        extra[slot] = host[rows[slot], after[slot], VALIDATE_END]
        latest = np.fmax(previous, extra)
        pinned = (kind == BIND_TS) & (t - previous > PIN_GAP_NS) & np.isnan(extra)
        slack = np.where(np.isnan(previous) | pinned, _FREE, latest - previous)
        return slack, np.where(np.isnan(latest) | pinned, 0.0, t - latest)

    def lags(self, rows: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The measured lag of each host event at ``(rows, index)`` after its latest dependency."""
        return self.timing(rows, index)[1]

    def lag(self, rank: int, step: int, kind: int) -> float:
        """The measured lag of one host event after its latest dependency (0 where the event is absent)."""
        where = self.chains.position_of(rank, step, kind)
        return float(self.lags(np.array([rank]), np.array([where]))[0]) if where >= 0 else 0.0

    def replay(self, removals: list[Removal], columns: int, first_step: int = 0) -> ReplayResult:
        """How far the decode wall's end moves in each column with its removals applied."""
        plan = _RemovalPlan(removals, columns, self.chains, self.ranks)
        state = _State(self.ranks, columns)
        # before first_step nothing has moved: start each chain just before that step's first event
        position = self._start_positions(first_step)
        shift = np.full(columns, np.nan)
        converged: list[int | None] = [None] * columns
        for j in range(first_step, self.steps):
            self._advance_host(state, position, self.chains.runner_index[:, j], plan)
            self._device(state, j, plan)
            self._check_converged(state, j, plan, shift, converged)
            if not np.isnan(shift).any():
                return ReplayResult(shift, converged)
        self._advance_host(state, position, self.chains.length - 1, plan)
        open_columns = np.isnan(shift)
        shift[open_columns] = self._final_end_shift(state)[open_columns]
        return ReplayResult(shift, converged)

    def _start_positions(self, first_step: int) -> np.ndarray:
        """Chain index just before the first event of ``first_step``'s run on each rank (a later run's, where it has none)."""
        if first_step >= self.steps:
            return self.chains.length - 1
        # a rank's runs start in step order, so its first event of a run from first_step on is among the next few runs
        window = self.chains.event_index[:, first_step : first_step + 3, :]
        if (window < 0).all(axis=(1, 2)).any():
            window = self.chains.event_index[:, first_step:, :]
        first = window.reshape(self.ranks, -1).astype(np.int64)
        first = np.where(first >= 0, first, np.iinfo(np.int64).max).min(axis=1)
        return np.where(first == np.iinfo(np.int64).max, self.chains.length, first) - 1

    def _advance_host(self, state: _State, position: np.ndarray, target: np.ndarray, plan: _RemovalPlan) -> None:
        """Process each rank's host events after ``position`` up to ``target`` (inclusive), in thread order.

        Along a thread ``Δ_i = max(Δ_{i-1} − a_i, b_i)`` (a: slack on the
        previous event plus what is removed at i; b: the extra dependency's Δ
        less its slack, less the removal), which unrolls to
        ``Δ_i = max(Δ_0, max_{k<=i}(b_k + A_k)) − A_i`` with A the running sum
        of a: one scan over the whole segment instead of a loop over its events.
        """
        chains = self.chains
        count = np.where(target >= 0, np.maximum(target - position, 0), 0)
        width = int(count.max(initial=0))
        if not width:
            return
        # [events, ranks] and [events, ranks, columns]: the scans run along the first axis, over contiguous blocks
        offsets = np.arange(1, width + 1)
        valid = offsets[:, None] <= count[None, :]
        rows = np.broadcast_to(np.arange(self.ranks)[None, :], valid.shape)
        index = np.where(valid, position[None, :] + offsets[:, None], 0)
        kind, step = chains.kind[rows, index], chains.step[rows, index]
        slack = np.where(valid, self.timing(rows, index)[0], 0.0)
        pinned = np.isinf(slack)
        extra = self._extra_deltas(state, rows, step, kind, valid)
        extra = np.where(pinned[:, :, None] & np.isneginf(extra), 0.0, extra)  # a pinned start keeps its time
        removed = plan.host_removed(rows, index, valid)
        A = np.cumsum(np.where(pinned, _PINNED, slack)[:, :, None] + removed, axis=0)
        reach = np.maximum.accumulate(extra - removed + A, axis=0)
        delta = np.maximum(state.host_last[None, :, :], reach) - A
        moved = np.flatnonzero(count > 0)
        state.host_last[moved] = delta[count[moved] - 1, moved]
        for kind_of, ring, written in ((RUNNER_TS, state.runner_start, None), (VALIDATE_END, state.validate_end, state.validate_written)):
            i, r = np.nonzero(valid & (kind == kind_of))
            ring[r, step[i, r] % _RING] = delta[i, r]
            if written is not None:
                written[r, step[i, r] % _RING] = step[i, r]
        position[:] = np.where(target >= 0, np.maximum(position, target), position)

    def _extra_deltas(self, state: _State, rows: np.ndarray, step: np.ndarray, kind: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Δ − slack of each event's extra dependency (the device end of its run, or its slot's previous validate); −inf if none."""
        chains = self.chains
        out = np.full((*kind.shape, state.host_last.shape[1]), -np.inf)
        for kind_of, ring, written, slack_of, after_of in (
            (RUNNER_END, state.device_end, state.device_written, chains.end_slack, None),
            (BIND_TS, state.validate_end, state.validate_written, chains.bind_slack, chains.bind_after),
        ):
            i, r = np.nonzero(valid & (kind == kind_of))
            run = step[i, r]
            slack = slack_of[r, run]
            has = np.isfinite(slack)  # the dependency existed
            if not has.any():
                continue
            i, r, run, slack = i[has], r[has], run[has], slack[has]
            depends_on = run if after_of is None else after_of[r, run]
            slot = depends_on % _RING
            known = written[r, slot] == depends_on  # a dependency not yet replayed here has not moved
            values = np.where(known[:, None], ring[r, slot], 0.0)
            out[i, r] = values - slack[:, None]
        return out

    def _device(self, state: _State, j: int, plan: _RemovalPlan) -> None:
        """The device programs of step ``j`` on every rank, coupled at their collectives."""
        slot = j % _RING
        launch = state.runner_start[:, slot] - self.device_slack_launch[:, j, None]
        previous = state.device_end[:, (j - 1) % _RING] - self.device_slack_previous[:, j, None] if j else np.full_like(launch, -np.inf)
        delta = np.maximum(launch, previous)
        delta[np.isneginf(delta)] = 0.0
        waits = self.runs.wait_ns.shape[2]
        for k in range(waits + 1):  # work segment k, then collective k (the last segment has none after it)
            delta = delta - plan.device_removed(j, k)
            if k < waits and self.coupled[j, k]:
                released = np.max(delta - self.arrival_slack[:, j, k, None], axis=0)
                delta = np.broadcast_to(released, delta.shape) - plan.exit_removed(j, k)
        has = self.has_device[:, j]
        state.device_end[:, slot] = np.where(has[:, None], delta, state.device_end[:, slot])
        state.device_written[has, slot] = j

    def _check_converged(self, state: _State, j: int, plan: _RemovalPlan, shift: np.ndarray, converged: list[int | None]) -> None:
        """Close the columns whose every frontier moved by one amount and that remove nothing later.

        The frontier is what later events can still depend on: each thread's
        last event, the last two device programs, and the validate ends written
        for the last two steps (slot reuse).
        """
        parts = [state.host_last]
        for back in (0, 1):
            ring = (j - back) % _RING
            parts.append(state.device_end[state.device_written[:, ring] == j - back, ring])
        for back in (1, 2):
            ring = (j - back) % _RING
            parts.append(state.validate_end[state.validate_written[:, ring] == j - back, ring])
        frontier = np.concatenate(parts, axis=0)
        low, high = frontier.min(axis=0), frontier.max(axis=0)
        done = np.isnan(shift) & (high - low < 1.0) & (plan.last_step <= j - 2)  # run j-2 is fully on the threads by now
        for column in np.flatnonzero(done):  # columns closing at this step
            shift[column] = high[column]
            converged[column] = j

    def _final_end_shift(self, state: _State) -> np.ndarray:
        """How far the latest validate end moved, per column."""
        validate = self.runs.host[:, :, VALIDATE_END]
        has = ~np.isnan(validate)
        last = np.where(has.any(axis=1), self.steps - 1 - np.argmax(has[:, ::-1], axis=1), -1)
        ends = np.full((self.ranks, state.host_last.shape[1]), -np.inf)
        for r in np.flatnonzero(last >= 0):  # one per rank
            ring = last[r] % _RING
            moved = state.validate_end[r, ring] if state.validate_written[r, ring] == last[r] else 0.0
            ends[r] = validate[r, last[r]] + moved
        return ends.max(axis=0) - self.end_ns


class _State:
    """Per rank and column: the Δ of the last host event, and of recent runs' runner start, validate end and device end."""

    def __init__(self, ranks: int, columns: int):
        self.host_last = np.zeros((ranks, columns))
        self.runner_start = np.zeros((ranks, _RING, columns))
        self.validate_end = np.zeros((ranks, _RING, columns))
        self.device_end = np.zeros((ranks, _RING, columns))
        # which step each ring entry holds (-1: none yet)
        self.validate_written = np.full((ranks, _RING), -1, np.int64)
        self.device_written = np.full((ranks, _RING), -1, np.int64)


class _RemovalPlan:
    """The removals, indexed for the replay loop: per host event (by chain position) and per device segment."""

    def __init__(self, removals: list[Removal], columns: int, chains: _HostChains, ranks: int):
        self.columns = columns
        self.device: dict[tuple[int, int], np.ndarray] = {}
        self.exit: dict[tuple[int, int], np.ndarray] = {}
        self.last_step = np.full(columns, -1, np.int64)
        host: dict[tuple[int, int], np.ndarray] = {}
        for removal in removals:  # one entry per cause and scenario: a few per flagged step
            if removal.target in ("device", "exit"):
                table = self.device if removal.target == "device" else self.exit
                amounts = table.setdefault((removal.step, removal.segment), np.zeros((ranks, columns)))
                amounts[removal.rank, removal.column] += removal.ns
            else:
                where = chains.position_of(removal.rank, removal.step, int(removal.target))
                if where >= 0:
                    host.setdefault((removal.rank, where), np.zeros(columns))[removal.column] += removal.ns
            self.last_step[removal.column] = max(self.last_step[removal.column], removal.step)
        # removed host events as sorted keys (rank * chain width + position); row 0 of the amounts: nothing removed
        self._width = chains.kind.shape[1]
        keys = sorted(host)
        self.host_keys = np.array([rank * self._width + where for rank, where in keys], np.int64)
        self.host_amounts = np.zeros((len(keys) + 1, columns))
        for row, key in enumerate(keys, start=1):  # one per removed host event
            self.host_amounts[row] = host[key]
        self._zero = np.zeros((ranks, columns))

    def host_removed(self, rows: np.ndarray, index: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """[events, ranks, columns]: what is taken off each event of a segment."""
        if not len(self.host_keys):
            return np.zeros((*rows.shape, self.columns))
        keys = rows * self._width + index
        found = np.minimum(np.searchsorted(self.host_keys, keys), len(self.host_keys) - 1)
        hit = valid & (self.host_keys[found] == keys)
        return self.host_amounts[np.where(hit, found + 1, 0)]

    def device_removed(self, step: int, segment: int) -> np.ndarray:
        return self.device.get((step, segment), self._zero)

    def exit_removed(self, step: int, collective: int) -> np.ndarray:
        return self.exit.get((step, collective), self._zero)
