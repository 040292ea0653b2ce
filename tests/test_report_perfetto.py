"""The Perfetto exports: Chrome JSON and the native ``.pftrace``, one layout, checked structurally and in Perfetto's own trace processor."""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
import os
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from dsprof.analysis.outputs.chrome_trace import write_chrome_trace
from dsprof.analysis.outputs.finding_markers import MARKER_CATEGORY
from dsprof.analysis.outputs.perfetto_proto import write_perfetto_proto
from dsprof.analysis.outputs.perfetto_tracks import BLAME_FLOW_NAME, END_SKEW_COUNTER, FLOW_NAME, RUN_QUEUE_COUNTER, START_SKEW_COUNTER
from dsprof.commands.analysis_job import analyze_paths
from dsprof.commands.report import export_from_dir
from dsprof.errors import DsprofError
from dsprof.profiler import artifacts
from dsprof.profiler import strace_format as fmt
from dsprof.testing.coupled import main as write_coupled_log
from dsprof.testing.synthetic import SyntheticRun

RANKS = 4
STEPS = 16
LATE_RANK = 1
HOSTILE = 'a"b\\c\x01</script><img src=x>\u2028'
RUN_ID_LINK = 9  # the central executor span below names the runs with run_id 9 (one per rank)
MS = 1_000_000


def _add_serving_events(directory: Path, run: SyntheticRun) -> None:
    """What the real stack adds: a scheduler.step span per step in every rank process (it dispatches that rank's run),
    a central span naming a run_id, an instant, and hostile text."""
    merged = directory / artifacts.SERVING_TRACE_DIR / artifacts.MERGED_TRACE
    doc = json.loads(merged.read_text())
    first = min(e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X")
    t = run.timings()
    for rank in range(RANKS):
        for step in range(STEPS):
            start = int(t.bind_start_ns[rank, step]) // 1000
            doc["traceEvents"].append(
                {
                    "name": "scheduler.step",
                    "cat": "scheduler",
                    "ph": "X",
                    "ts": start,
                    "dur": 50,
                    "pid": run.pid(rank),
                    "tid": run.pid(rank),
                    "args": {"step": step, "rank": rank},
                }
            )
    doc["traceEvents"] += [
        {
            "name": HOSTILE,
            "cat": "executor",
            "ph": "X",
            "ts": first + 10,
            "dur": 5,
            "pid": 9,
            "tid": 9,
            "args": {"run_id": RUN_ID_LINK, "note": HOSTILE},
        },
        {"name": "marker", "cat": "executor", "ph": "i", "s": "t", "ts": first + 20, "pid": 9, "tid": 9, "args": {}},
    ]
    merged.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("run")
    fence = np.full((RANKS, STEPS), 9 * MS, dtype=np.int64)
    fence[LATE_RANK, 5] += 25 * MS  # a long run that overlaps its two successors
    run = SyntheticRun(ranks=RANKS, steps=STEPS, fence_wait_ns=fence)
    run.write(directory)
    _add_serving_events(directory, run)
    analyze_paths([directory], directory)
    return directory


@pytest.fixture(scope="module")
def analysed(run_dir):
    return analyze_paths([run_dir], None).result


@pytest.fixture(scope="module")
def events(analysed, tmp_path_factory):
    path = write_chrome_trace(analysed, tmp_path_factory.mktemp("out") / "trace.json")
    doc = json.loads(path.read_text())
    assert doc["otherData"]["valid"] is True and doc["displayTimeUnit"] == "ns"
    return doc["traceEvents"]


@pytest.fixture(scope="module")
def proto(analysed, tmp_path_factory) -> tuple[Path, pb.Trace]:
    path = write_perfetto_proto(analysed, tmp_path_factory.mktemp("out") / "trace.pftrace")
    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    return path, trace


def _spans(events):
    return [e for e in events if e["ph"] == "X"]


def _rows(analysed, query: str) -> list[tuple]:
    return analysed.engine.rows(query)


# ---------------------------------------------------------------- Chrome JSON


def test_every_span_is_an_event_with_exact_microseconds(analysed, events):
    runtime = _rows(analysed, "SELECT s.name, s.ts_ns, s.dur_ns FROM spans s JOIN runs r USING (pid, inv) WHERE s.clk = 'host'")
    exported = Counter((e["name"], round(e["ts"] * 1000), round(e["dur"] * 1000)) for e in _spans(events) if e["cat"] == "runtime")
    assert exported == Counter(runtime)  # ts/dur are µs; multiplied back they give the span table's ns exactly
    serving_x = _rows(analysed, "SELECT count(*) FROM spans WHERE inv IS NULL AND ph = 'X' AND cat <> 'request'")[0][0]
    assert len([e for e in _spans(events) if e["cat"] not in ("runtime", "device")]) == serving_x
    for e in _spans(events):
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} <= e.keys() and e["dur"] >= 0
    assert [(e["name"], e["s"]) for e in events if e["ph"] == "i" and e["cat"] != MARKER_CATEGORY] == [("marker", "t")]


def test_roots_carry_identity_and_wall_clock_as_integer_strings(analysed, events):
    pid, inv, ts, wall, run_id, slot = _rows(
        analysed,
        """SELECT s.pid, s.inv, s.ts_ns, s.ts_ns + a.wall_ns - a.mono_ns, s.run_id, s.slot_id
        FROM spans s JOIN anchors a USING (pid) JOIN decode d USING (pid, inv) WHERE s.depth = 0 AND d.step = 3 AND d.rank = 2""",
    )[0]
    root = [e for e in _spans(events) if e["pid"] == pid and e["args"].get("inv") == str(inv) and e["name"] == fmt.ROOT]
    assert len(root) == 1 and round(root[0]["ts"] * 1000) == ts
    assert root[0]["args"]["wall_ns"] == str(wall)
    assert (root[0]["args"]["step"], root[0]["args"]["rank"], root[0]["args"]["run_id"], root[0]["args"]["slot_id"]) == (3, 2, run_id, slot)


def _assert_tracks_nest(events) -> None:
    """Every complete event lies inside or outside each other of its track (pid, tid), never partly."""
    by_track = defaultdict(list)
    for e in _spans(events):
        by_track[(e["pid"], e["tid"])].append((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)))
    for track, intervals in by_track.items():
        stack: list[int] = []
        for start, end in sorted(intervals, key=lambda i: (i[0], -i[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"partial overlap on track {track}"
            stack.append(end)


def test_tracks_nest_strictly_and_overlapping_runs_get_their_own_track(analysed, events):
    _assert_tracks_nest(events)
    # the late rank's long run overlaps its two successors: three tracks hold its roots
    late_pid = _rows(analysed, f"SELECT DISTINCT pid FROM decode WHERE rank = {LATE_RANK}")[0][0]
    assert len({e["tid"] for e in _spans(events) if e["pid"] == late_pid and e["name"] == fmt.ROOT}) == 3


def test_every_process_and_thread_is_named_and_ordered(events):
    meta = defaultdict(dict)
    for e in events:
        if e["ph"] == "M":
            key = (e["pid"],) if e["name"].startswith("process") else (e["pid"], e["tid"])
            meta[key][e["name"]] = e["args"]
    for e in events:
        if e["ph"] in ("X", "i", "b", "e", "s", "f"):
            assert {"process_name", "process_sort_index"} <= meta[(e["pid"],)].keys(), e
            assert {"thread_name", "thread_sort_index"} <= meta[(e["pid"], e["tid"])].keys(), e
    names = [m["process_name"]["name"] for k, m in meta.items() if len(k) == 1]
    ranks = sorted(n.split(" (pid")[0] for n in names if n.startswith("rank "))
    assert ranks == [f"rank {r} · npu:{r}" for r in range(RANKS)]
    sort_of = {m["process_name"]["name"]: m["process_sort_index"]["sort_index"] for k, m in meta.items() if len(k) == 1}
    assert sorted(sort_of, key=sort_of.get)[-RANKS:] == sorted((n for n in names if n.startswith("rank ")), key=sort_of.get)
    assert "serving (pid 9)" in names  # a process the trace never named still gets one


def test_hostile_text_round_trips_through_json(events):
    hostile = [e for e in _spans(events) if e["name"] == HOSTILE]
    assert len(hostile) == 1 and hostile[0]["args"]["note"] == HOSTILE


def test_overlapping_requests_become_async_slices(analysed, events):
    requests = _rows(analysed, "SELECT ts_ns, dur_ns FROM spans WHERE cat = 'request'")
    begins = {e["id"]: e for e in events if e["ph"] == "b"}
    ends = {e["id"]: e for e in events if e["ph"] == "e"}
    assert len(begins) == len(requests) == RANKS * 4 and begins.keys() == ends.keys()
    assert Counter((round(b["ts"] * 1000), round((ends[i]["ts"] - b["ts"]) * 1000)) for i, b in begins.items()) == Counter(requests)
    assert not [e for e in _spans(events) if e["cat"] == "request"]


def _flows(events) -> dict[int, dict]:
    flows: dict[int, dict] = defaultdict(dict)
    for e in events:
        if e["ph"] in ("s", "f"):
            assert e["ph"] not in flows[e["id"]]
            flows[e["id"]][e["ph"]] = e
    return flows


def test_each_root_gets_one_arrow_from_the_span_that_dispatched_it(analysed, events):
    flows = {i: f for i, f in _flows(events).items() if f["s"]["name"] == FLOW_NAME}
    assert all(set(f) == {"s", "f"} and f["f"]["bp"] == "e" for f in flows.values())
    decode_roots = _rows(analysed, "SELECT count(*) FROM decode")[0][0]
    # one arrow per decode root from its own rank's scheduler step (not one per rank: 4x as many), plus one per rank's
    # root with run_id 9 from the central executor span
    assert len(flows) == decode_roots + RANKS
    roots = {(e["pid"], e["tid"], e["ts"]): e for e in _spans(events) if e["name"] == fmt.ROOT}
    starts = Counter()
    for f in flows.values():
        source, target = f["s"], roots[(f["f"]["pid"], f["f"]["tid"], f["f"]["ts"])]
        if source["pid"] == 9:
            starts["central"] += 1
            assert target["args"]["run_id"] == RUN_ID_LINK
        else:
            starts["rank"] += 1
            assert source["pid"] == target["pid"]  # a rank's scheduler starts its own run only
            step = [e for e in _spans(events) if e["pid"] == source["pid"] and e["ts"] == source["ts"] and e["name"] == "scheduler.step"]
            assert step[0]["args"]["step"] == target["args"]["step"]
    assert starts == {"rank": decode_roots, "central": RANKS}
    assert Counter((f["f"]["pid"], f["f"]["ts"]) for f in flows.values() if f["s"]["pid"] != 9).most_common(1)[0][1] == 1


def test_skew_counters_carry_the_summarys_figures(analysed, events):
    per_step = analysed.summary["per_step"]
    for name, key in ((START_SKEW_COUNTER, "runner_start_skew_ms"), (END_SKEW_COUNTER, "runner_end_skew_ms")):
        values = [e["args"]["ms"] for e in sorted((e for e in events if e["ph"] == "C" and e["name"] == name), key=lambda e: e["ts"])]
        assert values == [row[key] for row in per_step]
    assert max(e["args"]["ms"] for e in events if e["ph"] == "C" and e["name"] == END_SKEW_COUNTER) == 25.0


def test_json_gz_is_compressed_json(analysed, tmp_path):
    path = write_chrome_trace(analysed, tmp_path / "t.json.gz")
    assert json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


# ---------------------------------------------------------------- native protobuf


def _descriptors(trace: pb.Trace) -> dict[int, pb.TrackDescriptor]:
    return {p.track_descriptor.uuid: p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")}


def _track_events(trace: pb.Trace) -> list[pb.TracePacket]:
    return [p for p in trace.packet if p.HasField("track_event")]


def _interned_names(trace: pb.Trace) -> dict[int, str]:
    return {n.iid: n.name for p in trace.packet for n in p.interned_data.event_names}


def test_pftrace_names_every_process_and_track(proto, events):
    _, trace = proto
    tracks = _descriptors(trace)
    processes = {t.process.pid: t.process.process_name for t in tracks.values() if t.HasField("process")}
    json_processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes == json_processes  # one layout for both writers
    threads = {(t.thread.pid, t.thread.tid): t.thread.thread_name for t in tracks.values() if t.HasField("thread")}
    json_threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == json_threads and all(threads.values())
    for event in _track_events(trace):
        assert event.track_event.track_uuid in tracks
    for track in tracks.values():
        assert track.name or track.HasField("process") or track.HasField("thread")
        if track.parent_uuid:
            assert tracks[track.parent_uuid].HasField("process")


def test_pftrace_holds_every_slice_nested_on_its_track(proto, events):
    _, trace = proto
    names = _interned_names(trace)
    stacks: dict[int, list[tuple[int, str]]] = defaultdict(list)
    slices = Counter()
    last = 0
    for packet in _track_events(trace):
        event = packet.track_event
        assert packet.timestamp >= last  # in time order
        last = packet.timestamp
        if event.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            stacks[event.track_uuid].append((packet.timestamp, names[event.name_iid]))
        elif event.type == pb.TrackEvent.TYPE_SLICE_END:
            start, name = stacks[event.track_uuid].pop()  # an end closes the innermost open slice of its track
            slices[(name, start, packet.timestamp)] += 1
    assert not any(stacks.values())
    expected = Counter((e["name"], round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)) for e in _spans(events))
    begins = {e["id"]: e for e in events if e["ph"] == "b"}
    expected.update((b["name"], round(b["ts"] * 1000), round(e["ts"] * 1000)) for e in events if e["ph"] == "e" for b in [begins[e["id"]]])
    assert slices == expected


def _annotations(trace: pb.Trace, event: pb.TrackEvent, names: dict[int, str] | None = None) -> dict[str, object]:
    names = names or {n.iid: n.name for p in trace.packet for n in p.interned_data.debug_annotation_names}
    return {
        names[a.name_iid]: next(getattr(a, f) for f in ("string_value", "double_value", "int_value") if a.HasField(f))
        for a in event.debug_annotations
    }


def test_pftrace_annotations_carry_identity_and_text_as_read(proto, analysed):
    _, trace = proto
    names = _interned_names(trace)
    begins = [p.track_event for p in _track_events(trace) if p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN]
    hostile = [e for e in begins if names[e.name_iid] == HOSTILE]
    assert len(hostile) == 1 and _annotations(trace, hostile[0]).items() >= {"run_id": RUN_ID_LINK, "note": HOSTILE}.items()
    inv, run_id, epoch = _rows(analysed, "SELECT inv, run_id, run_epoch FROM decode WHERE step = 3 AND rank = 2")[0]
    root = [a for e in begins if names[e.name_iid] == fmt.ROOT for a in [_annotations(trace, e)] if a.get("inv") == str(inv)]
    assert len(root) == 1
    assert {k: root[0][k] for k in ("step", "rank", "run_id", "run_epoch", "phase", "device")} == {
        "step": 3,
        "rank": 2,
        "run_id": run_id,
        "run_epoch": epoch,
        "phase": "root",
        "device": "npu:2",
    }


def test_pftrace_overlapping_serving_spans_lie_on_lanes_that_never_overlap(proto):
    _, trace = proto
    tracks = _descriptors(trace)
    lanes = {
        uuid: t.thread.thread_name
        for uuid, t in tracks.items()
        if " · lane " in t.thread.thread_name and not t.thread.thread_name.startswith("host thread")
    }
    # the 16 requests of the batch all overlap; so do the pipelined worker.execute spans of each rank
    assert sum(" · request · lane " in name for name in lanes.values()) == RANKS * 4
    assert {f"tid {41000 + r} · worker · lane {lane}" for r in range(RANKS) for lane in (0, 1)} <= set(lanes.values())
    open_on: dict[int, int] = defaultdict(int)
    for packet in _track_events(trace):
        event = packet.track_event
        if event.track_uuid in lanes and event.type in (pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END):
            open_on[event.track_uuid] += 1 if event.type == pb.TrackEvent.TYPE_SLICE_BEGIN else -1
            assert open_on[event.track_uuid] <= 1


def test_pftrace_flows_go_from_the_dispatch_to_its_root(proto, events):
    _, trace = proto
    names = _interned_names(trace)
    leaving, ending = Counter(), {}
    blame = {f for p in _track_events(trace) if p.track_event.type == pb.TrackEvent.TYPE_INSTANT for f in p.track_event.flow_ids}
    for packet in _track_events(trace):
        event = packet.track_event
        for flow in event.flow_ids:
            leaving[flow] += 1
        for flow in set(event.terminating_flow_ids) - blame:
            assert names[event.name_iid] == fmt.ROOT and flow not in ending
            ending[flow] = packet.timestamp
    dispatch = [f for f in _flows(events).values() if f["s"]["name"] == FLOW_NAME]
    assert set(leaving) - blame == set(ending) and len(ending) == len(dispatch) and set(leaving.values()) == {1}
    assert Counter(ending.values()) == Counter(round(f["f"]["ts"] * 1000) for f in dispatch)


def test_pftrace_counters_carry_the_skews(proto, analysed):
    _, trace = proto
    tracks = _descriptors(trace)
    values: dict[str, list[float]] = defaultdict(list)
    for packet in _track_events(trace):
        if packet.track_event.type == pb.TrackEvent.TYPE_COUNTER:
            track = tracks[packet.track_event.track_uuid]
            assert track.HasField("counter")
            values[track.name].append(packet.track_event.double_counter_value)
    per_step = analysed.summary["per_step"]
    assert values[START_SKEW_COUNTER] == [row["runner_start_skew_ms"] for row in per_step]
    assert values[END_SKEW_COUNTER] == [row["runner_end_skew_ms"] for row in per_step]
    assert RUN_QUEUE_COUNTER not in values  # no host evidence in this run


def _evidence_log(path: Path, rq_ms: dict[tuple[int, int], int]) -> None:
    """Two ranks, three steps, each root carrying os.rq_ns (and a serving trace-free log)."""
    lines = []
    for rank in range(2):
        pid = 700 + rank
        lines.append(fmt.format_anchor_record(pid, 10**9, 1_700_000_000_000_000_000, pid))
        for step in range(3):
            ts = 2 * 10**9 + step * 20 * MS
            attrs = {
                "rank": rank,
                "step": step,
                "device": f"npu:{rank}",
                "callable": fmt.DECODE_CALLABLE,
                "run_epoch": step,
                fmt.OS_RQ_NS: rq_ms[(rank, step)] * MS,
            }
            for depth, name, start, dur in (
                (1, fmt.BIND, ts, MS),
                (1, fmt.RUNNER_RUN, ts + MS, 10 * MS),
                (1, fmt.VALIDATE, ts + 12 * MS, MS),
                (0, fmt.ROOT, ts, 13 * MS),
            ):
                payload = fmt.format_strace_payload(
                    pid=pid,
                    tid=pid,
                    inv=rank * 100 + step + 1,
                    hid="ab",
                    depth=depth,
                    name=name,
                    ts_ns=start,
                    dur_ns=dur,
                    attrs=attrs if depth == 0 else None,
                )
                lines.append(fmt.format_prefix(start + dur, pid, "INFO", "span") + payload)
    path.write_text("\n".join(lines) + "\n")


def test_pftrace_draws_run_queue_wait_per_rank_where_spans_carry_it(tmp_path):
    rq = {(r, s): 1 + r * 3 + s for r in range(2) for s in range(3)}
    _evidence_log(tmp_path / artifacts.SERVER_LOG, rq)
    analyze_paths([tmp_path], tmp_path)
    out = export_from_dir(tmp_path, tmp_path / "t.pftrace")
    trace = pb.Trace()
    trace.ParseFromString(out.read_bytes())
    tracks = _descriptors(trace)
    by_process: dict[str, list[float]] = defaultdict(list)
    for packet in _track_events(trace):
        track = tracks[packet.track_event.track_uuid]
        if track.name == RUN_QUEUE_COUNTER:
            by_process[tracks[track.parent_uuid].process.process_name.split(" (pid")[0]].append(packet.track_event.double_counter_value)
    assert by_process == {f"rank {r} · npu:{r}": [float(rq[(r, s)]) for s in range(3)] for r in range(2)}


def test_combined_swimlane_draws_run_queue_wait_only_for_the_steps_it_draws(tmp_path):
    rq = {(r, s): 1 + r * 3 + s for r in range(2) for s in range(3)}
    _evidence_log(tmp_path / artifacts.SERVER_LOG, rq)
    result = analyze_paths([tmp_path], None).result
    # 4 spans a run, 2 ranks: a budget of 8 spans draws one step in full, the first of equal skew (step 0)
    doc = json.loads(write_chrome_trace(result, tmp_path / "t.json", span_budget=8).read_text())
    assert doc["otherData"]["steps_left_out"] == 2
    waits = sorted((e["pid"], e["args"]["ms"]) for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == RUN_QUEUE_COUNTER)
    assert waits == [(700, float(rq[(0, 0)])), (701, float(rq[(1, 0)]))]


# ---------------------------------------------------------------- the diagnosis: device spans and findings


def _pftrace_slices(trace: pb.Trace) -> list[dict]:
    """Every slice and instant of the .pftrace: its track and process, name, category, start, end, annotations and flows."""
    names, annotation_names = _interned_names(trace), {n.iid: n.name for p in trace.packet for n in p.interned_data.debug_annotation_names}
    categories = {c.iid: c.name for p in trace.packet for c in p.interned_data.event_categories}
    tracks = _descriptors(trace)
    open_on: dict[int, list[dict]] = defaultdict(list)
    slices = []
    for packet in _track_events(trace):
        event = packet.track_event
        if event.type == pb.TrackEvent.TYPE_SLICE_END:
            ended = open_on[event.track_uuid].pop()
            slices.append(ended | {"end": packet.timestamp})
        elif event.type in (pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_INSTANT):
            track = tracks[event.track_uuid]
            begun = {
                "track": track.thread.thread_name,
                "process": tracks[track.parent_uuid].process.process_name,
                "name": names[event.name_iid],
                "cat": categories[event.category_iids[0]],
                "start": packet.timestamp,
                "end": packet.timestamp,
                "args": _annotations(trace, event, annotation_names),
                "flow_out": list(event.flow_ids),
                "flow_in": list(event.terminating_flow_ids),
            }
            (open_on[event.track_uuid].append if event.type == pb.TrackEvent.TYPE_SLICE_BEGIN else slices.append)(begun)
    return slices


def _findings(summary: dict) -> Counter:
    """(kind, step, rank) of every item that is a finding (not noise): one marker each."""
    kinds = {"slow_steps": "slow step", "tail_steps": "tail step", "late_starts": "late start"}
    return Counter(
        (kind, item["step"], item["rank"]) for section, kind in kinds.items() for item in summary[section]["items"] if not item.get("noise")
    )


def _markers(slices: list[dict]) -> list[dict]:
    return [s for s in slices if s["cat"] == MARKER_CATEGORY]


def _check_markers(markers: list[dict], summary: dict, analysed) -> None:
    """One marker per finding, on its culprit's process's findings track, at its culprit's runner_run end (a late start: start)."""
    assert Counter((m["args"]["kind"], m["args"]["step"], m["args"]["rank"]) for m in markers) == _findings(summary)
    times = {
        (step, rank): (start, end)
        for step, rank, start, end in _rows(analysed, "SELECT step, rank, runner_ts_ns, runner_end_ns FROM decode")
    }
    for marker in markers:
        args = marker["args"]
        assert marker["track"] == "findings" and marker["process"].startswith(f"rank {args['rank']} ·")
        assert marker["start"] == times[(args["step"], args["rank"])][0 if args["kind"] == "late start" else 1]
        assert marker["name"] == f"{args['kind']} {args['step']}: rank {args['rank']} {args['mechanism']} +{args['excess_ms']} ms"
        assert {"phase", "evidence_ms", "finding"} <= args.keys()


def test_pftrace_draws_every_device_span_inside_its_runner_run(proto, analysed):
    _, trace = proto
    slices = _pftrace_slices(trace)
    device = [s for s in slices if s["cat"] == "device"]
    placed = _rows(
        analysed,
        """SELECT s.name, r.runner_ts_ns + s.ts_ns, r.runner_ts_ns + s.ts_ns + s.dur_ns
           FROM spans s JOIN runs r USING (pid, inv) WHERE s.clk = 'dev'""",
    )
    assert len(device) == len(placed) == _rows(analysed, "SELECT count(*) FROM spans WHERE clk = 'dev'")[0][0] > 0
    assert Counter((s["name"], s["start"], s["end"]) for s in device) == Counter(placed)
    runner = {(s["process"], s["args"]["inv"]): s for s in slices if s["name"] == fmt.RUNNER_RUN}
    for span in device:  # on the device track of its rank process, inside its own run's runner_run
        assert span["track"] == "device" and span["process"].startswith(f"rank {span['args']['rank']} ·")
        run = runner[(span["process"], span["args"]["inv"])]
        assert run["start"] <= span["start"] <= span["end"] <= run["end"]


def test_pftrace_marks_each_finding_and_points_at_the_culprit(proto, analysed):
    _, trace = proto
    slices = _pftrace_slices(trace)
    markers = _markers(slices)
    assert _findings(analysed.summary) == Counter({("slow step", 5, LATE_RANK): 1, ("tail step", 5, LATE_RANK): 1})
    _check_markers(markers, analysed.summary, analysed)
    slow = next(m for m in markers if m["args"]["kind"] == "slow step")
    assert slow["name"] == f"slow step 5: rank {LATE_RANK} device +25.0 ms" and slow["args"]["phase"] == "native_fence_wait"
    (flow,) = slow["flow_out"]
    (target,) = [s for s in slices if flow in s["flow_in"]]
    assert (target["name"], target["args"]["step"], target["args"]["rank"]) == (fmt.FENCE_WAIT, 5, LATE_RANK)
    assert not next(m for m in markers if m["args"]["kind"] == "tail step")["flow_out"]  # only slow steps have arrows


def test_noise_items_get_no_marker(analysed, tmp_path):
    summary = copy.deepcopy(analysed.summary)
    summary["tail_steps"]["items"][0]["noise"] = True
    path = write_perfetto_proto(dataclasses.replace(analysed, summary=summary), tmp_path / "t.pftrace")
    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    assert [m["args"]["kind"] for m in _markers(_pftrace_slices(trace))] == ["slow step"]
    events = json.loads(write_chrome_trace(dataclasses.replace(analysed, summary=summary), tmp_path / "t.json").read_text())["traceEvents"]
    assert [e["args"]["kind"] for e in events if e.get("cat") == MARKER_CATEGORY] == ["slow step"]


def test_overlapping_device_programs_get_a_device_lane_of_their_own(tmp_path):
    device_wall = np.full((2, 6), 9_100_000, dtype=np.int64)
    device_wall[1, 2] = 40 * MS  # placed on the host axis, it overlaps the next programs of its rank
    SyntheticRun(ranks=2, steps=6, device_wall_ns=device_wall).write(tmp_path)
    analyze_paths([tmp_path], tmp_path)
    events = json.loads(export_from_dir(tmp_path, tmp_path / "t.json").read_text())["traceEvents"]
    _assert_tracks_nest(events)
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    device = Counter((e["pid"], tracks[(e["pid"], e["tid"])]) for e in _spans(events) if e["cat"] == "device")
    first, second = sorted({pid for pid, _ in device})
    assert {track for pid, track in device if pid == first} == {"device"}  # one lane where programs never overlap
    lanes = {track for pid, track in device if pid == second}
    assert "device · lane 0" in lanes and len(lanes) > 1  # the programs the long one overlaps are on further lanes
    assert sum(device.values()) == 2 * 6  # every program drawn


@pytest.fixture(scope="module")
def contention(tmp_path_factory):
    """A coupled run (every rank meets the others at each layer's all-to-all) with faults: a run-queue wait among them."""
    run = tmp_path_factory.mktemp("contention") / "run"
    assert write_coupled_log([str(run), "--ranks", "4", "--steps", "60", "--seed", "3"]) == 0
    outcome = analyze_paths([run], run)
    trace = pb.Trace()
    trace.ParseFromString(export_from_dir(run, run / "x.pftrace").read_bytes())
    return run, outcome.result, trace


@pytest.mark.slow
def test_pftrace_of_a_contention_run_has_its_device_spans_and_one_marker_per_finding(contention):
    _, result, trace = contention
    slices = _pftrace_slices(trace)
    device = Counter((s["name"], s["start"], s["end"]) for s in slices if s["cat"] == "device")
    placed = _rows(
        result,
        "SELECT s.name, r.runner_ts_ns + s.ts_ns, r.runner_ts_ns + s.ts_ns + s.dur_ns FROM spans s JOIN runs r USING (pid, inv) WHERE s.clk = 'dev'",
    )
    assert device == Counter(placed) and len(placed) == _rows(result, "SELECT count(*) FROM spans WHERE clk = 'dev'")[0][0]
    assert {fmt.DEVICE_WALL + ".forward.layer1.a2a_wait", fmt.DEVICE_WALL + ".verify"} <= {name for name, _, _ in device}
    markers = _markers(slices)
    assert len(markers) == sum(_findings(result.summary).values()) == 16
    _check_markers(markers, result.summary, result)
    assert any(m["name"].startswith("slow step 9: rank 2 run_queue +") for m in markers)


def test_slow_step_arrows_go_to_the_culprit_and_to_the_victims_waits(contention):
    _, result, trace = contention
    slices = _pftrace_slices(trace)
    ending = {flow: s for s in slices for flow in s["flow_in"]}
    items = {item["step"]: item for item in result.summary["slow_steps"]["items"]}
    markers = [m for m in _markers(slices) if m["args"]["kind"] == "slow step"]
    assert len(markers) == len(items) == 6
    for marker in markers:
        item = items[marker["args"]["step"]]
        targets = {(t["args"]["rank"], t["args"]["phase"], t["args"]["step"]): t for t in (ending[f] for f in marker["flow_out"])}
        culprit = (item["rank"], item["phase"], item.get("evidence_step", item["step"]))
        victims = [cause for cause in item["ranks"] if cause["role"] == "victim"]
        assert set(targets) == {culprit} | {(v["rank"], v["phase"], item["step"]) for v in victims}
        assert targets[culprit]["cat"] == ("device" if item["phase"].startswith("device_wall") else "runtime")
        via = item["critical_path"]["via"]
        assert bool(victims) == (via != "step end")
        for victim in victims:  # its wait at the collective that held it: as long as the wait the item cites
            wait = targets[(victim["rank"], victim["phase"], item["step"])]
            assert wait["name"] == f"{fmt.RUNNER_RUN}.{via}" and wait["cat"] == "device"
            assert abs((wait["end"] - wait["start"]) / 1e6 - victim["evidence_ms"]) < 1e-3


def test_json_export_of_a_contention_run_draws_the_same_diagnosis(contention, tmp_path):
    run, result, trace = contention
    events = json.loads(export_from_dir(run, tmp_path / "x.json").read_text())["traceEvents"]
    slices = _pftrace_slices(trace)
    json_markers = Counter((e["name"], round(e["ts"] * 1000), e["pid"]) for e in events if e.get("cat") == MARKER_CATEGORY)
    pid_of = {e["args"]["name"]: e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert json_markers == Counter((m["name"], m["start"], pid_of[m["process"]]) for m in _markers(slices))
    blame = [f for f in _flows(events).values() if f["s"]["name"] == BLAME_FLOW_NAME]
    assert len(blame) == sum(len(m["flow_out"]) for m in _markers(slices)) == 6 + 3 * 3
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert all(tracks[(f["s"]["pid"], f["s"]["tid"])] == "findings" for f in blame)
    assert Counter(e["cat"] for e in events if e["ph"] == "X")["device"] == sum(s["cat"] == "device" for s in slices)


# ---------------------------------------------------------------- Perfetto's trace processor


def _trace_processor_shell() -> tuple[str | None, str]:
    """A trace_processor_shell: $TRACE_PROCESSOR_SHELL, PATH, else what the perfetto package fetches (its pinned build).

    Returns (path, "") or (None, why not): offline, the package's download fails at once.
    """
    for candidate in (os.environ.get("TRACE_PROCESSOR_SHELL"), shutil.which("trace_processor_shell")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate, ""
    from perfetto.prebuilts.manifests.trace_processor_shell import TRACE_PROCESSOR_SHELL_MANIFEST
    from perfetto.prebuilts.perfetto_prebuilts import get_perfetto_prebuilt

    try:
        return get_perfetto_prebuilt(TRACE_PROCESSOR_SHELL_MANIFEST), ""
    except Exception as error:  # any failure to fetch means: not available here
        return None, f"{type(error).__name__}: {error}"


@pytest.mark.parametrize("name", ["trace.pftrace", "trace.json"])
def test_perfettos_trace_processor_loads_the_export(run_dir, analysed, tmp_path, name):
    shell, why = _trace_processor_shell()
    if shell is None:
        pytest.skip(
            f"no trace_processor_shell here and the perfetto package could not fetch one ({why[:120]}); "
            "the structural tests above parse the .pftrace with the package's own proto classes"
        )
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    path = export_from_dir(run_dir, tmp_path / name)
    with TraceProcessor(trace=str(path), config=TraceProcessorConfig(bin_path=shell)) as tp:
        slices = tp.query("SELECT count(*) AS n FROM slice WHERE dur >= 0").as_pandas_dataframe()["n"][0]
        flows = tp.query("SELECT count(*) AS n FROM flow").as_pandas_dataframe()["n"][0]
        threads = tp.query("SELECT count(*) AS n FROM thread WHERE name IS NULL AND utid <> 0").as_pandas_dataframe()["n"][0]
        counters = tp.query(
            f"SELECT count(*) AS n FROM counter c JOIN counter_track t ON c.track_id = t.id WHERE t.name = '{END_SKEW_COUNTER}'"
        ).as_pandas_dataframe()["n"][0]
    runtime = _rows(analysed, "SELECT count(*) FROM spans s JOIN runs r USING (pid, inv)")[0][0]  # host and device clock
    serving = _rows(analysed, "SELECT count(*) FROM spans WHERE inv IS NULL")[0][0]
    markers = 2  # the late rank's slow step and tail step, each an instant (a slice of no length)
    assert slices == runtime + serving + markers
    assert flows == _rows(analysed, "SELECT count(*) FROM decode")[0][0] + RANKS + 1  # and one blame arrow
    assert threads == 0 and counters == STEPS


# ---------------------------------------------------------------- export command


def test_export_format_follows_the_output_name_and_defaults_to_pftrace(run_dir, tmp_path):
    assert export_from_dir(run_dir) == run_dir / artifacts.PERFETTO_PROTO
    pb.Trace().ParseFromString((run_dir / artifacts.PERFETTO_PROTO).read_bytes())
    assert json.loads(export_from_dir(run_dir, tmp_path / "t.json").read_text())["traceEvents"]
    assert json.loads(gzip.decompress(export_from_dir(run_dir, tmp_path / "t.json.gz").read_bytes()))["traceEvents"]
    assert export_from_dir(run_dir, format="perfetto-json") == run_dir / artifacts.PERFETTO_JSON
    with pytest.raises(DsprofError, match="unknown export format 'pprof'"):
        export_from_dir(run_dir, tmp_path / "t.pb", format="pprof")


def test_unanchored_run_exports_without_wall_clock(tmp_path):
    SyntheticRun(ranks=2, steps=3, anchors=False, sa_profile=False).write(tmp_path / "run")
    analyze_paths([tmp_path / "run"], tmp_path / "run")
    out = export_from_dir(tmp_path / "run", tmp_path / "t.json")
    spans = _spans(json.loads(out.read_text())["traceEvents"])
    assert spans and all("wall_ns" not in e["args"] for e in spans)


def test_the_runs_whose_device_spans_are_drawn_are_those_whose_spans_nest():
    from dsprof.analysis.outputs.perfetto_tracks import _build_device_runs
    from dsprof.analysis.store.engine import open_engine
    from dsprof.analysis.store.spans import SPAN_SCHEMA, Trace

    # run (inv) -> its device spans (depth, start, end) on the device clock; each run's device_wall is [0, 100)
    device_spans = {
        1: [(2, 10, 90)],  # one span inside the wall: drawn
        2: [(2, 10, 120)],  # one span past the wall: left out
        3: [(2, 0, 100), (3, 10, 40), (3, 40, 90)],  # children inside their parent, one after the other: drawn
        4: [(2, 0, 100), (3, 10, 50), (3, 40, 90)],  # children of one depth overlap: left out
        5: [(2, 0, 50), (3, 40, 60)],  # a child past its parent's end: left out
        6: [(2, 0, 30), (2, 40, 70), (3, 45, 60)],  # a child inside the latest parent that started before it: drawn
        7: [(2, 0, 30), (2, 40, 70), (3, 20, 35)],  # a child past the end of the parent it started in: left out
        8: [(2, -5, 50), (3, 10, 20)],  # a parent before the wall's start: left out
        9: [(2, 10, 20)],  # a run without a device_wall: left out
    }
    rows = [(inv, depth, start, end) for inv, spans in device_spans.items() for depth, start, end in spans]
    n = len(rows)
    columns = {field.name: pa.nulls(n, field.type) for field in SPAN_SCHEMA}
    columns |= {
        "pid": pa.array([7] * n, pa.int64()),
        "tid": pa.array([1] * n, pa.int64()),
        "name": pa.array(["device.program"] * n),
        "inv": pa.array([r[0] for r in rows], pa.uint64()),
        "depth": pa.array([r[1] for r in rows], pa.int64()),
        "ts_ns": pa.array([r[2] for r in rows], pa.int64()),
        "dur_ns": pa.array([r[3] - r[2] for r in rows], pa.int64()),
        "clk": pa.array([fmt.CLK_DEVICE] * n),
    }
    engine = open_engine(Trace(spans=pa.table(columns, schema=SPAN_SCHEMA)))
    try:
        walls = ", ".join(f"(7, {inv}, 1000, 0, {'NULL' if inv == 9 else 100})" for inv in device_spans)
        engine.run(f"CREATE TABLE runs AS SELECT * FROM (VALUES {walls}) t(pid, inv, runner_ts_ns, device_ts_ns, device_wall_ns)")
        _build_device_runs(engine)
        assert sorted(inv for _, inv in engine.rows("SELECT pid, inv FROM device_runs")) == [1, 3, 6]
    finally:
        engine.close()
