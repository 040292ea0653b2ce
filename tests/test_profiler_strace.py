"""The STRACE emitter writes exactly the SPEC §2 text, one atomic write per record."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest

from dsprof.profiler import strace
from dsprof.profiler.strace_format import (
    GC,
    HOST_EVIDENCE_ATTRS,
    MAX_VALUE_CHARS,
    PIPE_BUF,
    decode_value,
    format_anchor_record,
    format_chip_ready_payload,
    format_prefix,
    format_strace_payload,
)

LINE_RE = re.compile(r"^\[mono_ns=(\d+)\]\[T0x([0-9a-f]+)\]\[(\w+)\] (\S+): (.*)$")


def parse_line(line: str) -> dict:
    """Split one log line into its prefix fields and payload (test-local, independent of the readers)."""
    match = LINE_RE.match(line)
    assert match, f"not a log record: {line!r}"
    mono, thread_hex, level, func, payload = match.groups()
    out = {"mono_ns": int(mono), "thread": int(thread_hex, 16), "level": level, "func": func, "payload": payload}
    if payload.startswith("[STRACE] "):
        fields = dict(token.split("=", 1) for token in payload[len("[STRACE] ") :].split(" "))
        out["kind"] = "strace"
        out["fields"] = fields
    elif payload.startswith("[CLOCK_ANCHOR] "):
        out["kind"] = "anchor"
        out["fields"] = dict(token.split("=", 1) for token in payload[len("[CLOCK_ANCHOR] ") :].split(" "))
    else:
        out["kind"] = "other"
    return out


@pytest.fixture
def log(tmp_path):
    """Enable the emitter on a fresh file; yields a function returning the parsed lines.

    Without host evidence and gc spans, so that records are exactly what each
    test wrote (both are tested in test_profiler_host_evidence.py).
    """
    path = tmp_path / "server.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    was = strace.host_evidence_enabled()
    strace.set_host_evidence(False)
    strace.enable(fd, gc_spans=False)

    def lines() -> list[str]:
        return path.read_text().splitlines()

    lines.path = path
    yield lines
    strace.disable()
    strace.set_host_evidence(was)
    os.close(fd)


def strace_records(lines: list[str]) -> list[dict]:
    return [p for p in map(parse_line, lines) if p["kind"] == "strace"]


def test_span_line_matches_the_format_functions(log):
    strace.set_host_evidence(True)
    inv = strace.new_invocation()
    with strace.span("chip.run", inv=inv, hid="9f3a", rank=2, device="cpu:2") as sp:
        sp.set(step=7)
    lines = log()
    assert len(lines) == 2
    anchor, rec = parse_line(lines[0]), parse_line(lines[1])
    assert anchor["kind"] == "anchor" and rec["kind"] == "strace"
    f = rec["fields"]
    # the span's own attributes, then the host evidence (SPEC §2.1)
    evidence = {key: int(f[key]) for key in HOST_EVIDENCE_ATTRS}
    expected = format_prefix(rec["mono_ns"], threading.get_ident(), "INFO", strace.SPAN_FUNC) + format_strace_payload(
        pid=os.getpid(),
        tid=threading.get_native_id(),
        inv=inv,
        hid="9f3a",
        depth=0,
        name="chip.run",
        ts_ns=int(f["ts"]),
        dur_ns=int(f["dur"]),
        attrs={"rank": 2, "device": "cpu:2", "step": 7, **evidence},
    )
    assert lines[1] == expected
    a = anchor["fields"]
    # the anchor is a whole record the serving stack's reader accepts: level TIMING, function clock_anchor
    assert lines[0] == format_anchor_record(os.getpid(), int(a["mono_ns"]), int(a["wall_ns"]), threading.get_ident())
    assert (anchor["level"], anchor["func"]) == ("TIMING", "clock_anchor")
    assert anchor["mono_ns"] == int(a["mono_ns"])
    # the record's end (prefix mono_ns) is ts + dur on the monotonic clock
    assert rec["mono_ns"] == int(f["ts"]) + int(f["dur"])


def test_timestamps_are_host_monotonic_and_anchor_maps_to_wall(log):
    before = time.monotonic_ns()
    wall_before = time.time_ns()
    with strace.span("a", inv=1, hid="h"):
        time.sleep(0.002)
    after = time.monotonic_ns()
    anchor, rec = (parse_line(x) for x in log())
    ts, dur = int(rec["fields"]["ts"]), int(rec["fields"]["dur"])
    assert before <= ts and ts + dur <= after and dur >= 2_000_000
    mono, wall = int(anchor["fields"]["mono_ns"]), int(anchor["fields"]["wall_ns"])
    assert before <= mono <= after and wall >= wall_before
    # wall time of the span start from the anchor, within the test's own wall window
    assert wall_before - 1_000_000 <= wall + (ts - mono) <= time.time_ns()


def test_depth_is_thread_local_nesting(log):
    barrier = threading.Barrier(3)

    def work(tag: str) -> None:
        with strace.span(f"{tag}.root", inv=1, hid="h"):
            barrier.wait()
            with strace.span(f"{tag}.child", inv=1, hid="h"):
                with strace.span(f"{tag}.grandchild", inv=1, hid="h"):
                    barrier.wait()
            with strace.span(f"{tag}.child2", inv=1, hid="h"):
                pass

    threads = [threading.Thread(target=work, args=(t,)) for t in ("t0", "t1", "t2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = strace_records(log())
    depths = {r["fields"]["name"]: int(r["fields"]["depth"]) for r in records}
    for tag in ("t0", "t1", "t2"):
        assert depths[f"{tag}.root"] == 0
        assert depths[f"{tag}.child"] == 1
        assert depths[f"{tag}.grandchild"] == 2
        assert depths[f"{tag}.child2"] == 1
    assert len(records) == 12
    assert len({r["fields"]["tid"] for r in records}) == 3
    # one anchor despite three threads racing to write the first record
    assert sum(parse_line(x)["kind"] == "anchor" for x in log()) == 1


def test_exception_leaves_depth_balanced_and_marks_error(log):
    with pytest.raises(KeyError):
        with strace.span("outer", inv=1, hid="h"):
            raise KeyError("x")
    with strace.span("after", inv=1, hid="h"):
        pass
    records = {r["fields"]["name"]: r["fields"] for r in strace_records(log())}
    assert records["outer"]["error"] == "KeyError"
    assert records["after"]["depth"] == "0"


def test_escaping_and_cap_round_trip(log):
    name = "odd name[1]=%x"
    value = "a b\tc\n[d]=e%f"
    long_value = "z" * 1000
    with strace.span(name, inv=1, hid="h", text=value, long=long_value, unicode="héllo wörld"):
        pass
    line = log()[-1]
    rec = parse_line(line)
    f = rec["fields"]
    assert decode_value(f["name"]) == name
    assert decode_value(f["text"]) == value
    assert decode_value(f["unicode"]) == "héllo wörld"
    assert f["long"].endswith("~") and len(f["long"]) == MAX_VALUE_CHARS
    assert f["long"] == "z" * (MAX_VALUE_CHARS - 1) + "~"
    # the only raw spaces are the field separators
    assert "\n" not in line and "\t" not in line


def test_record_fits_pipe_buf_and_keeps_clk_dev(log):
    huge = {f"attr{i}": "é" * 200 for i in range(60)}  # far beyond PIPE_BUF once encoded
    strace.record("chip.run.runner_run.device_wall", inv=5, hid="h", depth=2, ts_ns=10, dur_ns=20, clk="dev", **huge)
    with strace.span("big", inv=5, hid="h", **huge):
        pass
    raw = log.path.read_bytes()
    records = raw.split(b"\n")[1:-1]
    assert len(records) == 2
    for line in records:
        assert len(line) + 1 <= PIPE_BUF
        assert line.endswith(b" trunc=1")
    dev = parse_line(records[0].decode())["fields"]
    assert dev["clk"] == "dev" and dev["ts"] == "10" and dev["dur"] == "20" and dev["depth"] == "2"
    kept = [k for k in dev if k.startswith("attr")]
    assert 0 < len(kept) < 60 and kept == [f"attr{i}" for i in range(len(kept))]


def test_record_explicit_fields_and_tid(log):
    strace.record("chip.run.bind", inv=2**64 - 1, hid="ab", depth=3, ts_ns=123, dur_ns=456, tid=4242, slot_id=1)
    f = strace_records(log())[0]["fields"]
    assert f == {
        "v": "1",
        "pid": str(os.getpid()),
        "tid": "4242",
        "inv": str(2**64 - 1),
        "hid": "ab",
        "depth": "3",
        "name": "chip.run.bind",
        "ts": "123",
        "dur": "456",
        "slot_id": "1",
    }
    assert "clk" not in f


def test_chip_process_ready_line(log):
    strace.chip_process_ready("cpu:3")
    lines = log()
    assert parse_line(lines[0])["kind"] == "anchor"
    assert (
        parse_line(lines[1])["payload"]
        == format_chip_ready_payload(os.getpid(), "cpu:3")
        == f"[chip_process pid={os.getpid()} dev=cpu:3] ready"
    )


def test_disabled_writes_nothing_and_costs_a_shared_noop(tmp_path):
    path = tmp_path / "quiet.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        strace.enable(fd)
        strace.disable()
        assert not strace.is_enabled()
        first = strace.span("a", inv=1, hid="h", x=1)
        assert first is strace.span("b", inv=2, hid="h")
        with first as sp:
            sp.set(y=2)
        assert strace.record("c", inv=1, hid="h", depth=0, ts_ns=0, dur_ns=1) is None
        strace.chip_process_ready("cpu:0")
        strace.emit_clock_anchor()
    finally:
        os.close(fd)
    assert path.read_bytes() == b""


def test_invocation_ids_unique_64bit_and_fresh_after_fork(tmp_path):
    ids = [strace.new_invocation() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(0 <= i < 2**64 for i in ids)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            child_ids = [strace.new_invocation() for _ in range(1000)]
            os.write(write_fd, ",".join(map(str, child_ids)).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    parent_ids_after_fork = [strace.new_invocation() for _ in range(1000)]
    with os.fdopen(read_fd, "rb") as r:
        child_ids = [int(x) for x in r.read().decode().split(",")]
    os.waitpid(pid, 0)
    assert len(set(child_ids)) == 1000
    # the child starts a sequence of its own: no id of the parent, before or after the fork
    assert not set(child_ids) & (set(ids) | set(parent_ids_after_fork))


def test_forked_children_share_one_pipe_without_interleaving(tmp_path):
    """Several forked ranks write big records concurrently to one pipe; every line arrives whole."""
    read_fd, write_fd = os.pipe()
    strace.enable(write_fd, gc_spans=False)
    children = 4
    spans_per_child = 150
    payload = "x" * 250
    try:
        with strace.span("parent.before_fork", inv=1, hid="h"):
            pass
        pids = []
        for rank in range(children):
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(read_fd)
                    strace.chip_process_ready(f"cpu:{rank}")
                    inv = strace.new_invocation()
                    for i in range(spans_per_child):
                        with strace.span("chip.run", inv=inv, hid="h", rank=rank, i=i, a=payload, b=payload, c=payload):
                            with strace.span("chip.run.bind", inv=inv, hid="h", a=payload):
                                pass
                finally:
                    os._exit(0)
            pids.append(pid)
    finally:
        strace.disable()
        os.close(write_fd)
    chunks = []
    with os.fdopen(read_fd, "rb") as r:
        while data := r.read(65536):
            chunks.append(data)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    lines = b"".join(chunks).decode().splitlines()
    parsed = [parse_line(line) for line in lines]  # asserts every line is one whole record
    anchors = [p for p in parsed if p["kind"] == "anchor"]
    assert sorted(int(a["fields"]["pid"]) for a in anchors) == sorted([os.getpid(), *pids])
    records = [p["fields"] for p in parsed if p["kind"] == "strace"]
    assert len(records) == 1 + children * spans_per_child * 2
    for pid in pids:
        mine = [r for r in records if r["pid"] == str(pid)]
        assert len(mine) == spans_per_child * 2
        # the child's own tid (its main thread), never the parent's
        assert {r["tid"] for r in mine} == {str(pid)}
        assert sorted(int(r["i"]) for r in mine if r["name"] == "chip.run") == list(range(spans_per_child))
        assert all(r["a"] == payload for r in mine)
        # each child's anchor comes before its first record
        first_anchor = next(i for i, p in enumerate(parsed) if p["kind"] == "anchor" and p["fields"]["pid"] == str(pid))
        first_record = next(i for i, p in enumerate(parsed) if p["kind"] == "strace" and p["fields"]["pid"] == str(pid))
        assert first_anchor < first_record
    ready = [p["payload"] for p in parsed if p["payload"].startswith("[chip_process")]
    assert sorted(ready) == sorted(f"[chip_process pid={pid} dev=cpu:{rank}] ready" for rank, pid in enumerate(pids))


@pytest.mark.parametrize("switch", ["1", None])
def test_environment_switch_writes_to_stderr(switch):
    code = "from dsprof.profiler import strace\nwith strace.span('chip.run', inv=7, hid='h', rank=0):\n    pass\n"
    env = {k: v for k, v in os.environ.items() if k != "DSPROF_STRACE"}
    if switch is not None:
        env["DSPROF_STRACE"] = switch
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout == ""
    if switch is None:
        assert proc.stderr == ""
        return
    anchor, rec, *collections = (parse_line(line) for line in proc.stderr.splitlines())
    assert anchor["kind"] == "anchor" and anchor["fields"]["pid"] == rec["fields"]["pid"]
    assert (rec["fields"]["name"], rec["fields"]["inv"], rec["fields"]["depth"], rec["fields"]["rank"]) == ("chip.run", "7", "0", "0")
    # the interpreter's own collections at exit, recorded as the switch enables gc spans too
    assert all(r["fields"]["name"] == GC for r in collections)


def test_attribute_kinds_and_cached_keys_match_the_format_functions(log):
    """ints (negative, past the cap), bools, floats, None, odd keys: same text as format_strace_payload, first and cached."""
    attrs = {
        "neg": -42,
        "huge": 7**400,  # 339 digits: capped like any long value
        "flag": True,
        "ratio": 0.25,
        "none": None,
        "odd key": "v w",
        "pct%": "100%",
    }
    for _ in range(2):  # the second record comes from the key/value caches
        strace.record("chip.run.validate", inv=9, hid="beef", depth=1, ts_ns=100, dur_ns=5, **attrs)
        with strace.span("chip.run.validate", inv=9, hid="beef", **attrs):
            pass
    lines = log()[1:]
    assert len(lines) == 4
    for line in lines:
        rec = parse_line(line)
        f = rec["fields"]
        expected = format_prefix(rec["mono_ns"], threading.get_ident(), "INFO", strace.SPAN_FUNC) + format_strace_payload(
            pid=os.getpid(),
            tid=threading.get_native_id(),
            inv=9,
            hid="beef",
            depth=int(f["depth"]),
            name="chip.run.validate",
            ts_ns=int(f["ts"]),
            dur_ns=int(f["dur"]),
            attrs=attrs,
        )
        assert line == expected
    huge = parse_line(lines[0])["fields"]["huge"]
    assert len(huge) == MAX_VALUE_CHARS and huge == str(7**400)[: MAX_VALUE_CHARS - 1] + "~"
    assert parse_line(lines[0])["fields"]["neg"] == "-42"


def test_enabled_flag_follows_enable_and_guarded_idiom_writes_the_same(tmp_path):
    path = tmp_path / "guarded.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        assert strace.TRACER.enabled is False
        with strace.span("x", inv=1, hid="h") if strace.TRACER.enabled else strace.NOOP_SPAN as sp:
            sp.set(a=1)
        strace.enable(fd, gc_spans=False)
        assert strace.TRACER.enabled is True and strace.is_enabled()
        with strace.span("x", inv=1, hid="h", step=3) if strace.TRACER.enabled else strace.NOOP_SPAN as sp:
            sp.set(a=1)
        strace.disable()
        assert strace.TRACER.enabled is False and not strace.is_enabled()
    finally:
        strace.disable()
        os.close(fd)
    anchor, rec = (parse_line(line) for line in path.read_text().splitlines())
    assert anchor["kind"] == "anchor"
    assert (rec["fields"]["name"], rec["fields"]["step"], rec["fields"]["a"], rec["fields"]["depth"]) == ("x", "3", "1", "0")


def test_span_open_across_fork_closes_in_child_with_child_ids(tmp_path):
    """A span opened before fork and closed in the child is the child's record; depth stays balanced there."""
    path = tmp_path / "fork.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    strace.enable(fd, gc_spans=False)
    try:
        with strace.span("warm", inv=1, hid="h"):  # builds the parent's per-thread head before the fork
            pass
        pid = -1
        try:
            with strace.span("outer", inv=1, hid="h"):
                pid = os.fork()
                if pid == 0:
                    with strace.span("child.inner", inv=2, hid="h"):
                        pass
            if pid == 0:  # the child left "outer" too; a sibling now sits at depth 0
                with strace.span("child.after", inv=2, hid="h"):
                    pass
        except BaseException:
            if pid == 0:
                os._exit(1)
            raise
        if pid == 0:
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with strace.span("parent.after", inv=1, hid="h"):
            pass
    finally:
        strace.disable()
        os.close(fd)
    records = {r["fields"]["name"] + "@" + r["fields"]["pid"]: r["fields"] for r in strace_records(path.read_text().splitlines())}
    me, child = str(os.getpid()), str(pid)
    assert set(records) == {
        f"warm@{me}",
        f"outer@{me}",
        f"parent.after@{me}",
        f"child.inner@{child}",
        f"outer@{child}",
        f"child.after@{child}",
    }
    assert records[f"child.inner@{child}"]["depth"] == "1"
    assert records[f"outer@{child}"]["depth"] == "0" and records[f"child.after@{child}"]["depth"] == "0"
    assert records[f"parent.after@{me}"]["depth"] == "0"
    assert {records[k]["tid"] for k in records if k.endswith("@" + child)} == {child}
    assert {records[k]["tid"] for k in records if k.endswith("@" + me)} == {str(threading.get_native_id())}


def test_encoding_caches_stay_bounded_and_output_stays_exact(log):
    """Unboundedly many distinct keys and values (e.g. request ids) never grow the caches past their limit."""
    distinct = strace._ENCODED_CACHE_MAX + 500
    for i in range(distinct):
        strace.record("chip.run", inv=1, hid="h", depth=0, ts_ns=i, dur_ns=1, **{f"k{i}": f"v {i}"})
    assert len(strace.TRACER.key_texts) <= strace._ENCODED_CACHE_MAX
    assert len(strace.TRACER.encoded) <= strace._ENCODED_CACHE_MAX
    lines = log()[1:]
    assert len(lines) == distinct
    for i in (0, distinct - 1):  # one written while the caches filled, one after they were full
        f = parse_line(lines[i])["fields"]
        assert f[f"k{i}"] == "v%20" + str(i) and f["ts"] == str(i)


def test_a_tracer_of_its_own_writes_its_own_records_and_leaves_the_process_tracer_alone(tmp_path):
    """The emitter's state is one Tracer object: a second one has its own fd, anchor, depth and invocation ids."""
    path = tmp_path / "own.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    own = strace.Tracer()
    own.set_host_evidence(False)
    try:
        own.enable(fd, gc_spans=False)
        assert own.enabled and not strace.TRACER.enabled
        with own.span("outer", inv=own.new_invocation(), hid="h"), own.span("inner", inv=7, hid="h", step=2):
            strace.record("elsewhere", inv=1, hid="h", depth=0, ts_ns=1, dur_ns=1)  # the process tracer is off: nothing
        own.record("chip.run", inv=7, hid="h", depth=1, ts_ns=10, dur_ns=5, clk="dev")
    finally:
        own.disable()
        os.close(fd)
    lines = path.read_text().splitlines()
    assert parse_line(lines[0])["kind"] == "anchor"
    records = [parse_line(line)["fields"] for line in lines[1:]]
    assert [(r["name"], r["depth"]) for r in records] == [("inner", "1"), ("outer", "0"), ("chip.run", "1")]
    assert records[0]["step"] == "2" and records[2]["clk"] == "dev"
