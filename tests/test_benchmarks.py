"""The benchmark scripts still run against the current library (`make bench` is not part of CI).

Only quick sections of two scripts, on small shapes: the figures are not
checked here (they belong to `make bench`), only that the scripts reach them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.runtime

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_runtime_cadence_section_runs_the_analysis_it_measures():
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_runtime.py"), "--sections", "cadence", "--repeats", "1", "--preset", "demo"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cadence ratio device-resident / host-shared" in proc.stdout


def test_watch_replay_reaches_its_latency_and_alert_figures(tmp_path):
    """A few seconds of each replay: the harness drives `dsprof watch` and reads its events."""
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_watch.py"),
            *("--keep", str(tmp_path), "--duration", "6", "--pace", "4", "--loop-steps", "120", "--fault-step", "40"),
            *("--startup-s", "2", "--idle-exit", "2", "--exit-timeout", "120"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "latency write -> shown: p50" in proc.stdout, proc.stdout
    assert "first alert" in proc.stdout and "target no alert on the clean replay" in proc.stdout, proc.stdout
