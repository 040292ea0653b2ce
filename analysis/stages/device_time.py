"""The device-time breakdown (SPEC §1.1, docs/FIGURES.md "Device time"): per rank and per step, from device activities.

A source that records device activities (a Kineto trace: kernels, memcpy,
memset) gives each as an ``activity.<kind>`` span below its step's
device_wall (:mod:`dsprof.analysis.ingest.kineto`). Over a rank's profiled
window, and over each step's activities: span = last end − first start,
busy = the union of every activity (all streams together), idle = span −
busy, compute = the union of the computation kernels, non-compute = span −
idle − compute. Unions are one windowed sort per group in DuckDB
(:mod:`dsprof.analysis.store.intervals`). A source without device activities gets
no breakdown: the section is absent, never zero.
"""

from __future__ import annotations

from dsprof.analysis.ingest.kineto import ACTIVITY
from dsprof.analysis.stages.runner import stage
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.store.intervals import union_sql
from dsprof.analysis.summary_schema import DeviceTime, DeviceTimeFigures, DeviceTimeStep
from dsprof.analysis.units import ns_to_ms
from dsprof.profiler import strace_format as fmt

COMPUTE_KIND = "compute"


def _breakdown_sql(keys: str, order: str) -> str:
    """SQL: per ``keys``, span, busy and compute (ns) of the ``activities`` table."""
    busy = union_sql("activities", keys)
    compute = union_sql(f"(SELECT * FROM activities WHERE kind = '{COMPUTE_KIND}')", keys)
    using = ", ".join(k.strip() for k in keys.split(","))
    return f"""SELECT {keys}, max(hi) - min(lo) AS span_ns, any_value(b.union_ns) AS busy_ns, coalesce(any_value(c.union_ns), 0) AS compute_ns
               FROM activities JOIN ({busy}) b USING ({using}) LEFT JOIN ({compute}) c USING ({using})
               GROUP BY {keys} ORDER BY {order}"""


def _figures(span_ns: int, busy_ns: int, compute_ns: int) -> DeviceTimeFigures:
    idle_ns = span_ns - busy_ns
    return DeviceTimeFigures(
        span_ms=ns_to_ms(span_ns),
        busy_ms=ns_to_ms(busy_ns),
        idle_ms=ns_to_ms(idle_ns),
        compute_ms=ns_to_ms(compute_ns),
        non_compute_ms=ns_to_ms(span_ns - idle_ns - compute_ns),
    )


@stage("device_time", reads=("spans", "decode"), in_summary=True)
def device_time_section(engine: Engine) -> DeviceTime | None:
    """The ``device_time`` block of summary.json; None where no decode run has a device activity."""
    prefix = len(ACTIVITY) + 2  # SQL substr is 1-based
    engine.run(f"""CREATE OR REPLACE TEMP TABLE activities AS
        SELECT d.rank, d.step, CAST(d.runner_ts_ns + s.ts_ns AS BIGINT) AS lo, CAST(d.runner_ts_ns + s.ts_ns + s.dur_ns AS BIGINT) AS hi,
               substr(s.name, {prefix}) AS kind
        FROM spans s JOIN decode d ON d.pid = s.pid AND d.inv = s.inv
        WHERE s.clk = '{fmt.CLK_DEVICE}' AND starts_with(s.name, '{ACTIVITY}.')""")
    if not engine.scalar("SELECT count(*) FROM activities"):
        return None
    ranks = {str(rank): _figures(span, busy, compute) for rank, span, busy, compute in engine.rows(_breakdown_sql("rank", "rank"))}
    per_step = [
        DeviceTimeStep(step=int(step), rank=int(rank), **_figures(span, busy, compute))
        for rank, step, span, busy, compute in engine.rows(_breakdown_sql("rank, step", "step, rank"))
    ]  # output rows, one per rank and step
    return DeviceTime(ranks=ranks, per_step=per_step)
