"""Outputs survive crashes: a SIGKILL inside the write of any output leaves every output old or new, never torn.

Every output goes through dsprof.fileio (a temporary file in the same
directory, fsynced, renamed over the target). The test analyses a run once,
keeps those outputs as "old", changes the run, and re-runs the command through
tests/kill_inside_write.py, which kills the process with SIGKILL once half of
one output's new bytes are in its temporary file: the kill provably lands
inside that write. Then every output must equal the old bytes or what an
uninterrupted run writes, the one being written must be the old one, and the
half-written temporary file must be hidden (a dot file), never an output.
analyze's four outputs are one set (dsprof/output_set.py): a kill inside any of
their writes leaves all four old, and only a hidden staging directory, which
the next writer or reader removes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dsprof.fileio import OutputError, atomic_write_text
from dsprof.output_set import STAGING_PREFIX, settle
from dsprof.testing.synthetic import SyntheticRun

DSPROF = Path(sys.executable).with_name("dsprof")
KILL_INSIDE_WRITE = Path(__file__).with_name("kill_inside_write.py")
RANKS, STEPS = 4, 40
ANALYZE_OUTPUTS = ("summary.json", "summary.md", "combined-swimlane.json", "report.html")
EXPORTS = ("perfetto-trace.pftrace", "perfetto-trace.json")


def _command(name: str, run: Path) -> list[str]:
    """The dsprof command that writes output ``name`` of ``run`` (into the run's directory)."""
    return ["analyze", str(run)] if name in ANALYZE_OUTPUTS else ["export", str(run), "-o", str(run / name)]


def _write_all(run: Path) -> dict[str, bytes]:
    for command in (_command(ANALYZE_OUTPUTS[0], run), *(_command(name, run) for name in EXPORTS)):
        subprocess.run([str(DSPROF), *command], check=True, capture_output=True, timeout=300)
    return {name: (run / name).read_bytes() for name in (*ANALYZE_OUTPUTS, *EXPORTS)}


def _run_with_fence(path: Path, extra_fence_ns: int) -> Path:
    fence = np.full((RANKS, STEPS), 9_000_000, dtype=np.int64)
    fence[3, 25] += extra_fence_ns
    return SyntheticRun(ranks=RANKS, steps=STEPS, fence_wait_ns=fence).write(path)


@pytest.fixture(scope="module")
def old_and_new(tmp_path_factory):
    """A run's directory, its outputs before and after its input changed (each an uninterrupted run's bytes)."""
    run = _run_with_fence(tmp_path_factory.mktemp("crash") / "run", 0)
    old = _write_all(run)
    _run_with_fence(run, 20_000_000)  # one tail step more: every output changes
    new = _write_all(run)  # the outputs are reproducible: these are the bytes any run over the changed input writes
    assert all(old[name] != new[name] for name in old), "every output changes with the input"
    return run, old, new


@pytest.mark.slow
@pytest.mark.parametrize("killed", [*ANALYZE_OUTPUTS, *EXPORTS])
def test_sigkill_inside_the_write_of_an_output_leaves_old_or_new_outputs(old_and_new, tmp_path, killed):
    run, old, new = old_and_new
    for name, content in old.items():
        # an export draws the findings of the summary.json beside it: it runs after analyze wrote the new set
        (run / name).write_bytes(new[name] if killed in EXPORTS and name in ANALYZE_OUTPUTS else content)
    for leftover in run.glob(".*.tmp"):
        leftover.unlink()
    evidence = tmp_path / "evidence.json"
    half = len(new[killed]) // 2
    proc = subprocess.run(
        [sys.executable, str(KILL_INSIDE_WRITE), killed, str(half), str(evidence), "--", *_command(killed, run)],
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    landed = json.loads(evidence.read_text())  # written just before the kill, from inside the write
    temporary = Path(landed["temporary"])
    staged = killed in ANALYZE_OUTPUTS  # analyze writes its outputs as one set, staged in a private directory inside the run's
    leftover = temporary.parent if staged else temporary
    assert leftover.parent == run, "the temporary file is in the output's directory (a rename within one file system)"
    assert not staged or leftover.name.startswith(STAGING_PREFIX)
    assert temporary.name.startswith(f".{killed}.") and temporary.name.endswith(".tmp"), f"{killed} was written in place"
    assert temporary.read_bytes() == new[killed][:half], "the kill landed inside the write, half of the new bytes written"
    assert (run / killed).read_bytes() == old[killed], f"{killed} is not the previous complete file after a kill inside its write"
    for name, content in old.items():
        assert (run / name).read_bytes() in (content, new[name]), f"{name} is torn after a kill"
        assert not staged or name not in ANALYZE_OUTPUTS or (run / name).read_bytes() == content, "analyze's outputs are not one set"
    json.loads((run / "summary.json").read_text())
    visible = {p.name for p in run.iterdir() if not p.name.startswith(".")}
    assert visible == {"server.log", "serving-trace", "performance_summary.json", *old}, "a temporary file is visible as an output"
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == [leftover.name]
    settle(run)  # what the next writer or reader does first: a dead writer's staging directory goes
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == ([] if staged else [temporary.name])


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
