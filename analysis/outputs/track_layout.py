"""Where every span, arrow and counter of an exported trace goes: the one track layout of both Perfetto writers.

The Chrome JSON writer (:mod:`~dsprof.analysis.outputs.chrome_trace`) and the
native protobuf writer (:mod:`~dsprof.analysis.outputs.perfetto_proto`) draw
the same picture, so they take it from here (docs/REPORTS.md, "Perfetto"):

* one process per rank process, named ``rank R · DEVICE (pid P)`` and sorted by
  rank after the serving processes, which keep the name their trace gave them;
* runtime spans on one track per (OS thread, pipeline-slot lane), named
  ``host thread T · lane L``: runs that overlap on a thread (a depth-2
  pipeline keeps two in flight) are on different lanes, so every track nests;
* serving spans on one track per (pid, tid, category, lane), named
  ``THREAD · CATEGORY`` (THREAD: the trace's thread name, else ``tid T``), with
  `` · lane L`` where spans of one category overlap on their thread without
  nesting (pipelined ``worker.execute`` spans, the ``request`` spans of a
  batch): each lane holds spans that never overlap, so every track nests;
* flow arrows from a serving dispatch span to the one root it started (see
  :func:`flow_links`);
* counters: the runner-start and runner-end skew of each step (from the
  summary) at the step's first runner start, and, where spans carry host
  evidence (``os.rq_ns``), each rank's run-queue wait per run at the run's start.

Track ids are synthetic (from :data:`TRACK_TID_BASE` up) so that they never
collide with a pid: Perfetto takes a thread whose tid equals its pid for the
process' main thread. The real thread id is in the track's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from dsprof.analysis.analyze import AnalysisResult
from dsprof.analysis.engine import Engine
from dsprof.analysis.invocations import serving_row
from dsprof.analysis.layout import GC_LANE, assign_lanes, build_lanes, collection_row, serving_spans_sql
from dsprof.analysis.summary_model import StepRow
from dsprof.profiler import sa_profile

TRACK_TID_BASE = 1 << 30
SERVING_PROCESS_SORT = 0
RANK_PROCESS_SORT = 1000
SERVING_THREAD_SORT = 0
RUNTIME_THREAD_SORT = 100
# A scheduler span carrying a step dispatched that step's run in its own rank process.
STEP_LINK_CATEGORY = sa_profile.CAT_SCHEDULER
FLOW_NAME = "dispatch"
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

    @property
    def threads(self) -> list[Thread]:
        return [*self.serving.values(), *self.runtime.values()]

    def runtime_track_table(self) -> pa.Table:
        """``pid, tid, lane -> track`` as a table, to join against span batches."""
        keys = list(self.runtime)
        return pa.table(
            {
                "pid": pa.array([k[0] for k in keys], pa.int64()),
                "tid": pa.array([k[1] for k in keys], pa.int64()),
                "lane": pa.array([k[2] for k in keys], pa.int64()),
                "track": pa.array([t.tid for t in self.runtime.values()], pa.int64()),
            }
        )

    def serving_track_table(self) -> pa.Table:
        """``pid, tid, cat, lane -> track`` as a table, to join against span batches."""
        keys = list(self.serving)
        return pa.table(
            {
                "pid": pa.array([k[0] for k in keys], pa.int64()),
                "tid": pa.array([k[1] for k in keys], pa.int64()),
                "cat": pa.array([k[2] for k in keys], pa.string()),
                "lane": pa.array([k[3] for k in keys], pa.int64()),
                "track": pa.array([t.tid for t in self.serving.values()], pa.int64()),
            }
        )


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
    pids = {t.pid for t in runtime.values()} | {t.pid for t in serving.values()}
    return TrackLayout(
        processes=_processes(result, pids),
        runtime=runtime,
        serving=serving,
        counters=_skew_counters(engine, result.summary.get("per_step") or []) + _run_queue_counters(engine, steps),
    )


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
    """The serving spans to draw (:func:`~dsprof.analysis.layout.serving_spans_sql`, those given a lane) with their ``lane``."""
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
    """One row per arrow: a serving dispatch span -> the root it started (``src_*`` -> ``dst_*``).

    The source is the span at ``src_file``/``src_line`` (on ``src_pid``/``src_tid``, category ``src_cat``, lane
    ``src_lane``, at ``src_ts``); the
    destination the root of run ``dst_pid``/``dst_inv`` (on ``dst_tid``, lane ``dst_lane``, at ``dst_ts``),
    among the runs drawn (``steps``: the decode steps drawn; None: all).

    A span links by the first identity it carries: ``dispatch_id`` (non-zero),
    else ``run_id``, else — a scheduler span in a rank process — ``step``. A
    span in a rank process only links to roots of that process, so one
    scheduler step of rank r starts rank r's run, not every rank's; a span of
    a process without runs (a central scheduler) links by dispatch_id or run_id.
    The three ways exclude each other, so each is its own (hash) join.
    """
    same_process = "(NOT d.in_rank_process OR r.pid = d.pid)"
    return engine.arrow(f"""
        WITH roots AS (SELECT r.pid, r.tid, l.lane, r.inv, r.root_ts_ns, r.dispatch_id, r.run_id, r.step_attr
                       FROM runs r JOIN lanes l ON l.pid = r.pid AND l.inv = r.inv
                       LEFT JOIN decode d ON d.pid = r.pid AND d.inv = r.inv WHERE {_drawn_runs(engine, steps)}),
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
                WHERE d.in_rank_process AND d.dispatch_id = 0 AND d.run_id IS NULL AND d.cat = '{STEP_LINK_CATEGORY}')
        SELECT file AS src_file, line AS src_line, pid AS src_pid, tid AS src_tid, cat AS src_cat, lane AS src_lane,
               ts_ns AS src_ts, dst_pid, dst_tid, dst_lane, dst_inv, dst_ts
        FROM links ORDER BY src_ts, src_file, src_line, dst_pid, dst_ts, dst_inv""")
