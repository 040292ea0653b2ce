"""Where every span, arrow and counter of an exported trace goes: the one track layout of both Perfetto writers.

The Chrome JSON writer (:mod:`~dsprof.analysis.outputs.chrome_trace`) and the
native protobuf writer (:mod:`~dsprof.analysis.outputs.perfetto_proto`) draw
the same picture, so they take it from here. Processes, tracks, device spans,
findings, flows and counters: docs/REPORTS.md, "Perfetto exports".
Track ids are synthetic (from :data:`TRACK_TID_BASE` up) so that none collides
with a pid: Perfetto takes a thread whose tid equals its pid for the process'
main thread. The real thread id is in the track's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from dsprof.analysis.analyze import AnalysisResult
from dsprof.analysis.outputs.drawing import (
    GC_LANE,
    assign_lanes,
    build_lanes,
    collection_row,
    device_spans_sql,
    drawn_runs_sql,
    runtime_spans_sql,
    serving_spans_sql,
)
from dsprof.analysis.outputs.finding_markers import SLOW_STEP, build_finding_markers
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.store.predicates import runtime_device_row, serving_row
from dsprof.analysis.summary_schema import StepRow
from dsprof.profiler import sa_profile
from dsprof.profiler import strace_format as fmt

TRACK_TID_BASE = 1 << 30
SERVING_PROCESS_SORT = 0
RANK_PROCESS_SORT = 1000
SERVING_THREAD_SORT = 0
RUNTIME_THREAD_SORT = 100
FINDINGS_THREAD_SORT = -1  # a rank process's findings first
DEVICE_TRACK = "device"
# the categories of runtime spans on the host clock and of device-clock spans
RUNTIME_CATEGORY = "runtime"
DEVICE_CATEGORY = "device"
FINDINGS_TRACK = "findings"
# A scheduler span carrying a step dispatched that step's run in its own rank process.
STEP_LINK_CATEGORY = sa_profile.CAT_SCHEDULER
FLOW_NAME = "dispatch"
BLAME_FLOW_NAME = "blame"
START_SKEW_COUNTER = "runner-start skew (ms)"
END_SKEW_COUNTER = "runner-end skew (ms)"
RUN_QUEUE_COUNTER = "run-queue wait per run (ms)"
COLLECTIVE_WAIT_COUNTER = "collective wait per run (ms)"


@dataclass(frozen=True)
class Process:
    pid: int
    name: str
    sort_index: int
    rank: int | None = None


@dataclass(frozen=True)
class Thread:
    """One track: ``tid`` is the id the writers give it (synthetic for runtime lanes, the OS tid for serving threads)."""

    pid: int
    tid: int
    name: str
    sort_index: int


@dataclass(frozen=True, eq=False)
class Counter:
    """One counter track: values (ms) at host times (ns); ``pid`` is the process it belongs to (None: global)."""

    name: str
    pid: int | None
    ts_ns: np.ndarray  # int64, ascending
    values: np.ndarray  # float64


@dataclass
class TrackLayout:
    processes: list[Process]
    runtime: dict[tuple[int, int, int], Thread]  # (pid, OS tid, lane) -> track
    serving: dict[tuple[int, int, str, int], Thread]  # (pid, tid, category, lane) -> track
    counters: list[Counter] = field(default_factory=list)
    device: dict[tuple[int, int], Thread] = field(default_factory=dict)  # (pid, device lane) -> track
    findings: dict[int, Thread] = field(default_factory=dict)  # pid -> the track of its findings' markers

    @property
    def threads(self) -> list[Thread]:
        return [*self.findings.values(), *self.serving.values(), *self.runtime.values(), *self.device.values()]

    def runtime_track_table(self) -> pa.Table:
        """``pid, tid, lane -> track`` as a table, to join against span batches."""
        return _track_table({"pid": pa.int64(), "tid": pa.int64(), "lane": pa.int64()}, self.runtime)

    def serving_track_table(self) -> pa.Table:
        """``pid, tid, cat, lane -> track`` as a table, to join against span batches."""
        return _track_table({"pid": pa.int64(), "tid": pa.int64(), "cat": pa.string(), "lane": pa.int64()}, self.serving)

    def device_track_table(self) -> pa.Table:
        """``pid, device_lane -> track`` as a table, to join against device span batches."""
        return _track_table({"pid": pa.int64(), "device_lane": pa.int64()}, self.device)

    def findings_track_table(self) -> pa.Table:
        """``pid -> track`` of the findings' markers."""
        return _track_table({"pid": pa.int64()}, {(pid,): track for pid, track in self.findings.items()})

    def register(self, engine: Engine) -> None:
        """The track tables as ``track_of_run``, ``track_of_serving``, ``track_of_device``, ``track_of_findings``."""
        for name, table in (
            ("track_of_run", self.runtime_track_table()),
            ("track_of_serving", self.serving_track_table()),
            ("track_of_device", self.device_track_table()),
            ("track_of_findings", self.findings_track_table()),
        ):
            engine.con.register(name, table)


def _track_table(keys: dict[str, pa.DataType], tracks: Mapping[tuple, Thread]) -> pa.Table:
    """One row per track: its key columns (``keys``: name -> type, in the order of the dict's key tuples), then ``track``."""
    columns = {name: pa.array([key[i] for key in tracks], type) for i, (name, type) in enumerate(keys.items())}
    return pa.table({**columns, "track": pa.array([t.tid for t in tracks.values()], pa.int64())})


def build_track_layout(result: AnalysisResult, steps: list[int] | None = None, serving_budget: int | None = None) -> TrackLayout:
    """Processes, tracks and counters of ``result``'s trace; ``steps``: the decode steps drawn (None: all).

    Creates the engine's ``lanes`` (runs) and ``serving_lanes`` (``file, line, lane`` of every serving
    span drawn; :func:`serving_lanes_sql` is the serving spans drawn with their lane): with a
    ``serving_budget``, the earliest that many (by time, then file and line), else all.
    """
    engine = result.engine
    build_lanes(engine)
    runtime = _runtime_threads(engine)
    _build_serving_lanes(engine, serving_budget)
    serving = _serving_threads(engine, result.trace.thread_names, first_tid=TRACK_TID_BASE + len(runtime))
    device = _device_threads(engine, TRACK_TID_BASE + len(runtime) + len(serving), RUNTIME_THREAD_SORT + len(runtime))
    build_finding_markers(engine, result.summary)
    findings = _findings_threads(engine, TRACK_TID_BASE + len(runtime) + len(serving) + len(device))
    pids = {t.pid for tracks in (runtime, serving, device, findings) for t in tracks.values()}
    layout = TrackLayout(
        processes=_processes(result, pids),
        runtime=runtime,
        serving=serving,
        counters=_skew_counters(engine, result.summary.get("per_step") or []) + _run_queue_counters(engine, steps),
        device=device,
        findings=findings,
    )
    layout.register(engine)
    return layout


def _processes(result: AnalysisResult, pids: set[int]) -> list[Process]:
    """Rank processes by rank, after every other process (named as its trace named it, else ``serving``)."""
    ranked = {p["pid"]: p for p in result.swimlane.processes}
    names = result.trace.process_names
    processes = []
    for pid in sorted(pids | set(ranked) | set(names)):  # one per process
        rank_process = ranked.get(pid)
        if rank_process is not None:
            processes.append(
                Process(
                    pid,
                    f"rank {rank_process['rank']} · {rank_process['device']} (pid {pid})",
                    RANK_PROCESS_SORT + int(rank_process["rank"]),
                    int(rank_process["rank"]),
                )
            )
        else:
            processes.append(Process(pid, f"{names.get(pid, 'serving')} (pid {pid})", SERVING_PROCESS_SORT))
    return processes


def _runtime_threads(engine: Engine) -> dict[tuple[int, int, int], Thread]:
    """A track per (pid, thread, lane) of the runs, and one per thread of a rank process for its garbage collections."""
    rows = engine.rows(f"""SELECT DISTINCT r.pid, r.tid, l.lane FROM runs r JOIN lanes l USING (pid, inv)
                           UNION SELECT DISTINCT g.pid, g.tid, {GC_LANE} FROM spans g JOIN processes p USING (pid)
                           WHERE {collection_row("g")} ORDER BY 1, 2, 3""")
    return {
        (pid, tid, lane): Thread(pid, TRACK_TID_BASE + i, f"host thread {tid} · {lane_name(lane)}", RUNTIME_THREAD_SORT + i)
        for i, (pid, tid, lane) in enumerate(rows)
    }


def _build_device_runs(engine: Engine) -> None:
    """``device_runs`` (pid, inv): the runs whose device spans are drawn, those that nest.

    A run's device spans nest when every one lies inside its ``device_wall``,
    spans of one depth never overlap, and each span lies inside the latest span
    one depth up that started at or before it. The device programs' lanes keep
    apart the device_walls that overlap, so then every device track nests.
    Spans that overlap without nesting (a Kineto run's device-time breakdown
    and kernel activities) cannot be drawn on one track: their run's device
    spans are left out of the exports (report.html draws them). Once per engine.
    """
    if "device_runs" in engine.relations():
        return
    # the first start and last end of each run's device spans: a run whose spans all lie inside its device_wall and
    # that has one span nests; only the runs with several need the nesting check, which sorts their spans
    engine.run(f"""CREATE OR REPLACE TEMP TABLE _device_extents AS
        SELECT x.pid, x.inv, x.spans FROM (SELECT s.pid, s.inv, count(*) AS spans, min(s.ts_ns) AS first_ts, max(s.ts_ns + s.dur_ns) AS last_end
                                           FROM spans s WHERE {runtime_device_row("s")} GROUP BY s.pid, s.inv) x
        JOIN runs r ON r.pid = x.pid AND r.inv = x.inv
        WHERE r.runner_ts_ns IS NOT NULL AND r.device_wall_ns IS NOT NULL
          AND x.first_ts >= r.device_ts_ns AND x.last_end <= r.device_ts_ns + r.device_wall_ns""")
    nested, several = "SELECT pid, inv FROM _device_extents WHERE spans = 1", "(SELECT pid, inv FROM _device_extents WHERE spans > 1)"
    if engine.scalar(f"SELECT count(*) FROM {several}"):
        nested += f" UNION ALL SELECT pid, inv FROM ({_nested_runs_sql(several)})"
    engine.run(f"CREATE TEMP TABLE device_runs AS {nested}")
    engine.run("DROP TABLE _device_extents")


def _nested_runs_sql(runs: str) -> str:
    """SQL: the runs of ``runs`` (pid, inv) whose device spans of one depth never overlap and each lie inside the latest
    span one depth up that started at or before it (the spans of the top depth: no parent)."""
    return f"""
        WITH d AS (SELECT s.pid, s.inv, s.depth, CAST(s.depth AS HUGEINT) - 1 AS parent_depth, s.ts_ns AS ts, s.ts_ns + s.dur_ns AS end_ns
                   FROM spans s SEMI JOIN {runs} k ON k.pid = s.pid AND k.inv = s.inv WHERE {runtime_device_row("s")}),
             checked AS (
                SELECT c.pid, c.inv, c.depth, c.ts, c.end_ns, p.end_ns AS parent_end, min(c.depth) OVER (PARTITION BY c.pid, c.inv) AS top,
                       max(c.end_ns) OVER (PARTITION BY c.pid, c.inv, c.depth ORDER BY c.ts, c.end_ns
                                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before_end
                FROM d c ASOF LEFT JOIN d p ON p.pid = c.pid AND p.inv = c.inv AND p.depth = c.parent_depth AND p.ts <= c.ts)
        SELECT pid, inv FROM checked GROUP BY pid, inv
        HAVING bool_and(coalesce(before_end <= ts, TRUE) AND (depth = top OR coalesce(end_ns <= parent_end, FALSE)))"""


def device_spans_drawn_sql(runs: str) -> str:
    """The device spans the exports draw (:func:`~dsprof.analysis.outputs.drawing.device_spans_sql`) of ``runs`` (a table of
    :func:`~dsprof.analysis.outputs.drawing.drawn_runs_sql`): those of the runs in ``device_runs``."""
    return device_spans_sql(f"(SELECT * FROM {runs} x SEMI JOIN device_runs k ON k.pid = x.pid AND k.inv = x.inv)")


def _device_threads(engine: Engine, first_tid: int, first_sort: int) -> dict[tuple[int, int], Thread]:
    """A track per (pid, device lane) of the device programs drawn: ``device``, or ``device · lane L`` where a process has several."""
    _build_device_runs(engine)
    rows = engine.rows("""SELECT pid, lane, max(lane) OVER (PARTITION BY pid) AS last_lane
                          FROM (SELECT DISTINCT pid, lane FROM device_lanes SEMI JOIN device_runs USING (pid, inv)) ORDER BY pid, lane""")
    return {
        (pid, lane): Thread(pid, first_tid + i, DEVICE_TRACK + (f" · lane {lane}" if last_lane else ""), first_sort + i)
        for i, (pid, lane, last_lane) in enumerate(rows)
    }


def _findings_threads(engine: Engine, first_tid: int) -> dict[int, Thread]:
    """A ``findings`` track in every process a finding's marker lies in (``finding_markers``), first in its process."""
    pids = [pid for (pid,) in engine.rows("SELECT DISTINCT pid FROM finding_markers ORDER BY pid")]
    return {pid: Thread(pid, first_tid + i, FINDINGS_TRACK, FINDINGS_THREAD_SORT) for i, pid in enumerate(pids)}


def lane_name(lane: int) -> str:
    """``lane 1``, or ``garbage collections`` for the lane of a thread's collections."""
    return "garbage collections" if lane == GC_LANE else f"lane {lane}"


def _build_serving_lanes(engine: Engine, budget: int | None) -> None:
    """``serving_lanes``: a lane per serving span drawn within its (pid, tid, category), overlapping spans on different lanes."""
    drawable = f"{serving_row()} AND ph IN ('X', 'i')"
    drawn = f"SELECT pid, tid, cat, file, line, ts_ns, dur_ns FROM spans WHERE {drawable}"
    if budget is not None:  # a top-N: memory for the budget's rows, not the trace's
        # in two passes: the start of the budget's last span over one integer column first, then the rows up to it;
        # one top-N over the whole rows held several times their size (0.57 GB for 500k of 4.5M serving spans)
        last = engine.scalar(f"SELECT max(ts_ns) FROM (SELECT ts_ns FROM spans WHERE {drawable} ORDER BY ts_ns LIMIT {int(budget)})")
        upto = "ts_ns IS NULL" if last is None else f"(ts_ns <= {int(last)} OR ts_ns IS NULL)"  # nulls sort last, as before
        drawn += f" AND {upto} ORDER BY ts_ns, file, line LIMIT {int(budget)}"
    spans = engine.arrow(f"""SELECT file, line, ts_ns, ts_ns + dur_ns AS end_ns,
                                    dense_rank() OVER (ORDER BY pid, tid, cat) AS thread_cat
                             FROM ({drawn}) ORDER BY thread_cat, ts_ns, file, line""")
    lanes = assign_lanes(spans.column("thread_cat").to_numpy(), spans.column("ts_ns").to_numpy(), spans.column("end_ns").to_numpy(), None)
    engine.con.register(
        "serving_lanes_in", pa.table({"file": spans.column("file"), "line": spans.column("line"), "lane": pa.array(lanes, pa.int64())})
    )
    # one lane per (file, line), the key serving spans are joined on: rows repeating a key (a crafted
    # dataset) share its first lane, so the join stays one row per span instead of growing as n²
    engine.run("CREATE OR REPLACE TABLE serving_lanes AS SELECT file, line, min(lane) AS lane FROM serving_lanes_in GROUP BY file, line")


def serving_span_count(engine: Engine) -> int:
    """Serving spans and instants there are to draw, before any budget."""
    return int(engine.scalar(f"SELECT count(*) FROM spans WHERE {serving_row()} AND ph IN ('X', 'i')") or 0)


def serving_lanes_sql() -> str:
    """The serving spans to draw (:func:`~dsprof.analysis.outputs.drawing.serving_spans_sql`, those given a lane) with their ``lane``."""
    return f"SELECT s.*, l.lane FROM ({serving_spans_sql()}) s JOIN serving_lanes l USING (file, line)"


def _serving_threads(engine: Engine, thread_names: dict[tuple[int, int], str], first_tid: int) -> dict[tuple[int, int, str, int], Thread]:
    """A track per (pid, tid, category, lane), named after the thread (by its trace, else its id) and the category."""
    rows = engine.rows(f"""SELECT pid, tid, cat, lane, max(lane) OVER (PARTITION BY pid, tid, cat) AS last_lane
                           FROM (SELECT DISTINCT pid, tid, cat, lane FROM ({serving_lanes_sql()})) ORDER BY pid, tid, cat, lane""")
    threads = {}
    for i, (pid, tid, cat, lane, last_lane) in enumerate(rows):  # one per serving track
        name = f"{thread_names.get((pid, tid)) or f'tid {tid}'} · {cat or 'serving'}" + (f" · lane {lane}" if last_lane else "")
        threads[(pid, tid, cat, lane)] = Thread(pid, first_tid + i, name, SERVING_THREAD_SORT + i)
    return threads


def _skew_counters(engine: Engine, per_step: list[StepRow]) -> list[Counter]:
    """The summary's per-step skews, placed at each step's first runner start (the engine's ``steps`` table)."""
    if not per_step:
        return []
    starts = dict(engine.rows("SELECT step, min_start_ns FROM steps"))
    # one per step, by start then step (two steps may start together: rows themselves do not compare)
    placed = sorted(((starts[row["step"]], row) for row in per_step if row.get("step") in starts), key=lambda p: (p[0], p[1]["step"]))
    ts = np.array([ts for ts, _ in placed], np.int64)
    start_skews = np.array([float(row["runner_start_skew_ms"]) for _, row in placed], np.float64)
    end_skews = np.array([float(row["runner_end_skew_ms"]) for _, row in placed], np.float64)
    return [Counter(START_SKEW_COUNTER, None, ts, start_skews), Counter(END_SKEW_COUNTER, None, ts, end_skews)]


def _drawn_runs(engine: Engine, steps: list[int] | None) -> str:
    """SQL condition on ``runs r`` left-joined to ``decode d``: the run is drawn (``steps``: the decode steps drawn; None: all)."""
    if steps is None:
        return "TRUE"
    engine.con.register("drawn_steps", pa.table({"step": pa.array(steps, pa.int64())}))
    return "(d.step IS NULL OR d.step IN (SELECT step FROM drawn_steps))"


def _run_queue_counters(engine: Engine, steps: list[int] | None) -> list[Counter]:
    """Per rank process: the run-queue wait its host thread saw during each run drawn (root ``os.rq_ns``, else its phases'),
    and the time each run's device program waited on peers at collectives (``*_wait`` device spans, which have no place
    of their own on the host axis)."""
    drawn = _drawn_runs(engine, steps)
    table = engine.arrow(f"""
        SELECT r.pid, r.root_ts_ns AS ts, coalesce(r.root_rq_ns,
               CASE WHEN coalesce(r.bind_rq_ns, r.runner_rq_ns, r.validate_rq_ns) IS NOT NULL
                    THEN coalesce(r.bind_rq_ns, 0) + coalesce(r.runner_rq_ns, 0) + coalesce(r.validate_rq_ns, 0) END) AS rq
        FROM runs r LEFT JOIN decode d ON d.pid = r.pid AND d.inv = r.inv
        WHERE rq IS NOT NULL AND {drawn} ORDER BY r.pid, ts, r.inv""")
    waits = engine.arrow(f"""
        SELECT r.pid, r.runner_ts_ns AS ts, CAST(r.device_wait_ns AS DOUBLE) AS rq FROM runs r LEFT JOIN decode d ON d.pid = r.pid AND d.inv = r.inv
        WHERE r.device_wait_ns IS NOT NULL AND r.runner_ts_ns IS NOT NULL AND {drawn} ORDER BY r.pid, ts, r.inv""")
    return _per_process(RUN_QUEUE_COUNTER, table) + _per_process(COLLECTIVE_WAIT_COUNTER, waits)


def _per_process(name: str, table: pa.Table) -> list[Counter]:
    """One counter per pid of ``table`` (pid, ts, value in ns; sorted by pid, then time), in ms."""
    pid, ts = table.column("pid").to_numpy(), table.column("ts").to_numpy()
    values_ms = table.column("rq").to_numpy() / 1e6
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(pid)) + 1, [len(pid)]])
    return [Counter(name, int(pid[a]), ts[a:b], values_ms[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def flow_links(engine: Engine, steps: list[int] | None = None) -> pa.Table:
    """One row per arrow, in a total order: ``name`` (:data:`FLOW_NAME` or :data:`BLAME_FLOW_NAME`), its source
    (``src_pid``, ``src_track``, ``src_ts``; a serving span ``src_file``/``src_line``, or a finding's marker
    ``src_marker``) and its destination (``dst_pid``, ``dst_track``, ``dst_ts``; a run's root ``dst_inv``, or a
    span ``dst_file``/``dst_line``), among the runs drawn (``steps``: the decode steps drawn; None: all).
    Tracks are the layout's (:meth:`TrackLayout.register`).

    A dispatch arrow goes from a serving span to the root it started. A span
    links by the first identity it carries: ``dispatch_id`` (non-zero), else
    ``run_id``, else — a scheduler span in a rank process — ``step``. A span in
    a rank process only links to roots of that process, so one scheduler step
    of rank r starts rank r's run, not every rank's; a span of a process
    without runs (a central scheduler) links by dispatch_id or run_id. The
    three ways exclude each other, so each is its own (hash) join.

    A blame arrow goes from a slow step's marker to each span it blames
    (:mod:`~dsprof.analysis.outputs.finding_markers`).
    """
    drawn = _drawn_runs(engine, steps)
    same_process = "(NOT d.in_rank_process OR r.pid = d.pid)"
    return engine.arrow(f"""
        WITH roots AS (SELECT r.pid, r.tid, l.lane, r.inv, r.root_ts_ns, r.dispatch_id, r.run_id, r.step_attr
                       FROM runs r JOIN lanes l ON l.pid = r.pid AND l.inv = r.inv
                       LEFT JOIN decode d ON d.pid = r.pid AND d.inv = r.inv WHERE {drawn}),
             dispatch AS (SELECT s.file, s.line, s.pid, s.tid, s.ts_ns, s.cat, s.lane, coalesce(s.dispatch_id, 0) AS dispatch_id,
                                 s.run_id, s.step, s.pid IN (SELECT pid FROM runs) AS in_rank_process
                          FROM ({serving_lanes_sql()}) s WHERE s.ph = 'X'
                            AND (coalesce(s.dispatch_id, 0) <> 0 OR s.run_id IS NOT NULL
                                 OR (s.cat = '{STEP_LINK_CATEGORY}' AND s.step IS NOT NULL))),
             links AS (
                SELECT d.*, r.pid AS dst_pid, r.tid AS dst_tid, r.lane AS dst_lane, r.inv AS dst_inv, r.root_ts_ns AS dst_ts
                FROM dispatch d JOIN roots r ON r.dispatch_id = d.dispatch_id
                WHERE d.dispatch_id <> 0 AND {same_process}
                UNION ALL
                SELECT d.*, r.pid, r.tid, r.lane, r.inv, r.root_ts_ns
                FROM dispatch d JOIN roots r ON r.run_id = d.run_id
                WHERE d.dispatch_id = 0 AND {same_process}
                UNION ALL
                SELECT d.*, r.pid, r.tid, r.lane, r.inv, r.root_ts_ns
                FROM dispatch d JOIN roots r ON r.pid = d.pid AND r.step_attr = d.step
                WHERE d.in_rank_process AND d.dispatch_id = 0 AND d.run_id IS NULL AND d.cat = '{STEP_LINK_CATEGORY}'),
             blamed AS ({_blamed_spans_sql(drawn)})
        SELECT '{FLOW_NAME}' AS name, l.file AS src_file, l.line AS src_line, NULL::BIGINT AS src_marker, l.pid AS src_pid,
               st.track AS src_track, l.ts_ns AS src_ts, l.dst_pid, rt.track AS dst_track, l.dst_ts, l.dst_inv,
               NULL::VARCHAR AS dst_file, NULL::BIGINT AS dst_line
        FROM links l
        JOIN track_of_serving st ON st.pid = l.pid AND st.tid = l.tid AND st.cat IS NOT DISTINCT FROM l.cat AND st.lane = l.lane
        JOIN track_of_run rt ON rt.pid = l.dst_pid AND rt.tid = l.dst_tid AND rt.lane = l.dst_lane
        UNION ALL
        SELECT '{BLAME_FLOW_NAME}', NULL, NULL, m.marker, m.pid, ft.track, m.ts_ns, b.pid, coalesce(dt.track, rt.track), b.ts_ns, NULL,
               b.file, b.line
        FROM blamed b JOIN finding_markers m ON m.marker = b.marker JOIN track_of_findings ft ON ft.pid = m.pid
        LEFT JOIN track_of_device dt ON b.device AND dt.pid = b.pid AND dt.device_lane = b.device_lane
        LEFT JOIN track_of_run rt ON NOT b.device AND rt.pid = b.pid AND rt.tid = b.tid AND rt.lane = b.lane
        ORDER BY src_ts, src_file, src_line, src_marker, dst_pid, dst_ts, dst_inv, dst_file, dst_line""")


def _blamed_spans_sql(drawn: str) -> str:
    """The span each arrow of a slow-step marker ends on: ``marker``, the span's ``pid, tid, lane, device_lane``
    (``device``: a device-clock span), ``file, line`` and drawn ``ts_ns``; only in runs meeting ``drawn``
    (a condition on ``runs r`` left-joined to ``decode d``).

    One arrow to the culprit's span of the blamed phase, in its run of the item's
    ``evidence_step`` where it names one (a long bind of the next step), else of
    the step; and, where the critical path went through a collective, one to each
    victim's wait span at it in that step: of the victim's phase, the one whose
    length is the wait the item cites. A run without a span of that phase (or
    whose device spans are not drawn) gets the arrow on its ``runner_run``.
    """
    return f"""
    WITH targets AS (
        SELECT marker, rank, coalesce(evidence_step, step) AS step, phase, NULL::BIGINT AS evidence_ns, 0 AS victim
        FROM finding_markers WHERE kind = '{SLOW_STEP}'
        UNION ALL
        SELECT v.marker, v.rank, m.step, v.phase, v.evidence_ns, 1 FROM finding_victims v JOIN finding_markers m USING (marker)),
    target_runs AS (
        SELECT t.*, d.pid, d.inv FROM targets t JOIN decode d ON d.step = t.step AND d.rank = t.rank
        QUALIFY row_number() OVER (PARTITION BY t.marker, t.victim, t.rank ORDER BY d.root_ts_ns, d.pid, d.inv) = 1),
    runs_drawn AS (
        SELECT x.* FROM ({drawn_runs_sql()}) x SEMI JOIN (
            SELECT r.pid, r.inv FROM runs r LEFT JOIN decode d ON d.pid = r.pid AND d.inv = r.inv
            SEMI JOIN target_runs t ON t.pid = r.pid AND t.inv = r.inv WHERE {drawn}) k ON k.pid = x.pid AND k.inv = x.inv),
    candidates AS (
        SELECT file, line, pid, tid, inv, lane, NULL::BIGINT AS device_lane, phase, ts_ns, dur_ns, FALSE AS device
        FROM ({runtime_spans_sql("runs_drawn")}) WHERE phase <> '{fmt.GC}'
        UNION ALL
        SELECT file, line, pid, tid, inv, lane, device_lane, phase, ts_ns, dur_ns, TRUE FROM ({device_spans_drawn_sql("runs_drawn")}))
    SELECT t.marker, c.pid, c.tid, c.lane, c.device_lane, c.device, c.file, c.line, c.ts_ns
    FROM target_runs t JOIN candidates c ON c.pid = t.pid AND c.inv = t.inv
    WHERE c.phase = t.phase OR c.phase = '{fmt.PHASE_RUNNER}'
    QUALIFY row_number() OVER (PARTITION BY t.marker, t.victim, t.rank
                               ORDER BY c.phase = t.phase DESC, abs(c.dur_ns - coalesce(t.evidence_ns, c.dur_ns)), c.ts_ns,
                                        c.file, c.line) = 1"""
