"""SIGTERM and Ctrl-C stop a command with one line, exit 128 + signal, and leave no partial output or temporary dataset.

The commands read, after a synthetic run, a ``performance_summary.json`` that is a FIFO kept open without an end, so
the signal always lands before they could finish: no timing decides what the test checks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading

import pytest

from dsprof.commands import analyze as analyze_module
from dsprof.commands.ingest import ingest_paths
from dsprof.errors import InputError
from dsprof.testing.synthetic import SyntheticRun

BINARY = b"\0\1\2\3" * 300_000


# the CLI with every text log spilled to a temporary span dataset, as a log over SPILL_BYTES is
SPILLING_CLI = "import sys; from dsprof.commands import analyze; analyze.SPILL_BYTES = 0; from dsprof.cli.main import main; main()"


def _command(args: list[str], cwd, launcher: tuple[str, ...] = ("-m", "dsprof.cli.main")) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(cwd)}  # any temporary dataset would be made here, where the test looks
    return subprocess.Popen(
        [sys.executable, *launcher, *args],
        cwd=cwd,
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _feed_without_end(fifo, data: bytes, done: threading.Event) -> threading.Thread:
    """Write ``data`` into the FIFO and keep it open (no EOF) until ``done``."""

    def feed() -> None:
        with open(fifo, "wb") as pipe:
            pipe.write(data)
            pipe.flush()
            done.wait(60)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return thread


def _stop_while_reading(args: list[str], tmp_path, signum: int, **launch) -> tuple[int, str]:
    SyntheticRun(ranks=2, steps=6).write(tmp_path / "run")
    (tmp_path / "side").mkdir()
    fifo = tmp_path / "side" / "performance_summary.json"
    os.mkfifo(fifo)
    done = threading.Event()
    feeder = _feed_without_end(fifo, b'{"exit_status": 0, ', done)
    process = _command([*args, "run", str(fifo)], tmp_path, **launch)
    try:
        assert process.stderr is not None
        process.stderr.readline()  # the first progress line: the CLI is running (its handler is in place)
        process.send_signal(signum)
        _, rest = process.communicate(timeout=60)
    finally:
        done.set()
        feeder.join(5)
        if process.poll() is None:
            process.kill()
    return process.returncode, rest


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_ingest_with_one_line_and_no_output(tmp_path, signum, status):
    code, stderr = _stop_while_reading(["ingest", "-o", "deep/spans/"], tmp_path, signum)
    assert code == status
    *progress, last = stderr.strip().splitlines()
    assert last == f"dsprof: error: stopped by {signal.Signals(signum).name}; no partial output is left"
    assert all(line.startswith("reading ") for line in progress)  # progress lines, no traceback
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "side"]


def test_sigterm_stops_analyze_leaving_no_output_dir_and_no_temporary_files(tmp_path):
    code, stderr = _stop_while_reading(["analyze", "-o", "out"], tmp_path, signal.SIGTERM)
    assert code == 143 and "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "side"]  # no out/, no dsprof-spans-*, no .tmp


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_spilled_analyze_leaving_no_temporary_dataset(tmp_path, signum):
    """A big log is analysed out of core, from a span dataset in TMPDIR: the signal lands while it is being written."""
    code, stderr = _stop_while_reading(["analyze", "-o", "out"], tmp_path, signum, launcher=("-c", SPILLING_CLI))
    assert code == 128 + signum and stderr.strip().splitlines()[-1].startswith("dsprof: error: stopped by"), stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "side"]  # no dsprof-spans-*, no dsprof-duckdb-*


def test_the_folders_a_killed_analyze_left_are_removed_by_the_next_one(tmp_path):
    """SIGKILL leaves the temporary dataset and DuckDB's spill; the next analysis sees their owner gone and removes them."""
    code, _ = _stop_while_reading(["analyze", "-o", "out"], tmp_path, signal.SIGKILL, launcher=("-c", SPILLING_CLI))
    assert code == -signal.SIGKILL
    left = sorted(p for p in tmp_path.iterdir() if p.name.startswith(("dsprof-spans-", "dsprof-duckdb-")))
    assert [p.name.startswith("dsprof-spans-") for p in left][:1] == [True]  # killed while writing the dataset
    for folder in left:
        os.utime(folder, (0, 0))  # older than tempdirs.YOUNG_S: not a folder another process is making right now
    process = _command(["analyze", "-o", "again", "run"], tmp_path, launcher=("-c", SPILLING_CLI))
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "run", "side"]


def test_read_inputs_removes_its_temporary_dataset_on_error(tmp_path, monkeypatch):
    monkeypatch.setattr(analyze_module, "SPILL_BYTES", 0)  # every log goes to a temporary span dataset
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    SyntheticRun(ranks=2, steps=4).write(tmp_path / "run")
    trace, spill = analyze_module.read_inputs([tmp_path / "run"])
    assert spill is not None and spill.parent == tmp_path / "tmp" and spill.name.startswith(analyze_module.SPILL_PREFIX)
    (tmp_path / "run" / "zz.log").write_bytes(BINARY)
    with pytest.raises(InputError, match="binary data"):
        analyze_module.read_inputs([tmp_path / "run"])
    assert list((tmp_path / "tmp").iterdir()) == [spill]  # the first call's, which its caller removes


@pytest.mark.parametrize("output", ["a/b/spans/", "a/b/spans.parquet"])
def test_ingest_of_bad_input_leaves_no_folder_it_made(tmp_path, output):
    (tmp_path / "bad.log").write_bytes(BINARY)
    (tmp_path / "kept").mkdir()
    for base in (tmp_path, tmp_path / "kept"):
        with pytest.raises(InputError, match="binary data"):
            ingest_paths([tmp_path / "bad.log"], base / output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.log", "kept"]
    assert list((tmp_path / "kept").iterdir()) == []


# the CLI with a long query on the analysis engine's DuckDB connection before the analysis: Python's handler waits
# for the main thread, which is inside DuckDB, so only dsprof.interrupts can stop the query
QUERYING_CLI = """import sys, threading
from dsprof.analysis.store.engine import open_engine
from dsprof.commands import analyze
analyzed = analyze.analyze_trace
def query_first(trace, **options):
    engine = open_engine(trace)
    threading.Timer(0.5, lambda: print("querying", file=sys.stderr, flush=True)).start()  # the query runs for hours
    engine.con.execute("SELECT count(*) FROM range(10000000000000) t(i) WHERE i % 7 = 3").fetchall()
    return analyzed(trace, **options)
analyze.analyze_trace = query_first
from dsprof.cli.main import main; main()"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_duckdb_query_stops_with_one_line(tmp_path, signum):
    SyntheticRun(ranks=2, steps=6).write(tmp_path / "run")
    process = _command(["analyze", "-o", "out", "run"], tmp_path, launcher=("-c", QUERYING_CLI))
    try:
        assert process.stderr is not None
        while (line := process.stderr.readline()) and line != "querying\n":
            pass
        process.send_signal(signum)
        _, rest = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signum, rest  # within the 30 s, where the query would run for hours
    assert rest.strip().splitlines() == [f"dsprof: error: stopped by {signal.Signals(signum).name}; no partial output is left"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
