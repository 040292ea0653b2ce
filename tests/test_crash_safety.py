"""Outputs survive crashes: SIGKILL at any point of `dsprof analyze` leaves every output old or new, never torn.

Every output goes through dsprof.fileio (a temporary file in the same
directory, fsynced, renamed over the target). The test analyses a run once,
keeps those outputs as "old", changes the run, and kills re-analyses at
random points; after each kill every output must parse and equal either the
old bytes or what an uninterrupted analysis writes.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dsprof.fileio import OutputError, atomic_write_text
from dsprof.testing.synthetic import SyntheticRun

DSPROF = Path(sys.executable).with_name("dsprof")
OUTPUTS = ("summary.json", "summary.md", "combined-swimlane.json", "report.html")


def _outputs(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in OUTPUTS}


def test_sigkill_during_analyze_leaves_old_or_new_outputs(tmp_path):
    run = tmp_path / "run"
    SyntheticRun(ranks=8, steps=120).write(run)
    subprocess.run([str(DSPROF), "analyze", str(run)], check=True, capture_output=True, timeout=300)
    old = _outputs(run)
    fence = np.full((8, 120), 9_000_000, dtype=np.int64)
    fence[3, 50] += 20_000_000  # the new analysis differs: one tail step
    SyntheticRun(ranks=8, steps=120, fence_wait_ns=fence).write(run)
    reference = tmp_path / "reference"
    subprocess.run([str(DSPROF), "analyze", str(run), "-o", str(reference)], check=True, capture_output=True, timeout=300)
    new = _outputs(reference)  # the summaries name the inputs, not the output directory: the same bytes
    assert old["summary.json"] != new["summary.json"]
    rng = random.Random(5)
    for _ in range(6):
        proc = subprocess.Popen([str(DSPROF), "analyze", str(run)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.5, 4.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        for name, content in _outputs(run).items():
            assert content in (old[name], new[name]), f"{name} is torn after a kill"
        json.loads((run / "summary.json").read_text())


def test_a_failed_write_names_the_file_and_keeps_the_previous_output(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    target.write_text('{"old": true}\n')

    def full_disk(fd, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", full_disk)
    with pytest.raises(OutputError, match=f"{target}: cannot write: No space left on device"):
        atomic_write_text(target, '{"new": true}\n')
    assert target.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary file left behind
