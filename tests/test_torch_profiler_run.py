"""``dsprof run --torch-profiler``: a Kineto trace per rank beside STRACE, read alone against faults.json.

A run with real injected faults (a CPU-burning neighbour, late completion
fences, garbage collections inside the device program and on the host path)
and the device-phase markers off records torch.profiler traces; analysed
alone, they must find >= 80% of the faults that measurably cost something at
their step, on a rank that lost the time (any mechanism: the trace has no host
evidence). Their steps are the STRACE roots' steps. A run without the flag
writes the same STRACE records and no trace.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.ingest import read_paths
from dsprof.analysis.ingest.kineto import ACTIVITY
from dsprof.profiler import artifacts, torch_labels
from dsprof.profiler import strace_format as fmt
from dsprof.testing.truth import alone_faults, device_timeline_agreement, found_faults, scored_faults

pytestmark = pytest.mark.runtime

DSPROF = Path(sys.executable).with_name("dsprof")
SHAPE = ["--ranks", "4", "--requests", "8", "--output-tokens", "128", "--seed", "5"]
FAULTS = ["cpu_contention:rank=1,p=0.07,ms=40", "fence_tail:p=0.07,ms=40", "gc_pause:p=0.07,ms=40,at=device", "gc_pause:p=0.07,ms=40"]


def _run(out: Path, *args: str) -> None:
    proc = subprocess.run([str(DSPROF), "run", *args, "-o", str(out)], capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("torch_profiler") / "run"
    _run(out, *SHAPE, "--no-device-phases", "--torch-profiler", *(a for spec in FAULTS for a in ("--inject", spec)))
    return out


def test_kineto_traces_alone_find_the_faults_at_their_step_and_rank(faulty):
    summary = analyze_trace(read_paths([faulty / artifacts.TORCH_PROFILER_DIR])).summary
    strace = json.loads((faulty / artifacts.SUMMARY_JSON).read_text())
    assert summary["validation"]["valid"], summary["validation"]["problems"]
    assert [row["step"] for row in summary["per_step"]] == [row["step"] for row in strace["per_step"]]
    injected = [f for f in json.loads((faulty / artifacts.FAULTS).read_text())["faults"] if (f["delay_ms"] or 0) >= 20]
    faults = scored_faults(injected)
    assert len(faults) >= 6 and len(faults) >= 0.6 * len(alone_faults(injected)), (faults, injected)
    found = found_faults(summary, faults, mechanism=False)
    assert len(found) >= 0.8 * len(faults), (len(found), len(faults), [f for f in faults if f not in found])


def test_runs_without_markers_take_the_kineto_device_timeline(faulty):
    """With the device-phase markers off, each decode run's device_wall and collective waits come from its Kineto step."""
    spans = read_paths([faulty]).spans.to_pylist()
    decode = {
        (r["pid"], r["inv"])
        for r in spans
        if r["name"] == fmt.ROOT and r["source"] == "strace" and (r["step"] or 0) >= 0 and r["rank"] is not None
    }
    walls = {(r["pid"], r["inv"]) for r in spans if r["name"] == fmt.DEVICE_WALL}
    waits = [r for r in spans if r["name"].endswith(fmt.WAIT_SUFFIX) and r["source"] == "kineto"]
    assert walls == decode and {(r["pid"], r["inv"]) for r in waits} == decode
    assert all(dict(r["attrs"]).get(fmt.PEER_ATTR) is not None for r in waits)


def test_every_rank_records_its_steps_and_its_device_thread(faulty):
    strace_steps = sorted(row["step"] for row in json.loads((faulty / artifacts.SUMMARY_JSON).read_text())["per_step"])
    files = sorted((faulty / artifacts.TORCH_PROFILER_DIR).glob("*.json"))
    assert [f.name for f in files] == [artifacts.torch_profile_name(r) for r in range(4)]
    for rank, path in enumerate(files):
        document = json.loads(path.read_text())
        assert document["distributedInfo"]["rank"] == rank
        spans = [e for e in document["traceEvents"] if e.get("ph") == "X"]
        steps = {e["tid"]: [] for e in spans if e["name"].startswith(torch_labels.STEP_PREFIX)}
        programs = {e["tid"] for e in spans if e["name"].startswith(torch_labels.PROGRAM + torch_labels.STEP_MARK)}
        assert len(steps) == 1 and len(programs) == 1 and programs.isdisjoint(steps), (steps.keys(), programs)
        numbers = sorted(int(e["name"].split(torch_labels.STEP_MARK)[1]) for e in spans if e["name"].startswith(torch_labels.STEP_PREFIX))
        assert numbers == strace_steps  # N is the producer's step, as the STRACE roots carry it
        on_device = Counter(e["name"] for e in spans if e["tid"] in programs)
        assert on_device[fmt.device_phase_name(fmt.DEVICE_FORWARD)] >= len(numbers) and on_device["aten::mm"] > 0, on_device
        on_host = Counter(e["name"] for e in spans if e["tid"] in steps)
        assert all(on_host[name] >= len(numbers) for name in (fmt.BIND, fmt.RUNNER_RUN, fmt.CLAIM_RELEASE, fmt.VALIDATE)), on_host


def _records(log: Path) -> Counter:
    """How many STRACE records of each name and attribute set a log holds (garbage collections aside: they come as
    the process allocates, and the profiler allocates as it starts)."""
    spans = read_paths([log]).spans.select(["name", "attrs", "clk"]).to_pylist()
    return Counter((s["name"], s["clk"], tuple(sorted(k for k, _ in s["attrs"]))) for s in spans if s["name"] != fmt.GC)


def test_a_run_without_the_flag_writes_the_same_strace_and_no_trace(tmp_path):
    out = tmp_path / "run"
    clean = ["--ranks", "2", "--requests", "4", "--output-tokens", "24"]
    _run(out, *clean, "--torch-profiler")
    profiled = _records(out / artifacts.SERVER_LOG)
    assert list((out / artifacts.TORCH_PROFILER_DIR).glob("*.json"))
    _run(out, *clean)  # into the same directory: the earlier traces must not be read with this run
    assert not list((out / artifacts.TORCH_PROFILER_DIR).glob("*.json"))
    assert _records(out / artifacts.SERVER_LOG) == profiled


def _device_walls(spans) -> dict[int, np.ndarray]:
    """rank -> the [start, end] of every STRACE run's device_wall on the host axis (its runner_run start + offset), by start."""
    rows = spans.filter(pc.equal(spans.column("source"), "strace")).select(["pid", "inv", "name", "ts_ns", "dur_ns", "rank"]).to_pylist()
    rank = {(r["pid"], r["inv"]): r["rank"] for r in rows if r["name"] == fmt.ROOT}
    runner = {(r["pid"], r["inv"]): r["ts_ns"] for r in rows if r["name"] == fmt.RUNNER_RUN}
    walls: dict[int, list] = {}
    for r in rows:
        if r["name"] == fmt.DEVICE_WALL:
            start = runner[(r["pid"], r["inv"])] + r["ts_ns"]
            walls.setdefault(rank[(r["pid"], r["inv"])], []).append((start, start + r["dur_ns"]))
    return {k: np.array(sorted(v), dtype=np.int64) for k, v in walls.items()}


def _share_inside(walls: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> float:
    at = np.searchsorted(walls[:, 0], starts, side="right") - 1
    return float(((at >= 0) & (ends <= walls[np.clip(at, 0, None), 1])).mean())


def test_one_swimlane_one_clock(tmp_path):
    """STRACE and Kineto of one run on one swimlane: the Kineto steps join the STRACE runs (no second set of runs), the
    clock comes from each rank's CLOCK_ANCHOR and agrees with runner_run, and the executor's profiled ops (mapped by
    the anchor, read straight from the files) fall inside their rank's STRACE device_wall."""
    out = tmp_path / "run"
    _run(out, "--ranks", "4", "--requests", "8", "--output-tokens", "64", "--torch-profiler")
    trace = read_paths([out])
    summary = analyze_trace(trace).summary
    alone = analyze_trace(read_paths([out / artifacts.SERVER_LOG])).summary
    assert summary["validation"]["valid"], summary["validation"]["problems"]
    assert summary["figures"]["root_ms"]["count"] == alone["figures"]["root_ms"]["count"]  # no second set of runs
    steps = len(alone["per_step"])
    notes = [n for n in summary["inputs"]["notes"] if n.startswith("Kineto")]
    assert f"{4 * steps} of {4 * steps} Kineto steps matched" in notes[0], notes
    assert len(notes) == 5 and all("from its CLOCK_ANCHOR" in n for n in notes[1:]), notes
    walls = _device_walls(trace.spans)
    anchors = {r["pid"]: r["wall_ns"] - r["mono_ns"] for r in trace.anchors.to_pylist()}
    pids = {
        r["rank"]: r["pid"] for r in trace.spans.filter(pc.equal(trace.spans.column("name"), fmt.ROOT)).to_pylist() if r["rank"] is not None
    }
    for path in sorted((out / artifacts.TORCH_PROFILER_DIR).glob("*.json")):
        document = json.loads(path.read_text(), parse_float=Decimal)
        rank, base = document["distributedInfo"]["rank"], int(document["baseTimeNanoseconds"])
        spans = [e for e in document["traceEvents"] if e.get("ph") == "X"]
        executor = {e["tid"] for e in spans if e["name"].startswith(torch_labels.PROGRAM)}
        ops = [e for e in spans if e["tid"] in executor and e.get("cat") == "cpu_op"]
        starts = np.array([base + int(e["ts"] * 1000) for e in ops], dtype=np.int64) - anchors[pids[rank]]
        ends = starts + np.array([int(e["dur"] * 1000) for e in ops], dtype=np.int64)
        # 99%, the target (100.0% on every rank of 5 seeds since the CPU device's clock starts at runner_run's
        # start: 98.5-99.8% on seeds 1-5, 97.2% once, while it started at the submit, which a GIL wait can hold milliseconds
        # after that start)
        assert len(ops) > 100 * steps and _share_inside(walls[rank], starts, ends) >= 0.99, rank
    # the joined activities (the executor's outermost ops) lie inside their own run's device_wall
    rows = trace.spans.to_pylist()
    wall = {(r["pid"], r["inv"]): (r["ts_ns"], r["ts_ns"] + r["dur_ns"]) for r in rows if r["name"] == fmt.DEVICE_WALL}
    joined = [r for r in rows if r["source"] == "kineto"]
    assert joined and all(r["name"] == f"{ACTIVITY}.compute" for r in joined)
    inside = [wall[(r["pid"], r["inv"])][0] <= r["ts_ns"] and r["ts_ns"] + r["dur_ns"] <= wall[(r["pid"], r["inv"])][1] for r in joined]
    assert sum(inside) >= 0.99 * len(inside), (sum(inside), len(inside))


@pytest.mark.parametrize(
    "specs",
    [["fence_tail:p=0.15,ms=40", "gc_pause:p=0.1,ms=40,at=device"], ["straggler:rank=2,ms=30"]],
    ids=["fence_tail+gc_pause_device", "straggler"],
)
def test_tails_strace_leaves_unattributed_are_attributed_from_the_device_timeline(tmp_path, specs):
    """Device-phase markers off: STRACE alone places a tail inside runner_run, unattributed; with the Kineto device
    timeline beside it, the device still computing is ``device``, the device idle before the fence signal the late
    fence (``device`` in native_fence_wait), a wait at a collective ``peer_wait`` — in agreement with faults.json."""
    out = tmp_path / "run"
    _run(out, *SHAPE, "--no-device-phases", "--torch-profiler", *(a for spec in specs for a in ("--inject", spec)))
    alone = analyze_trace(read_paths([out / artifacts.SERVER_LOG])).summary
    joined = analyze_trace(read_paths([out])).summary
    assert joined["validation"]["valid"], joined["validation"]["problems"]
    faults = [f for f in json.loads((out / artifacts.FAULTS).read_text())["faults"] if f["measured"] and f["delay_ms"] >= 20]
    agreeing, explained = device_timeline_agreement(alone, joined, faults, persistent=all("p=" not in spec for spec in specs))
    assert len(explained) >= 5, (explained, "STRACE alone leaves tails at the faults unattributed")
    # 90%, the target: at least 9 of 10 over seeds 1-7 of both specs on a loaded 2-core machine, since the device's
    # own work or growth, or the late start, is named only where it is no less than the device's idle before the late
    # signal and the carry-over through the drain (fence_tail+gc_pause_device was 4 of 10, 4 of 8, 5 of 7 on some seeds)
    assert len(agreeing) >= 0.9 * len(explained), (len(agreeing), len(explained), sorted(set(explained) - set(agreeing)))
