"""What the recorders write, the readers return exactly.

The recorders (dsprof.profiler) and the readers (dsprof.analysis.ingest) are
separate code; these tests run real forked writers and compare the span table
with what each writer recorded: names, attributes (the SPEC vocabulary in its
typed columns, host evidence included), ids (64-bit ``inv`` above 2**63
included), depths, clocks and timestamps. The Arrow tables are read through
pandas here only to compare them row by row.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from dsprof.analysis.ingest import read_paths
from dsprof.analysis.store.spans import SPAN_COLUMNS
from dsprof.profiler import sa_profile, strace
from dsprof.profiler.strace_format import MAX_VALUE_CHARS, PIPE_BUF, encode_value

HID = "9f3ab2c4d5e6f708"
RANKS = 4
RUNS = 30
ODD_TEXT = "moe dispatch [a=b] 50% \t naïve"
LONG_TEXT = "L" * 1000


def attrs_of(row) -> dict[str, str]:
    return dict(row["attrs"])


def table(arrow):
    """An Arrow table of the reader as a DataFrame, for row-by-row comparisons."""
    return arrow.to_pandas()


def drain(read_fd: int) -> bytes:
    chunks = []
    with os.fdopen(read_fd, "rb") as pipe:
        while data := pipe.read(65536):
            chunks.append(data)
    return b"".join(chunks)


def wait_all(pids: list[int]) -> None:
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


def _rank_process(rank: int, log_fd: int, truth_path: str) -> None:
    """One forked rank: STRACE spans and explicit records to the shared log, its truth to a JSON file."""
    strace.chip_process_ready(f"cpu:{rank}")
    runs = []
    for run in range(RUNS):
        inv = strace.new_invocation() if run % 2 else (1 << 63) + rank * 1000 + run  # some ids above 2**63
        before = time.monotonic_ns()
        with strace.span("chip.run", inv=inv, hid=HID, rank=rank, run=run, note=ODD_TEXT) as root:
            with strace.span("chip.run.bind", inv=inv, hid=HID):
                with strace.span("chip.run.bind.args", inv=inv, hid=HID, long=LONG_TEXT):
                    pass
            strace.record(
                "chip.run.runner_run.device_wall",
                inv=inv,
                hid=HID,
                depth=2,
                ts_ns=run * 10_000,
                dur_ns=5_000 + rank,
                clk="dev",
                phase=ODD_TEXT,
            )
            strace.record("chip.run.runner_run", inv=inv, hid=HID, depth=1, ts_ns=before, dur_ns=1234 + run, slot_id=run % 2)
            root.set(step=run)
        after = time.monotonic_ns()
        os.write(log_fd, f"INFO worker rank {rank}: unrelated log text for run {run}\n".encode())
        runs.append({"inv": str(inv), "before": before, "after": after})
    with open(truth_path, "w") as out:
        json.dump({"pid": os.getpid(), "runs": runs}, out)


def test_strace_from_forked_ranks_sharing_one_stderr(tmp_path):
    read_fd, write_fd = os.pipe()
    strace.set_host_evidence(True)
    strace.enable(write_fd, gc_spans=False)
    try:
        parent_inv = 2**64 - 7
        strace.record("ext.launcher.start", inv=parent_inv, hid="0", depth=0, ts_ns=42, dur_ns=7, who="launcher")
        pids = []
        for rank in range(RANKS):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.close(read_fd)
                    _rank_process(rank, write_fd, str(tmp_path / f"truth.{rank}.json"))
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
    finally:
        strace.disable()
        os.close(write_fd)
    log = tmp_path / "server.log"
    log.write_bytes(drain(read_fd))
    wait_all(pids)

    trace = read_paths([log])
    assert trace.dropped == {}
    spans = table(trace.spans)
    assert len(spans) == 1 + RANKS * RUNS * 5
    assert set(spans.columns) == set(SPAN_COLUMNS)

    launcher = spans[spans["name"] == "ext.launcher.start"].iloc[0]
    assert (launcher["pid"], launcher["inv"], launcher["hid"], launcher["depth"], launcher["ts_ns"], launcher["dur_ns"]) == (
        os.getpid(),
        2**64 - 7,
        "0",
        0,
        42,
        7,
    )
    assert attrs_of(launcher) == {"who": "launcher"}

    anchors, chips = table(trace.anchors), table(trace.chip_devices)
    assert sorted(anchors["pid"]) == sorted([os.getpid(), *pids])
    assert dict(zip(chips["pid"], chips["device"], strict=True)) == {pid: f"cpu:{rank}" for rank, pid in enumerate(pids)}

    for rank, pid in enumerate(pids):
        truth = json.loads((tmp_path / f"truth.{rank}.json").read_text())
        assert truth["pid"] == pid
        mine = spans[spans["pid"] == pid]
        assert set(mine["tid"]) == {pid}  # the child's main thread
        assert len(mine) == RUNS * 5
        anchor = anchors[anchors["pid"] == pid].iloc[0]
        assert anchor["mono_ns"] <= truth["runs"][0]["after"]
        for run, expected in enumerate(truth["runs"]):
            inv = int(expected["inv"])
            rows = mine[mine["inv"] == inv]
            by_name = {row["name"]: row for _, row in rows.iterrows()}
            assert sorted(by_name) == sorted(
                ["chip.run", "chip.run.bind", "chip.run.bind.args", "chip.run.runner_run", "chip.run.runner_run.device_wall"]
            )
            root, bind, args = by_name["chip.run"], by_name["chip.run.bind"], by_name["chip.run.bind.args"]
            assert [root["depth"], bind["depth"], args["depth"]] == [0, 1, 2]
            assert set(rows["hid"]) == {HID}
            assert expected["before"] <= root["ts_ns"] <= bind["ts_ns"] <= args["ts_ns"]
            assert args["ts_ns"] + args["dur_ns"] <= bind["ts_ns"] + bind["dur_ns"] <= root["ts_ns"] + root["dur_ns"] <= expected["after"]
            # rank and step are SPEC vocabulary: typed columns, not attrs
            assert (root["rank"], root["step"]) == (rank, run)
            assert attrs_of(root) == {"run": str(run), "note": ODD_TEXT}
            assert attrs_of(args) == {"long": "L" * (MAX_VALUE_CHARS - 1) + "~"}
            # host evidence of the spans the emitter timed itself, in its typed columns
            for row in (root, bind, args):
                assert 0 <= row["os_cpu_ns"] <= row["dur_ns"] + 1_000_000 and row["os_rq_ns"] >= 0
                assert row["os_nivcsw"] >= 0 and row["os_majflt"] >= 0
            assert root["clk"] == bind["clk"] == "host"
            device = by_name["chip.run.runner_run.device_wall"]
            assert (device["clk"], device["depth"], device["ts_ns"], device["dur_ns"]) == ("dev", 2, run * 10_000, 5_000 + rank)
            assert attrs_of(device) == {"phase": ODD_TEXT}
            runner = by_name["chip.run.runner_run"]
            assert (runner["clk"], runner["depth"], runner["ts_ns"], runner["dur_ns"]) == ("host", 1, expected["before"], 1234 + run)
            assert runner["slot_id"] == run % 2 and attrs_of(runner) == {}
        assert (mine["inv"] > 2**63).any()


@pytest.fixture
def sa_off(monkeypatch):
    monkeypatch.delenv(sa_profile.ENV_OUTPUT, raising=False)
    monkeypatch.delenv(sa_profile.ENV_LEVEL, raising=False)
    yield
    sa_profile.shutdown()
    sa_profile.configure(None)


def _sa_rank(rank: int) -> None:
    sa_profile.set_process_name(f"rank{rank}")
    sa_profile.set_thread_name("worker-main")
    for step in range(RUNS):
        with sa_profile.span(
            "worker.execute_model", "worker", rank=rank, step=step, label='naïve "quoted"', big=2**70, nested={"a": [1, 2]}, ratio=0.5
        ):
            with sa_profile.span("kernel.decode_fwd", "kernel", layer=step % 3):
                pass
        sa_profile.instant("token", "serving", step=step)
        sa_profile.complete("executor.phase", "executor", 1_000_000 + step * 100 + rank, 50 + step, tid=rank + 1, step=step)
    sa_profile.flush()


def test_sa_profile_from_forked_processes(tmp_path, sa_off):
    output = tmp_path / "serving-trace"
    sa_profile.configure(output, "verbose", main=True, flush_every=16)
    sa_profile.set_process_name("main")
    before_us = time.perf_counter_ns() // 1000
    pids = []
    for rank in range(RANKS):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _sa_rank(rank)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    wait_all(pids)
    after_us = time.perf_counter_ns() // 1000
    merge = sa_profile.merge_fragments(output)
    assert (merge.fragments, merge.skipped_lines) == (RANKS + 1, 0)

    from_merge = read_paths([output])  # reads trace.json
    from_fragments = read_paths([output / "fragments"])
    for trace in (from_merge, from_fragments):
        assert trace.dropped == {}
        spans = table(trace.spans)
        assert len(spans) == RANKS * RUNS * 4
        assert set(spans["source"]) == {"sa_profile"}
        assert trace.process_names == {os.getpid(): "main", **{pid: f"rank{rank}" for rank, pid in enumerate(pids)}}
        for rank, pid in enumerate(pids):
            mine = spans[spans["pid"] == pid]
            execute = mine[mine["name"] == "worker.execute_model"].sort_values("ts_ns")
            kernel = mine[mine["name"] == "kernel.decode_fwd"].sort_values("ts_ns")
            token = mine[mine["name"] == "token"].sort_values("ts_ns")
            phase = mine[mine["name"] == "executor.phase"]
            assert len(execute) == len(kernel) == len(token) == len(phase) == RUNS
            assert set(execute["tid"]) == {pid} and set(execute["cat"]) == {"worker"} and set(execute["ph"]) == {"X"}
            assert list(execute["rank"]) == [rank] * RUNS and list(execute["step"]) == list(range(RUNS))
            assert [attrs_of(r) for _, r in execute.iterrows()] == [
                {
                    "label": 'naïve "quoted"',
                    "big": str(2**70),
                    "nested": '{"a":[1,2]}',
                    "ratio": "0.5",
                }
                for step in range(RUNS)
            ]
            assert (execute["ts_ns"] % 1000 == 0).all() and (execute["ts_ns"] >= before_us * 1000).all()
            assert ((execute["ts_ns"] + execute["dur_ns"]) <= after_us * 1000).all()
            # kernel spans nest inside their execute span on the same µs clock
            assert (kernel["ts_ns"].to_numpy() >= execute["ts_ns"].to_numpy()).all()
            assert ((kernel["ts_ns"] + kernel["dur_ns"]).to_numpy() <= (execute["ts_ns"] + execute["dur_ns"]).to_numpy()).all()
            assert set(token["ph"]) == {"i"} and set(token["dur_ns"]) == {0}
            assert sorted((r["ts_ns"], r["dur_ns"], r["tid"], r["step"]) for _, r in phase.iterrows()) == sorted(
                ((1_000_000 + step * 100 + rank) * 1000, (50 + step) * 1000, rank + 1, step) for step in range(RUNS)
            )

    def comparable(trace):
        return table(trace.spans).drop(columns=["file", "line", "attrs"]).sort_values(["pid", "ts_ns", "name"]).reset_index(drop=True)

    assert comparable(from_merge).equals(comparable(from_fragments))


def test_both_recorders_share_the_host_clock(tmp_path, sa_off):
    """An SA_PROFILE span wrapping a STRACE span in one process contains it on the merged axis."""
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    sa_profile.configure(artifact / "serving-trace", "e2e", main=True)
    fd = os.open(artifact / "server.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    strace.enable(fd, gc_spans=False)
    try:
        for step in range(5):
            with sa_profile.span("scheduler.step", "scheduler", step=step):
                inv = strace.new_invocation()
                with strace.span("chip.run", inv=inv, hid=HID, step=step):
                    time.sleep(0.001)
    finally:
        strace.disable()
        os.close(fd)
    sa_profile.merge_fragments(artifact / "serving-trace")
    trace = read_paths([artifact])
    spans = table(trace.spans)
    serving = spans[spans["source"] == "sa_profile"].sort_values("ts_ns").reset_index(drop=True)
    host = spans[spans["source"] == "strace"].sort_values("ts_ns").reset_index(drop=True)
    assert len(serving) == len(host) == 5
    assert list(serving["pid"]) == list(host["pid"]) == [os.getpid()] * 5
    assert (serving["ts_ns"] <= host["ts_ns"]).all()
    # SA_PROFILE ends are floored to whole µs, so allow under 1 µs at the end
    assert ((host["ts_ns"] + host["dur_ns"]) < (serving["ts_ns"] + serving["dur_ns"] + 1000)).all()
    assert list(host["step"]) == list(range(5))


def test_strace_truncated_and_escaped_records(tmp_path):
    """A record trimmed to PIPE_BUF comes back with its leading attributes intact and ``trunc=1``."""
    log = tmp_path / "server.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    strace.enable(fd, gc_spans=False)
    values = {f"k{i}": f"value {i} ü" + "v" * 150 for i in range(40)}  # ~6.5 KB of attributes
    try:
        strace.record("odd name=[x]", inv=2**63 + 1, hid="ab cd", depth=0, ts_ns=100, dur_ns=200, clk="dev", **values)
    finally:
        strace.disable()
        os.close(fd)
    raw_record = log.read_bytes().splitlines()[-1]
    assert len(raw_record) + 1 <= PIPE_BUF
    trace = read_paths([log])
    assert trace.dropped == {}
    row = table(trace.spans).iloc[0]
    assert (row["name"], row["hid"], row["inv"], row["clk"], row["ts_ns"], row["dur_ns"]) == (
        "odd name=[x]",
        "ab cd",
        2**63 + 1,
        "dev",
        100,
        200,
    )
    attrs = attrs_of(row)
    assert attrs.pop("trunc") == "1"
    kept = len(attrs)
    assert 0 < kept < len(values)
    assert attrs == {f"k{i}": values[f"k{i}"] for i in range(kept)}
    # the next attribute would not have fitted in one atomic write
    next_attr = f" k{kept}={encode_value(values[f'k{kept}'])}".encode()
    assert len(raw_record) + len(next_attr) + 1 > PIPE_BUF
