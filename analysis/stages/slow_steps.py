"""Step intervals, slow steps and their critical path (docs/FIGURES.md "Slow steps").

A straggler in expert-parallel decode need not leave skew: every rank meets
every other at the MoE all-to-all inside the device program, so a rank that
reaches it late holds them all, and every rank ends late together. What the
user sees is the time between two steps' tokens, the **step interval**:
``max_r end(validate(s)) − max_r end(validate(s−1))`` (a Kineto step's token: the end of its step span). A step is **slow** when
its interval exceeds the median interval by more than the threshold.

The **critical path** of a slow step names the rank the others waited for. At
each collective (a device-clock ``*_wait`` span) every rank is released by the
last arrival, which ``collectives`` names (analysis/stages/collectives.py: the
producer's ``peer``, else the arrival order). The collective that held the
other ranks longest (their median wait beyond the last arrival's own) carries
the step's delay; where no collective held them for half the excess or the
threshold, the step waited for its latest rank at the end (the last validate).
"""

from __future__ import annotations

from typing import TypedDict

from dsprof.analysis.stages.cause_rules import EXPLAINS_SHARE
from dsprof.analysis.stages.causes import cause_item
from dsprof.analysis.stages.collectives import SOURCE_ARRIVAL, SOURCE_PEER
from dsprof.analysis.stages.runner import stage
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.summary_schema import Cause, CriticalPath, Percentiles, SlowStep
from dsprof.analysis.units import ns_to_ms, percentile_blocks
from dsprof.profiler import strace_format as fmt

# the critical path goes through a collective when it held the other ranks this share of the excess, or the threshold
COLLECTIVE_SHARE = 0.5
VIA_STEP_END = "step end"
SOURCE_LATEST = "latest rank"
SOURCE_STALL = "stalled inside"
# a culprit's end named so has no cause of its own; its own evidence, where it has some, is the better answer
_NO_CAUSE_OF_ITS_OWN = (fmt.MECH_UNATTRIBUTED, fmt.MECH_CARRIED_OVER, fmt.MECH_PEER_WAIT)


class StepIntervals(TypedDict):
    step_interval_ms: Percentiles  # figures.step_interval_ms
    median_interval_ms: float | None  # slow_steps.median_interval_ms


@stage("intervals", reads=("decode",), writes=("step_intervals",))
def step_intervals(engine: Engine, threshold_ms: float) -> StepIntervals:
    """``step_intervals`` (step, token_ns, interval_ns, excess_ns, slow) and the ``step_interval_ms`` percentiles."""
    threshold_ns = int(round(threshold_ms * 1e6))
    engine.run("""CREATE OR REPLACE TABLE step_intervals AS
        SELECT step, token_ns, token_ns - lag(token_ns) OVER (ORDER BY step) AS interval_ns
        FROM (SELECT step, max(token_ns) AS token_ns FROM decode GROUP BY step)""")
    median = engine.scalar("SELECT median(interval_ns) FROM step_intervals")
    engine.run(f"""ALTER TABLE step_intervals ADD COLUMN excess_ns BIGINT; ALTER TABLE step_intervals ADD COLUMN slow BOOLEAN;
        UPDATE step_intervals SET excess_ns = CAST(interval_ns - {float(median or 0)} AS BIGINT),
                                  slow = coalesce(interval_ns - {float(median or 0)} > {threshold_ns}, FALSE)""")
    return StepIntervals(
        step_interval_ms=percentile_blocks(engine, "step_intervals", {"step_interval_ms": "interval_ns"})["step_interval_ms"],
        median_interval_ms=None if median is None else ns_to_ms(median),
    )


@stage("critical_path", reads=("decode", "step_intervals", "collectives", "gc", "processes"), writes=("critical_path", "collective_waits"))
def critical_path(engine: Engine, threshold_ms: float) -> None:
    """``critical_path``: per slow step, the rank the others waited for, through which collective, and how it was known.

    ``collective_waits`` keeps each rank's wait at the step's critical
    collective (the victims' evidence).
    """
    engine.run("""CREATE OR REPLACE TEMP TABLE waits AS
        SELECT * FROM collectives WHERE step IN (SELECT step FROM step_intervals WHERE slow)""")
    # held: how long the last arrival (analysis/stages/collectives.py) kept the others waiting (aligned: from each
    # one's arrival to the last arrival; else how much longer they waited than it did, its own wait being the
    # collective's own time)
    engine.run("""CREATE OR REPLACE TEMP TABLE held AS
        SELECT step, name, occurrence, any_value(last_rank) AS last_rank, any_value(source) AS source,
               CASE WHEN any_value(aligned)
                    THEN coalesce(median(greatest(last_arrival_ns - arrival_ns, 0)) FILTER (WHERE rank <> last_rank), 0)
                    ELSE greatest(coalesce(median(wait_ns) FILTER (WHERE rank <> last_rank), 0)
                                  - coalesce(any_value(wait_ns) FILTER (WHERE rank = last_rank), 0), 0) END AS held_ns
        FROM waits GROUP BY step, name, occurrence""")
    _stalls(engine, int(round(threshold_ms * 1e6)))
    through = f"(t.c.held_ns >= least({COLLECTIVE_SHARE} * i.excess_ns, {int(round(threshold_ms * 1e6))}))"
    engine.run(f"""CREATE OR REPLACE TABLE critical_path AS
        WITH top AS (SELECT step, arg_max(struct_pack(name, occurrence, last_rank, source, held_ns),
                                          (held_ns, -occurrence, name)) AS c
                     FROM held GROUP BY step),
             latest AS (SELECT step, arg_max(rank, (token_ns, -rank)) AS rank FROM decode GROUP BY step)
        SELECT i.step, i.interval_ns, i.excess_ns,
               CASE WHEN {through} THEN t.c.last_rank ELSE l.rank END AS culprit_rank,
               CASE WHEN {through} THEN t.c.name ELSE '{VIA_STEP_END}' END AS via,
               CASE WHEN {through} THEN t.c.occurrence END AS occurrence,
               CASE WHEN {through}
                    THEN CASE WHEN t.c.source IN ('{SOURCE_PEER}', '{SOURCE_STALL}') THEN t.c.source ELSE '{SOURCE_ARRIVAL}' END
                    ELSE '{SOURCE_LATEST}' END AS source,
               coalesce(t.c.held_ns, 0) AS held_ns,
               (SELECT count(*) FROM waits w WHERE w.step = i.step) > 0 AS has_waits
        FROM step_intervals i LEFT JOIN top t USING (step) LEFT JOIN latest l USING (step)
        WHERE i.slow""")
    engine.run("""CREATE OR REPLACE TABLE collective_waits AS
        SELECT w.step, w.rank, w.name, w.wait_ns, p.culprit_rank
        FROM waits w JOIN critical_path p ON p.step = w.step AND p.via = w.name AND p.occurrence = w.occurrence
        WHERE w.rank <> p.culprit_rank""")


@stage("slow_step_causes", reads=("decode", "diagnosed", "critical_path", "collective_waits"))
def slow_step_items(engine: Engine, threshold_ms: float) -> list[SlowStep]:
    """One item per slow step, worst first: the culprit on the critical path, why it was late, and its victims."""
    rows = engine.arrow("""SELECT p.step AS slow_step, p.interval_ns, p.excess_ns AS slow_excess_ns, p.culprit_rank, p.via,
                                  p.source, p.has_waits, r.device AS culprit_device, d.*, NULL AS peer_device
                           FROM critical_path p
                           LEFT JOIN (SELECT DISTINCT rank, device FROM decode) r ON r.rank = p.culprit_rank
                           LEFT JOIN diagnosed d ON d.step = p.step AND d.rank = p.culprit_rank
                           ORDER BY p.excess_ns DESC, p.step""").to_pylist()
    devices = dict(engine.rows("SELECT rank, any_value(device) FROM decode GROUP BY rank"))
    victims: dict[int, list[Cause]] = {}
    for step, rank, name, wait_ns, culprit in engine.rows(
        """SELECT w.step, w.rank, w.name, w.wait_ns, w.culprit_rank FROM collective_waits w ORDER BY w.step, w.wait_ns DESC, w.rank"""
    ):  # one row per victim rank of a slow step
        victims.setdefault(step, []).append(_victim(devices, rank, name, wait_ns, culprit))
    items: list[SlowStep] = []
    for row in rows:  # one per slow step: the output items themselves
        cause = culprit_cause(row, threshold_ms)
        items.append(
            {
                "step": row["slow_step"],
                "interval_ms": ns_to_ms(row["interval_ns"]),
                "excess_ms": ns_to_ms(row["slow_excess_ns"]),
                **cause,
                "critical_path": CriticalPath(via=_phase_of(row["via"]), source=row["source"]),
                "ranks": [cause, *victims.get(row["slow_step"], [])],
            }
        )
    return items


def _stalls(engine: Engine, threshold_ns: int) -> None:
    """Add to ``held`` the collectives that a rank held up from inside, after everyone had arrived.

    On a CPU device the collective runs on the rank's own threads: a
    collection in that process (it holds the interpreter lock) stops its part
    of the exchange, and every rank leaves late although none arrived late.
    Where the collective took the threshold or more after the last arrival,
    the rank whose collections cover at least half of that time held it.
    """
    engine.run(f"""INSERT INTO held
        SELECT step, name, occurrence, rank, '{SOURCE_STALL}', stall_ns FROM (
            SELECT c.step, c.name, c.occurrence, p.rank, c.first_exit_ns - c.last_arrival_ns AS own_ns,
                   sum(least(g.gc_end_ns, c.first_exit_ns) - greatest(g.gc_ts_ns, c.last_arrival_ns)) AS stall_ns
            FROM (SELECT DISTINCT step, name, occurrence, aligned, last_arrival_ns, first_exit_ns FROM waits) c
            JOIN gc g ON g.gc_ts_ns < c.first_exit_ns AND g.gc_end_ns > c.last_arrival_ns
            JOIN processes p ON p.pid = g.pid
            WHERE c.aligned AND c.first_exit_ns - c.last_arrival_ns >= {threshold_ns}
            GROUP BY c.step, c.name, c.occurrence, p.rank, own_ns)
        WHERE stall_ns >= {COLLECTIVE_SHARE} * own_ns""")


def _phase_of(span_name: str) -> str:
    """``device_wall.forward.a2a_wait`` for a device span name; other names unchanged."""
    prefix = fmt.RUNNER_RUN + "."
    return span_name[len(prefix) :] if span_name.startswith(prefix) else span_name


def culprit_cause(row: dict, threshold_ms: float) -> Cause:
    """Why the culprit was late: its validate's, its end's, else its start's cause; ``unattributed`` names what was missing."""
    rank, device = row["culprit_rank"], row["culprit_device"]
    if row["via"] == VIA_STEP_END and row.get("token_mechanism") is not None:  # it gave the step's token late in validate
        cause = cause_item(row, "token", rank, device)
        cause.pop("late_rank", None)
        return cause
    if row.get("end_mechanism") is None:
        return _unattributed(row, fmt.PHASE_RUNNER, "the culprit's run lacks the phases needed to say why")
    which = "end"
    if (row["end_mechanism"] in _NO_CAUSE_OF_ITS_OWN and row.get("end_own_mechanism") is not None) or _own_explains_more(row):
        # the culprit's own evidence: e.g. a collection that stalled it inside a collective after the release,
        # which its device work and its start do not show, or one that explains more than its end's cause
        which = "end_own"
    elif row["end_mechanism"] == fmt.MECH_PEER_WAIT:  # it waited too: what held it back is before its run, if anything
        which = "start" if (row["start_excess_ns"] or 0) > threshold_ms * 1e6 else "end"
    if which == "end" and row["end_mechanism"] == fmt.MECH_PEER_WAIT:
        return _unattributed(
            row, fmt.PHASE_DEVICE_WALL, "the last rank at the collective also waited at another; no single rank held the step"
        )
    cause = cause_item(row, which, rank, device)
    if cause["mechanism"] == fmt.MECH_UNATTRIBUTED and not row["has_waits"]:
        cause["detail"] += f"; no collective {fmt.WAIT_SUFFIX} spans to follow the critical path"
    cause.pop("late_rank", None)
    return cause


def _own_explains_more(row: dict) -> bool:
    """The culprit's own evidence is the answer where its end's cause explains under half the step's excess and it more.

    Its end's cause is judged against the typical rank's end; behind an
    all-to-all every rank ends late together, so that excess can be a
    millisecond while the step lost forty (a collection on the culprit's host
    thread during the fence wait, holding its device thread at the exchange).
    """
    own = row.get("end_own_evidence_ns")
    if row.get("end_own_mechanism") in (None, *_NO_CAUSE_OF_ITS_OWN) or own is None:
        return False
    end = row.get("end_evidence_ns") or 0
    return end < EXPLAINS_SHARE * (row["slow_excess_ns"] or 0) and own > end


def _unattributed(row: dict, phase: str, detail: str) -> Cause:
    """The culprit named, but not why: the step's whole excess, unattributed."""
    return {
        "rank": row["culprit_rank"],
        "device": row["culprit_device"],
        "role": "culprit",
        "phase": phase,
        "mechanism": fmt.MECH_UNATTRIBUTED,
        "evidence_ms": ns_to_ms(row["slow_excess_ns"]),
        "detail": detail,
    }


def _victim(devices: dict, rank: int, name: str, wait_ns: int, culprit: int) -> Cause:
    """A rank that only waited at the critical collective for the culprit."""
    device, culprit_device = devices.get(rank), devices.get(culprit)
    wait_ms = ns_to_ms(wait_ns)
    return {
        "rank": rank,
        "device": device,
        "role": "victim",
        "phase": _phase_of(name),
        "mechanism": fmt.MECH_PEER_WAIT,
        "evidence_ms": wait_ms,
        "detail": f"waited {wait_ms:.3f} ms for rank {culprit} ({culprit_device}) at {_phase_of(name)}",
        "peer": culprit,
    }
