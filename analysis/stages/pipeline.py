"""Depth-2 pipeline check, cadence and achieved depth (docs/FIGURES.md "Pipeline"), as the serving stack checks it.

Which pairs are checked follows the serving stack's own checker
(``strace_timing.py --assert-native-overlap``), so both tools give the same
verdict on the same log.
``tests/test_analysis_pipeline.py::test_native_overlap_rule_matches_the_stack``
rebuilds the stack's rule from docs/FIGURES.md and guards this.
"""

from __future__ import annotations

from dsprof.analysis.stages.runner import stage
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.summary import run_info
from dsprof.analysis.summary_schema import NativeOverlap, Percentiles, Pipeline, PipelineViolation, PrefillPair, RunInfo
from dsprof.analysis.units import ns_to_ms, percentile_blocks
from dsprof.profiler import strace_format as fmt

FIRST_VIOLATIONS = 10
_IDENTITY = fmt.IDENTITY_ATTRS
_HAS_ALL = " AND ".join(f"{a} IS NOT NULL" for a in _IDENTITY)
_HAS_ANY = " OR ".join(f"{a} IS NOT NULL" for a in _IDENTITY)
_I_HAS_ALL = " AND ".join(f"i.{a} IS NOT NULL" for a in _IDENTITY)


def _pairs_sql(identity: bool) -> str:
    """Each checked run joined with the next one of its lane."""
    if identity:
        runs = f"""SELECT i.pid AS lane, i.*, p.rank, coalesce(r.is_decode, FALSE) AS is_decode, d.step AS decode_step,
                          CASE WHEN i.dispatch_id <> 0 THEN i.dispatch_id ELSE i.run_epoch END AS sequence
                   FROM invocations i LEFT JOIN processes p ON p.pid = i.pid
                   LEFT JOIN runs r ON r.pid = i.pid AND r.inv = i.inv LEFT JOIN decode d ON d.pid = i.pid AND d.inv = i.inv
                   WHERE i.n_roots > 0 AND {_I_HAS_ALL} AND (CASE WHEN i.dispatch_id <> 0 THEN i.dispatch_id ELSE i.run_epoch END) <> 0"""
        order = "runner_ts_ns, inv"
    else:
        runs = """SELECT rank AS lane, *, TRUE AS is_decode, step AS decode_step, run_epoch AS sequence FROM decode"""
        order = "coalesce(run_epoch, root_ts_ns), root_ts_ns, inv"
    fields = (
        "pid",
        "rank",
        "is_decode",
        "decode_step",
        "sequence",
        "run_epoch",
        "bind_ts_ns",
        "bind_end_ns",
        "runner_ts_ns",
        "runner_end_ns",
        "claim_ts_ns",
    )
    previous = ", ".join(f"lag({f}) OVER by_lane AS prev_{f}" for f in fields)
    return f"""
    SELECT * FROM (SELECT lane, {", ".join(fields)}, {previous}, lag(inv) OVER by_lane AS prev_inv
                   FROM ({runs}) WINDOW by_lane AS (PARTITION BY lane ORDER BY {order}))
    WHERE prev_inv IS NOT NULL
    """


def _violation_reason() -> str:
    no_overlap = "NOT coalesce(bind_ts_ns < prev_runner_end_ns AND bind_end_ns > prev_runner_ts_ns, FALSE)"
    early = "NOT coalesce(runner_ts_ns >= prev_claim_ts_ns, FALSE)"
    unordered = "coalesce(sequence <= prev_sequence, FALSE)"
    return f"""concat_ws('; ',
        CASE WHEN {no_overlap} THEN 'bind(N+1) does not overlap runner_run(N)' END,
        CASE WHEN {early} THEN 'runner_run(N+1) starts before claim_release(N)' END,
        CASE WHEN {unordered} THEN 'launch order is not monotonic in sequence' END)"""


@stage("pipeline", reads=("spans", "invocations", "processes", "runs", "decode"), in_summary=True)
def pipeline_figures(engine: Engine, performance_summary: dict | None = None) -> Pipeline:
    """The ``pipeline`` block of summary.json; a failed run (``performance_summary``'s exit status) gets no verdict."""
    identity = bool(engine.scalar(f"SELECT count(*) FROM invocations WHERE n_roots > 0 AND ({_HAS_ANY})"))
    engine.run(f"CREATE OR REPLACE TEMP TABLE pairs AS SELECT *, {_violation_reason()} AS reason FROM ({_pairs_sql(identity)})")
    checked, overlapped, early, decode_pairs = engine.rows(
        """SELECT count(*), count(*) FILTER (WHERE reason = ''),
                  count(*) FILTER (WHERE reason LIKE '%claim_release%'), count(*) FILTER (WHERE prev_is_decode)
           FROM pairs"""
    )[0]
    bad: list[PipelineViolation] = (
        engine.arrow(f"""SELECT coalesce(rank, prev_rank) AS rank, pid, run_epoch, decode_step AS step, sequence, reason
                           FROM pairs WHERE reason <> '' ORDER BY runner_ts_ns, lane, prev_inv LIMIT {FIRST_VIOLATIONS}""").to_pylist()
    )
    prefill: list[PrefillPair] = (
        engine.arrow("""SELECT coalesce(rank, prev_rank) AS rank, pid, sequence, prev_sequence, reason = '' AS overlapped, reason
                              FROM pairs WHERE NOT prev_is_decode ORDER BY rank, pid, lane, prev_inv""").to_pylist()
    )
    serialized = checked > 0 and overlapped < checked / 2
    cadence = _cadence(engine)
    depth = _depth(engine, "root_ts_ns", "root_end_ns")
    cadence_p50 = _cadence_p50(engine)
    figures = _unjudged_if_failed(
        Pipeline(
            rule="native identity (serving stack)" if identity else "decode runs by run_epoch",
            pairs_checked=int(checked),
            pairs_overlapped=int(overlapped),
            violations=int(checked - overlapped),
            claim_order_violations=int(early),
            overlap_share=round(overlapped / checked, 4) if checked else None,
            serialized=bool(serialized),
            native_overlap_verified=_native_verdict(engine, identity, checked, overlapped),
            first_violations=bad,
            prefill_pairs=prefill,
            cadence_ms=cadence,
            cadence_p50_ms=cadence_p50,
            achieved_depth=depth,
            runner_depth=_depth(engine, "runner_ts_ns", "runner_end_ns"),
            diagnosis=_diagnosis(engine, int(checked), int(overlapped), int(early), bool(serialized), cadence_p50),
        ),
        run_info(performance_summary),
    )
    if checked and not engine.scalar("SELECT count(*) FROM decode WHERE bind_ts_ns IS NOT NULL"):
        # a source without bind (a Kineto trace) cannot tell a serialized pipeline from an overlapped one
        figures["serialized"] = None
        figures["diagnosis"] = "no verdict: the runs record no bind phase (the overlap of bind(N+1) with runner_run(N) is unknown)"
    return figures


def _unjudged_if_failed(figures: Pipeline, run: RunInfo) -> Pipeline:
    """A run that failed is not a healthy pipeline: ``serialized`` is null (no verdict), ``partial`` says why.

    The overlap figures stay: they describe the steps the run completed.
    """
    status = run["exit_status"]
    failed = status not in (None, 0)
    figures["partial"] = failed
    if failed:
        figures["serialized"] = None
        figures["diagnosis"] = f"no verdict: the run failed (exit status {status}); over the steps it completed: {figures['diagnosis']}"
    return figures


def _native_verdict(engine: Engine, identity: bool, checked: int, overlapped: int) -> NativeOverlap:
    """What the stack's ``--assert-native-overlap`` would answer: verified, or the first reason it refuses."""
    if not identity:
        return {"verified": False, "reason": "no root carries the pipeline identity attributes"}
    partial = engine.scalar(f"SELECT count(*) FROM invocations WHERE n_roots > 0 AND ({_HAS_ANY}) AND NOT ({_HAS_ALL})")
    if partial:
        return {"verified": False, "reason": f"{partial} root(s) miss some identity field(s)"}
    incomplete = engine.scalar(f"""SELECT count(*) FROM invocations WHERE n_roots > 0 AND {_HAS_ALL}
                                   AND (CASE WHEN dispatch_id <> 0 THEN dispatch_id ELSE run_epoch END) <> 0
                                   AND (bind_ts_ns IS NULL OR runner_ts_ns IS NULL OR claim_ts_ns IS NULL)""")
    if incomplete:
        return {"verified": False, "reason": f"{incomplete} run(s) miss bind, runner_run or claim_release"}
    if checked == 0:
        return {"verified": False, "reason": "need at least two complete native runs on one process"}
    if overlapped < checked:
        first = engine.scalar(
            "SELECT reason || ' (pid ' || pid || ', sequence ' || sequence || ')' FROM pairs "
            "WHERE reason <> '' ORDER BY pid, runner_ts_ns, lane, prev_inv LIMIT 1"
        )
        return {"verified": False, "reason": f"{checked - overlapped} of {checked} pairs fail: {first}"}
    return {"verified": True, "reason": f"{checked} adjacent pairs overlap"}


def _cadence(engine: Engine) -> dict[str, Percentiles]:
    engine.run("""CREATE OR REPLACE TEMP TABLE cadence AS
        SELECT rank, runner_ts_ns - lag(runner_ts_ns) OVER (PARTITION BY rank ORDER BY runner_ts_ns) AS cadence_ns
        FROM decode WHERE runner_ts_ns IS NOT NULL""")
    return {rank: blocks["cadence"] for rank, blocks in percentile_blocks(engine, "cadence", {"cadence": "cadence_ns"}, by="rank").items()}


def _cadence_p50(engine: Engine) -> float | None:
    value = engine.scalar("SELECT median(cadence_ns) FROM cadence")
    return None if value is None else ns_to_ms(value)


def _depth(engine: Engine, start: str, end: str) -> dict[str, float]:
    """Per rank: Σ durations of the intervals / length of their union (sort, merge with a running max)."""
    rows = engine.rows(f"""
        WITH spans AS (SELECT rank, {start} AS s, {end} AS e FROM decode WHERE {start} IS NOT NULL AND {end} IS NOT NULL),
        marked AS (SELECT rank, s, e, CASE WHEN s <= max(e) OVER (PARTITION BY rank ORDER BY s, e
                                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 0 ELSE 1 END AS opens
                   FROM spans),
        blocks AS (SELECT rank, s, e, sum(opens) OVER (PARTITION BY rank ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS block FROM marked),
        unions AS (SELECT rank, sum(block_end - block_start) AS covered FROM
                   (SELECT rank, block, min(s) AS block_start, max(e) AS block_end FROM blocks GROUP BY rank, block) GROUP BY rank)
        SELECT rank, (SELECT sum(e - s) FROM spans x WHERE x.rank = u.rank) / covered FROM unions u ORDER BY rank""")
    return {str(rank): round(float(value), 3) for rank, value in rows if value is not None}


def _diagnosis(
    engine: Engine, checked: int, overlapped: int, claim_order_violations: int, serialized: bool, cadence_p50_ms: float | None
) -> str:
    cadence = "n/a" if cadence_p50_ms is None else f"{cadence_p50_ms:.3f} ms"
    if checked == 0:
        return "not checked: no rank has two adjacent decode runs"
    if not serialized:
        where = "every pair" if overlapped == checked else f"{overlapped} of {checked} pairs"
        return f"pipelined: bind(N+1) overlaps runner_run(N) on {where}; cadence p50 {cadence}"
    no_overlap = engine.scalar("SELECT count(*) FROM pairs WHERE reason LIKE '%does not overlap%'")
    if no_overlap * 2 < checked:
        return (
            f"unordered: runner_run(N+1) starts before claim_release(N) in {claim_order_violations} of {checked} pairs; "
            f"cadence p50 {cadence}"
        )
    ranks_serial, ranks = engine.rows("""SELECT count(DISTINCT coalesce(rank, prev_rank)) FILTER (WHERE reason LIKE '%does not overlap%'),
                                                count(DISTINCT coalesce(rank, prev_rank)) FROM pairs""")[0]
    on = "all ranks" if ranks_serial == ranks else f"{ranks_serial} of {ranks} ranks"
    bind, runner, root = (
        ns_to_ms(v or 0)
        for v in engine.rows(
            "SELECT median(bind_end_ns - bind_ts_ns), median(runner_end_ns - runner_ts_ns), median(root_end_ns - root_ts_ns) FROM decode"
        )[0]
    )
    return (
        f"serialized: bind(N+1) starts after runner_run(N) ends in {no_overlap} of {checked} pairs on {on}; "
        f"cadence {cadence} ≈ bind {bind:.3f} + runner_run {runner:.3f} ms (root {root:.3f} ms)"
    )
