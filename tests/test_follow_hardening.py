"""``dsprof watch``'s followers hold up against files swapped under them: a log truncated and regrown within one poll is
read again from its start (every record seen), a FIFO put in a followed file's place is refused at once in one line,
thousands of fragments never exhaust the descriptor limit, and a bad ``--events`` file is named and leaves no
temporary folder behind. Driven with explicit polls where in process; the CLI runs end on ``--idle-exit``.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from dsprof.analysis.ingest import read_strace_log
from dsprof.analysis.ingest.follow import LogFollower
from dsprof.analysis.ingest.fragment_follow import FragmentFollower
from dsprof.analysis.live.live_analysis import LiveAnalysis
from dsprof.analysis.store.spans import SPAN_SCHEMA
from dsprof.commands import watch as watch_module
from dsprof.commands.watch import WatchOptions, finish_watch
from dsprof.errors import DsprofError, InputError
from dsprof.profiler import artifacts
from dsprof.testing.coupled import Scenario, Shape
from dsprof.testing.coupled_log import write_log

FRAGMENTS = 200
DESCRIPTORS = 64  # the limit the many-fragments watch runs under: fewer than its fragments


def _log(tmp_path_factory: pytest.TempPathFactory, seed: int) -> bytes:
    scenario = Scenario(Shape(ranks=2, steps=20, layers=2, seed=seed), [])
    path = tmp_path_factory.mktemp(f"log{seed}") / "server.log"
    write_log(scenario, scenario.run(), path)
    return path.read_bytes()


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """Two logs of different runs: their first bytes differ."""
    return _log(tmp_path_factory, 5), _log(tmp_path_factory, 6)


def _event(pid: int) -> bytes:
    fields = {"name": "scheduler.step", "cat": "scheduler", "ph": "X", "ts": pid, "dur": 10, "pid": pid, "tid": 1, "args": {}}
    return json.dumps(fields).encode() + b"\n"


def _run_dir(tmp_path: Path, log: bytes, fragments: int = 1) -> Path:
    """An artifact directory: its server log, and one fragment per process."""
    run = tmp_path / "run"
    home = run / artifacts.SERVING_TRACE_DIR / artifacts.FRAGMENTS_DIR
    home.mkdir(parents=True)
    (run / artifacts.SERVER_LOG).write_bytes(log)
    for pid in range(1, fragments + 1):
        (home / artifacts.fragment_name(pid)).write_bytes(_event(pid))
    return run


def _dsprof(*args: str, tmpdir: Path, limit: int | None = None) -> subprocess.CompletedProcess:
    """The CLI with its own TMPDIR (and a descriptor limit), so that what it leaves there can be checked."""

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "dsprof.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "TMPDIR": str(tmpdir)},
        preexec_fn=None if limit is None else lower,
    )


def test_a_log_truncated_and_regrown_within_one_poll_is_read_again_whole(tmp_path, logs):
    old, new = logs
    before = old[: old.index(b"\n[", len(old) // 3) + 1]
    assert len(new) > len(before) and new[:4096] != before[:4096]
    log = tmp_path / "server.log"
    log.write_bytes(before)
    follower = LogFollower(log)
    tables = follower.poll()
    with log.open("r+b") as handle:  # copytruncate: the file emptied in place ...
        handle.truncate(0)
    with log.open("ab") as writer:  # ... and an O_APPEND writer past the old size before the next poll
        writer.write(new)
    tables += follower.finish()
    (tmp_path / "before.log").write_bytes(before)
    expected = [read_strace_log(tmp_path / name).spans.drop_columns(["file"]) for name in ("before.log", "server.log")]
    followed = pa.concat_tables(tables).cast(SPAN_SCHEMA).drop_columns(["file"])
    assert followed.num_rows == sum(t.num_rows for t in expected)  # no record skipped
    assert followed.equals(pa.concat_tables(expected))
    assert any("truncated or rewritten after" in note for note in follower.trace().notes)


def _fifo_in_place(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _returns_promptly(call) -> BaseException | None:
    """What ``call`` raised, run in a thread that must end within seconds (a blocked open() would not)."""
    raised: list[BaseException | None] = [None]

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            raised[0] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the follower blocked on the FIFO"
    return raised[0]


@pytest.mark.parametrize("kind", ["log", "fragment"])
def test_a_followed_file_replaced_by_a_fifo_is_refused_at_once(tmp_path, logs, kind):
    run = _run_dir(tmp_path, logs[0])
    path = run / artifacts.SERVER_LOG if kind == "log" else run / artifacts.SERVING_TRACE_DIR / artifacts.FRAGMENTS_DIR / "trace.1.jsonl"
    follower = LogFollower(path) if kind == "log" else FragmentFollower(path.parent)
    follower.poll()
    _fifo_in_place(path)
    raised = _returns_promptly(follower.poll)
    assert isinstance(raised, InputError) and str(raised).startswith(f"{path}: is a FIFO, not a regular file"), raised
    if kind == "fragment":
        follower.close()


@pytest.mark.slow
def test_cli_watch_refuses_a_fifo_in_one_line_and_leaves_no_temporary_folder(tmp_path, logs):
    run = _run_dir(tmp_path, logs[0])
    tmpdir, events = tmp_path / "tmp", tmp_path / "events.jsonl"
    tmpdir.mkdir()
    command = [sys.executable, "-m", "dsprof.cli.main", "watch", str(run), "-o", str(tmp_path / "out"), "--events", str(events)]
    watcher = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmpdir)})
    try:
        while not (events.is_file() and events.read_text()):  # the first refresh: the log is being followed
            assert watcher.poll() is None, watcher.communicate()
            threading.Event().wait(0.05)
        _fifo_in_place(run / artifacts.SERVER_LOG)
        _, stderr = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    assert watcher.returncode == 2 and stderr.count("\n") == 1, stderr
    assert f"{run / artifacts.SERVER_LOG}: is a FIFO, not a regular file" in stderr
    assert list(tmpdir.iterdir()) == []


@pytest.mark.slow
def test_cli_watch_of_more_fragments_than_descriptors_writes_its_outputs(tmp_path, logs):
    run = _run_dir(tmp_path, logs[0], fragments=FRAGMENTS)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    done = _dsprof("watch", str(run), "-o", str(tmp_path / "w"), "--idle-exit", "0.5", tmpdir=tmpdir, limit=DESCRIPTORS)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "w" / artifacts.SUMMARY_JSON).read_text())
    reference = _dsprof("analyze", str(run), "-o", str(tmp_path / "a"), tmpdir=tmpdir)
    assert reference.returncode == 0, reference.stderr
    assert summary == json.loads((tmp_path / "a" / artifacts.SUMMARY_JSON).read_text())


def test_fragments_past_the_descriptor_budget_are_read_whole_and_reopened_checked(tmp_path):
    home = tmp_path / "fragments"
    home.mkdir()
    paths = [home / artifacts.fragment_name(pid) for pid in range(1, 11)]
    for pid, path in enumerate(paths, 1):
        path.write_bytes(_event(pid))
    follower = FragmentFollower(home, max_open=3)
    rows = follower.poll().spans.num_rows
    assert len(follower._open) == 3
    for pid, path in enumerate(paths, 1):
        with path.open("ab") as handle:
            handle.write(_event(100 + pid))
    paths[0].write_bytes(_event(999) * 2)  # rewritten in place while it held no descriptor: read again from its start
    rows += follower.poll().spans.num_rows + follower.finish().spans.num_rows
    assert rows == 10 + 9 + 2  # the first poll, the nine appended lines, the rewritten fragment's two
    assert [note.split(":")[0] for note in follower.counts.notes] == [str(paths[0])]


@pytest.mark.parametrize("target", ["/dev/full", "a directory", "in a missing folder"])
def test_cli_watch_names_a_bad_events_file_and_leaves_no_temporary_folder(tmp_path, logs, target):
    if target == "/dev/full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    events = {"/dev/full": "/dev/full", "a directory": str(tmp_path), "in a missing folder": str(tmp_path / "no" / "ev.jsonl")}[target]
    run = _run_dir(tmp_path, logs[0])
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    done = _dsprof("watch", str(run), "-o", str(tmp_path / "w"), "--idle-exit", "0.5", "--events", events, tmpdir=tmpdir)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"dsprof: error: {events}: ") or f"'{events}' is a directory" in done.stderr  # named
    assert list(tmpdir.iterdir()) == []


def test_watchs_memory_error_names_what_watch_can_do(tmp_path, logs, monkeypatch):
    log = tmp_path / "server.log"
    log.write_bytes(logs[0])
    live = LiveAnalysis([log], tmp_path / "spans")
    live.poll()
    monkeypatch.setattr(watch_module, "analyze_paths", functools.partial(watch_module.analyze_paths, memory_limit=1 << 20))
    with pytest.raises(DsprofError) as raised:
        finish_watch(live, tmp_path / "out", WatchOptions(), keep_dataset=False)
    assert str(raised.value).endswith(watch_module.MEMORY_REMEDY) and "raise --memory-limit" not in str(raised.value)
