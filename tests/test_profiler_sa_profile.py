"""The SA_PROFILE recorder: levels, fragments per process, fork/thread/SIGKILL safety, merging."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from dsprof.errors import DsprofError, InputError
from dsprof.profiler import sa_profile as sa
from dsprof.profiler.chrome_json import MERGE_RECORD, NON_FINITE_VALUES, JsonLimits


@pytest.fixture(autouse=True)
def clean_recorder(monkeypatch):
    monkeypatch.delenv(sa.ENV_OUTPUT, raising=False)
    monkeypatch.delenv(sa.ENV_LEVEL, raising=False)
    yield
    sa.shutdown()
    sa.configure(None)


def read_fragment(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def fork_child(body) -> int:
    """Fork, run ``body`` in the child, flush and leave with os._exit (0 on success)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            sa.flush()
            code = 0
        finally:
            os._exit(code)
    return pid


def wait_ok(pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_levels_filter_categories(tmp_path):
    assert sa.configure(tmp_path / "e2e", "e2e")
    assert [sa.enabled(c) for c in ("request", "serving", "scheduler", "worker", "executor", "kernel", "misc")] == [True] * 5 + [False] * 2
    for cat in ("request", "kernel", "misc", "worker"):
        with sa.span(f"s.{cat}", cat):
            pass
    sa.flush()
    names = [e["name"] for e in read_fragment(tmp_path / "e2e" / "fragments" / f"trace.{os.getpid()}.jsonl")]
    assert names == ["s.request", "s.worker"]

    sa.configure(tmp_path / "k", "kernel")
    assert sa.enabled("kernel") and not sa.enabled("request")
    sa.configure(tmp_path / "both", ["e2e", "kernel"])
    assert sa.enabled("kernel") and sa.enabled("request") and not sa.enabled("misc")
    sa.configure(tmp_path / "all", "verbose")
    assert sa.enabled("misc") and sa.enabled("kernel")
    with pytest.raises(DsprofError, match="unknown level 'kernal'"):
        sa.configure(tmp_path / "bad", "e2e,kernal")


def test_environment_switches_recording_on_in_a_new_process(tmp_path):
    output = tmp_path / "run" / "trace.json"
    code = (
        "from dsprof.profiler import sa_profile as sa\n"
        "assert sa.is_active() and sa.enabled('kernel') and not sa.enabled('request')\n"
        "sa.set_process_name('engine')\n"
        "with sa.span('kernel.decode_fwd', 'kernel', layer=3): pass\n"
        "with sa.span('request', 'request'): pass\n"
    )
    env = {**os.environ, sa.ENV_OUTPUT: str(output), sa.ENV_LEVEL: "kernel"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    fragments = list((tmp_path / "run" / "trace.json.fragments").glob("trace.*.jsonl"))
    assert len(fragments) == 1
    events = read_fragment(fragments[0])
    assert [(e["ph"], e["name"]) for e in events] == [("M", "process_name"), ("X", "kernel.decode_fwd")]
    assert events[1]["args"] == {"layer": 3} and events[0]["args"] == {"name": "engine"}
    result = sa.merge_fragments(output)
    assert result.path == output and result.events == 2 and result.fragments == 1


def test_disabled_records_nothing(tmp_path):
    assert sa.configure(None) is False
    assert not sa.enabled("request")
    assert sa.span("a", "request") is sa.span("b", "kernel")
    with sa.span("a", "request") as s:
        s.set(x=1)
    sa.instant("i", "request")
    sa.complete("c", "request", 1, 2)
    sa.set_process_name("p")
    sa.flush()
    assert list(tmp_path.iterdir()) == []


def test_event_shapes_timestamps_and_args(tmp_path):
    sa.configure(tmp_path, "verbose")
    sa.set_process_name("main")
    sa.set_thread_name("scheduler-loop")
    before_us = time.perf_counter_ns() // 1000
    with sa.span("request", "request", rid="r1", big=2**70, obj=object(), nan=float("nan"), nested={"a": [1, 2]}) as outer:
        with sa.span("step", "scheduler"):
            time.sleep(0.001)
            sa.instant("token", "serving", n=1)
        outer.set(tokens=256)
    after_us = time.perf_counter_ns() // 1000
    sa.complete("kernel.decode_fwd", "kernel", 1000, 250, tid=77, layer=1)
    sa.flush()
    events = read_fragment(tmp_path / "fragments" / f"trace.{os.getpid()}.jsonl")
    by_name = {e["name"]: e for e in events}
    pid, tid = os.getpid(), threading.get_native_id()
    assert by_name["process_name"] == {"name": "process_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": "main"}}
    assert by_name["thread_name"]["args"] == {"name": "scheduler-loop"}
    req, step, token = by_name["request"], by_name["step"], by_name["token"]
    assert req["ph"] == "X" and req["cat"] == "request" and req["pid"] == pid and req["tid"] == tid
    assert before_us <= req["ts"] <= step["ts"] <= token["ts"] <= step["ts"] + step["dur"] <= req["ts"] + req["dur"] <= after_us
    assert step["dur"] >= 1000
    assert token["ph"] == "i" and token["s"] == "t" and token["args"] == {"n": 1} and "dur" not in token
    args = req["args"]
    assert args["big"] == 2**70 and isinstance(args["big"], int)
    assert args["obj"].startswith("<object object") and args["nan"] == "nan"
    assert args["nested"] == {"a": [1, 2]} and args["tokens"] == 256 and args["rid"] == "r1"
    kernel = by_name["kernel.decode_fwd"]
    assert (kernel["ts"], kernel["dur"], kernel["tid"], kernel["args"]) == (1000, 250, 77, {"layer": 1})


def test_traced_decorator(tmp_path):
    @sa.traced(cat="worker", worker=1)
    def execute(x):
        return x * 2

    @sa.traced("fails", cat="executor")
    def fails():
        raise RuntimeError("boom")

    assert execute(3) == 6  # not configured yet: plain call, nothing recorded
    sa.configure(tmp_path, "e2e")
    assert execute(4) == 8
    with pytest.raises(RuntimeError):
        fails()
    sa.flush()
    events = read_fragment(tmp_path / "fragments" / f"trace.{os.getpid()}.jsonl")
    assert [(e["name"], e["cat"], e["args"]) for e in events] == [
        ("test_traced_decorator.<locals>.execute", "worker", {"worker": 1}),
        ("fails", "executor", {"error": "RuntimeError"}),
    ]


def test_fork_children_write_own_fragments_without_parent_buffer(tmp_path):
    sa.configure(tmp_path, "e2e", flush_every=10_000, flush_interval_s=3600)
    with sa.span("parent.before_fork", "serving"):
        pass  # buffered, not yet written
    pids = []
    for rank in range(3):

        def body(rank=rank):
            sa.set_process_name(f"rank{rank}")
            for i in range(50):
                with sa.span("worker.step", "worker", rank=rank, i=i):
                    pass

        pids.append(fork_child(body))
    for pid in pids:
        wait_ok(pid)
    with sa.span("parent.after_fork", "serving"):
        pass
    sa.flush()
    fragments = tmp_path / "fragments"
    assert sorted(p.name for p in fragments.iterdir()) == sorted(f"trace.{p}.jsonl" for p in [os.getpid(), *pids])
    parent_events = read_fragment(fragments / f"trace.{os.getpid()}.jsonl")
    assert [e["name"] for e in parent_events] == ["parent.before_fork", "parent.after_fork"]
    for rank, pid in enumerate(pids):
        events = read_fragment(fragments / f"trace.{pid}.jsonl")
        assert events[0] == {"name": "process_name", "ph": "M", "pid": pid, "tid": pid, "args": {"name": f"rank{rank}"}}
        steps = events[1:]
        assert [e["args"] for e in steps] == [{"rank": rank, "i": i} for i in range(50)]
        assert {e["pid"] for e in events} == {pid}
    result = sa.merge_fragments(tmp_path)
    assert (result.events, result.skipped_lines, result.fragments) == (2 + 3 * 51, 0, 4)
    merged = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert sum(e["name"] == "parent.before_fork" for e in merged) == 1


def _mp_worker(rank: int) -> None:
    with sa.span("mp.step", "worker", rank=rank):
        pass


def test_multiprocessing_fork_child_flushes_at_exit(tmp_path):
    sa.configure(tmp_path, "e2e", flush_every=10_000, flush_interval_s=3600)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_mp_worker, args=(rank,)) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    for rank, p in enumerate(procs):
        events = read_fragment(tmp_path / "fragments" / f"trace.{p.pid}.jsonl")
        assert [(e["name"], e["args"]) for e in events] == [("mp.step", {"rank": rank})]


def test_threads_record_concurrently(tmp_path):
    sa.configure(tmp_path, "e2e", flush_every=64)
    threads_n, spans_n = 6, 400
    tids = {}

    def work(t: int) -> None:
        tids[t] = threading.get_native_id()
        sa.set_thread_name(f"worker-{t}")
        for i in range(spans_n):
            with sa.span("worker.step", "worker", t=t, i=i):
                pass

    threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    result = sa.merge_fragments(tmp_path)
    assert result.skipped_lines == 0 and result.events == threads_n * (spans_n + 1)
    events = json.loads(result.path.read_text())["traceEvents"]
    for t in range(threads_n):
        mine = [e for e in events if e["name"] == "worker.step" and e["args"]["t"] == t]
        assert sorted(e["args"]["i"] for e in mine) == list(range(spans_n))
        assert {e["tid"] for e in mine} == {tids[t]}


def test_sigkill_loses_at_most_the_last_unflushed_batch(tmp_path):
    """A child killed after recording 95 events with batches of 10 keeps exactly the 90 flushed ones."""
    sa.configure(tmp_path, "e2e", flush_every=10, flush_interval_s=3600)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            for i in range(95):
                sa.instant("tick", "worker", i=i)
            os.write(ready_w, b"1")
            time.sleep(60)
        finally:
            os._exit(1)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    result = sa.merge_fragments(tmp_path)
    assert (result.events, result.skipped_lines, result.fragments) == (90, 0, 1)
    events = json.loads(result.path.read_text())["traceEvents"]
    assert [e["args"]["i"] for e in events] == list(range(90))


def test_sigkill_mid_recording_never_breaks_merge(tmp_path):
    """Kill a child while it records big events as fast as it can; the merge keeps every whole line."""
    sa.configure(tmp_path, "e2e", flush_every=200, flush_interval_s=3600)
    started_r, started_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(started_r)
            blob = "y" * 3000
            for i in range(400):
                sa.instant("tick", "worker", i=i, blob=blob)
            os.write(started_w, b"1")
            i = 400
            while True:
                sa.instant("tick", "worker", i=i, blob=blob)
                i += 1
        finally:
            os._exit(1)
    os.close(started_w)
    assert os.read(started_r, 1) == b"1"
    os.close(started_r)
    time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    result = sa.merge_fragments(tmp_path)
    assert result.fragments == 1 and result.skipped_lines <= 1
    events = json.loads(result.path.read_text())["traceEvents"]
    indices = [e["args"]["i"] for e in events]
    # whole batches, in order, with no gap
    assert indices == list(range(len(indices))) and len(indices) >= 400


def test_merge_skips_and_counts_torn_and_malformed_lines(tmp_path):
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    good = {"name": "a", "cat": "request", "ph": "X", "ts": 1, "dur": 2, "pid": 11, "tid": 11, "args": {}}
    (fragments / "trace.11.jsonl").write_text(
        json.dumps(good) + "\n" + "not json at all\n" + "[1, 2]\n" + "\n" + json.dumps({**good, "name": "b"}) + "\n" + json.dumps(good)[:30]
    )
    (fragments / "trace.12.jsonl").write_text(json.dumps({**good, "pid": 12}) + "\n")
    (fragments / "unrelated.txt").write_text("ignored\n")
    progress: list[str] = []
    result = sa.merge_fragments(tmp_path, progress=progress.append)
    assert (result.events, result.skipped_lines, result.fragments) == (3, 3, 2)
    merged = json.loads((tmp_path / "trace.json").read_text())
    assert [(e["name"], e["pid"]) for e in merged["traceEvents"]] == [("a", 11), ("b", 11), ("a", 12)]
    assert len(progress) == 2 and "trace.11.jsonl" in progress[0]


def test_merge_of_empty_output_writes_empty_trace(tmp_path):
    result = sa.merge_fragments(tmp_path / "nothing")
    assert (result.events, result.skipped_lines, result.fragments) == (0, 0, 0)
    merged = json.loads(result.path.read_text())
    assert merged["traceEvents"] == [] and merged["otherData"][MERGE_RECORD]["fragments"] == {}


def test_merge_never_replaces_a_trace_with_an_empty_one(tmp_path):
    """Fragments holding only garbage, or no fragments at all: an error, and the old trace.json stays byte for byte."""
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    (fragments / "trace.3.jsonl").write_text('{"name":"a","ph":"X","ts":1,"dur":1,"pid":3,"tid":3,"args":{}}\n')
    sa.merge_fragments(tmp_path)
    good = (tmp_path / "trace.json").read_bytes()
    (fragments / "trace.3.jsonl").write_bytes(b"\x00garbage\n[1, 2]\n{torn")
    with pytest.raises(InputError, match="no fragment line is a JSON event; .*trace.json left as it was") as info:
        sa.merge_fragments(tmp_path)
    assert info.value.path == str(fragments)
    assert (tmp_path / "trace.json").read_bytes() == good
    (fragments / "trace.3.jsonl").unlink()
    with pytest.raises(InputError, match="no SA_PROFILE fragments to merge; .*left as it was"):
        sa.merge_fragments(tmp_path)
    assert (tmp_path / "trace.json").read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fragments", "trace.json"]  # no temporary file left behind


def test_cli_merge_of_garbage_exits_2_with_one_line(tmp_path):
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    (fragments / "trace.8.jsonl").write_text("garbage\n")
    proc = subprocess.run(
        [sys.executable, "-m", "dsprof.cli.main", "merge", str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 2, proc.stderr
    error = proc.stderr.splitlines()[-1]  # after the progress line: one line, no traceback
    assert error == f"dsprof: error: {fragments}: no fragment line is a JSON event (expected one Chrome trace event per line)"
    assert "Traceback" not in proc.stderr and not (tmp_path / "trace.json").exists()


def test_merge_nulls_non_finite_values_and_writes_strict_json(tmp_path):
    """NaN/Infinity (Python's json writes them) never reach trace.json: strict parsers must read it."""
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    lines = [
        '{"name":"a","ph":"X","ts":1,"dur":2,"pid":4,"tid":4,"args":{"loss":NaN,"text":"NaN stays","v":[Infinity,-Infinity]}}',
        '{"name":"b","ph":"X","ts":3,"dur":NaN,"pid":4,"tid":4,"args":{}}',
        json.dumps({"name": "c", "ph": "i", "ts": 5, "pid": 4, "tid": 4, "args": {"x": 1.10}}).replace("1.1", "1.10"),
    ]
    (fragments / "trace.4.jsonl").write_text("\n".join(lines) + "\n")
    result = sa.merge_fragments(tmp_path)
    assert (result.events, result.skipped_lines, result.non_finite_values) == (3, 0, 4)
    text = (tmp_path / "trace.json").read_text()

    def refuse(constant):
        raise ValueError(constant)

    merged = json.loads(text, parse_constant=refuse)  # strict: NaN/Infinity would raise
    events = merged["traceEvents"]
    assert events[0]["args"] == {"loss": None, "text": "NaN stays", "v": [None, None]}
    assert events[1]["dur"] is None
    assert '"x": 1.10' in text or '"x":1.10' in text  # the other lines are copied as they are
    assert merged["otherData"][MERGE_RECORD]["counts"][NON_FINITE_VALUES] == 4


def test_merge_takes_exactly_the_fragments_the_reader_reads(tmp_path):
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    event = {"name": "a", "ph": "X", "ts": 1, "dur": 1, "pid": 1, "tid": 1, "args": {}}
    for name in ("trace.1.jsonl", "trace.x.jsonl", "other.jsonl", "trace.2.jsonl.bak", "trace.2.json"):
        (fragments / name).write_text(json.dumps(event) + "\n")
    result = sa.merge_fragments(tmp_path)
    assert (result.events, result.fragments) == (1, 1)
    record = json.loads((tmp_path / "trace.json").read_text())["otherData"][MERGE_RECORD]
    assert record["fragments"] == {"trace.1.jsonl": (fragments / "trace.1.jsonl").stat().st_size}


def test_merge_counts_by_reason_and_records_them(tmp_path):
    """Skipped lines are counted by reason in the result and in the merge's otherData (readers report them)."""
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    good = json.dumps({"name": "a", "ph": "X", "ts": 1, "dur": 1, "pid": 1, "tid": 1, "args": {}})
    deep = '{"name":"d","args":' + "[" * 100_000 + "]" * 100_000 + "}"
    huge_int = '{"name":"h","ts":' + "9" * 100_000 + "}"
    (fragments / "trace.1.jsonl").write_text("\n".join([good, "torn {", "[1]", deep, huge_int, "x" * 5000, good]) + "\n")
    result = sa.merge_fragments(tmp_path, limits=JsonLimits(max_event_bytes=4096))
    # the deep and huge lines are longer than the 4 KiB limit too: cut before they are parsed
    assert result.dropped == {"bad_json": 1, "not_object": 1, "overlong_line": 3} and result.events == 2
    result = sa.merge_fragments(tmp_path)
    assert result.dropped == {"bad_json": 2, "not_object": 1, "too_deep": 1, "bad_value": 1} and result.skipped_lines == 5
    counts = json.loads((tmp_path / "trace.json").read_text())["otherData"][MERGE_RECORD]["counts"]
    assert counts["events"] == 2 and counts["too_deep"] == 1 and counts["bad_json"] == 2


def test_recycled_pid_fragment_with_torn_tail_keeps_new_events(tmp_path):
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    (fragments / f"trace.{os.getpid()}.jsonl").write_text('{"name":"old","ph":"X","ts":1,"dur":1,"pid":1,"tid":1,"args":{}}\n{"name":"to')
    sa.configure(tmp_path, "e2e")
    with sa.span("new", "request"):
        pass
    result = sa.merge_fragments(tmp_path)
    assert (result.events, result.skipped_lines) == (2, 1)
    assert [e["name"] for e in json.loads(result.path.read_text())["traceEvents"]] == ["old", "new"]


def test_main_process_removes_stale_fragments(tmp_path):
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    (fragments / "trace.999999.jsonl").write_text('{"name":"stale","ph":"i","s":"t","ts":1,"pid":999999,"tid":1,"args":{}}\n')
    (fragments / "notes.txt").write_text("keep me")
    sa.configure(tmp_path, "e2e")  # not the main process: leaves other processes' fragments alone
    assert (fragments / "trace.999999.jsonl").exists()
    sa.configure(tmp_path, "e2e", main=True)
    assert not (fragments / "trace.999999.jsonl").exists() and (fragments / "notes.txt").exists()
    with sa.span("fresh", "request"):
        pass
    result = sa.merge_fragments(tmp_path)
    assert result.events == 1 and result.fragments == 1


def test_json_output_path_layout(tmp_path):
    output = tmp_path / "serving.json"
    sa.configure(output, "e2e")
    sa.instant("x", "request")
    result = sa.merge_fragments(output)
    assert (tmp_path / "serving.json.fragments" / f"trace.{os.getpid()}.jsonl").exists()
    assert result.path == output and json.loads(output.read_text())["traceEvents"][0]["name"] == "x"
