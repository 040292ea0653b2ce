"""Where each span goes when a swimlane is drawn: pipeline-slot lanes, and spans with their run's identity.

Outputs (the Chrome/Perfetto trace writer, the HTML report) draw from the
queries here and never recompute figures. ``lanes`` gives every run a lane
within its OS thread such that overlapping runs (a depth-2 pipeline keeps two
in flight on one thread) never share one; :func:`runtime_spans_sql` and
:func:`serving_spans_sql` are the span rows, ready to draw.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dsprof.analysis.stages.runner import stage
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.store.predicates import runtime_device_row, runtime_row, serving_row
from dsprof.analysis.store.spans import anchor_offsets_sql
from dsprof.profiler import strace_format as fmt

# SQL of the phase label of a runtime span name (strace_format.phase_of, vectorised).
PHASE_SQL = (
    f"CASE WHEN name = '{fmt.ROOT}' THEN '{fmt.PHASE_ROOT}' ELSE "
    f"regexp_replace(regexp_replace(name, '^{fmt.ROOT.replace('.', '[.]')}[.]', ''), '^{fmt.PHASE_RUNNER}[.]', '') END"
)


# Runs laid out per numpy pass (~15 int64 arrays of this length live at once).
LANE_CHUNK_RUNS = 1_000_000


def assign_lanes(thread: np.ndarray, start: np.ndarray, end: np.ndarray, slot: np.ndarray | None) -> np.ndarray:
    """Pipeline-slot lane per run within its thread, such that overlapping runs never share a lane.

    Start from the run's ``slot_id`` (the ping-pong slot) where every run of
    the thread has one (``slot`` < 0 means absent), else take turns over as many
    lanes as the thread's deepest overlap; then move runs that still overlap
    their lane's predecessor to a fresh lane until no lane holds two overlapping
    runs. Each round is vectorised and settles at least one run; real traces need none.
    numpy only: it runs once per run of a day-long trace.
    """
    n = len(thread)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((start, thread))  # by thread, then start; stable
    t = np.asarray(thread, np.int64)[order]
    s, e = np.asarray(start, np.int64)[order], np.asarray(end, np.int64)[order]
    known = np.asarray(slot, np.int64)[order] if slot is not None else np.full(n, -1)
    group_start = np.flatnonzero(np.r_[True, t[1:] != t[:-1]])
    group = np.repeat(np.arange(len(group_start)), np.diff(np.r_[group_start, n]))
    started = np.arange(n) - group_start[group]  # runs of the thread started before this one
    # runs in flight at each start = started before it - ended at or before it, within the thread: starts and ends
    # in one order by thread, time, ends first; the ends before a start less those of the threads before its own
    # (one stable sort of times already sorted within each half; ranking every time to pack thread and time into
    # one key took two sorts more)
    start_row = np.lexsort((np.r_[np.zeros(n, np.int8), np.ones(n, np.int8)], np.r_[e, s], np.r_[t, t]))
    ends_so_far = np.cumsum(start_row < n)
    is_start = start_row >= n
    ended = np.empty(n, np.int64)
    ended[start_row[is_start] - n] = ends_so_far[is_start]
    ended -= group_start[group]
    depth = np.maximum.reduceat(np.maximum(started - ended, 0), group_start)[group] + 1
    slot_known = np.logical_and.reduceat(known >= 0, group_start)[group]
    lane = np.where(slot_known, known, started % depth)
    # lanes as their rank (same order): a slot_id near int64's end would make ``lane.max() + 1`` wrap, never settling
    lane = np.unique(lane, return_inverse=True)[1].reshape(-1).astype(np.int64)
    while True:
        by_lane = np.lexsort((s, lane, t))
        same_lane = np.r_[False, (t[by_lane][1:] == t[by_lane][:-1]) & (lane[by_lane][1:] == lane[by_lane][:-1])]
        clash = by_lane[same_lane & (s[by_lane] < np.r_[0, e[by_lane][:-1]])]
        if len(clash) == 0:
            break
        lane[clash] = lane.max() + 1
    # number lanes 0.. densely within each thread
    by_lane = np.lexsort((lane, t))
    new_thread = np.r_[True, t[by_lane][1:] != t[by_lane][:-1]]
    new_lane = np.cumsum(new_thread | np.r_[True, lane[by_lane][1:] != lane[by_lane][:-1]])
    dense = np.empty(n, np.int64)
    dense[by_lane] = new_lane - np.maximum.accumulate(np.where(new_thread, new_lane, 0))
    result = np.empty(n, np.int64)
    result[order] = dense
    return result


# the lane of a thread's garbage collections (``host.gc`` spans), beside its pipeline-slot lanes
GC_LANE = -1


@stage("layout", reads=("runs", "anchors", "processes"), writes=("lanes", "device_lanes", "anchor_offsets"))
def build_lanes(engine: Engine) -> None:
    """Create ``lanes`` and ``device_lanes`` (pid, inv, lane) for every run, and ``anchor_offsets`` (pid, wall − monotonic ns); once per engine.

    ``lanes``: the run's pipeline-slot lane within its host thread. ``device_lanes``: for every run with a
    ``device_wall``, the lane of its device program (the device_wall, placed as :func:`device_spans_sql`
    places it) within its rank process: 0, unless it overlaps the program before it on the host axis (the
    placement is approximate), then another.
    """
    if "lanes" in engine.relations():
        return
    _build_lane_table(
        engine,
        "lanes",
        "SELECT pid, inv, root_ts_ns AS start_ns, root_end_ns AS end_ns, coalesce(slot_id, -1) AS slot, "
        "dense_rank() OVER (ORDER BY pid, tid) AS thread FROM runs",
    )
    # every program given slot 0: one lane, and a further one only for a program that overlaps its lane's previous one
    _build_lane_table(
        engine,
        "device_lanes",
        "SELECT pid, inv, runner_ts_ns + device_ts_ns AS start_ns, "
        "runner_ts_ns + device_ts_ns + device_wall_ns AS end_ns, 0 AS slot, "
        "dense_rank() OVER (ORDER BY pid) AS thread FROM runs WHERE runner_ts_ns IS NOT NULL AND device_wall_ns IS NOT NULL",
    )
    # the serving stack keeps the last anchor of a process; so does dsprof
    engine.run(f"CREATE OR REPLACE TABLE anchor_offsets AS {anchor_offsets_sql('anchors')}")


def _build_lane_table(engine: Engine, name: str, intervals: str) -> None:
    """Table ``name`` (pid, inv, lane) from ``intervals`` (pid, inv, start_ns, end_ns, slot, thread) by :func:`assign_lanes`,
    whole threads at a time (about LANE_CHUNK_RUNS runs each), so memory stays bounded."""
    engine.run(f"CREATE OR REPLACE TEMP TABLE lane_runs AS {intervals}")
    engine.run(f"CREATE OR REPLACE TABLE {name} AS SELECT pid, inv, 0::BIGINT AS lane FROM lane_runs LIMIT 0")
    for first, last in _thread_chunks(engine):
        runs = engine.arrow("SELECT * FROM lane_runs WHERE thread BETWEEN ? AND ? ORDER BY thread, start_ns, pid, inv", [first, last])
        lanes = assign_lanes(
            runs.column("thread").to_numpy(),
            runs.column("start_ns").to_numpy(),
            runs.column("end_ns").to_numpy(),
            runs.column("slot").to_numpy(),
        )
        chunk = pa.table({"pid": runs.column("pid"), "inv": runs.column("inv"), "lane": pa.array(lanes)})
        engine.con.register("lanes_in", chunk)
        engine.run(f"INSERT INTO {name} SELECT pid, inv, lane FROM lanes_in")
        engine.con.unregister("lanes_in")
    engine.run("DROP TABLE lane_runs")


def _thread_chunks(engine: Engine) -> list[tuple[int, int]]:
    """Ranges of whole threads holding about LANE_CHUNK_RUNS runs each: threads are independent, so memory stays bounded."""
    counts = engine.rows("SELECT thread, count(*) FROM lane_runs GROUP BY thread ORDER BY thread")
    chunks: list[tuple[int, int]] = []
    first, held = None, 0
    for thread, n in counts:
        if first is None:
            first = thread
        held += n
        if held >= LANE_CHUNK_RUNS:
            chunks.append((first, thread))
            first, held = None, 0
    if first is not None:
        chunks.append((first, counts[-1][0]))
    return chunks


def drawn_runs_sql(where: str = "TRUE") -> str:
    """The runs to draw (``where``: a condition on ``runs r``), with what their spans are drawn with.

    Register it as a small table before joining spans to it: the span scan
    then probes a hash table of the runs drawn, not of every run.
    """
    return f"""
    SELECT r.pid, r.inv, r.tid, r.rank, r.device, r.step, r.callable_label, l.lane, r.runner_ts_ns, r.device_wall_ns,
           dl.lane AS device_lane
    FROM runs r LEFT JOIN lanes l ON l.pid = r.pid AND l.inv = r.inv
    LEFT JOIN device_lanes dl ON dl.pid = r.pid AND dl.inv = r.inv WHERE {where}"""


def runtime_spans_sql(runs: str | None = None) -> str:
    """Host-clock runtime spans of ``runs`` (a table or subquery of :func:`drawn_runs_sql`; default every run),
    with rank, device, step, callable, lane, phase, identity and wall time; ``file``, ``line`` order them totally.

    Every garbage collection of a rank process comes with them, on the lane
    :data:`GC_LANE` of its thread: the findings cite collections as evidence,
    so every drawing shows them.
    """
    return f"""
    SELECT s.file, s.line, s.pid, s.tid, s.inv, s.name, s.ts_ns, s.dur_ns, s.depth, s.attrs,
           r.rank, r.device, r.step, r.callable_label AS callable, r.lane, {PHASE_SQL.replace("name", "s.name")} AS phase,
           s.os_cpu_ns, s.os_rq_ns, s.os_nivcsw, s.os_majflt, r.device_wall_ns AS run_device_wall_ns,
           s.run_id, s.dispatch_id, s.run_epoch, s.slot_id, s.generation,
           s.ts_ns + a.offset_ns AS wall_ns
    FROM spans s JOIN {runs or f"({drawn_runs_sql()})"} r ON r.pid = s.pid AND r.inv = s.inv
    LEFT JOIN anchor_offsets a ON a.pid = s.pid
    WHERE {runtime_row("s")} AND s.clk <> '{fmt.CLK_DEVICE}'
    UNION ALL
    SELECT g.file, g.line, g.pid, g.tid, g.inv, g.name, g.ts_ns, g.dur_ns, g.depth, g.attrs,
           p.rank, p.device, NULL, '{fmt.GC}', {GC_LANE}, '{fmt.GC}',
           g.os_cpu_ns, g.os_rq_ns, g.os_nivcsw, g.os_majflt, NULL,
           g.run_id, g.dispatch_id, g.run_epoch, g.slot_id, g.generation,
           g.ts_ns + a.offset_ns
    FROM spans g JOIN processes p ON p.pid = g.pid LEFT JOIN anchor_offsets a ON a.pid = g.pid
    WHERE {collection_row("g")}
    """


def collection_row(alias: str = "") -> str:
    """SQL: a garbage collection (``host.gc``) on the host clock: evidence the findings cite, drawn on its own lane."""
    a = f"{alias}." if alias else ""
    return f"{a}name = '{fmt.GC}' AND {a}clk <> '{fmt.CLK_DEVICE}'"


def device_spans_sql(runs: str | None = None) -> str:
    """Device-clock spans (``clk=dev``) of ``runs`` (as :func:`runtime_spans_sql`), placed on the host axis at their run's launch.

    A device span's ``ts`` is an offset on a per-invocation device clock whose
    origin is the program's launch; the launch happens inside runner_run, just
    after it starts, so ``runner_run start + offset`` places it approximately
    (early by the launch latency). For drawing only: no figure uses it. The
    columns of :func:`runtime_spans_sql` (``wall_ns`` from the placed start),
    with the run's thread, and ``device_lane``: the lane of the run's device
    program in its process (``device_lanes``).
    """
    return f"""
    SELECT s.file, s.line, s.pid, r.tid, s.inv, s.name, r.runner_ts_ns + s.ts_ns AS ts_ns, s.dur_ns, s.depth, s.attrs,
           r.rank, r.device, r.step, r.callable_label AS callable, r.lane, {PHASE_SQL.replace("name", "s.name")} AS phase,
           s.os_cpu_ns, s.os_rq_ns, s.os_nivcsw, s.os_majflt, NULL::BIGINT AS run_device_wall_ns,
           s.run_id, s.dispatch_id, s.run_epoch, s.slot_id, s.generation,
           r.runner_ts_ns + s.ts_ns + a.offset_ns AS wall_ns, coalesce(r.device_lane, 0) AS device_lane
    FROM spans s JOIN {runs or f"({drawn_runs_sql()})"} r ON r.pid = s.pid AND r.inv = s.inv
    LEFT JOIN anchor_offsets a ON a.pid = s.pid
    WHERE {runtime_device_row("s")} AND r.runner_ts_ns IS NOT NULL
    """


def serving_spans_sql(where: str = "TRUE") -> str:
    """Serving (SA_PROFILE / Chrome) spans and instants as read (``file``, ``line``: which one), with wall time where their pid is anchored."""
    return f"""
    SELECT s.source, s.file, s.line, s.pid, s.tid, s.name, s.cat, s.ph, s.ts_ns, s.dur_ns, s.rank, s.step, s.dispatch_id, s.run_id, s.attrs,
           s.ts_ns + coalesce(a.offset_ns, (SELECT min(offset_ns) FROM anchor_offsets)) AS wall_ns
    FROM spans s LEFT JOIN anchor_offsets a ON a.pid = s.pid
    WHERE {serving_row("s")} AND s.ph IN ('X', 'i') AND ({where})
    """


def detailed_steps(engine: Engine, span_budget: int | None) -> tuple[list[int] | None, int]:
    """The decode steps to draw in full within ``span_budget`` runtime spans (None: all), and the total.

    Steps are taken in order of runner-end skew, largest first — the ones a
    reader zooms into — while their spans fit; runs outside decode always count.
    """
    total = int(engine.scalar("SELECT coalesce(sum(n_spans), 0) FROM runs") or 0)
    if span_budget is None or total <= span_budget:
        return None, total
    other = int(engine.scalar("SELECT coalesce(sum(n_spans), 0) FROM runs WHERE NOT is_decode") or 0)
    steps = engine.arrow("""SELECT d.step, sum(d.n_spans) AS n, any_value(s.runner_end_skew_ns) AS skew FROM decode d
                            LEFT JOIN steps s USING (step) GROUP BY d.step ORDER BY skew DESC NULLS LAST, d.step""")
    fits = np.cumsum(steps.column("n").to_numpy()) <= span_budget - other
    return sorted(steps.column("step").to_numpy()[fits].tolist()), total
