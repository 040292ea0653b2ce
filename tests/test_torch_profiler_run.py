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
from pathlib import Path

import pytest

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.ingest import read_paths
from dsprof.profiler import artifacts, torch_labels
from dsprof.profiler import strace_format as fmt
from dsprof.testing.truth import alone_faults, found_faults, scored_faults

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
