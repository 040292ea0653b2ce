"""The benchmark scripts still run against the current library (`make bench` is not part of CI).

Only a quick section of one script, on the small demo shape: the figures are
not checked here (they belong to `make bench`), only that the script reaches them.
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
