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

A replay holds one window of steps at a time (:class:`ReplayWindow`: its
runs, with a margin of :data:`MARGIN_STEPS` on each side): a step's events
depend on the thread's previous events and on the last :data:`_RING` runs,
never further back, so memory is sized by the window, not by the run. Where a
window's margin does not hold what a step depends on, :class:`WindowTooSmall`
says so and the caller replays in one window.
"""

from __future__ import annotations

from collections.abc import Callable
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
# steps a window holds on each side of the steps it replays: what the first of them depend on, and what the last
# ones' events interleave with on the thread
MARGIN_STEPS = 8


class WindowTooSmall(Exception):
    """A window's margin does not hold what its steps depend on (a rank idle for longer, a long collection)."""


@dataclass
class DecodeRuns:
    """Measured times of the decode runs of a window of steps, ``[rank, step]`` arrays of ns (NaN where absent).

    Step index ``j`` of the arrays is step index ``first_step + j`` of the run.
    """

    host: np.ndarray  # [ranks, steps, len(HOST_EVENTS)]
    device_start: np.ndarray  # [ranks, steps]: device program start on the host axis
    device_end: np.ndarray  # [ranks, steps]
    # collective waits in start order: arrival (host axis) and duration, [ranks, steps, waits]; NaN past a run's own count
    wait_start: np.ndarray
    wait_ns: np.ndarray
    # [ranks, steps]: the run's step index that last used the same ping-pong slot (-1: none), and its validate end
    slot_after: np.ndarray
    slot_after_validate: np.ndarray
    # [ranks, steps, waits], from ``collectives``: how long before the last arrival the rank arrived (``ahead_ns``),
    # and the last arrival where the instance is aligned (NaN where not: its ranks all left together); a
    # ReplayWindow takes both over (where a run has no such wait: _FREE and NaN)
    wait_ahead: np.ndarray
    wait_release: np.ndarray
    first_step: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        return self.host.shape[0], self.host.shape[1]


@dataclass
class RunEnds:
    """What a replay's end reads of the whole run: each rank's last run with a validate end, and the latest end."""

    last_step: np.ndarray  # [ranks] step index (-1: none)
    last_validate: np.ndarray  # [ranks] its validate end (ns)
    end_ns: float
    last_runner: np.ndarray  # [ranks] the last step index with a runner_run start (-1: none)
    last_run: np.ndarray  # [ranks] the last step index with a run


@dataclass
class Removal:
    """Take ``ns`` off one event of one run in one scenario column.

    ``target`` is a host event kind, ``device`` with ``segment`` the device
    work segment (0 = before the first collective; the last = after the last),
    or ``exit`` with ``segment`` the collective whose exit the rank was late to.
    """

    column: int
    rank: int
    step: int  # the run's step index
    target: int | str
    ns: float
    segment: int = 0


@dataclass
class _HostChains:
    """Each rank's host events in thread order, padded to one length (kind -1 past a rank's end).

    Only where each event sits is kept (5 bytes an event): its measured time
    is ``DecodeRuns.host[rank, step, kind]``, and its slack and lag come from
    the times of its dependencies (:meth:`ReplayWindow.timing`), 16 bytes an event
    less (0.9 GB at 64 x 100k).
    """

    kind: np.ndarray  # [ranks, n] int
    step: np.ndarray  # [ranks, n] int
    # per run, not per event (only two kinds of event have an extra dependency): the slack of runner_run end's device
    # end and of bind start's slot predecessor (_FREE: none), and which step index of the run that is (-1: none)
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
    binds = binds[runs.slot_after[r, step[binds]] >= 0]
    extra_step[binds] = runs.slot_after[r, step[binds]]
    extra[binds] = runs.slot_after_validate[r, step[binds]]
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


def slot_predecessors(slot: np.ndarray) -> np.ndarray:
    """[ranks, steps]: for each run, the previous step index of its rank that used the same slot (-1: none)."""
    ranks, steps = slot.shape
    rank, step = np.divmod(np.arange(ranks * steps), steps)
    flat = slot.reshape(-1)
    order = np.lexsort((step, flat, rank))
    same = np.flatnonzero((rank[order][1:] == rank[order][:-1]) & (flat[order][1:] == flat[order][:-1])) + 1
    previous = np.full(ranks * steps, -1, np.int32)
    previous[order[same]] = step[order[same - 1]]
    return previous.reshape(ranks, steps)


class ReplayWindow:
    """One window of the replay model: its runs' host chains, device slacks and collectives (module docstring).

    ``core`` is the step indices of the run it replays; the rest of its runs
    are the margins those depend on.
    """

    def __init__(self, runs: DecodeRuns, core: tuple[int, int]):
        self.runs = runs
        self.chains = _host_chains(runs)
        self.ranks, self.steps = runs.shape
        self.offset = runs.first_step
        self.core = core
        self._device_slacks()

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
        extra[slot] = self.runs.slot_after_validate[rows[slot], step[slot]]
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

    def start_positions(self, first_step: int) -> np.ndarray:
        """Chain index just before the first event of run ``first_step``'s on each rank (a later run's, where it has none)."""
        local = first_step - self.offset
        if local >= self.steps:
            return self.chains.length - 1
        # a rank's runs start in step order, so its first event of a run from first_step on is among the next few runs
        window = self.chains.event_index[:, local : local + 3, :]
        if (window < 0).all(axis=(1, 2)).any():
            window = self.chains.event_index[:, local:, :]
        first = window.reshape(self.ranks, -1).astype(np.int64)
        first = np.where(first >= 0, first, np.iinfo(np.int64).max).min(axis=1)
        return np.where(first == np.iinfo(np.int64).max, self.chains.length, first) - 1

    def advance_host(self, state: _State, position: np.ndarray, target: np.ndarray, plan: _RemovalPlan) -> None:
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
            run = step[i, r] + self.offset
            ring[r, run % _RING] = delta[i, r]
            if written is not None:
                written[r, run % _RING] = run
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
            depends_on = run + self.offset if after_of is None else after_of[r, run]
            slot = depends_on % _RING
            known = written[r, slot] == depends_on  # a dependency not yet replayed here has not moved
            values = np.where(known[:, None], ring[r, slot], 0.0)
            out[i, r] = values - slack[:, None]
        return out

    def device(self, state: _State, j: int, plan: _RemovalPlan) -> None:
        """The device programs of step ``j`` on every rank, coupled at their collectives."""
        slot, local = j % _RING, j - self.offset
        launch = state.runner_start[:, slot] - self.device_slack_launch[:, local, None]
        previous = state.device_end[:, (j - 1) % _RING] - self.device_slack_previous[:, local, None] if j else np.full_like(launch, -np.inf)
        delta = np.maximum(launch, previous)
        delta[np.isneginf(delta)] = 0.0
        waits = self.runs.wait_ns.shape[2]
        for k in range(waits + 1):  # work segment k, then collective k (the last segment has none after it)
            delta = delta - plan.device_removed(j, k)
            if k < waits and self.coupled[local, k]:
                released = np.max(delta - self.arrival_slack[:, local, k, None], axis=0)
                delta = np.broadcast_to(released, delta.shape) - plan.exit_removed(j, k)
        has = self.has_device[:, local]
        state.device_end[:, slot] = np.where(has[:, None], delta, state.device_end[:, slot])
        state.device_written[has, slot] = j

    def carry(self, position: np.ndarray, to: ReplayWindow, tail: _Tail) -> np.ndarray:
        """Where each rank's replay goes on in the next window ``to``: the chain index there of its last event done.

        A rank that will not run again (no runner_run from ``to``'s first step on)
        has the rest of its thread done now, on a copy of its state (``tail``),
        as the end of a replay would do it. :class:`WindowTooSmall` where
        ``to``'s margin does not hold a rank's last event done and what follows.
        """
        carried = np.full(self.ranks, -1, np.int64)
        for r in range(self.ranks):  # one per rank
            p, m = int(position[r]), int(self.chains.length[r])
            after = self.chains.step[r, p + 1 : m].astype(np.int64) + self.offset
            if (after < to.offset).any():
                if tail.runs_again(r, to.core[0]):
                    raise WindowTooSmall(f"rank index {r}: events of step index {int(after.min())} are not yet replayed")
                tail.finish(self, r, position)
                carried[r] = to.chains.length[r] - 1
                continue
            if p < 0:
                continue
            step = int(self.chains.step[r, p]) + self.offset
            if step < to.offset:
                if to.chains.length[r] > 0 and tail.runs_again(r, to.core[0]):
                    raise WindowTooSmall(f"rank index {r}: its last replayed event, of step index {step}, is before the window")
                carried[r] = to.chains.length[r] - 1
                continue
            carried[r] = to.chains.event_index[r, step - to.offset, self.chains.kind[r, p]]
            done = to.chains.step[r, : carried[r] + 1].astype(np.int64) + to.offset
            if (done >= self.offset + self.steps).any():
                raise WindowTooSmall(f"rank index {r}: events of steps past the window came before its last replayed one")
        return carried


class _Tail:
    """The end of the thread of ranks that stopped running before the replay's last window (a rank that crashed)."""

    def __init__(self, state: _State, plan: _RemovalPlan, ends: RunEnds):
        self.state, self.plan, self.ends = state, plan, ends
        self.validate_end: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # rank -> its validate ring and written steps

    def runs_again(self, r: int, step: int) -> bool:
        return bool(self.ends.last_runner[r] >= step)

    def finish(self, window: ReplayWindow, r: int, position: np.ndarray) -> None:
        """Replay the rest of rank r's thread in ``window`` on a copy of the state: what the replay's end would do."""
        if self.ends.last_run[r] >= window.offset + window.steps:
            raise WindowTooSmall(f"rank index {r} has runs after the window but no runner_run start in them")
        state = self.state.copy()
        target = np.full(window.ranks, -1, np.int64)
        target[r] = window.chains.length[r] - 1
        window.advance_host(state, position.copy(), target, self.plan)
        self.validate_end[r] = (state.validate_end[r].copy(), state.validate_written[r].copy())


class Replayer:
    """Replays the decode runs for a set of scenario columns, one window of steps at a time (module docstring).

    ``window_of(j)`` gives the window whose core holds step index ``j`` (a
    window's runs and chains are built when it is first asked for).
    """

    def __init__(self, window_of: Callable[[int], ReplayWindow], steps: int, ends: RunEnds):
        self.window_of, self.steps, self.ends = window_of, steps, ends

    def replay(self, removals: list[Removal], columns: int, first_step: int = 0) -> ReplayResult:
        """How far the decode wall's end moves in each column with its removals applied."""
        window = self.window_of(min(first_step, self.steps - 1))
        plan = _RemovalPlan(removals, columns, window.ranks)
        state = _State(window.ranks, columns)
        tail = _Tail(state, plan, self.ends)
        plan.bind(window)
        # before first_step nothing has moved: start each chain just before that step's first event
        position = window.start_positions(first_step)
        shift = np.full(columns, np.nan)
        converged: list[int | None] = [None] * columns
        for j in range(first_step, self.steps):
            if j >= window.core[1]:
                following = self.window_of(j)
                position = window.carry(position, following, tail)
                window = following
                plan.bind(window)
            window.advance_host(state, position, window.chains.runner_index[:, j - window.offset], plan)
            window.device(state, j, plan)
            _check_converged(state, j, plan, shift, converged)
            if not np.isnan(shift).any():
                return ReplayResult(shift, converged)
        window.advance_host(state, position, window.chains.length - 1, plan)
        open_columns = np.isnan(shift)
        shift[open_columns] = self._final_end_shift(state, tail)[open_columns]
        return ReplayResult(shift, converged)

    def _final_end_shift(self, state: _State, tail: _Tail) -> np.ndarray:
        """How far the latest validate end moved, per column."""
        ends = np.full(state.host_last.shape, -np.inf)
        for r in np.flatnonzero(self.ends.last_step >= 0):  # one per rank
            last = int(self.ends.last_step[r])
            ring_values, written = tail.validate_end.get(int(r), (state.validate_end[r], state.validate_written[r]))
            moved = ring_values[last % _RING] if written[last % _RING] == last else 0.0
            ends[r] = self.ends.last_validate[r] + moved
        return ends.max(axis=0) - self.ends.end_ns


def _check_converged(state: _State, j: int, plan: _RemovalPlan, shift: np.ndarray, converged: list[int | None]) -> None:
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

    def copy(self) -> _State:
        other = _State.__new__(_State)
        other.__dict__ = {name: value.copy() for name, value in self.__dict__.items()}
        return other


class _RemovalPlan:
    """The removals, indexed for the replay loop: per host event (by its chain position in the window at hand) and
    per device segment."""

    def __init__(self, removals: list[Removal], columns: int, ranks: int):
        self.columns = columns
        self.device: dict[tuple[int, int], np.ndarray] = {}
        self.exit: dict[tuple[int, int], np.ndarray] = {}
        self.last_step = np.full(columns, -1, np.int64)
        self.host: dict[tuple[int, int, int], np.ndarray] = {}  # (rank, step index, event kind) -> per column
        for removal in removals:  # one entry per cause and scenario: a few per flagged step
            if removal.target in ("device", "exit"):
                table = self.device if removal.target == "device" else self.exit
                amounts = table.setdefault((removal.step, removal.segment), np.zeros((ranks, columns)))
                amounts[removal.rank, removal.column] += removal.ns
            else:
                self.host.setdefault((removal.rank, removal.step, int(removal.target)), np.zeros(columns))[removal.column] += removal.ns
            self.last_step[removal.column] = max(self.last_step[removal.column], removal.step)
        self._zero = np.zeros((ranks, columns))
        self.host_keys = np.zeros(0, np.int64)
        self.host_amounts = np.zeros((1, columns))
        self._width = 1

    def bind(self, window: ReplayWindow) -> None:
        """Index the host removals by their events' chain positions in ``window`` (those of its runs present)."""
        self._width = window.chains.kind.shape[1]
        found: dict[int, np.ndarray] = {}
        for (rank, step, kind), amounts in self.host.items():  # one per removed host event
            local = step - window.offset
            where = window.chains.position_of(rank, local, kind) if 0 <= local < window.steps else -1
            if where >= 0:
                found[rank * self._width + where] = amounts
        # removed host events as sorted keys (rank * chain width + position); row 0 of the amounts: nothing removed
        keys = sorted(found)
        self.host_keys = np.array(keys, np.int64)
        self.host_amounts = np.zeros((len(keys) + 1, self.columns))
        for row, key in enumerate(keys, start=1):  # one per removed host event
            self.host_amounts[row] = found[key]

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
