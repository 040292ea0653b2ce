"""The run's own noise floor, and which late items stand out against it (docs/FIGURES.md "Noise floor").

A shared host makes every rank late now and then. A late item is a finding
only when it stands out against the run's own spread: the healthy majority's
variation, measured robustly (median and MAD, with the values far beyond the
bound set aside until none more is, so that faults at a third of the steps do
not widen it), with a Bonferroni-corrected one-sided normal bound over the steps
tested. Items below the floor stay in summary.json, marked
``noise: true``. A mechanism is named only on evidence for at least half of an
item's excess; otherwise the item is ``unattributed`` with its partial evidence.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, cast

from dsprof.analysis.stages.cause_rules import EXPLAINS_SHARE
from dsprof.analysis.stages.causes import Diagnosis
from dsprof.analysis.stages.runner import stage
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.summary_schema import Cause, LateStart, NoiseBlock, SlowStep, TailStep
from dsprof.analysis.units import ns_to_ms
from dsprof.profiler import strace_format as fmt

# the chance that a healthy run shows one noise item above its floor, over all the steps tested
ALPHA = 0.05
# a MAD times this estimates the standard deviation of normally distributed values
MAD_TO_SIGMA = 1.4826
METHOD = (
    "level + z(1 - alpha/n) * 1.4826 * MAD of the run's own values, those beyond 1.5 times that bound set aside until "
    "none more is (one-sided, Bonferroni over the n values), alpha 0.05"
)
# setting aside the values above the bound stops here at the latest (it settles in two or three rounds)
MAX_ROUNDS = 20
# values this many times the bound above the level are set aside: a healthy run's heavy tail on a shared host
# seldom reaches there (11 healthy runs of the runtime: none), faults of tens of ms do (docs/FIGURES.md)
SET_ASIDE_BEYOND = 1.5


@dataclass(frozen=True)
class NoiseFloor:
    """The size (ms) below which a late item of each kind is noise, from the run's own steps."""

    slow_steps_ms: float  # of a step interval's excess over the median interval
    late_starts_ms: float  # of a late start against the typical rank's (``typical_excess_ms``)
    tail_steps_ms: float  # of a late rank's runner end against the typical rank's
    steps: int

    def block(self) -> NoiseBlock:
        return NoiseBlock(
            floor_ms=round(self.slow_steps_ms, 3),
            slow_steps_ms=round(self.slow_steps_ms, 3),
            late_starts_ms=round(self.late_starts_ms, 3),
            tail_steps_ms=round(self.tail_steps_ms, 3),
            steps=self.steps,
            alpha=ALPHA,
            method=METHOD,
        )


def bound_z(tests: int) -> float:
    """The one-sided normal quantile that ``tests`` healthy values all stay under with chance 1 - ALPHA."""
    return NormalDist().inv_cdf(1 - ALPHA / max(1, tests))


@stage("noise_floor", reads=("decode", "step_intervals"))
def noise_floor(engine: Engine) -> NoiseFloor:
    """Each kind's floor from the run's own variation, scaled for the number of values tested.

    A rank's lateness at a step is its time against the step's median, scaled
    by n / (n - 1): exactly the other rank's for two ranks, near the others'
    median (the typical rank the causes compare with) for more. Each rank is
    centred on its own median first, so a rank late at every step (a
    persistent straggler) widens nothing: its lateness stands out against the
    jitter of all.
    """
    engine.run("""
        CREATE OR REPLACE TEMP TABLE _noise_values AS
        WITH d AS (SELECT rank, step, runner_ts_ns AS s, runner_end_ns AS e FROM decode
                   WHERE runner_ts_ns IS NOT NULL AND runner_end_ns IS NOT NULL),
             m AS (SELECT step, median(s) AS ms, median(e) AS me, count(*) AS n FROM d GROUP BY step HAVING count(*) >= 2),
             l AS (SELECT d.rank, (d.s - m.ms) * m.n / (m.n - 1.0) AS ls, (d.e - m.me) * m.n / (m.n - 1.0) AS le
                   FROM d JOIN m USING (step))
        SELECT ls - median(ls) OVER (PARTITION BY rank) AS late_start, le - median(le) OVER (PARTITION BY rank) AS late_end
        FROM l""")  # scratch: the stage runner drops it
    cells, start_mad = _settled_mad(engine, "_noise_values", "late_start")
    _, end_mad = _settled_mad(engine, "_noise_values", "late_end")
    intervals, interval_mad = _settled_mad(engine, "step_intervals", "interval_ns")
    steps = int(engine.scalar("SELECT count(*) FROM step_intervals"))
    z_cells = bound_z(cells)
    return NoiseFloor(
        slow_steps_ms=_floor_ms(interval_mad, bound_z(intervals)),
        late_starts_ms=_floor_ms(start_mad, z_cells),
        tail_steps_ms=_floor_ms(end_mad, z_cells),
        steps=steps,
    )


def _floor_ms(mad_ns: float, z: float) -> float:
    """The floor above level 0 (every kind's excess is against its typical value): z normal sigmas, from the MAD."""
    return ns_to_ms(z * MAD_TO_SIGMA * mad_ns)


def _settled_mad(engine: Engine, table: str, column: str) -> tuple[int, float]:
    """(values tested, MAD of those left once every value beyond 1.5 times the bound is set aside, round after round).

    A fault adds time and never takes it away, so the values it touches all
    lie above the healthy ones. Faults at a third of the steps (and the steps
    they hold back) move the plain MAD up by half or more; setting aside
    what stands out and measuring again leaves the healthy majority's own
    spread. The bound's z stays that of all the values tested.
    """
    tested, level, mad = engine.rows(f"SELECT count({column}), median({column}), mad({column}) FROM {table}")[0]
    if not tested:
        return 0, 0.0
    z, kept = bound_z(int(tested)), int(tested)
    for _ in range(MAX_ROUNDS):
        bound = float(level) + SET_ASIDE_BEYOND * z * MAD_TO_SIGMA * float(mad)
        now_kept, level, mad = engine.rows(
            f"SELECT count({column}), median({column}), mad({column}) FROM {table} WHERE {column} <= ?", [bound]
        )[0]
        if now_kept == kept:
            break
        kept = int(now_kept)
    return int(tested), float(mad or 0.0)


@dataclass(frozen=True)
class Findings:
    """The late items of a run, each judged against the noise floor and held to its evidence."""

    late_starts: list[LateStart]
    tail_steps: list[TailStep]
    slow_steps: list[SlowStep]

    def items(self) -> list[LateStart | TailStep | SlowStep]:
        return [*self.late_starts, *self.tail_steps, *self.slow_steps]


@stage("findings", reads=())
def judged_findings(engine: Engine, causes: Diagnosis, slow_step_causes: list[SlowStep], noise_floor: NoiseFloor) -> Findings:
    """The late starts, tail steps and slow steps, each marked against its noise floor (copies: the causes stay as found)."""
    late_starts, tail_steps, slow_steps = copy.deepcopy((causes.late_starts, causes.tail_steps, slow_step_causes))
    judge_items(late_starts, tail_steps, slow_steps, noise_floor)
    return Findings(late_starts, tail_steps, slow_steps)


def judge_items(late_starts: list[LateStart], tail_steps: list[TailStep], slow_steps: list[SlowStep], floor: NoiseFloor) -> None:
    """Mark every item against its floor and hold every named cause to its evidence (in place, before the what-if)."""
    for start in late_starts:
        start["noise"] = start.get("typical_excess_ms", start["excess_ms"]) <= floor.late_starts_ms
        require_evidence(start, start["excess_ms"])
    for tail in tail_steps:  # a late rank against its floor; the step is noise when all its late ranks are
        for late in tail["ranks"]:
            late["noise"] = late["excess_ms"] <= floor.tail_steps_ms
            require_evidence(late, late["excess_ms"])
        tail["noise"] = all(late["noise"] for late in tail["ranks"])
        primary = next((late for late in tail["ranks"] if late.get("late_rank") == tail.get("late_rank")), None)
        if primary is not None:
            _carry(primary, tail)  # a tail step carries its primary late rank's judged cause
    for slow in slow_steps:
        slow["noise"] = slow["excess_ms"] <= floor.slow_steps_ms
        require_evidence(slow, slow["excess_ms"])
        culprit = next((c for c in slow["ranks"] if c["role"] == "culprit" and c["rank"] == slow.get("late_rank", slow["rank"])), None)
        if culprit is not None:
            _carry(slow, culprit)  # the culprit row among a slow step's ranks says what the step says
            culprit["noise"] = slow["noise"]


def require_evidence(cause: Cause, excess_ms: float) -> None:
    """Name the cause's mechanism only when its evidence explains at least half the excess.

    ``explained_share`` is the evidence over the excess (at most 1). A cause
    whose evidence falls short becomes ``unattributed``, keeping its partial
    evidence (``evidence_ms``, ``explained_share``) and what it was
    (``partial_mechanism``). A victim that waited for a peer is held to the
    same rule: its wait must explain its lateness.
    """
    mechanism = cause.get("mechanism")
    if mechanism in (None, fmt.MECH_UNATTRIBUTED) or not excess_ms or excess_ms <= 0:
        return
    share = min(1.0, float(cause.get("evidence_ms") or 0.0) / excess_ms)
    cause["explained_share"] = round(share, 3)
    if share >= EXPLAINS_SHARE:
        return
    cause["partial_mechanism"] = mechanism
    cause["mechanism"] = fmt.MECH_UNATTRIBUTED
    cause["detail"] = f"{cause.get('detail')}: explains {share:.0%} of the {excess_ms:.3f} ms excess, too little to name it"
    if mechanism == fmt.MECH_PEER_WAIT:
        cause["role"] = "culprit"  # its own lateness, not the wait, is what is left unexplained
        cause["rank"] = cause.get("late_rank", cause["rank"])
        cause.pop("peer", None)
    cause.pop("from_step", None)


_JUDGED = ("rank", "device", "role", "mechanism", "detail", "explained_share", "partial_mechanism", "from_step", "peer")


def _carry(source: Cause, target: Cause) -> None:
    """``target`` says what ``source`` says of the cause, key by key (a key ``source`` lacks goes from ``target`` too)."""
    into = cast(dict[str, Any], target)
    for key in _JUDGED:
        if key in source:
            into[key] = source[key]  # type: ignore[literal-required]
        else:
            into.pop(key, None)
