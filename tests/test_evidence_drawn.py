"""Every piece of evidence a finding cites is drawn: collections (host.gc) and run-queue waits, in every output."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from dsprof.analysis.outputs.perfetto_tracks import RUN_QUEUE_COUNTER
from dsprof.commands.analysis_job import analyze_paths
from dsprof.commands.report import export_from_dir
from dsprof.profiler import strace_format as fmt
from dsprof.testing.coupled import main as write_coupled_log


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    run = tmp_path_factory.mktemp("evidence") / "run"
    assert write_coupled_log([str(run), "--ranks", "4", "--steps", "60", "--seed", "3"]) == 0
    out = run  # analysed in place: report and export read only the inputs a summary names inside its directory
    outcome = analyze_paths([run], out)
    collections = outcome.result.engine.rows(f"SELECT pid, ts_ns, dur_ns FROM spans WHERE name = '{fmt.GC}' ORDER BY ts_ns")
    assert len(collections) >= 4  # the log holds the faults' collections and small young-generation ones
    return out, outcome, collections


def _gc_events(events: list[dict]) -> list[tuple[int, int, int]]:
    return sorted((e["pid"], round(e["ts"] * 1000), round(e["dur"] * 1000)) for e in events if e.get("ph") == "X" and e["name"] == fmt.GC)


@pytest.mark.slow
def test_collections_and_run_queue_waits_in_the_combined_swimlane_and_the_json_export(analysed, tmp_path):
    out, _, collections = analysed
    export = export_from_dir(out, tmp_path / "trace.json", format="perfetto-json")
    for path in (out / "combined-swimlane.json", export):
        events = json.loads(path.read_text())["traceEvents"]
        assert _gc_events(events) == sorted(collections)
        tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        assert all(tracks[(e["pid"], e["tid"])].endswith("garbage collections") for e in events if e.get("name") == fmt.GC)
        assert any(e["ph"] == "C" and e["name"] == RUN_QUEUE_COUNTER and e["args"]["ms"] > 0 for e in events)


def test_collections_and_run_queue_waits_in_the_pftrace(analysed, tmp_path):
    out, _, collections = analysed
    trace = pb.Trace()
    trace.ParseFromString(export_from_dir(out, tmp_path / "trace.pftrace", format="perfetto").read_bytes())
    names = {n.iid: n.name for p in trace.packet for n in p.interned_data.event_names}
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")}
    begins = Counter(
        tracks[p.track_event.track_uuid].thread.thread_name.endswith("garbage collections")
        for p in trace.packet
        if p.HasField("track_event")
        and p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN
        and names.get(p.track_event.name_iid) == fmt.GC
    )
    assert begins == Counter({True: len(collections)})
    assert any(t.name == RUN_QUEUE_COUNTER for t in tracks.values())


def test_collections_and_run_queue_waits_in_the_report(analysed):
    out, _, collections = analysed
    page = (out / "report.html").read_text()
    data = json.loads(re.search(r'<script type="application/json" id="dsprof-data">(.*?)</script>', page, re.DOTALL).group(1))
    swimlane = data["swimlane"]
    gc = swimlane["names"].index(fmt.GC)
    rows = [r for i, r in enumerate(swimlane["spans"]["row"]) if swimlane["spans"]["name"][i] == gc]
    assert len(rows) == len(collections)
    assert all(swimlane["rows"]["label"][r].endswith("garbage collections") for r in rows)
    assert max(swimlane["spans"]["rq_us"]) > 0 and min(swimlane["spans"]["rq_us"]) == -1  # serving spans carry none


def test_collective_waits_are_counters_in_both_exports(analysed, tmp_path):
    from dsprof.analysis.outputs.perfetto_tracks import COLLECTIVE_WAIT_COUNTER

    out, outcome, _ = analysed
    waited = outcome.result.engine.scalar("SELECT CAST(sum(device_wait_ns) AS DOUBLE) FROM decode") / 1e6
    events = json.loads(export_from_dir(out, tmp_path / "trace.json", format="perfetto-json").read_text())["traceEvents"]
    counted = sum(e["args"]["ms"] for e in events if e["ph"] == "C" and e["name"] == COLLECTIVE_WAIT_COUNTER)
    assert counted == pytest.approx(waited, rel=1e-6) and waited > 0
    trace = pb.Trace()
    trace.ParseFromString(export_from_dir(out, tmp_path / "trace.pftrace", format="perfetto").read_bytes())
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")}
    assert any(t.name == COLLECTIVE_WAIT_COUNTER for t in tracks.values())
