"""The guard of a local Ray cluster (analysis/cluster/guard.py) without Ray: what a driver started dies with it.

A "driver" here is a Python process that enters ``guarded_local_cluster`` and
starts an orphan (a process that double-forks away, as Ray's agents end up
once their parent dies), then either leaves the block or is SIGKILLed. The
orphan and the scratch directory must be gone afterwards; a child the driver
started for itself before the block must not be touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dsprof.testing.processes import ends_within, is_running

GUARD_BOUND_S = 60.0  # far beyond the guard's work (the orphan would sleep for 600 s)

DRIVER = """
import subprocess, sys
from pathlib import Path
from dsprof.analysis.cluster.guard import guarded_local_cluster
scratch = Path(sys.argv[1])
own = subprocess.Popen(["sleep", "600"])  # the program's own child, started before: not the cluster's
print(own.pid, flush=True)
with guarded_local_cluster([scratch]):
    # an orphan: its parent (a shell) exits at once, so it is nobody's child here
    out = subprocess.run(["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True)
    print(out.stdout.strip(), flush=True)
    if sys.argv[2] == "wait":
        sys.stdin.readline()
print(own.poll() is None, flush=True)
own.kill()
"""


def _driver(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, int, int]:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "file").write_text("x")
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(scratch), mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    own = int(proc.stdout.readline())
    orphan = int(proc.stdout.readline())
    return proc, own, orphan


def test_leaving_the_block_kills_what_was_started_in_it(tmp_path):
    proc, _, orphan = _driver(tmp_path, "leave")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert not is_running(orphan), "the driver waits for its guard, which killed the orphan"
    assert out.strip() == "True", "the guard killed a process the driver started for itself, outside the block"
    assert not (tmp_path / "scratch").exists()


def test_a_sigkilled_driver_takes_what_it_started_with_it(tmp_path):
    proc, own, orphan = _driver(tmp_path, "wait")
    assert is_running(orphan)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert ends_within(orphan, GUARD_BOUND_S), "the orphan outlived its SIGKILLed driver"
    deadline = time.monotonic() + 60
    while (tmp_path / "scratch").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (tmp_path / "scratch").exists()
    assert is_running(own), "the guard killed a process the driver started for itself, outside the block"
    os.kill(own, signal.SIGKILL)
    if is_running(orphan):  # never reached when the test passes; keeps a failure from leaving a sleeper behind
        os.kill(orphan, signal.SIGKILL)
