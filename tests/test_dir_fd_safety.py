"""Inside a shared output or dataset directory nothing goes through a path resolved again (dsprof/fileio.py's dir fds).

Each test is a variant of an attack by someone who can write to the directory:
a planted journal whose staging folder is swapped for a link to the victim's
files (in-process at the two moments that matter, and by another uid racing a
real reader), journals naming paths instead of plain names, a ``time_window=``
folder linked into another dataset, and ``watch --events`` onto a link.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import types
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import dsprof.output_set as output_set_module
from dsprof.analysis.ingest import read_paths
from dsprof.analysis.store.dataset import SpanDatasetWriter
from dsprof.cli.main import cli
from dsprof.commands.watch import Events
from dsprof.fileio import OutputError
from dsprof.output_set import JOURNAL_NAME, STAGING_PREFIX, output_set, settle
from dsprof.profiler import strace_format as fmt

TRIES = 20
EVIL = STAGING_PREFIX + "evil"
# Many missing names first, so a reader spends its time on them before it reaches the victim's file.
PLANTED = {"staging": EVIL, "files": [f"missing-{i}" for i in range(200)] + ["secret.txt"]}


def _victim_home(base: Path) -> Path:
    home = base / "home"
    home.mkdir()
    (home / "secret.txt").write_text("victim's own\n")
    return home


def _untouched(home: Path, out: Path) -> None:
    assert (home / "secret.txt").read_text() == "victim's own\n"
    assert not os.path.lexists(out / "secret.txt")


def _plant(out: Path) -> None:
    (out / EVIL).mkdir()
    (out / JOURNAL_NAME).write_text(json.dumps(PLANTED))


def _swap(out: Path, home: Path) -> None:
    """The attacker's move: the staging folder (checked or opened already) becomes a link to the victim's home."""
    (out / EVIL).rename(out / "parked")
    (out / EVIL).symlink_to(home, target_is_directory=True)


# -- finding 1: the journal's staging folder swapped for a link ------------------------------------------


@pytest.mark.parametrize("moment", ["at the lock", "after the staging folder is opened"])
def test_a_staging_folder_swapped_for_a_link_moves_nothing_in(tmp_path, monkeypatch, capsys, moment):
    real_open_dir, real_flock = output_set_module.open_dir, fcntl.flock
    state: dict[str, Path] = {}

    @contextlib.contextmanager
    def open_then_swap(path, dir_fd=None, **kwargs):
        with real_open_dir(path, dir_fd, **kwargs) as fd:
            if Path(path).name == EVIL:
                _swap(state["out"], state["home"])
            yield fd

    def flock_then_swap(fd, operation):
        real_flock(fd, operation)
        if os.path.isdir(state["out"] / EVIL) and not os.path.islink(state["out"] / EVIL):
            _swap(state["out"], state["home"])

    if moment == "at the lock":
        monkeypatch.setattr(output_set_module, "fcntl", types.SimpleNamespace(flock=flock_then_swap, LOCK_EX=fcntl.LOCK_EX))
    else:
        monkeypatch.setattr(output_set_module, "open_dir", open_then_swap)
    for attempt in range(TRIES):
        base = tmp_path / str(attempt)
        base.mkdir()
        state.update(out=base / "out", home=_victim_home(base))
        state["out"].mkdir()
        _plant(state["out"])
        settle(state["out"])  # what report, gate, diff and analyze -o do first
        _untouched(state["home"], state["out"])
        assert not (state["out"] / JOURNAL_NAME).exists()
    assert capsys.readouterr().err.count("discarded") == (TRIES if moment == "at the lock" else 0)


def _attacker_can_run() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


ATTACKER = textwrap.dedent(
    """
    import json, os, sys, time
    out, home, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    staging, parked, journal = os.path.join(out, {evil!r}), os.path.join(out, "parked"), os.path.join(out, {journal!r})
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not os.path.lexists(staging):  # the reader removes a staging folder it completed
            os.mkdir(staging)
        if not os.path.lexists(journal):
            with open(journal + ".planting", "w") as handle:
                handle.write({planted!r})
            os.rename(journal + ".planting", journal)
        try:
            os.rename(staging, parked)
            os.symlink(home, staging)
            os.unlink(staging)
            os.rename(parked, staging)
        except FileNotFoundError:  # removed by the reader meanwhile
            continue
    """
).format(evil=EVIL, journal=JOURNAL_NAME, planted=json.dumps(PLANTED))


@pytest.mark.slow
@pytest.mark.skipif(not _attacker_can_run(), reason="needs root and setpriv to run the attacker as another uid")
def test_another_uid_racing_the_reader_never_moves_the_victims_file():
    """A real race: uid 65534 flips the staging folder between a folder and a link while the victim reads, ≥ 20 times."""
    base = Path(tempfile.mkdtemp(prefix="dsprof-race-"))
    try:
        base.chmod(0o711)
        out, home = base / "out", _victim_home(base)
        out.mkdir(mode=0o777)
        out.chmod(0o777)  # a shared output directory
        command = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable, "-c", ATTACKER]
        attacker = subprocess.Popen([*command, str(out), str(home), "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert attacker.stdout is not None and attacker.stdout.readline() == "ready\n"
        tries = 0
        while attacker.poll() is None:
            if (out / JOURNAL_NAME).exists():
                tries += 1
            settle(out)
            _untouched(home, out)
        assert attacker.returncode == 0, attacker.stderr.read() if attacker.stderr else ""
        assert tries >= TRIES
        _untouched(home, out)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize(
    "journal",
    [
        {"staging": EVIL, "files": ["../home/secret.txt"]},
        {"staging": EVIL, "files": ["sub/secret.txt"]},
        {"staging": EVIL, "files": [".."]},
        {"staging": "..", "files": ["home/secret.txt"]},
        {"staging": f"{EVIL}/../../home", "files": ["secret.txt"]},
        {"staging": EVIL, "files": ["linked.txt"]},  # a link in the staging folder
    ],
    ids=["dotdot name", "nested name", "dotdot", "dotdot staging", "nested staging", "linked entry"],
)
def test_a_bad_journal_is_discarded_with_one_note_and_blocks_nothing(tmp_path, capsys, journal):
    out, home = tmp_path / "out", _victim_home(tmp_path)
    out.mkdir()
    (out / EVIL).mkdir()
    (out / EVIL / "sub").mkdir()
    (out / EVIL / "linked.txt").symlink_to(home / "secret.txt")
    (out / JOURNAL_NAME).write_text(json.dumps(journal))
    settle(out)
    _untouched(home, out)
    assert not (out / JOURNAL_NAME).exists() and not os.path.lexists(out / "linked.txt")
    notes = capsys.readouterr().err.strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith(f"dsprof: {out / JOURNAL_NAME}: discarded"), notes
    with output_set(out) as outputs:  # the directory is not blocked for good
        outputs.path("a.txt").write_text("new\n")
    assert (out / "a.txt").read_text() == "new\n" and (home / "secret.txt").exists()


# -- finding 2: a time_window= folder linked into another dataset ---------------------------------------


def _log(path: Path) -> Path:
    """A tiny log whose spans all land in window 0 (of the default window length)."""
    lines = [fmt.format_anchor_record(1, 0, 1_764_470_000_123_456_789, 1)]
    for inv, ts in ((10, 500), (11, 2100)):
        lines.append(
            fmt.format_prefix(ts, 1, "INFO", "strace_span")
            + fmt.format_strace_payload(pid=1, tid=1, inv=inv, hid="ab", depth=0, name=fmt.ROOT, ts_ns=ts, dur_ns=10, attrs={})
        )
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def other_dataset(tmp_path) -> Path:
    """Another user's dataset, whose window 0 folder the attacker links to."""
    other = tmp_path / "other"
    assert CliRunner().invoke(cli, ["ingest", str(_log(tmp_path / "other.log")), "-o", f"{other}/"]).exit_code == 0
    assert (other / "time_window=0" / "part-0.parquet").is_file()
    return other


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_ingest_into_a_linked_window_folder_is_refused_in_one_line(tmp_path, other_dataset):
    before = _contents(other_dataset / "time_window=0")
    target = tmp_path / "mine"
    target.mkdir()
    (target / "time_window=0").symlink_to(other_dataset / "time_window=0", target_is_directory=True)
    result = CliRunner().invoke(cli, ["ingest", str(_log(tmp_path / "mine.log")), "-o", f"{target}/"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.output.strip().splitlines()[-1] == (
        f"dsprof: error: {target / 'time_window=0'}: refusing to write into a symbolic link (a real directory is expected)"
    )
    assert _contents(other_dataset / "time_window=0") == before


@pytest.mark.parametrize("when", ["planted before", "swapped in before abort"])
def test_a_linked_window_folder_is_never_followed_to_remove_parts(tmp_path, other_dataset, when):
    before = _contents(other_dataset / "time_window=0")
    for attempt in range(TRIES):
        target = tmp_path / f"mine-{attempt}"
        target.mkdir()
        if when == "planted before":
            (target / "time_window=0").symlink_to(other_dataset / "time_window=0", target_is_directory=True)
            writer = SpanDatasetWriter(target)  # removes stale parts of its prefix
        else:
            writer = SpanDatasetWriter(target)
            read_paths([_log(tmp_path / "mine.log")], sink=writer)
            writer.close()
            (target / "time_window=0").rename(target / "moved")
            (target / "time_window=0").symlink_to(other_dataset / "time_window=0", target_is_directory=True)
        writer.abort()
        assert _contents(other_dataset / "time_window=0") == before
        assert (target / "time_window=0").is_symlink()
    assert pq.read_table(other_dataset / "time_window=0" / "part-0.parquet").num_rows > 0


# -- finding 3: watch --events onto a link ---------------------------------------------------------------


def test_events_onto_a_link_is_refused_and_nothing_is_appended(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    link = tmp_path / "events.jsonl"
    link.symlink_to(victim)
    with pytest.raises(OutputError, match="refusing to append to a symbolic link"):
        Events(link)
    result = CliRunner().invoke(cli, ["watch", str(_log(tmp_path / "job.log")), "--events", str(link), "--idle-exit", "1"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"dsprof: error: {link}: refusing to append to a symbolic link"), last
    assert victim.read_text() == "keep me\n" and not any(p.name.startswith("dsprof-") for p in tmp_path.iterdir())
