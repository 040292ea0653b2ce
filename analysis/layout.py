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

from dsprof.analysis.engine import Engine
from dsprof.analysis.invocations import runtime_row, serving_row
from dsprof.profiler import strace_format as fmt

# SQL of the phase label of a runtime span name (strace_format.phase_of, vectorised).
PHASE_SQL = (
    f"CASE WHEN name = '{fmt.ROOT}' THEN '{fmt.PHASE_ROOT}' ELSE "
    f"regexp_replace(regexp_replace(name, '^{fmt.ROOT.replace('.', '[.]')}[.]', ''), '^{fmt.PHASE_RUNNER}[.]', '') END"
)


def assign_lanes(thread: np.ndarray, start: np.ndarray, end: np.ndarray, slot: np.ndarray | None) -> np.ndarray:
    """Pipeline-slot lane per run within its thread, such that overlapping runs never share a lane.

    Start from the run's ``slot_id`` (the ping-pong slot) where every run of
    the thread has one (``slot`` < 0 means absent), else take turns over as many
    lanes as the thread's deepest overlap; then move runs that still overlap
    their lane's predecessor to a fresh lane until no lane holds two overlapping
    runs. Each round is vectorised and settles at least one run; real traces need none.
    """
    import pandas as pd  # here, not at the top: dsprof ingest never loads pandas (test_dsprof_ingest_does_not_import_pandas)

    if len(thread) == 0:
        return np.zeros(0, dtype=np.int64)
    frame = pd.DataFrame(
        {"thread": thread, "start": start, "end": end, "slot": slot if slot is not None else np.full(len(thread), -1)}
    ).sort_values(["thread", "start"], kind="stable")
    # runs in flight at each start = started before it - ended at or before it, within the thread;
    # times are dense-ranked so that (thread, time) packs into one sortable int64 key
    times, codes = np.unique(np.concatenate([frame["start"].to_numpy(), frame["end"].to_numpy()]), return_inverse=True)
    width = len(times) + 1
    threads = frame["thread"].to_numpy(np.int64)
    start_key = threads * width + codes[: len(frame)]
    end_key = np.sort(threads * width + codes[len(frame) :])
    ended = np.searchsorted(end_key, start_key, side="right") - np.searchsorted(end_key, threads * width, side="left")
    started = frame.groupby("thread").cumcount().to_numpy()
    running = pd.Series(np.maximum(started - ended, 0), index=frame.index)
    depth = running.groupby(frame["thread"]).transform("max").to_numpy() + 1
    slot_known = (frame["slot"] >= 0).groupby(frame["thread"]).transform("all").to_numpy()
    frame["lane"] = np.where(slot_known, frame["slot"].to_numpy(np.int64), started % depth)
    while True:
        by_lane = frame.sort_values(["thread", "lane", "start"], kind="stable")
        previous_end = by_lane.groupby(["thread", "lane"])["end"].shift()
        clash = by_lane.index[(by_lane["start"] < previous_end).to_numpy()]
        if len(clash) == 0:
            break
        frame.loc[clash, "lane"] = frame["lane"].max() + 1
    # number lanes 0.. densely within each thread
    dense = frame.groupby("thread")["lane"].rank(method="dense").astype(np.int64) - 1
    return dense.sort_index().to_numpy()


def build_lanes(engine: Engine) -> None:
    """Create ``lanes`` (pid, inv, lane) for every run, and ``anchor_offsets`` (pid, wall − monotonic ns)."""
    runs = engine.arrow(
        "SELECT pid, inv, tid, root_ts_ns, root_end_ns, coalesce(slot_id, -1) AS slot, "
        "dense_rank() OVER (ORDER BY pid, tid) AS thread FROM runs"
    )
    lanes = assign_lanes(
        runs.column("thread").to_numpy(),
        runs.column("root_ts_ns").to_numpy(),
        runs.column("root_end_ns").to_numpy(),
        runs.column("slot").to_numpy(),
    )
    engine.con.register("lanes_in", pa.table({"pid": runs.column("pid"), "inv": runs.column("inv"), "lane": pa.array(lanes)}))
    engine.run("CREATE OR REPLACE TABLE lanes AS SELECT * FROM lanes_in")
    # the serving stack keeps the last anchor of a process; so does dsprof
    engine.run("""CREATE OR REPLACE TABLE anchor_offsets AS
                  SELECT pid, arg_max(wall_ns - mono_ns, seq) AS offset_ns FROM anchors GROUP BY pid""")


def runtime_spans_sql(where: str = "TRUE") -> str:
    """Host-clock runtime spans of the runs in the window, with rank, device, step, callable, lane, phase, identity and wall time."""
    return f"""
    SELECT s.pid, s.tid, s.inv, s.name, s.ts_ns, s.dur_ns, s.depth, s.attrs,
           r.rank, r.device, d.step, r.callable_label AS callable, l.lane, {PHASE_SQL.replace("name", "s.name")} AS phase,
           s.os_cpu_ns, s.os_rq_ns, s.os_nivcsw, s.os_majflt, r.device_wall_ns AS run_device_wall_ns,
           s.run_id, s.dispatch_id, s.run_epoch, s.slot_id, s.generation,
           s.ts_ns + a.offset_ns AS wall_ns
    FROM spans s JOIN runs r ON r.pid = s.pid AND r.inv = s.inv
    LEFT JOIN decode d ON d.pid = s.pid AND d.inv = s.inv
    LEFT JOIN lanes l ON l.pid = s.pid AND l.inv = s.inv
    LEFT JOIN anchor_offsets a ON a.pid = s.pid
    WHERE {runtime_row("s")} AND s.clk <> '{fmt.CLK_DEVICE}' AND ({where})
    """


def device_spans_sql() -> str:
    """Device-clock spans (``clk=dev``) of the runs in the window, placed on the host axis at their run's launch.

    A device span's ``ts`` is an offset on a per-invocation device clock whose
    origin is the program's launch; the launch happens inside runner_run, just
    after it starts, so ``runner_run start + offset`` places it approximately
    (early by the launch latency). For drawing only: no figure uses it. Columns
    as :func:`runtime_spans_sql` has them that a drawing needs, with the run's thread.
    """
    return f"""
    SELECT s.pid, r.tid, s.inv, s.name, r.runner_ts_ns + s.ts_ns AS ts_ns, s.dur_ns, s.depth, r.rank, r.device, d.step,
           l.lane, {PHASE_SQL.replace("name", "s.name")} AS phase
    FROM spans s JOIN runs r ON r.pid = s.pid AND r.inv = s.inv
    LEFT JOIN decode d ON d.pid = s.pid AND d.inv = s.inv
    LEFT JOIN lanes l ON l.pid = s.pid AND l.inv = s.inv
    WHERE {runtime_row("s")} AND s.clk = '{fmt.CLK_DEVICE}' AND r.runner_ts_ns IS NOT NULL
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
