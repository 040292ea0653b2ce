"""The native Perfetto export: a ``.pftrace`` (Perfetto's protobuf trace) built with the ``perfetto`` package.

The picture is the JSON export's (:mod:`~dsprof.analysis.outputs.perfetto_tracks`
decides processes, tracks, names, arrows and counters); here it is spelled as
``TracePacket`` s of :class:`perfetto.trace_builder.proto_builder.TraceProtoBuilder`.
Events are ordered in the engine (SQL) so that every track nests as Perfetto
requires, and streamed out in batches, one builder per batch, so memory stays
bounded. Timestamps are the spans' host CLOCK_MONOTONIC nanoseconds, written on
Perfetto's default trace clock. Packets and order: docs/REPORTS.md, "perfetto (.pftrace)".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto.trace_builder.proto_builder import TraceProtoBuilder

from dsprof.analysis.analyze import AnalysisResult
from dsprof.analysis.outputs.drawing import drawn_runs_sql, runtime_spans_sql
from dsprof.analysis.outputs.finding_markers import MARKER_CATEGORY
from dsprof.analysis.outputs.perfetto_tracks import (
    DEVICE_CATEGORY,
    RUNTIME_CATEGORY,
    TrackLayout,
    build_track_layout,
    device_spans_drawn_sql,
    flow_links,
    serving_lanes_sql,
)
from dsprof.analysis.store.engine import Engine
from dsprof.fileio import atomic_output
from dsprof.profiler import strace_format as fmt

SEQUENCE_ID = 1
BATCH_ROWS = 100_000
# Debug annotations of a runtime span's begin: integer columns, then text columns (null: left out).
RUNTIME_INT_ARGS = (
    "step",
    "rank",
    "lane",
    "run_id",
    "dispatch_id",
    "run_epoch",
    "slot_id",
    "generation",
    "os_cpu_ns",
    "os_rq_ns",
    "os_nivcsw",
    "os_majflt",
    "device_wall_dur_ns",
)
# (annotation name, column) of the text annotations; then a finding's marker's own
TEXT_ARGS = (
    ("phase", "phase"),
    ("device", "device"),
    ("callable", "callable"),
    ("inv", "inv_text"),
    ("wall_ns", "wall_text"),
    ("kind", "kind"),
    ("mechanism", "mechanism"),
    ("finding", "finding"),
)
# Debug annotations of a finding's marker that are numbers with a fraction (ms).
FLOAT_ARGS = ("excess_ms", "evidence_ms")
# Attribute names as the trace wrote them, for the promoted host-evidence columns.
EVIDENCE_NAMES = {"os_cpu_ns": "os.cpu_ns", "os_rq_ns": "os.rq_ns", "os_nivcsw": "os.nivcsw", "os_majflt": "os.majflt"}


def write_perfetto_proto(result: AnalysisResult, path: str | Path, *, progress: Callable[[str], None] | None = None) -> Path:
    """Write ``result``'s swimlane as a Perfetto protobuf trace (``.pftrace``) and return its path."""
    path = Path(path)
    engine = result.engine
    layout = build_track_layout(result)
    uuids = _Uuids(layout)
    _register_tracks(engine, layout, uuids)
    _register_counters(engine, layout, uuids)
    _register_flows(engine)
    interned = _Interned.of(engine)
    with atomic_output(path) as out:
        out.write(_descriptors(layout, uuids, interned).serialize())
        reader = engine.con.sql(_ORDERED_EVENTS_SQL).to_arrow_reader(BATCH_ROWS)
        done = 0
        for batch in reader:
            out.write(_event_packets(batch, interned).serialize())
            done += batch.num_rows
            if progress:
                progress(f"writing trace events: {done:,}")
    return path


@dataclass
class _Interned:
    """Iids of the event names, categories and debug-annotation names, written once in the sequence's first packet."""

    names: dict[str, int]
    categories: dict[str, int]
    annotations: dict[str, int]

    @classmethod
    def of(cls, engine: Engine) -> _Interned:
        def iids(query: str, fixed: tuple[str, ...] = ()) -> dict[str, int]:
            values = dict.fromkeys([*fixed, *(row[0] for row in engine.rows(query))])
            return {value: i + 1 for i, value in enumerate(values)}

        return cls(
            names=iids("SELECT DISTINCT name FROM report_events WHERE name IS NOT NULL ORDER BY 1"),
            categories=iids("SELECT DISTINCT cat FROM report_events WHERE cat IS NOT NULL ORDER BY 1"),
            annotations=iids(
                "SELECT DISTINCT k FROM (SELECT unnest(map_keys(attrs)) AS k FROM report_events) ORDER BY 1",
                (*(EVIDENCE_NAMES.get(n, n) for n in RUNTIME_INT_ARGS), *(n for n, _ in TEXT_ARGS), *FLOAT_ARGS),
            ),
        )

    def fill(self, data: pb.InternedData) -> None:
        data.event_names.extend(pb.EventName(iid=iid, name=name) for name, iid in self.names.items())
        data.event_categories.extend(pb.EventCategory(iid=iid, name=name) for name, iid in self.categories.items())
        data.debug_annotation_names.extend(pb.DebugAnnotationName(iid=iid, name=name) for name, iid in self.annotations.items())


class _Uuids:
    """A track uuid for every process, track and counter of the layout, numbered from 1."""

    def __init__(self, layout: TrackLayout):
        numbers = iter(range(1, 1 + len(layout.processes) + len(layout.threads) + len(layout.counters)))
        self.process = {p.pid: next(numbers) for p in layout.processes}
        self.thread = {(t.pid, t.tid): next(numbers) for t in layout.threads}
        self.counter = [next(numbers) for _ in layout.counters]


def _register_tracks(engine: Engine, layout: TrackLayout, uuids: _Uuids) -> None:
    """Table ``track_uuids`` (layout track -> uuid) and view ``report_events``: every span and marker with its track's uuid
    (``layout_track``: the layout's track), ``origin`` (runtime, device, serving, finding) and what it is annotated with."""
    thread_uuids = pa.table(
        {
            "layout_track": pa.array([t.tid for t in layout.threads], pa.int64()),
            "uuid": pa.array([uuids.thread[(t.pid, t.tid)] for t in layout.threads], pa.int64()),
        }
    )
    engine.con.register("track_uuids", thread_uuids)  # one row per track
    runtime_columns = f"""s.name, s.ts_ns, s.dur_ns, s.depth, s.pid, s.inv,
               s.step, s.rank, s.lane, s.run_id, s.dispatch_id, s.run_epoch, s.slot_id, s.generation,
               s.os_cpu_ns, s.os_rq_ns, s.os_nivcsw, s.os_majflt,
               CASE WHEN s.phase = '{fmt.PHASE_RUNNER}' THEN s.run_device_wall_ns END AS device_wall_dur_ns,
               s.phase, s.device, s.callable, CAST(s.inv AS VARCHAR) AS inv_text, CAST(s.wall_ns AS VARCHAR) AS wall_text,
               s.attrs, s.file, s.line"""
    engine.run(f"""CREATE OR REPLACE TEMP VIEW report_events AS
        SELECT u.uuid AS track, t.track AS layout_track, 'runtime' AS origin, '{RUNTIME_CATEGORY}' AS cat, 'X' AS ph, {runtime_columns}
        FROM ({runtime_spans_sql()}) s JOIN track_of_run t USING (pid, tid, lane) JOIN track_uuids u ON u.layout_track = t.track
        UNION ALL BY NAME
        SELECT u.uuid AS track, t.track AS layout_track, 'device' AS origin, '{DEVICE_CATEGORY}' AS cat, 'X' AS ph, {runtime_columns}
        FROM ({device_spans_drawn_sql(f"({drawn_runs_sql()})")}) s JOIN track_of_device t USING (pid, device_lane) JOIN track_uuids u ON u.layout_track = t.track
        UNION ALL BY NAME
        SELECT u.uuid AS track, t.track AS layout_track, 'serving' AS origin, s.name, s.cat, s.ph, s.ts_ns, s.dur_ns, NULL AS depth,
               s.pid, NULL AS inv, s.step, s.rank, s.dispatch_id, s.run_id, CAST(s.wall_ns AS VARCHAR) AS wall_text, s.attrs,
               s.file, s.line
        FROM ({serving_lanes_sql()}) s JOIN track_of_serving t USING (pid, tid, cat, lane) JOIN track_uuids u ON u.layout_track = t.track
        UNION ALL BY NAME
        SELECT u.uuid AS track, t.track AS layout_track, 'finding' AS origin, m.name, '{MARKER_CATEGORY}' AS cat, 'i' AS ph,
               m.ts_ns, 0 AS dur_ns, m.pid, m.step, m.rank, m.phase, m.kind, m.mechanism, m.finding, m.excess_ms, m.evidence_ms,
               m.marker
        FROM finding_markers m JOIN track_of_findings t USING (pid) JOIN track_uuids u ON u.layout_track = t.track""")


def _register_counters(engine: Engine, layout: TrackLayout, uuids: _Uuids) -> None:
    """``counter_values`` (t, track, value): every counter value, to be ordered with the slices."""
    counters = list(zip(layout.counters, uuids.counter, strict=True))
    engine.con.register(
        "counter_values",
        pa.table(
            {
                "t": pa.array(np.concatenate([c.ts_ns for c, _ in counters] + [np.zeros(0, np.int64)]), pa.int64()),
                "track": pa.array(
                    np.concatenate([np.full(len(c.ts_ns), uuid, np.int64) for c, uuid in counters] + [np.zeros(0, np.int64)])
                ),
                "value": pa.array(np.concatenate([c.values for c, _ in counters] + [np.zeros(0)]), pa.float64()),
            }
        ),
    )


def _register_flows(engine: Engine) -> None:
    """Flow ids leaving each serving span (``flow_out_span``) and marker (``flow_out_marker``), and ending on each
    root (``flow_in_root``) and span (``flow_in_span``), numbered in :func:`flow_links`' order."""
    engine.con.register("flow_links_in", flow_links(engine))
    engine.run("""CREATE OR REPLACE TEMP TABLE flows AS SELECT row_number() OVER (
            ORDER BY src_ts, src_file, src_line, src_marker, dst_pid, dst_ts, dst_inv, dst_file, dst_line) AS flow_id, * FROM flow_links_in;
        CREATE OR REPLACE TEMP TABLE flow_out_span AS SELECT src_file, src_line, list(flow_id ORDER BY flow_id) AS ids
            FROM flows WHERE src_marker IS NULL GROUP BY ALL;
        CREATE OR REPLACE TEMP TABLE flow_out_marker AS SELECT src_marker, list(flow_id ORDER BY flow_id) AS ids
            FROM flows WHERE src_marker IS NOT NULL GROUP BY ALL;
        CREATE OR REPLACE TEMP TABLE flow_in_root AS SELECT dst_pid, dst_inv, list(flow_id ORDER BY flow_id) AS ids
            FROM flows WHERE dst_inv IS NOT NULL GROUP BY ALL;
        CREATE OR REPLACE TEMP TABLE flow_in_span AS SELECT dst_file, dst_line, dst_ts, dst_track, list(flow_id ORDER BY flow_id) AS ids
            FROM flows WHERE dst_file IS NOT NULL GROUP BY ALL""")


# Begin and end events in an order every track nests in: by time; at one time ends first (inner before
# outer), then zero-length spans and instants (begin, then end), then begins (outer before inner); remaining
# ties by the span's place in its file (span_id), then track, so that the same input gives the same bytes.
_ORDERED_EVENTS_SQL = """
WITH spans_out AS (
    SELECT e.*, row_number() OVER (ORDER BY e.file, e.line, e.ts_ns, e.track, e.marker) AS span_id,
           coalesce(fo.ids, mo.ids) AS flow_out, list_concat(fr.ids, fs.ids) AS flow_in
    FROM report_events e
    LEFT JOIN flow_out_span fo ON e.origin = 'serving' AND fo.src_file = e.file AND fo.src_line = e.line
    LEFT JOIN flow_out_marker mo ON mo.src_marker = e.marker
    LEFT JOIN flow_in_root fr ON e.origin = 'runtime' AND e.depth = 0 AND fr.dst_pid = e.pid AND fr.dst_inv = e.inv
    LEFT JOIN flow_in_span fs ON fs.dst_file = e.file AND fs.dst_line = e.line AND fs.dst_ts = e.ts_ns AND fs.dst_track = e.layout_track)
SELECT * FROM (
    SELECT ts_ns AS t, CASE WHEN ph = 'i' OR dur_ns = 0 THEN 1 ELSE 2 END AS k, -dur_ns AS k2, coalesce(depth, 0) AS k3,
           span_id, 0 AS is_end, track, name, cat, ph, flow_out, flow_in,
           step, rank, lane, run_id, dispatch_id, run_epoch, slot_id, generation, os_cpu_ns, os_rq_ns, os_nivcsw, os_majflt,
           device_wall_dur_ns, phase, device, callable, inv_text, wall_text, kind, mechanism, finding, excess_ms, evidence_ms, attrs
    FROM spans_out
    UNION ALL BY NAME
    SELECT ts_ns + dur_ns AS t, CASE WHEN dur_ns = 0 THEN 1 ELSE 0 END AS k, CASE WHEN dur_ns = 0 THEN 0 ELSE -ts_ns END AS k2,
           CASE WHEN dur_ns = 0 THEN coalesce(depth, 0) ELSE -coalesce(depth, 0) END AS k3, span_id, 1 AS is_end, track, ph
    FROM spans_out WHERE ph <> 'i'
    UNION ALL BY NAME
    SELECT t, 1 AS k, 0 AS k2, 0 AS k3, 0 AS span_id, 0 AS is_end, track, 'C' AS ph, value FROM counter_values)
ORDER BY t, k, k2, k3, span_id, is_end, track, value
"""


def _descriptors(layout: TrackLayout, uuids: _Uuids, interned: _Interned) -> TraceProtoBuilder:
    """The sequence's first packet (interned names and categories), then a descriptor per process, track and counter."""
    builder = TraceProtoBuilder()
    first = builder.add_packet()
    first.trusted_packet_sequence_id = SEQUENCE_ID
    first.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    interned.fill(first.interned_data)
    for process in layout.processes:  # one per process
        track = builder.add_packet().track_descriptor
        track.uuid = uuids.process[process.pid]
        track.process.pid, track.process.process_name = process.pid, process.name
        track.process.legacy_sort_index = process.sort_index
        track.sibling_order_rank = process.sort_index
    for thread in layout.threads:  # one per track
        track = builder.add_packet().track_descriptor
        track.uuid, track.parent_uuid = uuids.thread[(thread.pid, thread.tid)], uuids.process[thread.pid]
        track.thread.pid, track.thread.tid, track.thread.thread_name = thread.pid, thread.tid, thread.name
        track.thread.legacy_sort_index = thread.sort_index
    for counter, uuid in zip(layout.counters, uuids.counter, strict=True):  # one per counter track
        track = builder.add_packet().track_descriptor
        track.uuid, track.name = uuid, counter.name
        if counter.pid is not None:
            track.parent_uuid = uuids.process[counter.pid]
        track.counter.unit_name = "ms"
    return builder


def _event_packets(batch: pa.RecordBatch, interned: _Interned) -> TraceProtoBuilder:
    """One packet per begin, end, instant or counter value of ``batch`` (already in order)."""
    builder = TraceProtoBuilder()
    columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
    begin, end, instant = pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END, pb.TrackEvent.TYPE_INSTANT
    for i in range(batch.num_rows):  # one packet per event: the protobuf builder takes them one by one
        packet = builder.add_packet()
        packet.timestamp = columns["t"][i]
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        packet.sequence_flags = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        event = packet.track_event
        event.track_uuid = columns["track"][i]
        if columns["is_end"][i]:
            event.type = end
            continue
        if columns["ph"][i] == "C":
            event.type, event.double_counter_value = pb.TrackEvent.TYPE_COUNTER, columns["value"][i]
            continue
        event.type = instant if columns["ph"][i] == "i" else begin
        event.name_iid = interned.names[columns["name"][i]]
        event.category_iids.append(interned.categories[columns["cat"][i]])
        if columns["flow_out"][i]:
            event.flow_ids.extend(columns["flow_out"][i])
        if columns["flow_in"][i]:
            event.terminating_flow_ids.extend(columns["flow_in"][i])
        _annotate(event, columns, i, interned.annotations)
    return builder


def _annotate(event: pb.TrackEvent, columns: dict[str, list], i: int, iids: dict[str, int]) -> None:
    """The span's facts as debug annotations (names interned): identity, host evidence, its own attributes."""
    for name in RUNTIME_INT_ARGS:
        value = columns[name][i]
        if value is not None:
            annotation = event.debug_annotations.add()
            annotation.name_iid, annotation.int_value = iids[EVIDENCE_NAMES.get(name, name)], value
    for name, column in TEXT_ARGS:
        value = columns[column][i]
        if value is not None:
            annotation = event.debug_annotations.add()
            annotation.name_iid, annotation.string_value = iids[name], value
    for name in FLOAT_ARGS:
        value = columns[name][i]
        if value is not None:
            annotation = event.debug_annotations.add()
            annotation.name_iid, annotation.double_value = iids[name], value
    for key, value in columns["attrs"][i] or ():
        annotation = event.debug_annotations.add()
        annotation.name_iid, annotation.string_value = iids[key], value if value is not None else ""
