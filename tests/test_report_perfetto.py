"""Perfetto / Chrome JSON export: fields, units, tracks, strict nesting, metadata and flows."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import numpy as np
import pytest

from dsprof.analysis.analyze import analyze
from dsprof.analysis.outputs.perfetto import _nested_tracks, export_from_dir, write_perfetto_json
from dsprof.analysis.spans import attr_columns
from dsprof.errors import DsprofError
from dsprof.profiler.synthetic import SyntheticRun

RANKS = 4
STEPS = 16
LATE_RANK = 1
HOSTILE = 'a"b\\c\x01</script><img src=x>\u2028'
RUN_ID_LINK = "9"  # the executor span below names the runs with run_id 9


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("run")
    fence = np.full((RANKS, STEPS), 9_000_000, dtype=np.int64)
    fence[LATE_RANK, 5] += 25_000_000  # a long run that overlaps its two successors
    SyntheticRun(ranks=RANKS, steps=STEPS, fence_wait_ns=fence).write(directory)
    merged = directory / "serving-trace" / "trace.json"
    doc = json.loads(merged.read_text())
    first = min(e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X")
    doc["traceEvents"] += [
        {"name": HOSTILE, "cat": "executor", "ph": "X", "ts": first + 10, "dur": 5, "pid": 9, "tid": 9, "args": {"run_id": RUN_ID_LINK, "note": HOSTILE}},
        {"name": "marker", "cat": "executor", "ph": "i", "s": "t", "ts": first + 20, "pid": 9, "tid": 9, "args": {}},
    ]
    merged.write_text(json.dumps(doc))
    return directory


@pytest.fixture(scope="module")
def analysed(run_dir):
    return analyze([run_dir])


@pytest.fixture(scope="module")
def events(analysed, tmp_path_factory):
    path = write_perfetto_json(analysed.swimlane, analysed.summary, tmp_path_factory.mktemp("out") / "trace.json")
    doc = json.loads(path.read_text())
    assert doc["otherData"]["valid"] is True and doc["displayTimeUnit"] == "ns"
    return doc["traceEvents"]


def _spans(events):
    return [e for e in events if e["ph"] == "X"]


def test_every_span_is_an_event_with_exact_microseconds(analysed, events):
    runtime, serving = analysed.swimlane.runtime, analysed.swimlane.serving
    spans = _spans(events)
    assert len(spans) == len(runtime) + int((serving["ph"] == "X").sum())
    for e in spans:
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} <= e.keys()
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and e["dur"] >= 0
    # ts/dur are µs; multiplied back they give the span table's ns exactly
    exported = Counter((e["name"], round(e["ts"] * 1000), round(e["dur"] * 1000)) for e in spans if e["cat"] == "runtime")
    expected = Counter(zip(runtime["name"], runtime["ts_ns"], runtime["dur_ns"]))
    assert exported == expected
    instants = [e for e in events if e["ph"] == "i"]
    assert [(e["name"], e["s"]) for e in instants] == [("marker", "t")]


def test_wall_clock_travels_as_integer_strings(analysed, events):
    runtime = analysed.swimlane.runtime
    root = runtime[runtime["depth"] == 0].iloc[0]
    match = [e for e in _spans(events) if e["cat"] == "runtime" and round(e["ts"] * 1000) == root["ts_ns"] and e["pid"] == root["pid"] and e["name"] == "chip.run"]
    assert len(match) == 1
    assert match[0]["args"]["wall_ns"] == str(int(root["wall_ns"]))
    assert match[0]["args"]["step"] == int(root["step"]) and match[0]["args"]["rank"] == int(root["rank"])


def test_tracks_nest_strictly_and_overlapping_runs_get_their_own_track(analysed, events):
    by_track = defaultdict(list)
    for e in _spans(events):
        by_track[(e["pid"], e["tid"])].append((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)))
    for track, intervals in by_track.items():
        stack = []
        for start, end in sorted(intervals, key=lambda i: (i[0], -i[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"partial overlap on track {track}"
            stack.append(end)
    # the late rank's long run overlaps its two successors: three tracks hold its roots
    late_pid = int(analysed.swimlane.roots.loc[analysed.swimlane.roots["rank"] == LATE_RANK, "pid"].iloc[0])
    root_tracks = {e["tid"] for e in _spans(events) if e["pid"] == late_pid and e["name"] == "chip.run"}
    assert len(root_tracks) == 3


def test_processes_and_threads_are_named_and_ordered(events):
    meta = defaultdict(dict)
    for e in events:
        if e["ph"] == "M":
            key = (e["pid"],) if e["name"].startswith("process") else (e["pid"], e["tid"])
            meta[key][e["name"]] = e["args"]
    for e in _spans(events):
        assert {"process_name", "process_sort_index"} <= meta[(e["pid"],)].keys()
        assert {"thread_name", "thread_sort_index"} <= meta[(e["pid"], e["tid"])].keys()
    rank_names = sorted(m["process_name"]["name"] for k, m in meta.items() if len(k) == 1 and "rank" in m["process_name"]["name"])
    assert [n.split(" (pid")[0] for n in rank_names] == [f"rank {r} · npu:{r}" for r in range(RANKS)]
    sort_of = {m["process_name"]["name"]: m["process_sort_index"]["sort_index"] for k, m in meta.items() if len(k) == 1}
    assert sorted(sort_of, key=sort_of.get)[0].startswith("serving")


def test_hostile_text_round_trips_through_json(events):
    hostile = [e for e in _spans(events) if e["name"] == HOSTILE]
    assert len(hostile) == 1 and hostile[0]["args"]["attrs"]["note"] == HOSTILE


def test_flows_link_dispatch_spans_to_the_roots_they_started(analysed, events):
    spans = _spans(events)
    flows = defaultdict(dict)
    for e in events:
        if e["ph"] in "sf":
            flows[e["id"]][e["ph"]] = e
    assert all(set(f) == {"s", "f"} and f["f"]["bp"] == "e" for f in flows.values())
    roots = analysed.swimlane.runtime[analysed.swimlane.runtime["depth"] == 0]
    root_attrs = attr_columns(roots, ["run_id"])
    by_run_id = int((root_attrs["run_id"] == RUN_ID_LINK).sum())
    decode_roots = len(analysed.swimlane.roots)
    # one arrow per decode root from its scheduler step, plus one per root with run_id 9 from the executor span
    assert len(flows) == decode_roots + by_run_id and by_run_id == RANKS
    starts = {(e["pid"], e["tid"], e["ts"]): e for e in spans}
    sources = Counter(starts[(f["s"]["pid"], f["s"]["tid"], f["s"]["ts"])]["name"] for f in flows.values())
    assert sources == {"scheduler.step": decode_roots, HOSTILE: RANKS}
    for f in flows.values():
        target = starts[(f["f"]["pid"], f["f"]["tid"], f["f"]["ts"])]
        assert target["name"] == "chip.run"
        source = starts[(f["s"]["pid"], f["s"]["tid"], f["s"]["ts"])]
        if source["name"] == "scheduler.step":
            assert source["args"]["attrs"]["step"] == str(target["args"]["attrs"]["step"])


def test_nested_tracks_split_chains_over_two_tracks_and_keep_nesting():
    # five pipelined steps, each overlapping the next; and one parent holding two children
    start = np.array([0, 8, 16, 24, 32, 100, 101, 105])
    end = np.array([10, 18, 26, 34, 42, 110, 104, 109])
    group = np.array([0] * 5 + [1] * 3)
    assert _nested_tracks(group, start, end).tolist() == [0, 1, 0, 1, 0, 0, 0, 0]


@pytest.mark.parametrize("seed", range(5))
def test_nested_tracks_never_leave_a_partial_overlap(seed):
    rng = np.random.default_rng(seed)
    start = rng.integers(0, 1000, 300)
    end = start + rng.integers(0, 60, 300)
    group = rng.integers(0, 3, 300)
    track = _nested_tracks(group, start, end)
    for key in set(zip(group.tolist(), track.tolist())):
        mask = (group == key[0]) & (track == key[1])
        intervals = sorted(zip(start[mask].tolist(), end[mask].tolist()), key=lambda i: (i[0], -i[1]))
        stack = []
        for s, e in intervals:
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or e <= stack[-1]
            stack.append(e)


def test_unanchored_run_exports_without_wall_clock(tmp_path):
    SyntheticRun(ranks=2, steps=3, anchors=False, sa_profile=False).write(tmp_path / "run")
    out = export_from_dir(tmp_path / "run", tmp_path / "t.json")
    spans = _spans(json.loads(out.read_text())["traceEvents"])
    assert len(spans) == len(analyze([tmp_path / "run"]).swimlane.runtime)
    assert spans and all("wall_ns" not in e["args"] for e in spans)


def test_export_from_dir(run_dir, tmp_path):
    out = export_from_dir(run_dir, tmp_path / "t.json", format="perfetto-json")
    assert json.loads(out.read_text())["traceEvents"]
    with pytest.raises(DsprofError, match="unknown export format 'pprof'"):
        export_from_dir(run_dir, tmp_path / "t.pb", format="pprof")
