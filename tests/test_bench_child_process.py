"""benchmarks/child_process.py measures the command alone, not the benchmark that starts it."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "child_process.py"
_SPEC = importlib.util.spec_from_file_location("bench_child_process", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
child_process = sys.modules[_SPEC.name] = importlib.util.module_from_spec(_SPEC)  # its dataclass looks itself up there
_SPEC.loader.exec_module(child_process)


def test_a_command_started_from_a_large_benchmark_is_measured_alone():
    """A fork carries its parent's resident pages until it execs, and ``ru_maxrss`` counted them: ``true`` started
    from a benchmark holding 512 MB measured over 512 MB. Started from the small launcher, it measures its own."""
    held = np.ones(64 << 20)  # 512 MB, resident
    measured = child_process.run_child([shutil.which("true") or "/bin/true"])
    assert held.sum() == 64 << 20
    assert measured.peak_rss_mib < 64, measured
    assert 0 <= measured.seconds < 5


def test_a_failed_command_says_its_status_and_stderr():
    with pytest.raises(SystemExit, match=r"failed \(3\): no such thing"):
        child_process.run_child(["sh", "-c", "echo no such thing >&2; exit 3"])
