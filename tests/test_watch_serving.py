"""``dsprof watch`` follows SA_PROFILE fragments: only new, complete lines, parsed as ``analyze`` parses a whole fragment
(new fragments picked up, a recreated one read from its start); the window's serving figures are those of its request
spans, read whole; the holding stays bounded; ``--alert`` rules on serving figures work per window; the final
summary.json still equals analyze's. Driven with explicit polls: no sleeps, no timing.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.ingest import read_strace_log
from dsprof.analysis.ingest.fragment_follow import FragmentFollower
from dsprof.analysis.ingest.sa_profile import read_sa_profile
from dsprof.analysis.live.live_analysis import LiveAnalysis, ServingRows
from dsprof.analysis.outputs.live_view import format_live_view
from dsprof.analysis.stages.serving import serving_figures
from dsprof.analysis.store.engine import open_engine
from dsprof.analysis.store.spans import SPAN_SCHEMA, Trace, concat_spans
from dsprof.commands.analysis_job import analyze_paths
from dsprof.commands.watch import Alerts, WatchOptions, finish_watch
from dsprof.profiler import artifacts
from dsprof.profiler.chrome_json import JsonLimits
from dsprof.testing.coupled import Scenario, Shape
from dsprof.testing.coupled_log import write_log

SHAPE = Shape(ranks=4, steps=60, layers=2, seed=5)
REQUEST_STEPS = 5  # each request is served over this many consecutive decode steps
BAD_REQUEST = 6  # steps 30-34: none of its draft tokens accepted
SERVER_PID = 4242
RULES = '[[rule]]\nname = "drafts accepted"\ncheck = "serving.acceptance_rate >= 0.75"\n'


def _event(**fields: object) -> bytes:
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """A clean 4-rank log, and the SA_PROFILE fragment of its server: one request per 5 steps, in the order they end."""
    scenario = Scenario(SHAPE, [])
    log = tmp_path_factory.mktemp("job") / "server.log"
    write_log(scenario, scenario.run(), log)
    roots = read_strace_log(log).spans.filter(pc.equal(pc.field("depth"), 0)).to_pandas()
    steps = roots.assign(end=roots["ts_ns"] + roots["dur_ns"]).groupby("step").agg(start=("ts_ns", "min"), end=("end", "max"))
    lines = [_event(ph="M", name="process_name", pid=SERVER_PID, tid=0, args={"name": "server"})]
    for k in range(SHAPE.steps // REQUEST_STEPS):
        first, last = steps.loc[k * REQUEST_STEPS], steps.loc[(k + 1) * REQUEST_STEPS - 1]
        ts, end = int(first["start"]) // 1000, int(last["end"]) // 1000 + 1
        args = {"request_id": k, "output_tokens": REQUEST_STEPS, "draft_tokens": 5, "accepted_draft_tokens": 0 if k == BAD_REQUEST else 4}
        lines.append(_event(name="scheduler.step", cat="scheduler", ph="X", ts=ts, dur=10, pid=SERVER_PID, tid=1, args={}))
        lines.append(_event(name="request", cat="request", ph="X", ts=ts, dur=end - ts, pid=SERVER_PID, tid=1, args=args))
        if k == 3:
            lines.append(b'{"name":"request","cat":"request","ph":"X","ts":12,"du\n')  # a line torn by a crash: bad_json
    return log.read_bytes(), b"".join(lines)


def _pieces(data: bytes, seed: int, count: int) -> list[bytes]:
    """``data`` cut at ``count - 1`` random bytes (mid-line)."""
    cuts = sorted(random.Random(seed).sample(range(1, len(data)), count - 1))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


def _in_file_order(tables: list[pa.Table]) -> pa.Table:
    rows = concat_spans(tables).cast(SPAN_SCHEMA)
    return rows.sort_by([("file", "ascending"), ("line", "ascending")])


def test_fragment_rows_equal_a_whole_read_with_torn_lines_and_a_new_fragment(tmp_path, job):
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    first, second = fragments / artifacts.fragment_name(7), fragments / artifacts.fragment_name(11)
    torn_end = job[1] + b'{"name":"request","cat":"req'  # the file ends inside a line: it waits, then counts as analyze counts it
    later = _pieces(job[1], seed=2, count=15)
    follower, tables = FragmentFollower(fragments, list_interval_s=0), []  # the directory listed on every poll
    for i, piece in enumerate(_pieces(torn_end, seed=1, count=25)):
        _append(first, piece)
        if i >= 10:  # a fragment that appears mid-watch
            _append(second, later[i - 10])
        tables.append(follower.poll().spans)
    assert follower.counts.dropped == {"bad_json": 2}  # each fragment's line torn by a crash; the one at the end waits
    tables.append(follower.finish().spans)
    whole = read_sa_profile(fragments)
    assert _in_file_order(tables).equals(_in_file_order([whole.spans])) and whole.spans.num_rows
    assert (follower.counts.records_read, follower.counts.dropped) == (whole.records_read, whole.dropped)
    assert whole.dropped == {"bad_json": 3} and follower.counts.process_names == whole.process_names


def test_a_fragments_directory_is_listed_once_an_interval_and_its_open_fragments_every_poll(tmp_path, job):
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    first, second = fragments / artifacts.fragment_name(7), fragments / artifacts.fragment_name(11)
    lines = job[1].splitlines(keepends=True)[1:]  # request spans (the first line names the process)
    _append(first, lines[0])
    follower = FragmentFollower(fragments, list_interval_s=3600)
    assert follower.poll().spans.num_rows == 1
    _append(first, lines[1])
    _append(second, lines[2])
    assert follower.poll().spans.num_rows == 1  # the open fragment's new line; the new fragment waits for the next listing
    assert follower.finish().spans.num_rows == 1  # the end lists the directory whatever the interval: its line


def test_fragment_line_numbers_and_an_overlong_line_as_a_whole_read(tmp_path, job):
    fragment = tmp_path / artifacts.fragment_name(3)
    data = job[1][:2000] + b'{"name":"' + b"x" * 3000 + b'"}\n' + job[1][2000:]
    limits = JsonLimits(max_event_bytes=1024)
    follower, tables = FragmentFollower(fragment, limits), []
    for piece in _pieces(data, seed=2, count=40):
        _append(fragment, piece)
        tables.append(follower.poll().spans)
    tables.append(follower.finish().spans)
    whole = read_sa_profile(fragment, limits=limits)
    assert _in_file_order(tables).equals(whole.spans) and whole.spans.num_rows
    assert follower.counts.dropped == whole.dropped and whole.dropped["overlong_line"] >= 1


@pytest.mark.parametrize("how", ["recreated", "truncated", "rewritten longer"])
def test_a_fragment_written_again_is_read_again_from_its_start(tmp_path, job, how):
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    fragment = fragments / artifacts.fragment_name(7)
    fragment.write_bytes(job[1])
    follower = FragmentFollower(fragments)
    follower.poll()
    shorter = job[1][: job[1].index(b"\n", len(job[1]) // 3) + 1]
    if how == "rewritten longer":  # in place, on the same inode, past what was read: only its first bytes tell
        shorter = job[1].replace(b'"pid":4242', b'"pid":4343') + shorter
    if how == "recreated":  # a new main process removes the stale fragment; its pid's fragment is made again
        fragment.unlink()
    with fragment.open("r+b" if how == "truncated" else "wb") as handle:
        handle.truncate(0)
        handle.write(shorter)
    again = follower.poll().spans
    (tmp_path / "shorter.jsonl").write_bytes(shorter)
    whole = read_sa_profile(tmp_path / "shorter.jsonl")
    assert again.drop_columns(["file"]).equals(whole.spans.drop_columns(["file"]))
    assert how == "recreated" or any("read again from its start" in note for note in follower.counts.notes)
    assert follower.finish().spans.num_rows == 0


def test_serving_rows_stay_within_their_cap_and_the_window(job, tmp_path):
    fragment = tmp_path / artifacts.fragment_name(1)
    fragment.write_bytes(job[1])
    requests = read_sa_profile(fragment).spans
    held = ServingRows(cap=3)
    for i in range(requests.num_rows):
        held.add(requests.slice(i, 1))
        assert held.rows <= 3
    served = requests.filter(pc.equal(requests["cat"], "request"))
    ends = pc.add(served["ts_ns"], served["dur_ns"]).to_pylist()  # in the order written: the order they ended
    kept = held.take(ends[-2], 2**62)  # requests 10 and 11 end at or after the window's start; 9 ended before it
    assert kept["line"].to_pylist() == served["line"].to_pylist()[-2:]
    assert held.rows == 2


def _job_dir(tmp_path: Path) -> tuple[Path, Path, Path]:
    run = tmp_path / "run"
    fragments = run / artifacts.SERVING_TRACE_DIR / artifacts.FRAGMENTS_DIR
    fragments.mkdir(parents=True)
    log, fragment = run / artifacts.SERVER_LOG, fragments / artifacts.fragment_name(SERVER_PID)
    log.touch()
    return run, log, fragment


def _windows(live: LiveAnalysis, job: tuple[bytes, bytes], log: Path, fragment: Path, count: int = 24):
    """Append the log and the fragment in pieces side by side, polling after each; each window's Trace and summary."""
    for log_piece, fragment_piece in zip(_pieces(job[0], 3, count), _pieces(job[1], 4, count), strict=True):
        _append(log, log_piece)
        _append(fragment, fragment_piece)
        live.poll()
        trace = live.window_trace()
        if trace is not None:
            result = analyze_trace(trace, threshold_ms=live.threshold_ms)
            yield trace, result.summary
            result.engine.close()


def _serving_of(requests: list[dict]) -> dict:
    """The serving figures ``analyze`` computes from these request spans (read whole), as the summary holds them."""
    engine = open_engine(Trace(spans=pa.Table.from_pylist(requests, SPAN_SCHEMA)))
    try:
        return dict(serving_figures(engine, Trace()))
    finally:
        engine.close()


@pytest.mark.slow
def test_window_serving_figures_are_those_of_its_requests_read_whole_and_alerts_use_them(tmp_path, job):
    run, log, fragment = _job_dir(tmp_path)
    (tmp_path / "rules.toml").write_text(RULES)
    live = LiveAnalysis([run], tmp_path / "spans", window=15)
    alerts, shown, below = Alerts(tmp_path / "rules.toml", None), [], []
    for trace, summary in _windows(live, job, log, fragment):
        steps = trace.spans.to_pandas().query("source == 'strace' and step.notna() and clk != 'dev'")
        start, end = steps["ts_ns"].min(), (steps["ts_ns"] + steps["dur_ns"]).max()  # the window's decode steps
        (tmp_path / "so-far.jsonl").write_bytes(fragment.read_bytes()[: fragment.read_bytes().rindex(b"\n") + 1])
        whole = read_sa_profile(tmp_path / "so-far.jsonl").spans.to_pylist()
        overlapping = [r for r in whole if r["cat"] == "request" and r["ts_ns"] <= end and r["ts_ns"] + r["dur_ns"] >= start]
        assert summary["serving"] == _serving_of(overlapping)
        shown.append(summary["serving"]["requests"])
        view = format_live_view(summary, bytes_read=live.bytes_read)
        assert ("serving    requests" in view) == (summary["serving"]["requests"] is not None)
        assert live.serving.rows <= SHAPE.steps // REQUEST_STEPS
        window = (int(steps["step"].min()), int(steps["step"].max()))
        for line in alerts.check(summary, window):
            if "null" not in line:  # a window no request has ended in yet has no rate: there the rule fails as missing
                below.append((window, summary["serving"]["acceptance_rate"]))
    live.abort()
    assert any(shown) and max(n or 0 for n in shown) <= 5  # 15 steps overlap 3 to 5 requests (steps overlap), never all 12
    bad = range(BAD_REQUEST * REQUEST_STEPS, (BAD_REQUEST + 1) * REQUEST_STEPS)
    assert below and all(rate < 0.75 and first <= bad[-1] and last >= bad[0] for (first, last), rate in below), below


@pytest.mark.slow
def test_final_summary_with_fragments_equals_analyze(tmp_path, job):
    run, log, fragment = _job_dir(tmp_path)
    live = LiveAnalysis([run], tmp_path / "spans", window=15)
    for _ in _windows(live, job, log, fragment, count=8):
        pass
    watched = finish_watch(live, tmp_path / "watch-out", WatchOptions(), keep_dataset=False)
    watched.result.engine.close()
    reference = analyze_paths([run], tmp_path / "analyze-out")
    reference.result.engine.close()
    got, want = ((tmp_path / d / artifacts.SUMMARY_JSON).read_bytes() for d in ("watch-out", "analyze-out"))
    assert got == want
    assert json.loads(want)["serving"]["requests"] == SHAPE.steps // REQUEST_STEPS  # the fragment's rows once, not twice
