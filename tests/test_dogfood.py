"""Dogfood: real `dsprof run`s of the bundled runtime, gated with dsprof's own CI rules.

The healthy run must pass `examples/ci-rules.toml`; the negative control — the
device-resident metadata path, which serializes the depth-2 pipeline — must
fail it on pipeline serialization and on cadence. A run with an injected crash must exit non-zero and still be
analysed as far as it got.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.runtime

REPO = Path(__file__).resolve().parents[1]
DSPROF = Path(sys.executable).with_name("dsprof")
CI_RULES = REPO / "examples" / "ci-rules.toml"
# A few seconds per run on two shared cores; two ranks keep skew and cadence
# meaningful. 160 output tokens give about 94 decode steps: with 16 (9 steps) one
# hiccup of the host is a ninth of the decode wall, and a clean-clone CI run once
# saw a healthy run's late work cost 13.7% of it (the ci-rules limit is 10%;
# benchmarks/bench_example_rules.py sizes its runs the same way).
SHAPE = ["--ranks", "2", "--requests", "4", "--prompt-tokens", "8", "--output-tokens", "160", "--layers", "2", "--seed", "7"]


def _dsprof(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(DSPROF), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False)


@pytest.fixture(scope="module")
def healthy_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dogfood") / "healthy"
    proc = _dsprof("run", *SHAPE, "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"report: {out / 'report.html'}" in proc.stdout
    return out


@pytest.fixture(scope="module")
def serialized_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dogfood") / "serialized"
    proc = _dsprof("run", *SHAPE, "--metadata", "device-resident", "-o", str(out))
    # The run itself completes and validates; only its pipeline is broken.
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_healthy_run_writes_artifacts_and_passes_ci_rules(healthy_run, tmp_path):
    for name in (
        "server.log",
        "serving-trace",
        "performance_summary.json",
        "summary.json",
        "summary.md",
        "combined-swimlane.json",
        "report.html",
    ):
        assert (healthy_run / name).exists(), name
    summary = json.loads((healthy_run / "summary.json").read_text())
    assert summary["validation"]["valid"] is True
    assert summary["validation"]["ranks"] == 2
    assert summary["serving"]["tokens_returned"] == summary["serving"]["tokens_expected"] == 4 * 160
    junit = tmp_path / "gate.xml"
    proc = _dsprof("gate", str(healthy_run), "--rules", str(CI_RULES), "--junit", str(junit))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gate PASSED" in proc.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("failures") == "0"


def test_serialized_metadata_path_fails_ci_rules_on_serialization_and_cadence(healthy_run, serialized_run, tmp_path):
    verdict_path = tmp_path / "verdict.json"
    proc = _dsprof("gate", str(serialized_run), "--rules", str(CI_RULES), "--verdict", str(verdict_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = json.loads(verdict_path.read_text())
    failed = {(r["kind"], r["path"]) for r in verdict["results"] if r["status"] == "fail"}
    assert ("check", "pipeline.serialized") in failed
    assert ("check", "pipeline.cadence_p50_ms") in failed  # cadence no longer beats one runner_run
    assert ("check", "pipeline.overlap_share") in failed  # depth 2 lost: bind(N+1) no longer overlaps runner_run(N)
    passed = {r["path"] for r in verdict["results"] if r["status"] == "pass"}
    assert {"validation.valid", "serving.tokens_returned", "exit_status"} <= passed

    diff = _dsprof("diff", str(healthy_run), str(serialized_run))
    assert diff.returncode == 0, diff.stderr
    assert "pipeline.serialized: false -> true  [worse]" in diff.stdout
    assert "note: workload metadata differs: A='host-shared' B='device-resident'" in diff.stdout


def test_crashed_run_exits_nonzero_and_is_still_analysed(tmp_path):
    out = tmp_path / "crash"
    proc = _dsprof("run", *SHAPE, "--inject", "crash:rank=1,step=3", "-o", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "runtime failed on rank 1" in proc.stderr
    assert "Traceback" not in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["validation"]["valid"] is False
    steps = summary["validation"]["steps_per_rank"]
    assert steps["1"] < steps["0"]  # rank 1 stopped early; what it did write was analysed
