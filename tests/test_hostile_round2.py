"""Hostile corpus, round 2 (issue 21): crafted datasets and parts, huge times, bad options, outputs, escapes.

Every case must end in a correct result or in one ``dsprof: error:`` line
with exit 2: never a traceback, never a hang. Cases that could hang (FIFOs)
run the CLI in a child process under a timeout, so a regression fails
instead of blocking the suite.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dsprof.analysis.store.spans import MAX_TIME_NS, SPAN_SCHEMA
from dsprof.cli.main import cli
from dsprof.testing.synthetic import SyntheticRun


def one_error_line(result, *needles: str) -> str:
    """The result is exit 2 with one ``dsprof: error:`` line (holding ``needles``) and no traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    last = result.output.rstrip("\n").splitlines()[-1]
    assert last.startswith("dsprof: error: ") and "\x1b" not in last, result.output
    for needle in needles:
        assert needle in last, last
    return last


def run_cli(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI in a child process (for cases that could block forever if they regressed)."""
    code = "import sys; from dsprof.cli.main import cli; cli(sys.argv[1:])"
    return subprocess.run(
        [sys.executable, "-c", code, *args], check=False, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return SyntheticRun(ranks=2, steps=4).write(tmp_path_factory.mktemp("run") / "run")


@pytest.fixture(scope="module")
def dataset(run_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ds") / "spans"
    result = CliRunner().invoke(cli, ["ingest", str(run_dir), "-o", str(out) + "/"])
    assert result.exit_code == 0, result.output
    return out


def copy_dataset(dataset: Path, tmp_path: Path) -> Path:
    target = tmp_path / "spans"
    shutil.copytree(dataset, target, symlinks=True)
    return target


# -- 1. a crafted dataset.json ---------------------------------------------------------------------------


def _set(path: str, value):
    """A mutation of the manifest: the member at ``path`` (dots; list indexes as numbers) set to ``value``."""

    def mutate(manifest: dict) -> None:
        *parents, last = path.split(".")
        node = manifest
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value

    return mutate


MANIFEST_CASES = {
    "window_ns text": (_set("window_ns", "17"), "window_ns"),
    "window_ns zero": (_set("window_ns", 0), "window_ns"),
    "window_ns huge": (_set("window_ns", 10**30), "window_ns"),
    "span_schema wrong": (_set("span_schema", ["a"]), "span_schema"),
    "files not a list": (_set("files", {"a": 1}), "files"),
    "file entry text": (_set("files.0", "x.parquet"), "files[0]"),
    "path a number": (_set("files.0.path", 7), "files[0].path"),
    "path absolute": (_set("files.0.path", "/etc/passwd"), "files[0].path"),
    "path escapes": (_set("files.0.path", "time_window=291/../../x.parquet"), "files[0].path"),
    "path dotdot window": (_set("files.0.path", "../time_window=291/part-0.parquet"), "files[0].path"),
    "window mismatch": (_set("files.0.window", 3), "files[0].window"),
    "window float": (_set("files.0.window", 291.0), "files[0].window"),
    "rows negative": (_set("files.0.rows", -1), "files[0].rows"),
    "rows wrong": (_set("files.0.rows", 5), "rows, the manifest says 5"),
    "rows bool": (_set("files.0.rows", True), "files[0].rows"),
    "min_ts text": (_set("files.0.min_ts_ns", "0"), "min_ts_ns"),
    "max_ts past int64": (_set("files.0.max_ts_ns", 2**64), "max_ts_ns"),
    "trace a list": (_set("trace", []), "trace"),
    "anchors short": (_set("trace.anchors", [[1, 2]]), "trace.anchors[0]"),
    "anchor past int64": (_set("trace.anchors", [[1, 2, 2**70]]), "trace.anchors[0][2]"),
    "anchor text": (_set("trace.anchors", [["1", 2, 3]]), "trace.anchors[0][0]"),
    "anchor past the time bound": (_set("trace.anchors", [[1, 2, MAX_TIME_NS]]), "trace.anchors[0][2]"),
    "anchor negative": (_set("trace.anchors", [[1, -1, 3]]), "trace.anchors[0][1]"),
    "chip device number": (_set("trace.chip_devices", [[1, 5]]), "trace.chip_devices[0][1]"),
    "process names flat": (_set("trace.process_names", [1, "x"]), "trace.process_names[0]"),
    "thread names short": (_set("trace.thread_names", [[1, "x"]]), "trace.thread_names[0]"),
    "dropped negative": (_set("trace.dropped", {"bad_json": -3}), "trace.dropped.bad_json"),
    "dropped text": (_set("trace.dropped", {"bad_json": "3"}), "trace.dropped.bad_json"),
    "records_read float": (_set("trace.records_read", 1.5), "trace.records_read"),
    "lines_read huge": (_set("trace.lines_read", 10**40), "trace.lines_read"),
    "files not text": (_set("trace.files", [1]), "trace.files[0]"),
    "notes a string": (_set("trace.notes", "x"), "trace.notes"),
    "performance_summary list": (_set("trace.performance_summary", [1]), "trace.performance_summary"),
    "faults text": (_set("trace.faults", "x"), "trace.faults"),
    "Infinity in the side block": (_set("trace.performance_summary.batch_elapsed_s", float("inf")), "Infinity is not JSON"),
    "NaN in the side block": (_set("trace.performance_summary.workload.preset", float("nan")), "NaN is not JSON"),
}


@pytest.mark.parametrize("case", MANIFEST_CASES)
def test_crafted_manifest_is_one_line(dataset, tmp_path, case):
    mutate, needle = MANIFEST_CASES[case]
    target = copy_dataset(dataset, tmp_path)
    manifest = json.loads((target / "dataset.json").read_text())
    changed = copy.deepcopy(manifest)
    mutate(changed)
    (target / "dataset.json").write_text(json.dumps(changed))
    result = CliRunner().invoke(cli, ["analyze", str(target), "-o", str(tmp_path / "out")])
    one_error_line(result, needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "text",
    ["", "[]", "{", '{"schema": "dsprof.span_dataset/1", "window_ns": 1, "span_schema": ' + "[" * 50_000 + "]" * 50_000 + "}", "1" * 5000],
)
def test_unreadable_manifest_is_one_line(dataset, tmp_path, text):
    target = copy_dataset(dataset, tmp_path)
    (target / "dataset.json").write_text(text)
    one_error_line(CliRunner().invoke(cli, ["analyze", str(target), "-o", str(tmp_path / "out")]), "dataset.json")


def _first_part(target: Path) -> Path:
    return target / json.loads((target / "dataset.json").read_text())["files"][0]["path"]


def test_part_symlinked_out_of_the_dataset_is_refused(dataset, tmp_path):
    target = copy_dataset(dataset, tmp_path)
    part = _first_part(target)
    outside = tmp_path / "outside.parquet"
    part.rename(outside)
    part.symlink_to(outside)
    one_error_line(CliRunner().invoke(cli, ["analyze", str(target), "-o", str(tmp_path / "out")]), "not a regular file")


def test_window_folder_symlinked_out_of_the_dataset_is_refused(dataset, tmp_path):
    target = copy_dataset(dataset, tmp_path)
    folder = _first_part(target).parent
    moved = tmp_path / "elsewhere"
    folder.rename(moved)
    folder.symlink_to(moved, target_is_directory=True)
    one_error_line(CliRunner().invoke(cli, ["analyze", str(target), "-o", str(tmp_path / "out")]), "not a folder")


@pytest.mark.parametrize("which", ["part", "manifest"])
def test_fifo_in_a_dataset_does_not_block(dataset, tmp_path, which):
    target = copy_dataset(dataset, tmp_path)
    node = _first_part(target) if which == "part" else target / "dataset.json"
    node.unlink()
    os.mkfifo(node)
    done = run_cli("analyze", str(target), "-o", str(tmp_path / "out"), timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("dsprof: error: "), done.stderr


# -- 1. Parquet parts with wrong column types ------------------------------------------------------------


def _retyped(column: str, values):
    def change(table: pa.Table) -> pa.Table:
        index = table.schema.get_field_index(column)
        array = values(table.column(column)) if callable(values) else values
        return table.set_column(index, pa.field(column, array.type), array)

    return change


PART_CASES = {
    "ts_ns as text": _retyped("ts_ns", lambda c: c.cast(pa.string())),
    "ts_ns as timestamp": _retyped("ts_ns", lambda c: c.cast(pa.timestamp("ns"))),
    "depth as text": _retyped("depth", lambda c: c.cast(pa.string())),
    "pid as float": _retyped("pid", lambda c: c.cast(pa.float64())),
    "all-null ts_ns": _retyped("ts_ns", lambda c: pa.nulls(len(c), pa.int64())),
    "all-null ts_ns typed null": _retyped("ts_ns", lambda c: pa.nulls(len(c))),
    "decimal dur": _retyped("dur_ns", lambda c: c.cast(pa.decimal128(20, 0))),
    "list for clk": _retyped("clk", lambda c: pa.array([[v] for v in c.to_pylist()])),
    "column missing": lambda t: t.drop_columns(["hid"]),
    "column extra": lambda t: t.append_column("extra", pa.array([1] * t.num_rows)),
    "ts_ns near 2^63": _retyped("ts_ns", lambda c: pa.array([2**63 - 10] * len(c), pa.int64())),
    "dur_ns negative": _retyped("dur_ns", lambda c: pa.array([-5] * len(c), pa.int64())),
    "end past the bound": _retyped("dur_ns", lambda c: pa.array([MAX_TIME_NS] * len(c), pa.int64())),
}


@pytest.mark.parametrize("case", PART_CASES)
@pytest.mark.parametrize("statistics", [True, False])
def test_part_with_wrong_columns_is_one_line_naming_it(dataset, tmp_path, case, statistics):
    target = copy_dataset(dataset, tmp_path)
    part = _first_part(target)
    table = PART_CASES[case](pq.read_table(part))
    pq.write_table(table, part, write_statistics=statistics)
    last = one_error_line(CliRunner().invoke(cli, ["analyze", str(target), "-o", str(tmp_path / "out")]), str(part))
    assert "\n" not in last


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "pages"])
def test_corrupt_part_is_named(dataset, tmp_path, damage):
    target = copy_dataset(dataset, tmp_path)
    part = _first_part(target)
    data = part.read_bytes()
    pages = data[:8] + b"\xab" * (len(data) // 2 - 8) + data[len(data) // 2 :]  # the footer intact: found only when read
    part.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"PAR1" + b"\xff" * 100, "empty": b"", "pages": pages}[damage])
    one_error_line(CliRunner().invoke(cli, ["analyze", str(target), "-o", str(tmp_path / "out")]), str(part))


def test_pristine_dataset_still_analyses(dataset, tmp_path):
    result = CliRunner().invoke(cli, ["analyze", str(dataset), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output


# -- 2. timestamps near 2^63 -----------------------------------------------------------------------------

NEAR = [2**63 - 100, MAX_TIME_NS, MAX_TIME_NS - 5]


def _with_strace_times(run_dir: Path, tmp_path: Path, ts: int, dur: int) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    log = target / "server.log"
    lines = log.read_text().splitlines()
    record = next(line for line in lines if "[STRACE]" in line and " depth=1 " in line)
    head, _, _ = record.partition(" ts=")
    log.write_text("\n".join([*lines, f"{head.replace('inv=', 'inv=9')} ts={ts} dur={dur}"]) + "\n")
    return target


@pytest.mark.slow
@pytest.mark.parametrize("reader", ["compiled", "python"])
@pytest.mark.parametrize(("ts", "dur"), [(NEAR[0], 10), (NEAR[1], 0), (NEAR[2], 10), (10, 2**63 - 20)])
def test_strace_times_near_the_int64_limit_are_dropped_and_counted(run_dir, tmp_path, monkeypatch, reader, ts, dur):
    from dsprof.testing.strace_readers import select_reader

    select_reader(reader, monkeypatch)
    target = _with_strace_times(run_dir, tmp_path, ts, dur)
    result = CliRunner().invoke(cli, ["analyze", str(target), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    dropped = json.loads((tmp_path / "out" / "summary.json").read_text())["inputs"]["dropped"]
    assert dropped.get("bad_value") == 1, dropped


@pytest.mark.slow
@pytest.mark.parametrize("anchor", ["mono_ns=1 wall_ns=9223372036854775807", "mono_ns=-9223372036854775807 wall_ns=5"])
def test_clock_anchor_near_the_int64_limit_is_dropped_and_counted(run_dir, tmp_path, anchor):
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    log = target / "server.log"
    lines = log.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if "[CLOCK_ANCHOR]" in line)
    lines[first] = lines[first][: lines[first].rindex(" mono_ns=")] + " " + anchor
    log.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(cli, ["analyze", str(target), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    dropped = json.loads((tmp_path / "out" / "summary.json").read_text())["inputs"]["dropped"]
    assert dropped.get("bad_anchor") == 1, dropped


@pytest.mark.slow
@pytest.mark.parametrize(
    "event",
    [
        {"ts": 9223372036854775, "dur": 1},
        {"ts": MAX_TIME_NS // 1000 + 1, "dur": 0},
        {"ts": 4999999000, "dur": 9223372036854775},
        {"ts": "9223372036854775.807", "dur": 1},
        {"ts": -9223372036854775, "dur": 1},
    ],
)
def test_chrome_times_near_the_int64_limit_are_dropped_and_counted(run_dir, tmp_path, event):
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    trace = target / "serving-trace" / "trace.json"
    extra = {"name": "request", "cat": "request", "ph": "X", "pid": 40999, "tid": 1, **event}
    trace.write_text(trace.read_text().replace('{"traceEvents": [\n', '{"traceEvents": [\n' + json.dumps(extra) + ",\n", 1))
    result = CliRunner().invoke(cli, ["analyze", str(target), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    dropped = json.loads((tmp_path / "out" / "summary.json").read_text())["inputs"]["dropped"]
    assert dropped.get("bad_value") == 1, dropped


# -- 3. bad option values --------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["1e30GB", "100000000000000000000", "٥GB", "nan", "inf", "0", "-5GB", "101%", "1e400GB", "4 parsecs"])
def test_bad_memory_limit_is_refused_before_any_input_is_read(tmp_path, limit):
    nothing = tmp_path / "empty"  # read first, it would be refused for holding no input
    nothing.mkdir()
    result = CliRunner().invoke(cli, ["analyze", str(nothing), "-o", str(tmp_path / "out"), "--memory-limit", limit])
    one_error_line(result, "bad memory limit")


def test_large_but_sane_memory_limit_is_taken(run_dir, tmp_path):
    result = CliRunner().invoke(cli, ["analyze", str(run_dir), "-o", str(tmp_path / "out"), "--memory-limit", "512TB"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("address", ["not a host", "host", "h:0", "h:65536", "\x1b]0;x\x07:1", "ray://", "[zz]:1"])
def test_bad_ray_address_is_one_line(run_dir, tmp_path, address):
    result = CliRunner().invoke(cli, ["analyze", str(run_dir), "-o", str(tmp_path / "out"), "--engine", "ray", "--address", address])
    one_error_line(result, "bad Ray address")


def test_unreachable_ray_address_fails_fast(run_dir, tmp_path):
    import socket

    with socket.socket() as taken:  # a port bound but never listening: connections to it are refused
        taken.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = run_cli("analyze", str(run_dir), "-o", str(tmp_path / "out"), "--engine", "ray", "--address", address, timeout=100)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith("dsprof: error: cannot reach the Ray cluster"), done.stderr[-2000:]


@pytest.mark.parametrize("answer", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b"", None])
def test_an_address_that_is_no_ray_cluster_fails_fast_with_one_line(answer):
    """Something else listens (an HTTP/1 server, one that hangs up, one that never answers): no gRPC SETTINGS frame, so no
    ray.init retrying for minutes with its C++ client's warnings."""
    import socket
    import threading

    from dsprof.analysis.cluster import ray_engine as cluster
    from dsprof.errors import DsprofError

    with socket.create_server(("127.0.0.1", 0)) as listener:
        released = threading.Event()

        def serve() -> None:
            connection, _ = listener.accept()
            with connection:
                if answer is not None:
                    connection.sendall(answer)
                    return
                released.wait(10)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(DsprofError, match="no Ray cluster at .* does not answer as Ray's gRPC server"):
            cluster.probe_address(address, timeout_s=5.0) if answer is not None else _probe_silent(cluster, address)
        released.set()
        server.join(10)


def _probe_silent(cluster, address: str) -> None:
    saved, cluster.ANSWER_TIMEOUT_S = cluster.ANSWER_TIMEOUT_S, 0.2
    try:
        cluster.probe_address(address)
    finally:
        cluster.ANSWER_TIMEOUT_S = saved


def test_ray_missing_is_one_line_and_leaves_nothing_in_tmpdir(run_dir, tmp_path):
    (tmp_path / "no-ray").mkdir()
    (tmp_path / "no-ray" / "ray.py").write_text("raise ImportError('no module named ray')\n")  # shadows any installed Ray
    (tmp_path / "tmp").mkdir()
    env = {
        "TMPDIR": str(tmp_path / "tmp"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "no-ray"), os.environ.get("PYTHONPATH")])),
    }
    done = run_cli("analyze", str(run_dir), "-o", str(tmp_path / "out"), "--engine", "ray", env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == "dsprof: error: the ray engine needs Ray: pip install 'dsprof[cluster]'"
    assert list((tmp_path / "tmp").iterdir()) == [] and not (tmp_path / "out").exists()


def test_unreachable_ray_address_leaves_nothing_in_tmpdir(run_dir, tmp_path):
    import socket

    (tmp_path / "tmp").mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        args = ("analyze", str(run_dir), "-o", str(tmp_path / "out"), "--engine", "ray", "--address", address)
        done = run_cli(*args, timeout=100, env={"TMPDIR": str(tmp_path / "tmp")})
    assert done.returncode == 2, done.stderr[-2000:]
    assert list((tmp_path / "tmp").iterdir()) == [] and not (tmp_path / "out").exists()


# -- 5. the spill folder ---------------------------------------------------------------------------------


def test_engine_spills_to_a_private_folder_of_its_own(tmp_path, monkeypatch):
    from dsprof.analysis.store.engine import open_engine
    from dsprof.analysis.store.spans import Trace

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / "elsewhere"
    planted.mkdir()
    (tmp_path / "dsprof-duckdb").symlink_to(planted)  # the old fixed path, planted by someone else
    first, second = open_engine(Trace()), open_engine(Trace())
    folders = {first.scalar("SELECT current_setting('temp_directory')"), second.scalar("SELECT current_setting('temp_directory')")}
    assert len(folders) == 2
    for folder in map(Path, folders):
        assert folder.parent == tmp_path and not folder.is_symlink() and folder.stat().st_mode & 0o777 == 0o700
    first.close()
    second.close()
    first.close()  # twice: nothing more
    assert not any(Path(f).exists() for f in folders)
    assert not list(planted.iterdir())


def test_analyze_leaves_nothing_in_tmpdir(run_dir, tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = run_cli("analyze", str(run_dir), "-o", str(tmp_path / "out"), "--memory-limit", "300MB", env={"TMPDIR": str(temp)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(temp.iterdir()) == []


# -- 4. outputs written only where asked -----------------------------------------------------------------

RULES = '[[rule]]\ncheck = "runner_start_skew_ms.p95 <= 1000000"\n'


@pytest.fixture(scope="module")
def analysed(run_dir, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("analysed") / "run"
    shutil.copytree(run_dir, target)
    assert CliRunner().invoke(cli, ["analyze", str(target)]).exit_code == 0
    return target


def _plant(kind: str, path: Path, tmp_path: Path) -> Path | None:
    """Put ``kind`` at ``path``; returns the file a link points at (which must stay as it was)."""
    if kind == "symlink":
        victim = tmp_path / "victim.txt"
        victim.write_text("keep me")
        path.symlink_to(victim)
        return victim
    if kind == "dangling symlink":
        path.symlink_to(tmp_path / "created-through-the-link")
        return None
    if kind == "fifo":
        os.mkfifo(path)
        return None
    if kind == "device":
        try:
            os.mknod(path, 0o666 | __import__("stat").S_IFCHR, os.makedev(1, 3))  # a null device node of our own
        except PermissionError:
            pytest.skip("no permission to make a device node here")
        return None
    path.mkdir()
    return None


OUTPUT_COMMANDS = {
    "report -o": lambda d, out: ["report", str(d), "-o", str(out)],
    "export -o": lambda d, out: ["export", str(d), "-o", str(out)],
    "export json -o": lambda d, out: ["export", str(d), "-o", str(out), "--format", "perfetto-json"],
    "gate --junit": lambda d, out: ["gate", str(d), "--rules", str(d / "rules.toml"), "--junit", str(out)],
    "gate --verdict": lambda d, out: ["gate", str(d), "--rules", str(d / "rules.toml"), "--verdict", str(out)],
    "ingest -o csv": lambda d, out: ["ingest", str(d / "server.log"), "-o", str(out)],
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "fifo", "device", "directory"])
@pytest.mark.parametrize("command", OUTPUT_COMMANDS)
def test_output_onto_anything_but_a_regular_file_is_refused(analysed, tmp_path, command, kind):
    if (command, kind) == ("ingest -o csv", "directory"):
        pytest.skip("ingest -o DIR writes a span dataset there (its documented form)")
    (analysed / "rules.toml").write_text(RULES)
    out = tmp_path / ("spans.csv" if command.startswith("ingest") else "output.out")
    victim = _plant(kind, out, tmp_path)
    if kind == "fifo":  # a regression would block: in a child process, under a timeout
        done = run_cli(*OUTPUT_COMMANDS[command](analysed, out), timeout=120)
        assert done.returncode == 2, (done.stdout + done.stderr)[-2000:]
        assert "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("dsprof: error: "), done.stderr[-2000:]
    else:
        one_error_line(CliRunner().invoke(cli, OUTPUT_COMMANDS[command](analysed, out)), str(out))
    assert os.path.lexists(out) and not out.is_file() or out.is_symlink()
    if victim is not None:
        assert victim.read_text() == "keep me"
    assert not (tmp_path / "created-through-the-link").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_analyze_onto_a_linked_summary_is_refused(run_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.json"
    victim.write_text("keep me")
    (out / "summary.json").symlink_to(victim)
    one_error_line(CliRunner().invoke(cli, ["analyze", str(run_dir), "-o", str(out)]), "symbolic link")
    assert victim.read_text() == "keep me"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["report", "gate", "diff", "export"])
def test_fifo_summary_does_not_block(analysed, tmp_path, command):
    target = tmp_path / "run"
    shutil.copytree(analysed, target)
    (target / "summary.json").unlink()
    os.mkfifo(target / "summary.json")
    (tmp_path / "rules.toml").write_text(RULES)
    args = {
        "report": ["report", str(target), "-o", str(tmp_path / "r.html")],
        "export": ["export", str(target), "-o", str(tmp_path / "t.pftrace")],
        "gate": ["gate", str(target), "--rules", str(tmp_path / "rules.toml")],
        "diff": ["diff", str(analysed), str(target)],
    }[command]
    done = run_cli(*args, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith("dsprof: error: ") and "FIFO" in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("where", ["fifo", "symlink"])
def test_step_summary_that_is_not_a_regular_file_does_not_block_gate(analysed, tmp_path, where):
    (tmp_path / "rules.toml").write_text(RULES)
    step = tmp_path / "step.md"
    victim = _plant(where, step, tmp_path)
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(step)}
    done = run_cli("gate", str(analysed), "--rules", str(tmp_path / "rules.toml"), timeout=60, env=env)
    assert done.returncode == 2, (done.stdout + done.stderr)[-2000:]
    assert "refusing to append" in done.stderr and "Traceback" not in done.stderr
    if victim is not None:
        assert victim.read_text() == "keep me"


# -- 6. escaped text everywhere a person reads it ----------------------------------------------------------


@pytest.mark.slow
def test_file_names_in_progress_and_report_lines_are_escaped(run_dir, tmp_path):
    hostile = tmp_path / "x\x1b]0;pwned\x07\u202e.log"
    shutil.copy(run_dir / "server.log", hostile)
    for args in (["ingest", str(hostile), "-o", str(tmp_path / "spans") + "/"], ["analyze", str(hostile), "-o", str(tmp_path / "out")]):
        done = run_cli(*args)
        assert done.returncode == 0, done.stderr[-2000:]
        printed = done.stdout + done.stderr
        assert "\x1b" not in printed and "\x07" not in printed and "\u202e" not in printed, printed
        assert "\\x1b]0;pwned\\x07\\u202e.log" in printed


def test_summary_md_shows_bidi_controls_and_breaks_mentions(run_dir, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    summary_file = target / "performance_summary.json"
    performance = json.loads(summary_file.read_text())
    performance["workload"]["preset"] = "demo\u202e\u2066 cc @octocat @org/team"
    summary_file.write_text(json.dumps(performance))
    assert CliRunner().invoke(cli, ["analyze", str(target)]).exit_code == 0
    text = (target / "summary.md").read_text()
    assert "\u202e" not in text and "\u2066" not in text and "\\u202e\\u2066" in text
    assert "@octocat" not in text and "@org/team" not in text
    assert "@&#8203;octocat" in text


def test_csv_span_table_cells_never_start_a_formula(tmp_path):
    events = [
        {"name": '=HYPERLINK("http://evil.example","click")', "ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 1, "cat": "+cmd"},
        {"name": "-2+3", "ph": "X", "ts": 3, "dur": 1, "pid": 1, "tid": 1, "cat": "@SUM(A1)"},
        {"name": "ordinary", "ph": "X", "ts": 5, "dur": 1, "pid": 1, "tid": 1, "cat": "c"},
    ]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    out = tmp_path / "spans.csv"
    assert CliRunner().invoke(cli, ["ingest", str(trace), "-o", str(out)]).exit_code == 0
    import csv

    rows = list(csv.DictReader(out.open(newline="")))
    assert [r["name"] for r in rows] == ['\'=HYPERLINK("http://evil.example","click")', "'-2+3", "ordinary"]
    assert [r["cat"] for r in rows] == ["'+cmd", "'@SUM(A1)", "c"]
    assert all(not cell.startswith(("=", "+", "-", "@")) for r in rows for cell in r.values())


# -- 7. repeated (file, line) rows -----------------------------------------------------------------------


def test_repeated_file_line_rows_keep_the_serving_join_linear(dataset, tmp_path):
    from dsprof.analysis.analyze import analyze_trace
    from dsprof.analysis.outputs.drawing import serving_spans_sql
    from dsprof.analysis.outputs.perfetto_tracks import build_track_layout, serving_lanes_sql
    from dsprof.analysis.store.dataset import open_dataset

    target = copy_dataset(dataset, tmp_path)
    part = _first_part(target)
    table = pq.read_table(part)
    serving = table.filter(pc.is_null(table.column("inv")))
    copies = 40
    pq.write_table(pa.concat_tables([table, *[serving] * copies]), part)
    manifest = json.loads((target / "dataset.json").read_text())
    manifest["files"][0]["rows"] = table.num_rows + copies * serving.num_rows
    (target / "dataset.json").write_text(json.dumps(manifest))
    result = analyze_trace(open_dataset(target))
    try:
        build_track_layout(result)
        spans = result.engine.scalar(f"SELECT count(*) FROM ({serving_spans_sql()})")
        joined = result.engine.scalar(f"SELECT count(*) FROM ({serving_lanes_sql()})")
    finally:
        result.engine.close()
    assert spans == (copies + 1) * serving.num_rows > 0
    assert joined == spans


# -- 7. sparse timestamps --------------------------------------------------------------------------------


@pytest.mark.slow
def test_sparse_timestamps_do_not_open_a_file_per_window(run_dir, tmp_path):
    from dsprof.analysis.store.dataset import DEFAULT_WINDOW_NS, MAX_WINDOWS

    lines = (run_dir / "server.log").read_text().splitlines()
    record = next(line for line in lines if "[STRACE]" in line and " depth=1 " in line)
    head, _, _ = record.partition(" ts=")
    head = head.replace(" depth=1 ", " depth=0 ")
    spans = MAX_WINDOWS + 300  # windows grow past MAX_WINDOWS (tests/test_hostile_bounds.py)
    log = tmp_path / "sparse.log"
    log.write_text("".join(f"{re.sub(r'inv=[0-9]+', f'inv={i}', head)} ts={i * DEFAULT_WINDOW_NS} dur=10\n" for i in range(1, spans + 1)))
    limit = 128  # far fewer descriptors than windows
    code = (
        f"import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit})); "
        "from dsprof.cli.main import cli; cli(sys.argv[1:])"
    )
    out = tmp_path / "spans"
    done = subprocess.run(
        [sys.executable, "-c", code, "ingest", str(log), "-o", str(out) + "/"], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((out / "dataset.json").read_text())
    assert sum(f["rows"] for f in manifest["files"]) == spans
    assert len({f["window"] for f in manifest["files"]}) <= MAX_WINDOWS < spans


# -- property: any one manifest value replaced --------------------------------------------------------------

HOSTILE_VALUES = st.one_of(
    st.sampled_from([10**400, 2**63, -(2**63) - 1, 1e308, -1, 0, True, None, "", "../x", "/etc/passwd", [], {}, [[[]]], "\x1b[2J"]),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)


def _leaves(node, path=()):
    """Every (path, value) of a JSON document, containers included."""
    yield path, node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from _leaves(child, (*path, key))


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_manifest_value_replaced_is_read_or_refused_in_one_line(dataset, tmp_path_factory, data):
    target = copy_dataset(dataset, tmp_path_factory.mktemp("mutant"))
    manifest = json.loads((target / "dataset.json").read_text())
    paths = [path for path, _ in _leaves(manifest) if path]
    path = data.draw(st.sampled_from(paths))
    node = manifest
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = data.draw(HOSTILE_VALUES)
    (target / "dataset.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(cli, ["analyze", str(target), "-o", str(target.parent / "out")])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:
        one_error_line(result)


# -- property: any one column of a part retyped -----------------------------------------------------------

RETYPINGS = {
    "text": lambda c: c.cast(pa.string()) if not pa.types.is_map(c.type) else pa.array(["x"] * len(c)),
    "float": lambda c: pa.array([1.5] * len(c)),
    "int32": lambda c: pa.array([1] * len(c), pa.int32()),
    "uint64 max": lambda c: pa.array([2**64 - 1] * len(c), pa.uint64()),
    "int64 min": lambda c: pa.array([-(2**63)] * len(c), pa.int64()),
    "timestamp": lambda c: pa.array([0] * len(c), pa.timestamp("ns")),
    "nulls": lambda c: pa.nulls(len(c), c.type),
    "bool": lambda c: pa.array([True] * len(c)),
    "list": lambda c: pa.array([[1]] * len(c)),
    "binary": lambda c: pa.array([b"\xff"] * len(c), pa.binary()),
}


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(column=st.sampled_from(SPAN_SCHEMA.names), retype=st.sampled_from(sorted(RETYPINGS)), statistics=st.booleans())
@example(column="depth", retype="int64 min", statistics=False)  # a device span's parent depth overflowed int64 (track layout)
def test_any_part_column_retyped_is_read_or_refused_in_one_line(dataset, tmp_path_factory, column, retype, statistics):
    target = copy_dataset(dataset, tmp_path_factory.mktemp("mutant"))
    part = _first_part(target)
    table = pq.read_table(part)
    array = RETYPINGS[retype](table.column(column))
    pq.write_table(
        table.set_column(table.schema.get_field_index(column), pa.field(column, array.type), array), part, write_statistics=statistics
    )
    result = CliRunner().invoke(cli, ["analyze", str(target), "-o", str(target.parent / "out")])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:
        one_error_line(result)


# -- values of the right type that the analysis once tripped on ----------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("column", "value", "refused"),
    [
        ("slot_id", 2**63 - 1, True),
        ("pid", 5, False),  # every rank one process: steps starting together once compared dicts
        ("rank", -(2**63), True),  # negated in SQL
        ("step", 2**63 - 1, True),
    ],
)
def test_extreme_column_values_end_in_a_result_or_one_line(dataset, tmp_path, column, value, refused):
    target = copy_dataset(dataset, tmp_path)
    part = _first_part(target)
    table = pq.read_table(part)
    array = pa.array([value] * table.num_rows, pa.int64())
    pq.write_table(table.set_column(table.schema.get_field_index(column), pa.field(column, array.type), array), part)
    done = run_cli("analyze", str(target), "-o", str(tmp_path / "out"), timeout=120)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    if refused:
        assert done.returncode == 2 and f"column {column} out of range" in done.stderr, done.stderr[-2000:]
    else:
        assert done.returncode in (0, 1), done.stderr[-2000:]


def test_lanes_settle_whatever_the_slot_ids():
    """Overlapping runs in one slot near int64's end: lanes once wrapped past it and never settled (a hang)."""
    code = (
        "import numpy as np; from dsprof.analysis.outputs.drawing import assign_lanes; "
        "print(assign_lanes(np.zeros(4, np.int64), np.array([0, 1, 2, 3]), np.array([10, 10, 10, 10]), "
        "np.full(4, 2**63 - 1, np.int64)).tolist())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(json.loads(done.stdout)) == [0, 1, 2, 3]
