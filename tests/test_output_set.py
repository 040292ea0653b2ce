"""The outputs of one analysis appear together or not at all (issue 21, "Mixed outputs").

``analyze`` stages summary.json, summary.md, combined-swimlane.json and
report.html in a private directory inside ``-o`` and moves them into place as
one set under a lock (dsprof/output_set.py). Each test runs the real command in
a subprocess and stops it at a known point: a file size limit, a SIGKILL or
SIGTERM between two renames (tests/stop_inside_commit.py), a second writer
started while the first holds the lock. Afterwards every output is either all
the old set or all the new one, and no staging directory, journal or lock file
is left.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsprof.analysis.summary import load_summary
from dsprof.output_set import JOURNAL_NAME, output_set, settle
from dsprof.testing.synthetic import SyntheticRun

DSPROF = Path(sys.executable).with_name("dsprof")
STOP_INSIDE_COMMIT = Path(__file__).with_name("stop_inside_commit.py")
OUTPUTS = ("summary.json", "summary.md", "combined-swimlane.json", "report.html")


def _outputs(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in OUTPUTS}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two different runs and each one's outputs as an uninterrupted analysis writes them."""
    root = tmp_path_factory.mktemp("sets")
    runs, sets = [], []
    for steps in (10, 14):
        run = SyntheticRun(ranks=2, steps=steps).write(root / f"run{steps}")
        subprocess.run([str(DSPROF), "analyze", str(run), "-o", str(root / f"out{steps}")], check=True, capture_output=True, timeout=300)
        runs.append(run)
        sets.append(_outputs(root / f"out{steps}"))
    assert all(sets[0][name] != sets[1][name] for name in OUTPUTS)
    return runs, sets


def _old_outputs(directory: Path, old: dict[str, bytes]) -> Path:
    directory.mkdir()
    for name, content in old.items():
        (directory / name).write_bytes(content)
    return directory


def _stopped(action: str, name: str, run: Path, out: Path, **kwargs) -> subprocess.Popen:
    command = [sys.executable, str(STOP_INSIDE_COMMIT), action, name, "--", "analyze", str(run), "-o", str(out)]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def _only_outputs(out: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS), "a staging directory, journal or lock file was left"


@pytest.mark.slow
def test_a_write_error_leaves_the_whole_previous_set(two_runs, tmp_path):
    (_, new_run), (old, _) = two_runs
    out = _old_outputs(tmp_path / "out", old)

    def small_files():  # report.html (megabytes) fails, the summaries (kilobytes) would fit
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    proc = subprocess.run(
        [str(DSPROF), "analyze", str(new_run), "-o", str(out)],
        check=False,
        capture_output=True,
        text=True,
        preexec_fn=small_files,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"dsprof: error: {out / 'report.html'}: cannot write: File too large"
    assert _outputs(out) == old, "new summaries next to an old report"
    _only_outputs(out)


@pytest.mark.slow
def test_a_new_directory_is_removed_after_a_write_error(two_runs, tmp_path):
    (_, new_run), _ = two_runs
    out = tmp_path / "fresh"
    proc = subprocess.run(
        [str(DSPROF), "analyze", str(new_run), "-o", str(out)],
        check=False,
        capture_output=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000)),
        timeout=300,
    )
    assert proc.returncode == 2
    assert not out.exists()


def test_a_crash_between_two_renames_is_completed_by_the_next_reader(two_runs, tmp_path):
    (_, new_run), (old, new) = two_runs
    out = _old_outputs(tmp_path / "out", old)
    proc = _stopped("kill", "summary.json", new_run, out)
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL
    assert (out / "summary.json").read_bytes() == new["summary.json"] and (out / "report.html").read_bytes() == old["report.html"]
    load_summary(out)  # what report, export, gate and diff read first
    assert _outputs(out) == new
    _only_outputs(out)


@pytest.mark.slow
def test_sigterm_between_two_renames_waits_for_the_set(two_runs, tmp_path):
    (_, new_run), (old, new) = two_runs
    out = _old_outputs(tmp_path / "out", old)
    proc = _stopped("term", "summary.json", new_run, out)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == "dsprof: error: stopped by SIGTERM; no partial output is left"
    assert _outputs(out) == new
    _only_outputs(out)


@pytest.mark.slow
@pytest.mark.parametrize(("action", "signum"), [("term-staged", signal.SIGTERM), ("int-staged", signal.SIGINT)])
@pytest.mark.parametrize("staged", ["summary.json", "report.html"])
def test_a_signal_while_staging_leaves_the_previous_set_and_no_staging(two_runs, tmp_path, staged, action, signum):
    (_, new_run), (old, _) = two_runs
    out = _old_outputs(tmp_path / "out", old)
    proc = _stopped(action, staged, new_run, out)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signum, err
    name = signal.Signals(signum).name
    assert err.strip().splitlines()[-1] == f"dsprof: error: stopped by {name}; no partial output is left", err
    assert _outputs(out) == old
    _only_outputs(out)


@pytest.mark.slow
def test_a_second_writer_waits_for_the_first_to_finish_its_set(two_runs, tmp_path):
    """The first writer is stopped holding the lock, one file moved; the second must wait, then replace the whole set."""
    (first_run, second_run), (first, second) = two_runs
    out = tmp_path / "out"
    writer = _stopped("pause", "summary.json", first_run, out)
    assert writer.stdout.readline().strip() == "paused after summary.json"
    rival = subprocess.Popen([str(DSPROF), "analyze", str(second_run), "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while rival.poll() is None and not _waits_for_a_lock(rival.pid):  # a state to reach, not a time to sleep
        time.sleep(0.05)
    assert rival.poll() is None, "the second writer finished while the first held the lock mid-move"
    writer.communicate("go\n", timeout=300)
    assert writer.returncode == 0
    assert rival.wait(timeout=300) == 0
    assert _outputs(out) == second
    _only_outputs(out)
    assert first != second


def _waits_for_a_lock(pid: int) -> bool:
    """Whether ``pid`` is blocked on a file lock (a ``->`` waiter line of /proc/locks)."""
    return any(line.split()[1] == "->" and line.split()[5] == str(pid) for line in Path("/proc/locks").read_text().splitlines())


@pytest.mark.slow
def test_outputs_keep_the_umask_mode(two_runs, tmp_path):
    (run, _), _ = two_runs
    out = tmp_path / "out"
    subprocess.run(
        [str(DSPROF), "analyze", str(run), "-o", str(out)], check=True, capture_output=True, preexec_fn=lambda: os.umask(0o027), timeout=300
    )
    assert {name: (out / name).stat().st_mode & 0o777 for name in OUTPUTS} == dict.fromkeys(OUTPUTS, 0o640)
    _only_outputs(out)


def test_an_error_in_the_block_removes_the_staging_and_keeps_the_old_files(tmp_path):
    (tmp_path / "a.txt").write_text("old\n")
    with pytest.raises(RuntimeError), output_set(tmp_path) as outputs:
        outputs.path("a.txt").write_text("new\n")
        raise RuntimeError("stop")
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"] and (tmp_path / "a.txt").read_text() == "old\n"


def test_a_journal_half_written_by_a_killed_writer_is_removed_by_the_next(tmp_path):
    (tmp_path / "a.txt").write_text("old\n")
    torn = tmp_path / f".{JOURNAL_NAME}.0123456789ab.tmp"  # SIGKILL while the journal was written (fileio's temporary name)
    torn.write_text('{"staging": ".dsprof-sta')
    settle(tmp_path)  # a reader
    assert not torn.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    torn.write_text("{")
    with output_set(tmp_path) as outputs:  # a writer
        outputs.path("a.txt").write_text("new\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"] and (tmp_path / "a.txt").read_text() == "new\n"


def test_a_set_refuses_a_link_or_a_nested_name(tmp_path):
    (tmp_path / "a.txt").symlink_to("/dev/null")
    with output_set(tmp_path) as outputs:
        with pytest.raises(Exception, match="refusing to replace a symbolic link"):
            outputs.path("a.txt")
        with pytest.raises(ValueError):
            outputs.path("../b.txt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


# -- planted files: nothing outside the output directory is read, moved or written ------------------------


def _analyze_into(run: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(DSPROF), "analyze", str(run), "-o", str(out)], check=False, capture_output=True, text=True, timeout=300)


def test_an_output_directory_that_is_a_fifo_is_refused_in_one_line(two_runs, tmp_path):
    (run, _), _ = two_runs
    os.mkfifo(tmp_path / "out")
    done = _analyze_into(run, tmp_path / "out")
    assert done.returncode == 2
    assert (
        done.stderr.strip().splitlines()[-1]
        == f"dsprof: error: {tmp_path / 'out'}: refusing to write into a FIFO (the outputs go into a directory)"
    )


def test_a_planted_lock_link_is_never_followed(two_runs, tmp_path):
    (run, _), _ = two_runs
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    victim.write_text("keep me")
    (out / ".dsprof.lock").symlink_to(victim)
    done = _analyze_into(run, out)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith(f"dsprof: error: {out}: cannot write")
    assert victim.read_text() == "keep me" and sorted(p.name for p in out.iterdir()) == [".dsprof.lock"]


def test_a_planted_journal_moves_nothing_in_from_outside(two_runs, tmp_path):
    """A journal naming a staging "directory" that is a link elsewhere: the reader drops it and moves nothing."""
    (run, _), (old, _) = two_runs
    out, victim = _old_outputs(tmp_path / "out", old), tmp_path / "victim"
    victim.mkdir()
    (victim / "summary.json").write_text("keep me")
    (out / ".dsprof-staging-planted").symlink_to(victim)
    (out / ".dsprof-journal.json").write_text('{"staging": ".dsprof-staging-planted", "files": ["summary.json"]}')
    load_summary(out)
    assert (victim / "summary.json").read_text() == "keep me" and _outputs(out) == old
    assert not (out / ".dsprof-journal.json").exists() and (out / ".dsprof-staging-planted").is_symlink()
