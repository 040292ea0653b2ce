"""The ranks (and the helper processes they fork) die with their launcher, however it dies.

Real runs in a subprocess, killed while serving; the test then looks for every
process that descended from the launcher in /proc.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsprof.profiler import artifacts

pytestmark = pytest.mark.runtime

RANKS = 2
# Long enough to be killed mid-run; the CPU neighbour makes every rank fork a helper.
WORKLOAD = [
    "--preset",
    "demo",
    "--ranks",
    str(RANKS),
    "--requests",
    "4",
    "--output-tokens",
    "3000",
    "--inject",
    "cpu_contention:p=0.02,ms=5",
]
ENTRY_POINTS = {"runtime": [sys.executable, "-m", "dsprof.runtime"], "dsprof run": [sys.executable, "-m", "dsprof.cli.main", "run"]}


def parents() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if state != "Z":
                found[int(entry)] = int(ppid)
    return found


def descendants(root: int) -> set[int]:
    tree = parents()
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in tree.items() if ppid in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    return pids & set(parents())


def start_run(entry: str, out: Path) -> tuple[subprocess.Popen, set[int]]:
    """Start a run; once every rank serves, return it with its rank and helper processes."""
    if entry == "dsprof run":
        try:  # dsprof run analyses after the run, and imports the analysis before starting it
            import dsprof.analysis.analyze  # noqa: F401
        except ImportError as error:
            pytest.skip(f"dsprof run needs the analysis, which does not import on this branch: {error}")
    launcher = subprocess.Popen([*ENTRY_POINTS[entry], *WORKLOAD, "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        family = descendants(launcher.pid)
        log = out / artifacts.SERVER_LOG
        serving = log.exists() and log.read_text(errors="replace").count("name=chip.run.validate") >= 4 * RANKS
        if serving and len(family) >= 2 * RANKS:  # every rank and its CPU neighbour
            return launcher, family
        assert launcher.poll() is None, launcher.stderr.read().decode()
        time.sleep(0.1)
    launcher.kill()
    pytest.fail("the run did not start serving in time")


def gone_within(pids: set[int], seconds: float) -> set[int]:
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_sigkill_of_the_launcher_leaves_no_process_behind(tmp_path, entry):
    launcher, family = start_run(entry, tmp_path)
    launcher.kill()
    assert launcher.wait(30) == -signal.SIGKILL
    assert not gone_within(family, 10), "processes outlived the launcher"


@pytest.mark.parametrize(
    "entry, sig, status", [("runtime", signal.SIGTERM, 143), ("runtime", signal.SIGINT, 130), ("dsprof run", signal.SIGTERM, 143)]
)
def test_sigterm_stops_the_ranks_and_keeps_what_was_written(tmp_path, entry, sig, status):
    """SIGTERM is handled as Ctrl-C is: ranks stopped, artifacts of what ran written, no analysis afterwards."""
    launcher, family = start_run(entry, tmp_path)
    launcher.send_signal(sig)
    assert launcher.wait(60) == status  # 128 + the signal, from the runtime and from the dsprof CLI alike
    assert not gone_within(family, 10), "processes outlived the launcher"
    stderr = launcher.stderr.read().decode()
    assert "Traceback" not in stderr
    if entry == "dsprof run":
        assert stderr.strip().splitlines()[-1] == f"dsprof: error: stopped by {signal.Signals(sig).name}; no partial output is left"
    summary = json.loads((tmp_path / artifacts.PERFORMANCE_SUMMARY).read_text())
    name = signal.Signals(sig).name
    assert summary["exit_status"] == 128 + sig and name in summary["message"]
    assert 0 < summary["tokens_returned"] < summary["tokens_expected"]
    json.loads((tmp_path / artifacts.FAULTS).read_text())
    trace = json.loads((tmp_path / artifacts.SERVING_TRACE_DIR / artifacts.MERGED_TRACE).read_text())
    assert trace["traceEvents"]
    assert not (tmp_path / artifacts.SUMMARY_JSON).exists()  # dsprof run did not go on to analyse
    # every STRACE record the ranks wrote is whole: one write per record, ranks stopped between writes
    log = (tmp_path / artifacts.SERVER_LOG).read_text()
    records = [line for line in log.splitlines() if "[STRACE]" in line]
    assert records and all(line.count("[STRACE]") == 1 and " dur=" in line for line in records)
