"""Late starts, tail steps, and the cause of every run of a flagged step (docs/FIGURES.md "Causes").

Everything here is SQL over the engine's ``decode`` table (one row per rank and
step) and ``gc`` table, so it runs unchanged on a day-long soak. The steps:

1. ``cells``: each run of a flagged step (late start, tail or slow step, and
   the two before it) with its phase durations, host evidence, garbage
   collection inside its phase windows, and what it waited for on its own rank
   (claim_release of the previous run, the previous user of its ping-pong
   slot, the drain of the previous run).
2. For every quantity, the median over the *other* ranks of the same step: the
   typical rank. A cell's excess is its value minus that median.
3. The decision, per cell, for its start and for its end, by the rules of
   :mod:`dsprof.analysis.stages.cause_rules`; a carried-over start or end with a
   material cause of its own names that cause; then carry-over chains are
   followed back to the step where they began (they pass only through runs
   late for no reason of their own).

A late start (r, s): start(runner_run) − min_r start > threshold. A tail step:
runner-end skew > threshold; its late ranks are the rank that ended last plus
every rank whose end exceeds the typical end by more than the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from dsprof.analysis.ingest.kineto import HOST_GAP
from dsprof.analysis.stages.cause_rules import (
    EXPLAINS_SHARE,
    PHASE_NEXT_BIND,
    Rule,
    end_rules,
    excess_of,
    own_rules,
    rule_field_sql,
    rule_index_sql,
    start_rules,
    token_rules,
)
from dsprof.analysis.stages.collectives import arrived_last
from dsprof.analysis.stages.runner import stage
from dsprof.analysis.stages.tables import TABLES
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.summary_schema import CarriedOver, Cause, LateRank, LateStart, Straggler, TailStep, TailSteps
from dsprof.analysis.units import ns_to_ms
from dsprof.profiler import strace_format as fmt

# Quantities compared with the typical rank of the same step (medians over the other ranks).
_COMPARED = (
    "start_ns",
    "end_ns",
    "root_ts_ns",
    "admissible_ns",
    "drain_after_ns",
    "bind_ns",
    "launch_gap_ns",
    "runner_ns",
    "fence_ns",
    "drain_lag_ns",
    "signal_lag_ns",
    "next_bind_ns",
    "next_bind_cpu_ns",
    "next_bind_rq_ns",
    "device_wall_ns",
    "device_wait_ns",
    "device_wait_rq_ns",
    "device_work_ns",
    "bind_rq_ns",
    "bind_cpu_ns",
    "runner_rq_ns",
    "runner_cpu_ns",
    "fence_rq_ns",
    "fence_cpu_ns",
    "device_rq_ns",
    "device_cpu_ns",
    "validate_end_ns",
    "validate_ns",
    "validate_rq_ns",
    "validate_cpu_ns",
)


def _cells_sql() -> str:
    """One row per decode run: times, durations, evidence and its predecessors on the rank.

    ``host_at_fence_ns``: when the host thread reached the run's completion fence: its fence wait's start, else
    (no device-phase markers) when it finished what it does before that drain in the depth-2 loop: the previous
    run's validate, the next run's bind and launch (at most the run's end).
    """
    slot = "coalesce(slot_id, position % 2)"
    host_at = """coalesce(fence_ts_ns, least(greatest(lag(validate_end_ns) OVER by_rank, lead(claim_ts_ns) OVER by_rank), runner_end_ns))"""
    return f"""
    SELECT rank, step, position, device, pid, slot_id,
           runner_ts_ns AS start_ns, runner_end_ns AS end_ns, root_ts_ns, root_end_ns,
           bind_ts_ns, bind_end_ns, fence_ts_ns, fence_end_ns, validate_ts_ns, validate_end_ns,
           bind_end_ns - bind_ts_ns AS bind_ns,
           runner_ts_ns - bind_end_ns AS launch_gap_ns,
           runner_end_ns - runner_ts_ns AS runner_ns,
           fence_end_ns - fence_ts_ns AS fence_ns,
           validate_end_ns - validate_ts_ns AS validate_ns,
           {host_at} AS host_at_fence_ns,
           {host_at} - runner_ts_ns AS drain_lag_ns,
           runner_end_ns - greatest({host_at}, CAST(runner_ts_ns AS HUGEINT) + device_ts_ns + device_wall_ns) AS signal_lag_ns,
           device_wall_ns,
           CASE WHEN device_markers > 0 THEN coalesce(device_wait_ns, 0) END AS device_wait_ns,
           device_wall_ns - coalesce(device_wait_ns, 0) AS device_work_ns,
           CASE WHEN device_markers > 0 THEN device_wait_rq_ns END AS device_wait_rq_ns,
           device_markers,
           bind_rq_ns, bind_cpu_ns, runner_rq_ns, runner_cpu_ns, fence_rq_ns, fence_cpu_ns, device_rq_ns, device_cpu_ns,
           validate_rq_ns, validate_cpu_ns,
           lead(step) OVER by_rank AS next_step,
           lead(bind_ts_ns) OVER by_rank AS next_bind_ts_ns, lead(bind_end_ns) OVER by_rank AS next_bind_end_ns,
           lead(bind_end_ns - bind_ts_ns) OVER by_rank AS next_bind_ns,
           lead(bind_cpu_ns) OVER by_rank AS next_bind_cpu_ns, lead(bind_rq_ns) OVER by_rank AS next_bind_rq_ns,
           lag(claim_ts_ns) OVER by_rank AS previous_claim_ns,
           lag(step) OVER by_rank AS previous_step,
           lag(root_end_ns) OVER by_rank AS drain_after_ns,
           lag(root_end_ns) OVER (PARTITION BY rank, {slot} ORDER BY position) AS slot_free_ns,
           lag(step) OVER (PARTITION BY rank, {slot} ORDER BY position) AS slot_step
    FROM decode
    WHERE runner_ts_ns IS NOT NULL AND runner_end_ns IS NOT NULL
    WINDOW by_rank AS (PARTITION BY rank ORDER BY position)
    """


def _with(ctes: dict[str, str], select: str, materialized: tuple[str, ...] = ()) -> str:
    """One query: ``WITH name AS (body), ... select``; the CTEs named in ``materialized`` are computed once."""
    parts = [f"{name} AS {'MATERIALIZED ' if name in materialized else ''}({body})" for name, body in ctes.items()]
    return "WITH " + ",\n     ".join(parts) + f"\n{select}"


def _flagged_sql(threshold_ns: int) -> str:
    """CTE: the steps with a late start, a tail or a slow interval."""
    return f"""SELECT step FROM steps WHERE runner_start_skew_ns > {threshold_ns} OR runner_end_skew_ns > {threshold_ns}
               UNION SELECT step FROM step_intervals WHERE slow"""


def _wanted_sql() -> str:
    """CTE: the flagged steps and the two before each (what a carry-over chain looks back to)."""
    return """SELECT DISTINCT d.step FROM (SELECT DISTINCT step, position FROM decode) d
              JOIN (SELECT DISTINCT position FROM decode WHERE step IN (SELECT step FROM flagged)) f
              ON d.position BETWEEN f.position - 2 AND f.position"""


def _admissible_sql() -> str:
    """CTE: the wanted runs, with ``admissible_ns``, the later of the previous run's claim and the slot's release."""
    return f"""SELECT *, CAST(CASE WHEN previous_claim_ns IS NULL THEN slot_free_ns WHEN slot_free_ns IS NULL THEN previous_claim_ns
                                   ELSE greatest(previous_claim_ns, slot_free_ns) END AS BIGINT) AS admissible_ns
               FROM ({_cells_sql()}) WHERE step IN (SELECT step FROM wanted)"""


def _long_sql(columns: tuple[str, ...]) -> str:
    """CTE: the compared columns of ``runs`` unpivoted into (run, name, x) rows."""
    values = ", ".join(f"CAST({c} AS HUGEINT) AS {c}" for c in columns)
    return f"UNPIVOT (SELECT step, rank, position, {values} FROM runs) ON {', '.join(columns)} INTO NAME name VALUE x"


def _sorted_sql() -> str:
    """CTE: per step and column, the sorted values and their count."""
    return "SELECT step, name, list(x ORDER BY x) AS v, count(*) AS n FROM long GROUP BY step, name"


def _others_median_sql() -> str:
    """CTE: per run and column, the median of the other ranks' values (see :func:`_typical_ctes`)."""

    def remaining(k: str) -> str:  # DuckDB lists are 1-based
        return f"(CASE WHEN v[{k} + 1] < x THEN v[{k} + 1] ELSE v[{k} + 2] END)"

    return f"""SELECT l.step, l.rank, l.position,
                      CASE WHEN n >= 2 THEN ({remaining("((n - 2) // 2)")} + {remaining("((n - 1) // 2)")}) / 2.0 END AS typ, l.name
               FROM long l JOIN sorted USING (step, name)"""


def _wide_sql() -> str:
    """CTE: one map of the typical values per run."""
    return """SELECT step, rank, position, map_from_entries(list(struct_pack(k := name, v := typ))) AS typ
              FROM others_median GROUP BY step, rank, position"""


def _typed_sql(columns: tuple[str, ...]) -> str:
    """CTE: every run with ``<column>_typ`` for each compared column, and ``root_typ_ns``."""
    typical = ", ".join(f"w.typ['{c}'] AS {c}_typ" for c in columns)
    return f"""SELECT *, CAST(root_ts_ns_typ AS BIGINT) AS root_typ_ns
               FROM (SELECT c.*, {typical} FROM runs c LEFT JOIN wide w USING (step, rank, position))"""


def _typical_ctes(columns: tuple[str, ...]) -> dict[str, str]:
    """CTEs ending in ``typed``: each run of ``runs`` with the median of each column over the *other* ranks of the step.

    The columns are unpivoted into (run, column, value) rows, so that one
    median expression serves them all, and come back through one map per run:
    a wide form costs DuckDB more to plan than to run on the few steps
    diagnosed. Each (step, column) keeps its sorted values v (0-based); the
    median of the others then needs only the run's own value x: with n values,
    the others' median averages remaining[a] and remaining[b] (a = (n - 2) // 2,
    b = (n - 1) // 2), and removing x (its first copy) leaves remaining[k] =
    v[k] where v[k] < x, else v[k + 1].
    """
    return {
        "long": _long_sql(columns),
        "sorted": _sorted_sql(),
        "others_median": _others_median_sql(),
        "wide": _wide_sql(),
        "typed": _typed_sql(columns),
    }


def _gc_overlap(start: str, end: str) -> str:
    """Nanoseconds of garbage collection on the cell's process inside [start, end] (GC holds the GIL: any thread)."""
    return f"""coalesce((SELECT sum(greatest(0, least(g.gc_end_ns, c.{end}) - greatest(g.gc_ts_ns, c.{start})))
                         FROM gc g WHERE g.pid = c.pid AND g.gc_ts_ns < c.{end} AND g.gc_end_ns > c.{start}), 0)"""


_GC_WINDOWS = {
    "gc_bind": ("bind_ts_ns", "bind_end_ns"),
    "gc_fence": ("fence_ts_ns", "fence_end_ns"),
    "gc_validate": ("validate_ts_ns", "validate_end_ns"),
    "gc_next_bind": ("next_bind_ts_ns", "next_bind_end_ns"),
    "gc_run": ("start_ns", "end_ns"),
    "gc_gap": ("bind_end_ns", "start_ns"),
    "gc_before": ("root_typ_ns", "root_ts_ns"),
}


def _build_cells(engine: Engine, threshold_ns: int) -> None:
    """``cells`` of the steps that need a diagnosis, with their typical values and GC overlaps.

    Only steps with a late start or a tail, and the two before each (what a
    carry-over chain looks back to), are diagnosed: a healthy soak costs nothing
    here however long it is.
    """
    gc_columns = ", ".join(f"{_gc_overlap(*window)} AS {name}" for name, window in _GC_WINDOWS.items())
    ctes = {"flagged": _flagged_sql(threshold_ns), "wanted": _wanted_sql(), "runs": _admissible_sql(), **_typical_ctes(_COMPARED)}
    select = f"SELECT c.*, {gc_columns} FROM typed c"
    # ``sorted`` computed once: inlined, DuckDB sorted each (step, column)'s list again for every run and every
    # element taken from it (0.8 s of a 200-step window of 64 ranks with 8 faulty steps, benchmarks/README.md)
    engine.run(f"CREATE OR REPLACE TEMP TABLE cells AS {_with(ctes, select, materialized=('runs', 'sorted'))}")


def _rule_sets(threshold_ns: int) -> dict[str, list[Rule]]:
    """The rule lists, by the prefix of the verdict columns they decide (``start_own``: ``start_own_phase``, ...)."""
    return {
        "start": start_rules(excess_of("start_ns")),
        "end": end_rules(threshold_ns),
        "start_own": own_rules(threshold_ns, "start"),
        "end_own": own_rules(threshold_ns, "end"),
        "token": token_rules(),
    }


def _ruled_sql(rule_sets: dict[str, list[Rule]]) -> str:
    """CTE: every cell with ``<name>_rule``, the position of the first rule of each list that holds."""
    picks = ", ".join(f"{rule_index_sql(rules)} AS {name}_rule" for name, rules in rule_sets.items())
    return f"SELECT c.*, {picks} FROM cells c"


def _verdicts_sql(rule_sets: dict[str, list[Rule]]) -> str:
    """CTE: each list's chosen rule as phase, mechanism, evidence and detail; excesses, end skew and the latest rank."""
    columns = []
    for name, rules in rule_sets.items():
        index = f"{name}_rule"
        columns += [
            f"{rule_field_sql(rules, index, 'phase')} AS {name}_phase",
            f"{rule_field_sql(rules, index, 'mechanism')} AS {name}_mechanism",
            f"CAST({rule_field_sql(rules, index, 'evidence')} AS DOUBLE) AS {name}_evidence_ns",
            f"{rule_field_sql(rules, index, 'detail')} AS {name}_detail",
        ]
    rule_columns = ", ".join(f"{name}_rule" for name in rule_sets)
    return f"""SELECT c.* EXCLUDE ({rule_columns}), {", ".join(columns)},
                      c.start_ns - min(c.start_ns) OVER (PARTITION BY c.step) AS start_excess_ns,
                      c.end_ns - c.end_ns_typ AS end_excess_ns,
                      max(c.end_ns) OVER (PARTITION BY c.step) - min(c.end_ns) OVER (PARTITION BY c.step) AS end_skew_ns,
                      arg_max(c.rank, (c.end_ns, -c.rank)) OVER (PARTITION BY c.step) AS latest_end_rank
               FROM ruled c"""


def _peers_sql(threshold_ns: int) -> str:
    """CTE: the verdicts with ``last_arrival_rank``, the peer a waiting rank's end waited for.

    A question about its whole step, not one collective, asked of the ranks'
    total waits. The last arrival's rule (analysis/stages/collectives.py) on the
    wait axis: of the other ranks that ended late in the step (else of all the
    others), the one that waited least reached the collectives last.
    """
    late_first = f"(NOT (o.end_excess_ns > {threshold_ns} / 2), coalesce(o.device_wait_ns, 0))"
    return f"""SELECT v.*, p.last_arrival_rank FROM verdicts v LEFT JOIN (
                   SELECT d.step, d.rank, {arrived_last("o.rank", late_first)} AS last_arrival_rank
                   FROM (SELECT step, rank FROM verdicts WHERE end_mechanism = '{fmt.MECH_PEER_WAIT}') d
                   JOIN verdicts o ON o.step = d.step AND o.rank <> d.rank GROUP BY d.step, d.rank) p USING (step, rank)"""


_VERDICT_FIELDS = ("phase", "mechanism", "evidence_ns", "detail")


def _own_over_carried_sql() -> str:
    """CTE: a carried-over start or end with a material cause of its own names that cause; the carried part is kept beside it."""
    replaced, carried = [], []
    for w in ("start", "end"):
        is_carried = f"{w}_mechanism = '{fmt.MECH_CARRIED_OVER}'"
        has_own = f"{is_carried} AND {w}_own_mechanism IS NOT NULL"
        replaced += [f"CASE WHEN {has_own} THEN {w}_own_{field} ELSE {w}_{field} END AS {w}_{field}" for field in _VERDICT_FIELDS]
        carried += [
            f"CAST(CASE WHEN {is_carried} THEN {w}_evidence_ns END AS DOUBLE) AS {w}_carried_ns",
            f"CAST(CASE WHEN {is_carried} THEN {w}_phase END AS VARCHAR) AS {w}_carried_phase",
        ]
    return f"SELECT * REPLACE ({', '.join(replaced)}), {', '.join(carried)} FROM peers"


def _flags_sql(threshold_ns: int) -> str:
    """The final SELECT: an end held by the next run's bind names that step, and the late flags."""
    next_bind = f"end_phase = '{PHASE_NEXT_BIND}'"
    return f"""SELECT * REPLACE (CASE WHEN {next_bind} THEN '{fmt.PHASE_BIND}' ELSE end_phase END AS end_phase),
                      CAST(CASE WHEN {next_bind} THEN next_step END AS BIGINT) AS end_evidence_step,
                      start_excess_ns > {threshold_ns} AS late_start,
                      end_skew_ns > {threshold_ns} AND (rank = latest_end_rank OR end_excess_ns > {threshold_ns}) AS late_end
               FROM own"""


def _decide(engine: Engine, threshold_ns: int) -> None:
    """``decided``: ``cells`` with the start and end causes and the late flags."""
    rule_sets = _rule_sets(threshold_ns)
    ctes = {
        "ruled": _ruled_sql(rule_sets),
        "verdicts": _verdicts_sql(rule_sets),
        "peers": _peers_sql(threshold_ns),
        "own": _own_over_carried_sql(),
    }
    engine.run(f"CREATE OR REPLACE TEMP TABLE decided AS {_with(ctes, _flags_sql(threshold_ns), materialized=('verdicts',))}")


def _device_steps_sql() -> str:
    """CTE: the steps with a device cause, start or end."""
    return f"SELECT DISTINCT step FROM decided WHERE (end_mechanism = '{fmt.MECH_DEVICE}' OR start_mechanism = '{fmt.MECH_DEVICE}')"


def _device_spans_sql() -> str:
    """CTE: per run of those steps, the device-clock time of each span name below device_wall (waits left out)."""
    return f"""SELECT r.step, r.rank, s.name, sum(s.dur_ns) AS dur_ns
               FROM spans s JOIN (SELECT d.pid, d.inv, d.step, d.rank FROM decode d JOIN device_steps USING (step)) r
                    ON r.pid = s.pid AND r.inv = s.inv
               WHERE s.clk = '{fmt.CLK_DEVICE}' AND starts_with(s.name, '{fmt.DEVICE_WALL}.')
                 AND NOT ends_with(s.name, '{fmt.WAIT_SUFFIX}') GROUP BY r.step, r.rank, s.name"""


def _device_phases_sql() -> str:
    """CTE: each such span's depth and its excess over the mean of the other ranks of the step."""
    return """SELECT step, rank, name, length(name) - length(replace(name, '.', '')) AS depth,
                     dur_ns - (sum(dur_ns) OVER (PARTITION BY step, name) - dur_ns) / nullif(count(*) OVER (PARTITION BY step, name) - 1, 0)
                     AS excess_ns
              FROM device_spans"""


def _deepest_sql() -> str:
    """CTE: per run with a device cause, the deepest sub-phase whose excess is at least half the device excess."""
    prefix = len(fmt.RUNNER_RUN) + 2  # SQL substr is 1-based
    return f"""SELECT d.step, d.rank, arg_max(substr(p.name, {prefix}), (p.depth, p.excess_ns)) AS phase
               FROM decided d JOIN device_phases p ON p.step = d.step AND p.rank = d.rank
               WHERE d.end_mechanism = '{fmt.MECH_DEVICE}' AND p.excess_ns >= {EXPLAINS_SHARE} * d.end_evidence_ns
               GROUP BY d.step, d.rank"""


def _deeper_sql() -> str:
    """CTE: ``decided`` with a device_wall end named by its deepest sub-phase."""
    return f"""SELECT d.* REPLACE (CASE WHEN d.end_phase = '{fmt.PHASE_DEVICE_WALL}' THEN coalesce(p.phase, d.end_phase)
                                       ELSE d.end_phase END AS end_phase)
               FROM decided d LEFT JOIN deepest p USING (step, rank)"""


def _host_gap_sql() -> str:
    """CTE: a Kineto run's time in which the host ran no op and the device no kernel: the host launched nothing (SPEC §1.1)."""
    gap = f"end_phase = '{HOST_GAP[len(fmt.RUNNER_RUN) + 1 :]}' AND end_mechanism = '{fmt.MECH_DEVICE}'"
    return f"""SELECT * REPLACE (CASE WHEN {gap} THEN '{fmt.MECH_HOST_CPU}' ELSE end_mechanism END AS end_mechanism,
                                 CASE WHEN {gap} THEN '{HOST_GAP_DETAIL}' ELSE end_detail END AS end_detail)
               FROM deeper"""


HOST_GAP_DETAIL = "more time with no op, kernel or collective before the launches (CPU-bound or launch-bound host)"


def _device_phase_ctes(engine: Engine) -> dict[str, str]:
    """CTEs ending in ``refined``: ``decided`` with the deepest device sub-phase that explains a device cause (e.g. ``device_wall.verify``).

    Each device-clock span below device_wall of the runs in question is
    compared with the mean of the same span on the other ranks of the step; the
    deepest one whose excess is at least half the device excess is named.
    Only the few steps with a device cause are read, and none when no cause
    is on device_wall.
    """
    wanted = " OR ".join(f"({w}_mechanism = '{fmt.MECH_DEVICE}' AND {w}_phase = '{fmt.PHASE_DEVICE_WALL}')" for w in ("start", "end"))
    if not engine.scalar(f"SELECT count(*) FROM decided WHERE {wanted}"):
        return {"refined": "SELECT * FROM decided"}
    return {
        "device_steps": _device_steps_sql(),
        "device_spans": _device_spans_sql(),
        "device_phases": _device_phases_sql(),
        "deepest": _deepest_sql(),
        "deeper": _deeper_sql(),
        "refined": _host_gap_sql(),
    }


def _chain_origins(engine: Engine, threshold_ns: int) -> None:
    """``origins``: for carried_over causes, the step where the chain began (``start_from_step`` / ``end_from_step``).

    A carried-over start or end points at what held it back on its rank: the
    previous run's start (its claim_release admits this launch), or the end of
    the slot's previous run (slot reuse) or of the previous run (the drain). A
    chain continues only through a start or end that was itself carried over;
    it ends at one with a cause of its own. Pointer jumping (every round, each
    node jumps to its ancestor's ancestor) follows a chain of length L in log L
    rounds.
    """
    claim = "previous_claim_ns >= coalesce(slot_free_ns, previous_claim_ns)"
    carried = f"= '{fmt.MECH_CARRIED_OVER}'"
    half = f"{threshold_ns} / 2"
    # a link leaves every start or end that was held back; a chain passes only through one that was late for no reason
    # of its own (still carried over, and late by a material amount: a start held back by microseconds is not late)
    engine.run(f"""CREATE OR REPLACE TEMP TABLE links AS
        SELECT rank, step, 'start' AS kind, CASE WHEN {claim} THEN previous_step ELSE slot_step END AS next_step,
               CASE WHEN {claim} THEN 'start' ELSE 'end' END AS next_kind,
               coalesce(start_mechanism {carried} AND {excess_of("start_ns")} > {half}, FALSE) AS through
        FROM decided WHERE start_carried_ns IS NOT NULL
        UNION ALL
        SELECT rank, step, 'end',
               CASE WHEN end_carried_phase = '{fmt.PHASE_RUNNER}' THEN previous_step WHEN {claim} THEN previous_step ELSE slot_step END,
               CASE WHEN end_carried_phase = '{fmt.PHASE_RUNNER}' THEN 'end' WHEN {claim} THEN 'start' ELSE 'end' END,
               coalesce(end_mechanism {carried} AND end_excess_ns > {half}, FALSE)
        FROM decided WHERE end_carried_ns IS NOT NULL""")
    engine.run(
        """CREATE OR REPLACE TEMP TABLE ancestor AS SELECT rank, step, kind, next_step AS anc_step, next_kind AS anc_kind FROM links"""
    )
    engine.run("CREATE OR REPLACE TEMP TABLE passable AS SELECT rank, step, kind FROM links WHERE through")
    jump = """FROM ancestor a JOIN ancestor p ON p.rank = a.rank AND p.step = a.anc_step AND p.kind = a.anc_kind
              JOIN passable t ON t.rank = a.rank AND t.step = a.anc_step AND t.kind = a.anc_kind"""
    while engine.scalar(f"SELECT count(*) {jump} WHERE p.anc_step IS DISTINCT FROM a.anc_step OR p.anc_kind IS DISTINCT FROM a.anc_kind"):
        engine.run(f"""CREATE OR REPLACE TEMP TABLE ancestor AS
            SELECT a.rank, a.step, a.kind, coalesce(j.anc_step, a.anc_step) AS anc_step, coalesce(j.anc_kind, a.anc_kind) AS anc_kind
            FROM ancestor a LEFT JOIN (SELECT a.rank, a.step, a.kind, p.anc_step, p.anc_kind {jump}) j
                 ON j.rank = a.rank AND j.step = a.step AND j.kind = a.kind""")
    # a chain that stops at an end held by the next run's bind began at that run
    engine.run("""CREATE OR REPLACE TEMP TABLE origins AS
        SELECT a.rank, a.step, a.kind, CASE WHEN a.anc_kind = 'end' THEN coalesce(o.end_evidence_step, a.anc_step) ELSE a.anc_step END
               AS origin_step
        FROM ancestor a LEFT JOIN decided o ON o.rank = a.rank AND o.step = a.anc_step""")


def _write_diagnosed(engine: Engine) -> None:
    """``diagnosed``: ``decided`` with its device sub-phases and the origins of its carry-over chains."""
    select = """SELECT d.*, s.origin_step AS start_from_step, e.origin_step AS end_from_step
        FROM refined d
        LEFT JOIN origins s ON s.rank = d.rank AND s.step = d.step AND s.kind = 'start'
        LEFT JOIN origins e ON e.rank = d.rank AND e.step = d.step AND e.kind = 'end'"""
    engine.run(f"CREATE OR REPLACE TABLE diagnosed AS {_with(_device_phase_ctes(engine), select)}")


@dataclass
class Diagnosis:
    """Every late start and every tail step's late ranks, with their causes (summary.json items)."""

    late_starts: list[LateStart]
    tail_steps: list[TailStep]


@stage("causes", reads=("decode", "steps", "step_intervals", "gc", "spans"), writes=("diagnosed",))
def diagnose(engine: Engine, threshold_ms: float) -> Diagnosis:
    """Decide the cause of every run of a flagged step (late start, tail or slow step) and list the late ones."""
    threshold_ns = int(round(threshold_ms * 1e6))
    if not engine.scalar(f"SELECT count(*) FROM ({_flagged_sql(threshold_ns)})"):
        # nothing to diagnose: the same empty table, without planning a dozen queries over no rows (a healthy window)
        columns = ", ".join(f'"{column.name}" {column.type}' for column in TABLES["diagnosed"].columns)
        engine.run(f"CREATE OR REPLACE TABLE diagnosed ({columns})")
        return Diagnosis(late_starts=[], tail_steps=[])
    _build_cells(engine, threshold_ns)
    _decide(engine, threshold_ns)
    _chain_origins(engine, threshold_ns)  # before the device sub-phases: they change no column a chain reads
    _write_diagnosed(engine)
    return Diagnosis(late_starts=_late_start_items(engine), tail_steps=_tail_items(engine))


def cause_item(row: dict, which: str, late_rank: int, late_device: str) -> Cause:
    """One cause, as summary.json items carry it; a victim names its culprit as ``rank``."""
    mechanism = row[f"{which}_mechanism"]
    evidence_ms = ns_to_ms(max(0.0, row[f"{which}_evidence_ns"] or 0.0))
    item = Cause(
        rank=late_rank,
        device=late_device,
        phase=row[f"{which}_phase"],
        mechanism=mechanism,
        evidence_ms=evidence_ms,
        detail=row[f"{which}_detail"],
        role="culprit",
    )
    if which == "end" and row.get("end_evidence_step") is not None:
        item["evidence_step"] = row["end_evidence_step"]  # the run whose phase holds the evidence
    if mechanism == fmt.MECH_CARRIED_OVER:
        item["from_step"] = row[f"{which}_from_step"]
    elif row.get(f"{which}_carried_ns") is not None and row.get(f"{which}_from_step") is not None:
        # its own cause, and lateness carried over from an earlier step beside it
        item["carried_over"] = CarriedOver(from_step=row[f"{which}_from_step"], evidence_ms=ns_to_ms(max(0.0, row[f"{which}_carried_ns"])))
    if mechanism == fmt.MECH_PEER_WAIT:
        peer = row["last_arrival_rank"]
        # the keys it had keep their places; peer comes last
        item["role"] = "victim"
        item["rank"] = peer
        item["device"] = row["peer_device"]
        item["peer"] = peer
        item["detail"] = f"waited {evidence_ms:.3f} ms for rank {peer} (it reached the collective last)"
    else:
        item["detail"] = f"{evidence_ms:.3f} ms {item['detail']}"
    item["late_rank"] = late_rank
    return item


_ITEM_COLUMNS = """d.*, p.device AS peer_device"""
_PEER_JOIN = "LEFT JOIN (SELECT DISTINCT rank, device FROM decode) p ON p.rank = d.last_arrival_rank"


def _late_start_items(engine: Engine) -> list[LateStart]:
    rows = engine.arrow(f"SELECT {_ITEM_COLUMNS} FROM diagnosed d {_PEER_JOIN} WHERE late_start ORDER BY step, d.rank").to_pylist()
    items: list[LateStart] = []
    for row in rows:  # one per late start: the output items themselves
        cause = cause_item(row, "start", row["rank"], row["device"])
        typical = row["start_ns"] - row["start_ns_typ"] if row["start_ns_typ"] is not None else row["start_excess_ns"]
        items.append(
            {"step": row["step"], **cause, "excess_ms": ns_to_ms(row["start_excess_ns"]), "typical_excess_ms": ns_to_ms(max(0.0, typical))}
        )
    return items


def _tail_items(engine: Engine) -> list[TailStep]:
    rows = engine.arrow(f"""SELECT {_ITEM_COLUMNS} FROM diagnosed d {_PEER_JOIN} WHERE late_end
                            ORDER BY step, end_ns DESC, d.rank""").to_pylist()
    steps: list[tuple[dict, list[LateRank]]] = []  # each tail step's first row, and its late ranks
    for row in rows:  # one per late rank of a tail step
        late: LateRank = {
            **cause_item(row, "end", row["rank"], row["device"]),
            "excess_ms": ns_to_ms(max(0.0, row["end_excess_ns"] or 0.0)),
        }
        if steps and steps[-1][0]["step"] == row["step"]:
            steps[-1][1].append(late)
            continue
        steps.append((row, [late]))
    return [_tail_item(row, ranks) for row, ranks in steps]


def _tail_item(row: dict, ranks: list[LateRank]) -> TailStep:
    """A tail step with the cause of its culprit: the latest-ending rank that is not a victim, else the latest."""
    primary = next((r for r in ranks if r["role"] == "culprit"), ranks[0])
    culprit = cast(Cause, {k: v for k, v in primary.items() if k != "excess_ms"})
    skew_ms = ns_to_ms(row["end_skew_ns"])
    return {"step": row["step"], "runner_end_skew_ms": skew_ms, "excess_ms": skew_ms, "ranks": ranks, **culprit}


def tail_block(tails: list[TailStep], threshold_ms: float, straggler: Straggler) -> TailSteps:
    """The ``tail_steps`` block of summary.json: the items, which devices they fall on, and the straggler verdict."""
    devices: dict[str, int] = {}
    for item in tails:  # one per tail step
        device = cast(str, item["device"])  # null where a victim's peer has no device: JSON writes that key "null"
        devices[device] = devices.get(device, 0) + 1
    return TailSteps(
        threshold_ms=threshold_ms,
        count=len(tails),
        items=tails,
        same_device=None if not tails else len(devices) == 1,
        devices=devices,
        straggler=straggler,
    )
