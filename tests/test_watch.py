"""``dsprof watch``: the follower reads only new bytes and parses them as a whole-file read does (rotation, truncation,
a torn record at the end); the final summary.json equals analyze's; findings and alerts name the injected fault and
stay silent on a clean run. Driven with explicit polls: no sleeps, no timing.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.ingest import read_strace_log
from dsprof.analysis.ingest.follow import LogFollower
from dsprof.analysis.live.live_analysis import RING_CHUNKS, LiveAnalysis, window_summary
from dsprof.analysis.outputs import live_view
from dsprof.analysis.outputs.findings import LATE_LISTS
from dsprof.analysis.outputs.live_view import FindingLines, format_live_view, window_steps
from dsprof.analysis.store.spans import SPAN_SCHEMA
from dsprof.commands.analysis_job import analyze_paths
from dsprof.commands.watch import Alerts, Events, WatchOptions, WindowAnalyses, finish_watch
from dsprof.compiled import PURE_PYTHON_ENV
from dsprof.errors import InputError
from dsprof.profiler import artifacts
from dsprof.testing.coupled import Scenario, Shape, known_answers, scenario_for
from dsprof.testing.coupled_log import write_log

SHAPE = Shape(ranks=4, steps=60, layers=2, seed=5)
TITLES = {"slow_steps": "slow step", "tail_steps": "tail step", "late_starts": "late start"}
RULES = '[[rule]]\nname = "no slow steps"\ncheck = "slow_steps.count == 0"\n'


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict]:
    scenario = scenario_for(SHAPE)
    path = tmp_path_factory.mktemp("faulty") / "server.log"
    write_log(scenario, scenario.run(), path)
    return path.read_bytes(), known_answers(scenario)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    scenario = Scenario(SHAPE, [])
    path = tmp_path_factory.mktemp("clean") / "server.log"
    write_log(scenario, scenario.run(), path)
    return path.read_bytes()


def _pieces(data: bytes, seed: int, most: int = 40_000) -> list[bytes]:
    """``data`` cut at random bytes (mid-record, mid-line)."""
    rng, cuts, at = random.Random(seed), [], 0
    while at < len(data):
        step = rng.randint(1, most)
        cuts.append(data[at : at + step])
        at += step
    return cuts


def _torn(data: bytes) -> bytes:
    """The log cut inside its last record's required fields: the file ends with a torn record."""
    return data[: data.rindex(b"[STRACE]") + 40]


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


def _rows(tables: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(tables).cast(SPAN_SCHEMA)


@pytest.mark.parametrize("pure_python", [False, True])
def test_follower_rows_equal_a_whole_file_read(tmp_path, faulty, monkeypatch, pure_python):
    if pure_python:
        monkeypatch.setenv(PURE_PYTHON_ENV, "1")
    data = _torn(faulty[0])
    log = tmp_path / "server.log"
    log.touch()
    follower, tables = LogFollower(log), []
    for piece in _pieces(data, seed=1):
        _append(log, piece)
        tables += follower.poll()
    assert not follower.counts.drops.counts  # the torn record at the end waits for its rest
    tables += follower.finish()
    whole = read_strace_log(log)
    assert _rows(tables).equals(whole.spans)
    followed = follower.trace()
    assert (followed.records_read, followed.lines_read, followed.dropped) == (whole.records_read, whole.lines_read, whole.dropped)
    assert whole.dropped.get("torn_record") == 1
    assert followed.anchors.equals(whole.anchors) and followed.chip_devices.equals(whole.chip_devices)


def test_follower_reads_only_new_bytes_and_starts_again_after_truncation(tmp_path, faulty, clean):
    log = tmp_path / "server.log"
    log.write_bytes(faulty[0])
    follower = LogFollower(log)
    before = follower.poll()
    assert follower.poll() == [] and follower.total_read == len(faulty[0])  # nothing new: nothing read again
    after_bytes = clean[: clean.index(b"\n[", len(clean) // 2) + 1]
    log.write_bytes(after_bytes)  # truncated (shorter than what was read) and written again
    after = follower.finish()
    (tmp_path / "before.log").write_bytes(faulty[0])
    (tmp_path / "after.log").write_bytes(after_bytes)
    expected = [read_strace_log(tmp_path / name).spans.drop_columns(["file"]) for name in ("before.log", "after.log")]
    # the last line held back before the truncation is parsed then; the new content's lines are numbered from 1 again
    assert _rows(before + after).drop_columns(["file"]).equals(pa.concat_tables(expected))
    assert any("truncated" in note for note in follower.trace().notes)


def _follow(live: LiveAnalysis, pieces: list[bytes], log: Path, every: int = 3, finished: bool = False) -> list:
    """Append the pieces, polling after each and analysing the window every ``every`` pieces; each window's summary.

    Unless ``finished`` is to come, the dataset the live analysis wrote is let go at the end.
    """
    summaries = []
    for i, piece in enumerate(pieces):
        _append(log, piece)
        live.poll()
        if i % every == every - 1:
            result = live.window()
            if result is not None:
                summaries.append(result.summary)
                result.engine.close()
    if not finished:
        live.abort()
    return summaries


@pytest.mark.slow
@pytest.mark.parametrize("rotated_name", ["server.log.1", "server-1.log"])  # the second one a watched directory lists too
def test_final_summary_equals_analyze_with_rotation_and_a_torn_end(tmp_path, faulty, rotated_name):
    data = faulty[0]
    middle = data.index(b"\n[", len(data) // 2) + 1  # a logger rotates between lines
    run = tmp_path / "run"
    run.mkdir()
    log = run / "server.log"
    log.touch()
    live = LiveAnalysis([run], tmp_path / "spans", window=20)
    _follow(live, _pieces(data[:middle], seed=2), log, every=10, finished=True)
    log.rename(run / rotated_name)  # rotated: a new server.log starts
    (run / "server.log").touch()
    _follow(live, _pieces(_torn(data)[middle:], seed=3), log, every=10, finished=True)
    watched = finish_watch(live, tmp_path / "watch-out", WatchOptions(), keep_dataset=False)
    watched.result.engine.close()
    reference = analyze_paths([run / rotated_name, log], tmp_path / "analyze-out")
    reference.result.engine.close()
    got, want = (json.loads((tmp_path / d / artifacts.SUMMARY_JSON).read_text()) for d in ("watch-out", "analyze-out"))
    assert got["inputs"].pop("files") == [str(log)]
    assert want["inputs"].pop("files") == [str(run / rotated_name), str(log)]
    assert got == want
    assert want["inputs"]["dropped"] == {"torn_record": 1}


@pytest.mark.slow
def test_findings_name_the_injected_ranks_and_the_ring_stays_bounded(tmp_path, faulty):
    data, answers = faulty
    log = tmp_path / "server.log"
    log.touch()
    live = LiveAnalysis([log], tmp_path / "spans", window=15)
    findings, lines, ring = FindingLines(), [], []
    for summary in _follow(live, _pieces(data, seed=4, most=120_000), log, every=2):
        lines += findings.new_lines(summary)
        ring.append(live.ring.rows)
        steps = window_steps(summary)
        assert steps is None or all(step >= steps[0] for _, step, _ in findings.said)  # kept for the window only
        assert "steps" in format_live_view(summary, bytes_read=live.bytes_read)
    expected = {(TITLES[f["section"]], f["step"], f["rank"]) for fault in answers["faults"] for f in fault["flags"]}
    said = {_finding(line) for line in lines if not line.startswith("straggler: ")}
    assert said == expected, lines  # every flag of every injected fault, with its rank, and nothing else
    assert len(lines) == len(set(lines))  # each finding said once
    rows_per_step = read_strace_log(log).spans.num_rows / SHAPE.steps
    assert max(ring) < 3 * 15 * rows_per_step  # the ring holds about the window, not the run


def test_a_window_is_a_few_chunks_however_many_polls_filled_it(tmp_path, faulty):
    """Each poll adds a small table; the window taken (and the ring kept) is at most RING_CHUNKS chunks per column,
    which every query of the analysis scans at the cost of a few (hundreds of chunks doubled the take,
    benchmarks/README.md)."""
    log = tmp_path / "server.log"
    log.touch()
    live = LiveAnalysis([log], tmp_path / "spans", window=15)
    pieces = _pieces(faulty[0], seed=6, most=8_000)
    for piece in pieces[: len(pieces) // 2]:
        _append(log, piece)
        live.poll()
    chunks = []
    for piece in pieces[len(pieces) // 2 :]:
        _append(log, piece)
        live.poll()
        trace = live.window_trace()
        assert trace is not None and trace.spans.num_rows
        chunks += [column.num_chunks for column in (*trace.spans.columns, *live.ring._tables[0].columns)]
    assert len(live.ring._tables) == 1 and max(chunks) <= RING_CHUNKS
    live.abort()


def test_window_analyses_come_back_in_the_order_they_were_taken(tmp_path, faulty):
    """Two analyses under way at once: the older window is shown first, whichever ends first; no step yet is None."""
    log = tmp_path / "server.log"
    log.touch()
    live = LiveAnalysis([log], tmp_path / "spans", window=15)
    windows = WindowAnalyses(workers=2, threshold_ms=5.0)
    try:
        windows.start(live)  # nothing read yet: no window to analyse
        assert [summary for summary, _ in windows.done(wait=False)] == [None]
        data = faulty[0]
        half = data.index(b"\n[", len(data) // 2) + 1
        for part in (data[:half], data[half:]):
            _append(log, part)
            live.poll()
            windows.start(live)
        assert not windows.free()
        shown = [window_steps(summary) for summary, _ in windows.done(wait=True)]
    finally:
        windows.close()
        live.abort()
    assert len(shown) == 2 and shown[0] is not None and shown[1] is not None
    assert shown[0][1] < shown[1][1] and windows.free()


def _finding(line: str) -> tuple[str, int, int]:
    """(list title, step, rank) of a finding line: ``slow step: step 32 · rank 2 (cpu:2) · ...``."""
    title, _, rest = line.partition(": step ")
    step, _, rest = rest.partition(" · rank ")
    return title, int(step), int(rest.split()[0])


@pytest.mark.slow
def test_a_clean_run_says_nothing(tmp_path, clean):
    log = tmp_path / "server.log"
    log.touch()
    live = LiveAnalysis([log], tmp_path / "spans", window=15)
    findings, alerts = FindingLines(), Alerts(_rules(tmp_path), None)
    lines = []
    for summary in _follow(live, _pieces(clean, seed=5, most=120_000), log, every=2):
        lines += findings.new_lines(summary) + alerts.check(summary, (summary["per_step"][0]["step"], summary["per_step"][-1]["step"]))
    assert lines == []


@pytest.mark.slow
def test_an_alert_runs_the_hook_once_per_window(tmp_path, faulty):
    log = tmp_path / "server.log"
    log.touch()
    live = LiveAnalysis([log], tmp_path / "spans", window=15)
    fired_to = tmp_path / "fired.txt"
    alerts = Alerts(_rules(tmp_path), f'printf "%s\\n" "$DSPROF_ALERT" >> {fired_to}')
    events = Events(tmp_path / "events.jsonl")
    for summary in _follow(live, _pieces(faulty[0], seed=6, most=120_000), log, every=2):
        steps = (min(r["step"] for r in summary["per_step"]), max(r["step"] for r in summary["per_step"]))
        events.write(steps, alerts.check(summary, steps), 0.0)
    events.close()
    alerts.stop(stopped=False)  # the hooks still running end on their own
    hooked = fired_to.read_text().splitlines()
    assert alerts.hooks is not None and sorted(hooked + alerts.hooks.skipped) == sorted(alerts.fired)  # hooks run side by side
    assert hooked and all(line.startswith("alert: steps ") and "no slow steps" in line for line in alerts.fired)
    ranges = [tuple(map(int, line.split(":")[1].split()[1].split("-"))) for line in alerts.fired]
    assert all(later[0] > earlier[1] for earlier, later in zip(ranges, ranges[1:], strict=False))  # quiet until the window moved past
    written = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [a for e in written for a in e["alerts"]] == alerts.fired
    shown = [e["new_last_step"] for e in written if e["new_last_step"] is not None]
    assert shown == sorted(set(shown)) and set(written[0]) == {"wall_s", "first_step", "last_step", "new_last_step", "alerts", "refresh_s"}


def _rules(tmp_path: Path) -> Path:
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    return rules


def _dsprof(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsprof.cli.main", *args], capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_cli_watch_ends_when_idle_with_analyzes_outputs_and_exits_1_on_an_alert(tmp_path, faulty):
    run = tmp_path / "run"
    run.mkdir()
    (run / "server.log").write_bytes(faulty[0])
    done = _dsprof("watch", str(run), "-o", str(tmp_path / "w"), "--idle-exit", "0.5", "--alert", str(_rules(tmp_path)))
    assert done.returncode == 1, done.stderr
    assert "alert: steps " in done.stdout and "watch ended: an alert fired" in done.stdout
    assert (tmp_path / "w" / artifacts.REPORT_HTML).is_file()
    done = _dsprof("watch", str(run), "-o", str(tmp_path / "w"), "--idle-exit", "0.5", "--events", str(tmp_path / "ev.jsonl"))
    assert done.returncode == 0, done.stderr
    assert "watch ended: no new bytes for 0.5 s" in done.stdout
    reference = _dsprof("analyze", str(run), "-o", str(tmp_path / "a"))
    assert reference.returncode == 0, reference.stderr
    assert (tmp_path / "w" / artifacts.SUMMARY_JSON).read_bytes() == (tmp_path / "a" / artifacts.SUMMARY_JSON).read_bytes()
    assert json.loads((tmp_path / "ev.jsonl").read_text().splitlines()[-1])["last_step"] == SHAPE.steps - 1


@pytest.mark.slow
def test_cli_watch_refuses_bad_input_in_one_line(tmp_path):
    binary = tmp_path / "blob.log"
    binary.write_bytes(b"\0\1\2" * 100)
    done = _dsprof("watch", str(binary), "--idle-exit", "0.5", "-o", str(tmp_path / "out"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "binary data" in done.stderr
    done = _dsprof("watch", str(tmp_path), "--on-alert", "true")
    assert done.returncode == 2 and "--on-alert needs --alert" in done.stderr
    assert not os.path.exists(tmp_path / "out" / artifacts.SUMMARY_JSON)
    quiet = tmp_path / "quiet.log"
    quiet.write_text("a job that wrote no [STRACE] record\n")
    done = _dsprof("watch", str(quiet), "--idle-exit", "0.5", "-o", str(tmp_path / "out"))
    assert (
        done.returncode == 2 and done.stderr.count("\n") == 1 and f"{quiet}: no spans to analyse" in done.stderr
    )  # the input, not a dataset


@pytest.mark.slow
def test_ctrl_c_ends_the_watch_with_analyzes_outputs(tmp_path, faulty):
    run = tmp_path / "run"
    run.mkdir()
    (run / "server.log").write_bytes(faulty[0])
    events = tmp_path / "ev.jsonl"
    command = [sys.executable, "-m", "dsprof.cli.main", "watch", str(run), "-o", str(tmp_path / "w"), "--events", str(events)]
    watcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not (events.is_file() and events.read_text()):  # the first refresh is written: the watch is under way
            assert watcher.poll() is None, watcher.communicate()
            time.sleep(0.1)
        watcher.send_signal(signal.SIGINT)
        stdout, stderr = watcher.communicate(timeout=300)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, stderr
    assert "watch ended: stopped by SIGINT" in stdout
    reference = _dsprof("analyze", str(run), "-o", str(tmp_path / "a"))
    assert (tmp_path / "w" / artifacts.SUMMARY_JSON).read_bytes() == (tmp_path / "a" / artifacts.SUMMARY_JSON).read_bytes(), (
        reference.stderr
    )


@pytest.mark.runtime
def test_run_live_writes_the_runs_outputs_as_analyze_does(tmp_path):
    out_dir = tmp_path / "live"
    done = _dsprof("run", "--live", "--ranks", "2", "--output-tokens", "12", "-o", str(out_dir))
    assert done.returncode == 0, done.stderr
    assert f"artifacts: {out_dir}" in done.stdout and "watch ended: the job ended" in done.stdout
    reference = _dsprof("analyze", str(out_dir), "-o", str(tmp_path / "a"), "--expect-ranks", "2")
    assert reference.returncode == 0, reference.stderr
    assert (out_dir / artifacts.SUMMARY_JSON).read_bytes() == (tmp_path / "a" / artifacts.SUMMARY_JSON).read_bytes()


@pytest.mark.slow
def test_a_log_not_written_yet_is_waited_for(tmp_path, clean):
    log = tmp_path / "server.log"
    live = LiveAnalysis([log], tmp_path / "spans", window=20)
    assert live.poll() == 0 and live.window() is None  # nothing yet: no error
    _follow(live, _pieces(clean, seed=4), log, every=10, finished=True)
    watched = finish_watch(live, tmp_path / "watch-out", WatchOptions(), keep_dataset=False)
    watched.result.engine.close()
    reference = analyze_paths([log], None)
    reference.result.engine.close()
    assert watched.summary["per_step"] == reference.summary["per_step"] and len(watched.summary["per_step"]) == SHAPE.steps
    with pytest.raises(InputError, match="nor a directory for it to appear in"):
        LiveAnalysis([tmp_path / "no-such-dir" / "server.log"], tmp_path / "spans2")


def test_the_live_view_fits_the_terminal_and_counts_what_it_leaves_out(tmp_path, faulty, monkeypatch):
    monkeypatch.setattr(live_view, "VIEW_LIST_LIMIT", 3)  # the known-answer run has 4-6 items a list
    log = tmp_path / "server.log"
    log.write_bytes(faulty[0])
    outcome = analyze_paths([log], None, threshold_ms=1.0)  # a low threshold: lists longer than the view shows
    outcome.result.engine.close()
    summary = outcome.summary
    wide = format_live_view(summary, bytes_read=1).splitlines()
    narrow = format_live_view(summary, bytes_read=1, width=60).splitlines()
    assert len(wide) == len(narrow) and all(len(line) <= 60 for line in narrow)
    assert [line[:59] + "…" if len(line) > 60 else line for line in wide] == narrow
    assert any(len(line) > 60 for line in wide)  # some line was cut
    counts = {title: len(summary[key]["items"]) for key, title in LATE_LISTS}
    assert min(counts.values()) > 3
    for title, n in counts.items():
        assert f"  … {n - 3} more" in wide[wide.index(f"{title} in the window: {n}") :]


@pytest.mark.slow
def test_a_window_keeps_the_invocations_of_the_window_before_only_where_their_rows_are_unchanged(tmp_path, faulty):
    """Each window aggregates again only the invocations with rows read since the window before was taken; its summary
    equals a whole analysis of the same rows, also after a row came late to an invocation already analysed."""
    log = tmp_path / "server.log"
    log.touch()
    live = LiveAnalysis([log], tmp_path / "spans", window=15)
    reused, late_row_seen = 0, False
    for i, piece in enumerate(_pieces(faulty[0], seed=8, most=60_000)):
        _append(log, piece)
        live.poll()
        if i == 6:  # a late child row of an invocation analysed already: a copy of one, a microsecond longer
            rows = live._learned.invocations if live._learned is not None else None
            assert rows is not None and rows.num_rows
            spans = live.ring._tables[0]
            pid, inv = rows.column("pid")[0].as_py(), rows.column("inv")[0].as_py()
            mine = spans.filter(pa.compute.and_(pa.compute.equal(spans["pid"], pid), pa.compute.equal(spans["inv"], inv)))
            child = mine.filter(pa.compute.greater(mine["depth"], 0)).slice(0, 1)
            assert child.num_rows == 1
            live._take(child.set_column(child.schema.get_field_index("dur_ns"), "dur_ns", pa.compute.add(child["dur_ns"], 1000)))
            late_row_seen = True
        window = live.take()
        if window is None:
            continue
        result = window_summary(window)
        live.learn(result)
        if late_row_seen:
            assert window.known_invocations is not None and window.known_invocations.num_rows
            known = zip(window.known_invocations["pid"].to_pylist(), window.known_invocations["inv"].to_pylist(), strict=True)
            assert (pid, inv) not in set(known)
            late_row_seen = False
        reused += window.known_invocations is not None and window.known_invocations.num_rows > 0
        fresh = analyze_trace(window.trace)
        fresh.engine.close()
        assert json.dumps(result.summary, sort_keys=True, default=str) == json.dumps(fresh.summary, sort_keys=True, default=str)
    live.abort()
    assert reused >= 3
