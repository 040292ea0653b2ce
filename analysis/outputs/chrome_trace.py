"""The one Chrome trace writer: ``combined-swimlane.json`` and the Perfetto JSON export.

Where every span, arrow and counter goes is
:mod:`~dsprof.analysis.outputs.perfetto_tracks`, shared with the native
protobuf writer; this module only spells it as Chrome trace events (``request``
spans, which overlap on one thread, as async slices instead of an invented
nesting). The combined swimlane keeps a span budget, as ``otherData`` says. A
path ending in ``.gz`` is written gzip-compressed. Events, args and the budget:
docs/REPORTS.md, "perfetto-json".
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
from dsprof.analysis.outputs.drawing import detailed_steps, drawn_runs_sql, runtime_spans_sql
from dsprof.analysis.outputs.finding_markers import MARKER_CATEGORY
from dsprof.analysis.outputs.perfetto_tracks import (
    DEVICE_CATEGORY,
    RUNTIME_CATEGORY,
    TrackLayout,
    build_track_layout,
    device_spans_drawn_sql,
    flow_links,
    serving_lanes_sql,
    serving_span_count,
)
from dsprof.analysis.outputs.text import json_string, text_buffer, us_text
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.store.spans import PROMOTED_INT_ATTRS
from dsprof.fileio import atomic_output
from dsprof.profiler import sa_profile
from dsprof.profiler import strace_format as fmt

BATCH_ROWS = 200_000
# combined-swimlane.json: Perfetto UI loads a JSON trace whole into the tab; 500k spans (~190 MB) still open in
# seconds. Steps beyond it are left out (otherData.steps_left_out); `dsprof export` writes every span.
COMBINED_SPAN_BUDGET = 500_000
# Events in one order whatever the query engine's threads did: by process and time; a span's place in its file decides ties.
SPAN_ORDER = "ORDER BY pid, ts_ns, file, line"
# A span whose track is unknown (cannot happen for a run in ``runs``) lands here rather than on a real thread.
UNKNOWN_TRACK = -1
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
    """``{...}`` of the members present in each row (a null member is left out).

    Each present member brings its own trailing comma and the last one is
    trimmed: a member's JSON text never ends in a bare comma. (Arrow's
    ``null_handling="skip"`` join loses rows when a member is null throughout.)
    """
    with_comma = [pc.fill_null(_join(member, ","), "") for member in members]
    inner = pc.utf8_rtrim(pc.binary_join_element_wise(*with_comma, _lit("")), ",")
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


def write_chrome_trace(
    result: AnalysisResult, path: str | Path, *, span_budget: int | None = None, progress: Callable[[str], None] | None = None
) -> Path:
    """Write the swimlane as Chrome trace JSON that Perfetto and chrome://tracing load (``.gz``: compressed)."""
    path = Path(path)
    engine = result.engine
    steps, total = detailed_steps(engine, span_budget)
    layout = build_track_layout(result, steps, serving_budget=span_budget)
    serving_total = serving_span_count(engine)
    if steps is not None:
        engine.con.register("kept_steps", pa.table({"step": pa.array(steps, pa.int64())}))
    keep = "TRUE" if steps is None else "(r.step IS NULL OR r.step IN (SELECT step FROM kept_steps))"
    other = {
        "producer": "dsprof",
        "summary_schema": result.summary.get("schema"),
        "valid": (result.summary.get("validation") or {}).get("valid"),
        "clock": "host CLOCK_MONOTONIC, ts/dur in us; wall_ns args from CLOCK_ANCHOR",
        "runtime_spans": total,
        "steps_left_out": None if steps is None else int(engine.scalar("SELECT count(DISTINCT step) FROM decode")) - len(steps),
        "window": None if result.window is None else result.window.block(),
        "serving_spans": serving_total,
        "serving_spans_left_out": max(0, serving_total - span_budget) if span_budget is not None else 0,
    }
    with atomic_output(path) as raw:
        out: BinaryIO = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) if path.suffix == ".gz" else raw  # type: ignore[assignment]
        out.write(b'{"displayTimeUnit":"ns","otherData":' + json.dumps(other).encode() + b',"traceEvents":[\n')
        writer = _Writer(out)
        writer.dicts(metadata_events(layout))
        runtime_tracks, device_tracks, serving_tracks = (
            layout.runtime_track_table(),
            layout.device_track_table(),
            layout.serving_track_table(),
        )
        engine.run(f"CREATE OR REPLACE TEMP TABLE drawn_runs AS {drawn_runs_sql(keep)}")
        for batch in _batches(engine, f"SELECT * FROM ({runtime_spans_sql('drawn_runs')}) {SPAN_ORDER}", progress, "runtime spans"):
            writer.events(_runtime_events(batch, runtime_tracks, RUNTIME_CATEGORY))
        for batch in _batches(engine, f"SELECT * FROM ({device_spans_drawn_sql('drawn_runs')}) {SPAN_ORDER}", progress, "device spans"):
            writer.events(_runtime_events(batch, device_tracks, DEVICE_CATEGORY))
        for batch in _batches(engine, f"SELECT * FROM ({serving_lanes_sql()}) {SPAN_ORDER}", progress, "serving spans"):
            writer.events(_serving_events(batch, serving_tracks, writer))
        writer.events(_marker_events(engine))
        writer.events(_flow_events(flow_links(engine, steps)))
        writer.events(counter_events(layout))
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


def metadata_events(layout: TrackLayout) -> list[dict]:
    """Names and sort order of every process and track."""
    events = []
    for process in layout.processes:  # one per process
        events.append({"ph": "M", "name": "process_name", "pid": process.pid, "tid": 0, "args": {"name": process.name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": process.pid, "tid": 0, "args": {"sort_index": process.sort_index}})
    for thread in layout.threads:  # one per track
        events.append({"ph": "M", "name": "thread_name", "pid": thread.pid, "tid": thread.tid, "args": {"name": thread.name}})
        events.append(
            {"ph": "M", "name": "thread_sort_index", "pid": thread.pid, "tid": thread.tid, "args": {"sort_index": thread.sort_index}}
        )
    return events


def counter_events(layout: TrackLayout) -> pa.Array:
    """One ``C`` event per counter value; global counters go to the first process (Chrome counters belong to one)."""
    home = layout.processes[0].pid if layout.processes else 0
    return pa.concat_arrays(
        [pa.array([], pa.string())]
        + [
            _join(
                f'{{"ph":"C","name":{json.dumps(counter.name)},"pid":{home if counter.pid is None else counter.pid},"tid":0,"ts":',
                us_text(counter.ts_ns),
                ',"args":{"ms":',
                pc.cast(pa.array(counter.values, pa.float64()), pa.string()),
                "}}",
            )
            for counter in layout.counters  # a few: two skew counters and one per rank process
        ]
    )


def _marker_events(engine: Engine) -> pa.Array:
    """An instant (``i``, thread scope) per finding's marker on its process's findings track, the item's facts as args."""
    markers = _plain(
        engine.arrow("SELECT m.*, t.track FROM finding_markers m JOIN track_of_findings t USING (pid) ORDER BY m.ts_ns, m.marker")
    )
    if markers.num_rows == 0:
        return pa.array([], pa.string())
    members = [
        *[_member(name, json_string(markers.column(name), null=None)) for name in ("kind", "mechanism", "phase", "finding")],
        *[_member(name, _ints(markers.column(name))) for name in ("step", "rank")],
        *[_member(name, pc.cast(markers.column(name), pa.string())) for name in ("excess_ms", "evidence_ms")],
    ]
    return _event_text(markers, f',"cat":"{MARKER_CATEGORY}","ph":"i","s":"t","ts":', "", markers.column("track"), members)


def _runtime_events(batch: pa.RecordBatch, tracks: pa.Table, category: str) -> pa.Array:
    track = _track_ids(batch, tracks)
    is_runner = pc.equal(batch.column("phase"), fmt.PHASE_RUNNER).fill_null(False)
    device_wall = pc.if_else(is_runner, batch.column("run_device_wall_ns"), pa.scalar(None, pa.int64()))
    optional_int = {name: batch.column(name) for name in ("step", "rank", "lane", *fmt.IDENTITY_ATTRS)}
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
    duration = _join(',"dur":', us_text(batch.column("dur_ns").to_numpy()))
    return _event_text(batch, f',"cat":"{category}","ph":"X","ts":', duration, pa.array(track), members)


def _event_text(rows: pa.RecordBatch, head: str, after_ts: pa.Array | str, track: pa.Array, members: list[pa.Array]) -> pa.Array:
    """``{"name":...`` ``head`` ts ``after_ts`` ``,"pid":...,"tid":...,"args":{members}}`` of each row (its name, ts_ns and pid)."""
    return _join(
        '{"name":',
        json_string(rows.column("name"), null="null"),
        head,
        us_text(rows.column("ts_ns").to_numpy()),
        after_ts,
        ',"pid":',
        _ints(rows.column("pid")),
        ',"tid":',
        _ints(track),
        ',"args":',
        _object(members),
        "}",
    )


def _track_ids(rows: pa.RecordBatch | pa.Table, tracks: pa.Table) -> np.ndarray:
    """The track of each row, matched on the key columns of ``tracks`` (all but ``track``), in row order."""
    keys = [name for name in tracks.column_names if name != "track"]
    table = pa.table({**{k: rows.column(k) for k in keys}, "row": pa.array(np.arange(rows.num_rows))})
    joined = table.join(tracks, keys, join_type="left outer")
    track = np.full(rows.num_rows, UNKNOWN_TRACK, np.int64)
    track[joined.column("row").to_numpy()] = joined.column("track").fill_null(UNKNOWN_TRACK).to_numpy()
    return track


def _serving_events(batch: pa.RecordBatch, tracks: pa.Table, writer: _Writer) -> pa.Array:
    is_request = pc.equal(batch.column("cat"), sa_profile.CAT_REQUEST).fill_null(False).to_numpy(zero_copy_only=False)
    members = [
        *[_member(name, _ints(batch.column(name))) for name in ("rank", "step", "dispatch_id", "run_id")],
        _member("wall_ns", _join('"', _ints(batch.column("wall_ns")), '"')),
        _attrs_members(batch.column("attrs")),
    ]
    args = _object(members)
    head = _join('{"name":', json_string(batch.column("name"), null="null"), ',"cat":', json_string(batch.column("cat"), null="null"))
    where = _join(',"pid":', _ints(batch.column("pid")), ',"tid":', _ints(pa.array(_track_ids(batch, tracks))))
    ts = us_text(batch.column("ts_ns").to_numpy())
    is_instant = pc.equal(batch.column("ph"), "i").fill_null(False)
    duration = _join(',"ph":"X","dur":', us_text(batch.column("dur_ns").to_numpy()))
    complete = _join(head, pc.if_else(is_instant, _lit(',"ph":"i","s":"t"'), duration), ',"ts":', ts, where, ',"args":', args, "}")
    if not is_request.any():
        return complete
    # overlapping request spans: async slices, one id each
    rows = pa.array(np.flatnonzero(is_request))
    ids = _ints(pa.array(np.arange(writer.next_id, writer.next_id + len(rows))))
    writer.next_id += len(rows)
    sub = batch.take(rows)
    req_head, req_where = head.take(rows), where.take(rows)
    end = us_text(sub.column("ts_ns").to_numpy() + sub.column("dur_ns").to_numpy())
    begin = _join(req_head, ',"ph":"b","id":', ids, ',"ts":', ts.take(rows), req_where, ',"args":', args.take(rows), "}")
    finish = _join(req_head, ',"ph":"e","id":', ids, ',"ts":', end, req_where, "}")
    return pa.concat_arrays([complete.filter(pa.array(~is_request)), begin, finish])


def _plain(table: pa.Table) -> pa.RecordBatch:
    """A table as one batch of plain arrays (one chunk each)."""
    return pa.RecordBatch.from_struct_array(table.to_struct_array().combine_chunks())


def _flow_events(links: pa.Table) -> pa.Array:
    """An ``s``/``f`` pair per arrow (see :func:`~dsprof.analysis.outputs.perfetto_tracks.flow_links`)."""
    if links.num_rows == 0:
        return pa.array([], pa.string())
    batch = _plain(links)
    flow_id = _ints(pa.array(np.arange(1, links.num_rows + 1)))
    name = json_string(batch.column("name"))

    def flow_end(head: str, side: str) -> pa.Array:
        ts, pid, track = (
            us_text(batch.column(f"{side}_ts").to_numpy()),
            _ints(batch.column(f"{side}_pid")),
            _ints(batch.column(f"{side}_track")),
        )
        return _join(f"{{{head},", '"name":', name, ',"cat":"flow","id":', flow_id, ',"ts":', ts, ',"pid":', pid, ',"tid":', track, "}")

    return pa.concat_arrays([flow_end('"ph":"s"', "src"), flow_end('"ph":"f","bp":"e"', "dst")])
