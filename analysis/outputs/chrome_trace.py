"""The one Chrome trace writer: ``combined-swimlane.json`` and the Perfetto JSON export.

Layout (docs/REPORTS.md), the same in both files:

* one process per rank process, named ``rank R · device D (pid P)`` and sorted
  by rank; processes that only served (e.g. the launcher) keep their own name;
* runtime spans on one track per (OS thread, pipeline-slot lane), named
  ``host thread T · lane L``: runs that overlap on a thread are on different
  lanes, so every track nests strictly; device-clock spans never reach the host
  axis (a runner_run carries its run's ``device_wall_dur_ns``);
* serving spans on one track per (pid, tid), named by the trace's own thread
  name or by the categories it holds; ``request`` spans, which overlap on one
  thread, become async slices (``b``/``e``) instead of inventing a nesting;
* flow arrows from a serving dispatch span to the one root it started: in the
  same process, matched by ``dispatch_id``, else ``run_id``, else (a scheduler
  span) ``step``; a dispatch from a process without runs links to the roots
  carrying its ``dispatch_id`` or ``run_id``;
* args: the run's step, rank, device, phase, callable and lane, ``inv`` and
  ``wall_ns`` as strings (64-bit), host evidence as numbers, every other
  attribute as the text it was read as.

The combined swimlane keeps a span budget: beyond it, the steps with the
largest runner-end skew are kept in full and the others left out, as
``otherData`` says. A path ending in ``.gz`` is written gzip-compressed.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.analyze import AnalysisResult
from dsprof.analysis.layout import build_lanes, detailed_steps, runtime_spans_sql, serving_spans_sql
from dsprof.analysis.outputs.text import json_string, text_buffer, us_text
from dsprof.analysis.spans import PROMOTED_INT_ATTRS
from dsprof.fileio import atomic_output
from dsprof.profiler import strace_format as fmt

# Synthetic thread ids start here so they never collide with a real pid (Perfetto treats tid == pid as a main thread).
TRACK_TID_BASE = 1 << 30
SERVING_PROCESS_SORT = 0
RANK_PROCESS_SORT = 1000
RUNTIME_THREAD_SORT = 100
BATCH_ROWS = 200_000
COMBINED_SPAN_BUDGET = 2_000_000
REQUEST_CATEGORY = "request"
STEP_LINK_CATEGORY = "scheduler"
# host evidence columns -> the attribute names they came from
_EVIDENCE = {column: name for name, column in PROMOTED_INT_ATTRS.items() if column.startswith("os_")}


def _lit(text: str) -> pa.Scalar:
    return pa.scalar(text, pa.string())


def _join(*parts) -> pa.Array:
    """Element-wise concatenation; a null part leaves its row null (so optional members can be skipped)."""
    return pc.binary_join_element_wise(*[p if isinstance(p, (pa.Array, pa.ChunkedArray)) else _lit(p) for p in parts], _lit(""))


def _ints(values: pa.Array) -> pa.Array:
    return pc.cast(values, pa.string())


def _member(key: str, text: pa.Array) -> pa.Array:
    return _join(f'"{key}":', text)


def _object(members: list[pa.Array]) -> pa.Array:
    inner = pc.binary_join_element_wise(*members, _lit(","), null_handling="skip")
    return _join("{", inner, "}")


def _attrs_members(attrs: pa.Array) -> pa.Array:
    """Each row's attribute map as object members (``"k":"v",...``), null when it has none."""
    attrs = attrs.combine_chunks() if isinstance(attrs, pa.ChunkedArray) else attrs
    if len(attrs) == 0:
        return pa.array([], pa.string())
    attrs = attrs.fill_null(pa.scalar([], attrs.type)) if attrs.null_count else attrs
    pairs = _join(json_string(attrs.keys, null=None), ":", json_string(attrs.items, null="null"))
    offsets = pc.subtract(attrs.offsets, attrs.offsets[0])
    start = attrs.offsets[0].as_py()
    lists = pa.ListArray.from_arrays(offsets, pairs.slice(start, attrs.offsets[-1].as_py() - start))
    joined = pc.binary_join(lists, ",")
    return pc.if_else(pc.equal(joined, ""), pa.scalar(None, pa.string()), joined)


class _Writer:
    """Events as JSON text, written chunk by chunk with one separator between events."""

    def __init__(self, out: BinaryIO):
        self.out, self.first = out, True
        self.next_id = 1  # async slice ids, unique in the file

    def events(self, text: pa.Array) -> None:
        if len(text) == 0:
            return
        text = text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text
        lines = pc.binary_join_element_wise(text, _lit(",\n"), _lit(""))
        if not self.first:
            self.out.write(b",\n")
        data = text_buffer(lines)
        self.out.write(data[:-2])  # the last event's separator goes with the next chunk
        self.first = False

    def dicts(self, events: list[dict]) -> None:
        self.events(pa.array([json.dumps(e, ensure_ascii=False) for e in events], pa.string()))


def write_chrome_trace(result: AnalysisResult, path: str | Path, *, span_budget: int | None = None,
                       progress: Callable[[str], None] | None = None) -> Path:
    """Write the swimlane as Chrome trace JSON that Perfetto and chrome://tracing load (``.gz``: compressed)."""
    path = Path(path)
    engine = result.engine
    build_lanes(engine)
    steps, total = detailed_steps(engine, span_budget)
    if steps is not None:
        engine.con.register("kept_steps", pa.table({"step": pa.array(steps, pa.int64())}))
    keep = "TRUE" if steps is None else "(d.step IS NULL OR d.step IN (SELECT step FROM kept_steps))"
    tracks = _runtime_tracks(engine)
    other = {
        "producer": "dsprof",
        "summary_schema": result.summary.get("schema"),
        "valid": (result.summary.get("validation") or {}).get("valid"),
        "clock": "host CLOCK_MONOTONIC, ts/dur in us; wall_ns args from CLOCK_ANCHOR",
        "runtime_spans": total,
        "steps_left_out": None if steps is None else int(engine.scalar("SELECT count(DISTINCT step) FROM decode")) - len(steps),
    }
    with atomic_output(path) as raw:
        out: BinaryIO = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) if path.suffix == ".gz" else raw  # type: ignore[assignment]
        out.write(b'{"displayTimeUnit":"ns","otherData":' + json.dumps(other).encode() + b',"traceEvents":[\n')
        writer = _Writer(out)
        writer.dicts(_metadata(result, tracks))
        for batch in _batches(engine, runtime_spans_sql(keep), progress, "runtime spans"):
            writer.events(_runtime_events(batch, tracks))
        serving_tracks = _serving_tracks(engine)
        writer.dicts(_serving_metadata(serving_tracks))
        for batch in _batches(engine, serving_spans_sql(), progress, "serving spans"):
            writer.events(_serving_events(batch, writer))
        writer.events(_flow_events(engine, tracks, serving_tracks))
        out.write(b"\n]}\n")
        if out is not raw:
            out.close()
    return path


def _batches(engine, query: str, progress, what: str) -> Iterator[pa.RecordBatch]:
    reader = engine.con.sql(query).to_arrow_reader(BATCH_ROWS)
    done = 0
    for batch in reader:
        done += batch.num_rows
        if progress:
            progress(f"writing {what}: {done:,}")
        yield batch


def _runtime_tracks(engine) -> dict[tuple[int, int, int], int]:
    rows = engine.rows("SELECT DISTINCT r.pid, r.tid, l.lane FROM runs r JOIN lanes l USING (pid, inv) ORDER BY 1, 2, 3")
    return {(pid, tid, lane): TRACK_TID_BASE + i for i, (pid, tid, lane) in enumerate(rows)}


def _serving_tracks(engine) -> dict[tuple[int, int], dict]:
    rows = engine.rows("""SELECT pid, tid, list(DISTINCT cat ORDER BY cat) FROM spans
                          WHERE (inv IS NULL OR depth IS NULL) AND ph IN ('X', 'i') GROUP BY pid, tid ORDER BY pid, tid""")
    return {(pid, tid): {"cats": cats} for pid, tid, cats in rows}


def _metadata(result: AnalysisResult, tracks: dict) -> list[dict]:
    """Process names and sort order (ranks first by rank), runtime thread names."""
    trace = result.trace
    events = []
    ranked = {p["pid"]: p for p in result.swimlane.processes}
    pids = sorted(set(ranked) | set(trace.process_names))
    for pid in pids:  # one per process
        process = ranked.get(pid)
        name = (f"rank {process['rank']} · {process['device']} (pid {pid})" if process
                else f"{trace.process_names.get(pid, 'serving')} (pid {pid})")
        sort = RANK_PROCESS_SORT + process["rank"] if process else SERVING_PROCESS_SORT
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort}})
    for i, ((pid, tid, lane), track) in enumerate(tracks.items()):  # one per track
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": track, "args": {"name": f"host thread {tid} · lane {lane}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": track, "args": {"sort_index": RUNTIME_THREAD_SORT + i}})
    for (pid, tid), name in trace.thread_names.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
    return events


def _serving_metadata(tracks: dict) -> list[dict]:
    """A name for every serving thread the trace did not name: the categories it holds."""
    return [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"{', '.join(c for c in t['cats'] if c) or 'serving'} (tid {tid})"}}
            for (pid, tid), t in tracks.items()]


def _runtime_events(batch: pa.RecordBatch, tracks: dict) -> pa.Array:
    track = _track_ids(batch, tracks)
    is_runner = pc.equal(batch.column("phase"), fmt.PHASE_RUNNER).fill_null(False)
    device_wall = pc.if_else(is_runner, batch.column("run_device_wall_ns"), pa.scalar(None, pa.int64()))
    optional_int = {name: batch.column(name) for name in ("step", "rank", "lane")}
    members = [
        _member("phase", json_string(batch.column("phase"), null=None)),
        *[_member(name, _ints(values)) for name, values in optional_int.items()],
        _member("device", json_string(batch.column("device"), null=None)),
        _member("callable", json_string(batch.column("callable"), null=None)),
        _member("inv", _join('"', _ints(batch.column("inv")), '"')),
        _member("wall_ns", _join('"', _ints(batch.column("wall_ns")), '"')),
        _member("device_wall_dur_ns", _ints(device_wall)),
        *[_member(name, _ints(batch.column(column))) for column, name in _EVIDENCE.items()],
        _attrs_members(batch.column("attrs")),
    ]
    return _join(
        '{"name":', json_string(batch.column("name"), null="null"), ',"cat":"runtime","ph":"X","ts":',
        us_text(batch.column("ts_ns").to_numpy()), ',"dur":', us_text(batch.column("dur_ns").to_numpy()),
        ',"pid":', _ints(batch.column("pid")), ',"tid":', _ints(pa.array(track)), ',"args":', _object(members), "}",
    )


def _track_ids(batch: pa.RecordBatch, tracks: dict) -> np.ndarray:
    keys = pa.table({"pid": [k[0] for k in tracks], "tid": [k[1] for k in tracks], "lane": [k[2] for k in tracks],
                     "track": list(tracks.values())})
    joined = pa.Table.from_batches([batch.select(["pid", "tid", "lane"])]).append_column("row", pa.array(np.arange(batch.num_rows))).join(
        keys, ["pid", "tid", "lane"], join_type="left outer")
    track = np.full(batch.num_rows, TRACK_TID_BASE - 1, np.int64)
    track[joined.column("row").to_numpy()] = joined.column("track").fill_null(TRACK_TID_BASE - 1).to_numpy()
    return track


def _serving_events(batch: pa.RecordBatch, writer: _Writer) -> pa.Array:
    is_request = pc.equal(batch.column("cat"), REQUEST_CATEGORY).fill_null(False).to_numpy(zero_copy_only=False)
    members = [
        *[_member(name, _ints(batch.column(name))) for name in ("rank", "step", "dispatch_id", "run_id")],
        _member("wall_ns", _join('"', _ints(batch.column("wall_ns")), '"')),
        _attrs_members(batch.column("attrs")),
    ]
    args = _object(members)
    head = _join('{"name":', json_string(batch.column("name"), null="null"), ',"cat":', json_string(batch.column("cat"), null="null"))
    where = _join(',"pid":', _ints(batch.column("pid")), ',"tid":', _ints(batch.column("tid")))
    ts = us_text(batch.column("ts_ns").to_numpy())
    is_instant = pc.equal(batch.column("ph"), "i").fill_null(False)
    complete = _join(head, pc.if_else(is_instant, _lit(',"ph":"i","s":"t"'), _join(',"ph":"X","dur":', us_text(batch.column("dur_ns").to_numpy()))),
                     ',"ts":', ts, where, ',"args":', args, "}")
    if not is_request.any():
        return complete
    # overlapping request spans: async slices, one id each
    rows = np.flatnonzero(is_request)
    ids = _ints(pa.array(np.arange(writer.next_id, writer.next_id + len(rows))))
    writer.next_id += len(rows)
    sub = batch.take(pa.array(rows))
    req_head = head.take(pa.array(rows))
    req_where = where.take(pa.array(rows))
    end = us_text(sub.column("ts_ns").to_numpy() + sub.column("dur_ns").to_numpy())
    begin = _join(req_head, ',"ph":"b","id":', ids, ',"ts":', ts.take(pa.array(rows)), req_where, ',"args":', args.take(pa.array(rows)), "}")
    finish = _join(req_head, ',"ph":"e","id":', ids, ',"ts":', end, req_where, "}")
    return pa.concat_arrays([complete.filter(pa.array(~is_request)), begin, finish])


def _flow_events(engine, tracks: dict, serving_tracks: dict) -> pa.Array:
    """One arrow per dispatch: serving span -> the root it started (see the module docstring)."""
    links = engine.arrow(f"""
        WITH roots AS (SELECT r.pid, r.tid, l.lane, r.inv, r.root_ts_ns, r.dispatch_id, r.run_id, r.step_attr
                       FROM runs r JOIN lanes l USING (pid, inv)),
             dispatch AS (SELECT s.pid, s.tid, s.ts_ns, s.cat, s.dispatch_id, s.run_id, s.step,
                                 s.pid IN (SELECT pid FROM runs) AS in_rank_process
                          FROM spans s WHERE (s.inv IS NULL OR s.depth IS NULL) AND s.ph = 'X'
                            AND (coalesce(s.dispatch_id, 0) <> 0 OR s.run_id IS NOT NULL OR (s.cat = '{STEP_LINK_CATEGORY}' AND s.step IS NOT NULL)))
        SELECT d.pid AS src_pid, d.tid AS src_tid, d.ts_ns AS src_ts, r.pid AS dst_pid, r.tid AS dst_tid, r.lane AS dst_lane,
               r.root_ts_ns AS dst_ts
        FROM dispatch d JOIN roots r ON
             (NOT d.in_rank_process OR r.pid = d.pid) AND (
               (coalesce(d.dispatch_id, 0) <> 0 AND r.dispatch_id = d.dispatch_id)
               OR (coalesce(d.dispatch_id, 0) = 0 AND d.run_id IS NOT NULL AND r.run_id = d.run_id)
               OR (d.in_rank_process AND coalesce(d.dispatch_id, 0) = 0 AND d.run_id IS NULL AND d.cat = '{STEP_LINK_CATEGORY}'
                   AND r.step_attr = d.step))
        ORDER BY src_ts, dst_pid""")
    if links.num_rows == 0:
        return pa.array([], pa.string())
    flow_id = _ints(pa.array(np.arange(1, links.num_rows + 1)))
    dst_track = pa.array([tracks.get(key, TRACK_TID_BASE - 1) for key in zip(  # one per link
        links.column("dst_pid").to_pylist(), links.column("dst_tid").to_pylist(), links.column("dst_lane").to_pylist())], pa.int64())
    start = _join('{"ph":"s","name":"dispatch","cat":"flow","id":', flow_id, ',"ts":', us_text(links.column("src_ts").to_numpy()),
                  ',"pid":', _ints(links.column("src_pid")), ',"tid":', _ints(links.column("src_tid")), "}")
    finish = _join('{"ph":"f","bp":"e","name":"dispatch","cat":"flow","id":', flow_id, ',"ts":',
                   us_text(links.column("dst_ts").to_numpy()), ',"pid":', _ints(links.column("dst_pid")), ',"tid":', _ints(dst_track), "}")
    return pa.concat_arrays([start, finish])


