"""The STRACE log reader against every messy case SPEC §2 lists, with hand-known answers.

Every case runs on both readers: the compiled scanner and the pure-Python reader.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsprof.analysis.ingest import read_paths, read_strace_log, strace_pieces
from dsprof.analysis.store.spans import MAX_TIME_NS, SPAN_COLUMNS, SPAN_SCHEMA
from dsprof.commands.ingest import format_ingest_report
from dsprof.errors import InputError
from dsprof.profiler.strace_format import (
    encode_value,
    format_anchor_payload,
    format_anchor_record,
    format_chip_ready_payload,
    format_prefix,
    format_strace_payload,
)
from dsprof.testing.strace_readers import READERS, select_reader

PREFIX = format_prefix(5_000_000_123, 0x7F3A2B1C, "INFO", "chip_run")


def payload(**over) -> str:
    fields = {
        "pid": 4242,
        "tid": 4243,
        "inv": 7,
        "hid": "9f3c2a71d04be815",
        "depth": 0,
        "name": "chip.run",
        "ts_ns": 1_000_000,
        "dur_ns": 2_500,
    }
    fields.update(over)
    return format_strace_payload(**fields)


def write(tmp_path: Path, lines: list[str], name: str = "server.log") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(autouse=True, params=READERS)
def reader(request, monkeypatch):
    select_reader(request.param, monkeypatch)
    return request.param


def col(trace, name: str) -> list:
    return trace.spans.column(name).to_pylist()


def row(trace, index: int = 0) -> dict:
    return trace.spans.slice(index, 1).to_pylist()[0]


def attrs_of(trace, index: int = 0) -> dict:
    return dict(row(trace, index)["attrs"])


def test_clean_records_exact_fields(tmp_path):
    path = write(
        tmp_path,
        [
            PREFIX
            + payload(
                inv=2**64 - 1, ts_ns=MAX_TIME_NS - 1, dur_ns=0, attrs={"run_id": 12, "callable": "decode.main+verify+mtp", "note": "x"}
            ),
            payload(pid=1, tid=2, inv=0, depth=3, name="chip.run.validate", ts_ns=5, dur_ns=9),  # no prefix
            "some text before " + payload(pid=9, name="x") + "",
        ],
    )
    trace = read_strace_log(path)
    assert trace.spans.schema.equals(SPAN_SCHEMA) and tuple(trace.spans.column_names) == SPAN_COLUMNS
    assert trace.spans.num_rows == 3 and trace.dropped == {}
    first = row(trace)
    assert (first["source"], first["file"], first["line"]) == ("strace", str(path), 1)
    assert (first["pid"], first["tid"], first["hid"], first["depth"], first["name"]) == (4242, 4243, "9f3c2a71d04be815", 0, "chip.run")
    assert first["inv"] == 2**64 - 1  # exact, not through a float
    assert first["ts_ns"] == MAX_TIME_NS - 1 and first["dur_ns"] == 0
    assert (first["ph"], first["cat"], first["clk"]) == ("X", "", "host")
    assert (first["run_id"], first["callable"]) == (12, "decode.main+verify+mtp")  # promoted to columns
    assert attrs_of(trace) == {"note": "x"}
    assert col(trace, "line") == [1, 2, 3]
    assert col(trace, "ts_ns")[1] == 5 and col(trace, "depth") == [0, 3, 0]
    assert col(trace, "pid") == [4242, 1, 9]
    assert trace.records_read == 3 and trace.lines_read == 3


def test_promoted_attributes_first_integer_wins_rest_stays_in_attrs(tmp_path):
    record = (
        payload(attrs={"rank": "x7", "step": -3}) + " rank=5 rank=6 device=npu%3A1 device=b os.cpu_ns=" + str(10**18) + " os.rq_ns=0012"
    )
    path = write(tmp_path, [PREFIX + record + " os.nivcsw=-" + "9" * 18 + " os.majflt=%31"])
    trace = read_strace_log(path)
    first = row(trace)
    assert (first["rank"], first["step"], first["device"], first["os_rq_ns"], first["os_cpu_ns"]) == (5, -3, "npu:1", 12, None)
    assert (first["os_nivcsw"], first["os_majflt"]) == (-(10**18 - 1), 1)  # 18 digits and a sign; decoded text
    assert first["attrs"] == [("rank", "x7"), ("rank", "6"), ("device", "b"), ("os.cpu_ns", str(10**18))]


def test_two_records_on_one_physical_line(tmp_path):
    a = payload(name="a", attrs={"k": "v"})
    b = payload(name="b", inv=8)
    c = payload(name="c", inv=9)
    path = write(tmp_path, [PREFIX + a + PREFIX + b, PREFIX + b + c + " trailing words"])
    trace = read_strace_log(path)
    assert col(trace, "name") == ["a", "b", "b", "c"]
    assert col(trace, "line") == [1, 1, 2, 2]
    assert attrs_of(trace, 0) == {"k": "v"} and attrs_of(trace, 3) == {}
    assert trace.dropped == {}


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda r: (r[: r.index("ts=") + 5], r[r.index("ts=") + 5 :]), id="inside-number"),
        pytest.param(lambda r: (r[: r.index(" name=")], r[r.index(" name=") :]), id="before-space"),
        pytest.param(lambda r: (r[: r.index(" name=")], r[r.index(" name=") + 1 :]), id="newline-replaces-space"),
        pytest.param(lambda r: (r[:4], r[4:]), id="inside-marker"),
        pytest.param(lambda r: (r[:8], r[8:]), id="after-marker"),
        pytest.param(lambda r: (r[: r.index("run_id") + 3], r[r.index("run_id") + 3 :]), id="inside-attribute"),
    ],
)
def test_record_split_across_lines_is_rejoined(tmp_path, cut):
    record = payload(inv=2**64 - 2, attrs={"run_id": 77, "clk": "host", "k": "v"})
    head, tail = cut(record)
    path = write(tmp_path, ["unrelated start", PREFIX + head, tail, "unrelated end " + PREFIX + payload(name="next")])
    trace = read_strace_log(path)
    assert trace.dropped == {}
    assert col(trace, "name") == ["chip.run", "next"]
    assert col(trace, "line") == [2, 4]
    assert col(trace, "inv")[0] == 2**64 - 2
    assert row(trace)["run_id"] == 77 and attrs_of(trace) == {"k": "v"}


def test_record_split_over_three_lines(tmp_path):
    record = payload(ts_ns=123456789, attrs={"a": "b"})
    i, j = record.index("inv=") + 2, record.index("ts=") + 4
    path = write(tmp_path, [PREFIX + record[:i], record[i:j], record[j:]])
    trace = read_strace_log(path)
    assert trace.dropped == {} and trace.spans.num_rows == 1
    assert col(trace, "ts_ns") == [123456789] and attrs_of(trace) == {"a": "b"}


def test_torn_records_dropped_and_counted(tmp_path):
    record = payload(attrs={"x": 1})
    path = tmp_path / "crash.log"
    # torn mid-record, then the next process's line; and torn at end of file without newline
    path.write_text(PREFIX + record[:50] + "\n" + PREFIX + payload(name="ok") + "\n" + PREFIX + record[: record.index("dur=") + 2])
    trace = read_strace_log(path)
    assert col(trace, "name") == ["ok"]
    assert trace.dropped == {"torn_record": 2}
    assert trace.records_read == 3


def test_torn_record_followed_by_record_on_same_line(tmp_path):
    path = write(tmp_path, [PREFIX + payload()[:60] + PREFIX + payload(name="whole")])
    trace = read_strace_log(path)
    assert col(trace, "name") == ["whole"] and trace.dropped == {"torn_record": 1}


def test_interleaved_text_is_ignored_not_dropped(tmp_path):
    lines = ["Traceback (most recent call last):", "  File x, line 3", PREFIX + "plain log message k=v", "", "[not a marker] STRACE v=1"]
    path = write(tmp_path, lines + [PREFIX + payload()] + lines)
    trace = read_strace_log(path)
    assert col(trace, "line") == [6]
    assert trace.dropped == {}
    assert trace.lines_read == 11


def test_unknown_versions_skipped_and_counted(tmp_path):
    v2_same_layout = payload().replace("v=1", "v=2", 1)
    v3_other_layout = "[STRACE] v=3 span=chip.run start=1 end=2"
    path = write(tmp_path, [PREFIX + v2_same_layout, PREFIX + v3_other_layout, PREFIX + payload(name="v1")])
    trace = read_strace_log(path)
    assert col(trace, "name") == ["v1"]
    assert trace.dropped == {"unknown_version": 2}


def test_percent_encoded_names_keys_and_values(tmp_path):
    name = "ext.prod.odd name[1]=%"
    attrs = {"path": "/a b/c", "eq=key": "x=y", "ctl": "tab\there\nnl", "brackets": "[x]", "capped": "v" * 400}
    path = write(tmp_path, [PREFIX + payload(name=name, hid=encode_value("a b"), attrs=attrs)])
    trace = read_strace_log(path)
    assert col(trace, "name") == [name]
    assert col(trace, "hid") == ["a b"]
    got = attrs_of(trace)
    assert {k: got[k] for k in ("path", "eq=key", "ctl", "brackets")} == {k: attrs[k] for k in ("path", "eq=key", "ctl", "brackets")}
    assert got["capped"].endswith("~") and got["capped"][:-1] == "v" * (len(got["capped"]) - 1)


def test_clk_dev_goes_to_clk_column_not_attrs(tmp_path):
    path = write(
        tmp_path,
        [
            PREFIX + payload(name="chip.run.runner_run.device_wall", depth=2, attrs={"clk": "dev", "phase": "attn"}),
            PREFIX + payload(name="host", attrs={"clk": "host"}),
        ],
    )
    trace = read_strace_log(path)
    assert col(trace, "clk") == ["dev", "host"]
    assert attrs_of(trace, 0) == {"phase": "attn"} and attrs_of(trace, 1) == {}


def test_unknown_trailing_attributes_kept(tmp_path):
    path = write(tmp_path, [PREFIX + payload(attrs={"future_field": "42", "empty": "", "trunc": 1})])
    assert attrs_of(read_strace_log(path)) == {"future_field": "42", "empty": "", "trunc": "1"}


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (payload().replace("pid=4242", "pid=abc"), "bad_value"),
        (payload().replace(" tid=4243", ""), "missing_field"),
        (payload(inv=2**64 - 1).replace(str(2**64 - 1), str(2**64)), "bad_value"),
        (payload().replace("ts=1000000", "ts=" + str(2**63)), "bad_value"),
        (payload().replace("dur=2500", "dur=25x0"), "bad_value"),
        (payload().replace("ts=1000000", "ts=-" + str(2**63 + 1)), "bad_value"),
        (payload().replace("ts=1000000", "ts=" + "1" * 25), "bad_value"),
        (payload().replace("pid=4242", "pid=" + "9" * 19), "bad_value"),
        (payload().replace("inv=7", "inv=0" + str(2**64)), "bad_value"),
        (payload(ts_ns=-5), "bad_value"),  # a negative start
        (payload(ts_ns=2**62, dur_ns=2**62), "bad_value"),  # ends past int64
        (payload(dur_ns=-1), "negative_duration"),
    ],
)
def test_garbled_required_fields_dropped_with_reason(tmp_path, record, reason):
    path = write(tmp_path, [PREFIX + record, PREFIX + payload(name="good")])
    trace = read_strace_log(path)
    assert col(trace, "name") == ["good"]
    assert trace.dropped == {reason: 1}


def test_int64_extremes_are_kept(tmp_path):
    """Ids and depths keep the whole int64 range; times stop just short of MAX_TIME_NS (SQL adds them)."""
    path = write(
        tmp_path,
        [
            payload(ts_ns=0, dur_ns=MAX_TIME_NS - 1, pid=2**63 - 1, tid=-(2**63)),
            payload(inv=0).replace("inv=0", "inv=" + "0" * 30 + "42"),
            payload(inv=0).replace("inv=0", "inv=" + "0" * 18 + "42") + " " + payload(inv=2**64 - 1, pid=-0, depth=2**63 - 1),
        ],
    )
    trace = read_strace_log(path)
    assert trace.dropped == {}
    assert (row(trace)["ts_ns"], row(trace)["dur_ns"], row(trace)["pid"], row(trace)["tid"]) == (0, MAX_TIME_NS - 1, 2**63 - 1, -(2**63))
    assert col(trace, "inv")[1:] == [42, 42, 2**64 - 1]  # leading zeros, one record on the line or two
    assert row(trace, 3)["depth"] == 2**63 - 1


def test_anchors_and_chip_processes(tmp_path):
    wall = 1_764_470_000_123_456_789  # > 2**53: must stay exact
    path = write(
        tmp_path,
        [
            format_anchor_record(101, 5_000_000_000, wall, 1),
            "text before it " + format_anchor_record(102, 5_000_000_007, wall + 3, 1) + "  ",
            format_prefix(3, 1, "INFO", "chip_process") + format_chip_ready_payload(101, "npu:0"),
            format_prefix(4, 1, "INFO", "chip_process") + format_chip_ready_payload(102, "cpu dev[1]"),
            "[CLOCK_ANCHOR] v=1 pid=103 mono_ns=",  # torn anchor
            format_prefix(5, 1, "INFO", "clock") + format_anchor_payload(105, 9, 10),  # not from the clock_anchor function
            # an anchor followed by a record on one physical line: the anchor does not count (text after it)
            format_anchor_record(104, 9, 10, 1) + PREFIX + payload(pid=104),
        ],
    )
    trace = read_strace_log(path)
    assert trace.anchors.to_pydict() == {"pid": [101, 102], "mono_ns": [5_000_000_000, 5_000_000_007], "wall_ns": [wall, wall + 3]}
    assert col(trace, "pid") == [104]
    assert str(trace.anchors.column("wall_ns").type) == "int64"
    assert trace.chip_devices.to_pydict() == {"pid": [101, 102], "device": ["npu:0", "cpu dev[1]"]}
    assert trace.dropped == {"bad_anchor": 3}
    assert trace.records_read == 1 + 2 + 2 + 3


def test_binary_file_is_an_input_error_naming_file_and_line(tmp_path):
    path = tmp_path / "blob.log"
    path.write_bytes(b"first line\nsecond\n\x00\x01\xff\xfe garbage \x89PNG")
    with pytest.raises(InputError) as info:
        read_strace_log(path)
    assert info.value.path == str(path) and info.value.line == 3


def test_partly_binary_log_reads_what_it_can(tmp_path):
    path = tmp_path / "damaged.log"
    good = (PREFIX + payload(name="kept") + "\n").encode()
    path.write_bytes(good + b"\xff\xfe\x00\x00 crash dump bytes \x80\n" + good)
    trace = read_strace_log(path)
    assert col(trace, "name") == ["kept", "kept"]
    assert col(trace, "line") == [1, 3]


def test_text_log_without_records_is_empty_not_an_error(tmp_path):
    trace = read_strace_log(write(tmp_path, ["just", "text"]))
    assert trace.spans.num_rows == 0 and trace.dropped == {} and trace.lines_read == 2


def test_missing_path_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_paths([tmp_path / "nope.log"])


def test_read_paths_artifact_directory(tmp_path):
    """server.log + serving-trace (merged and fragments: the merge only) + side files."""
    write(tmp_path, [PREFIX + payload(name="host.span")])
    serving = tmp_path / "serving-trace"
    (serving / "fragments").mkdir(parents=True)
    event = {"name": "request", "cat": "request", "ph": "X", "ts": 10, "dur": 5, "pid": 1, "tid": 1, "args": {}}
    (serving / "fragments" / "trace.1.jsonl").write_text(json.dumps(event) + "\n")
    (serving / "trace.json").write_text(json.dumps({"traceEvents": [event]}))
    summary = {"schema": "dsprof.performance_summary/1", "tokens_returned": 8192}
    faults = {
        "schema": "dsprof.faults/1",
        "seed": 3,
        "specs": [],
        "faults": [{"kind": "straggler", "rank": 2, "step": 5, "delay_ms": 12.5}],
    }
    (tmp_path / "performance_summary.json").write_text(json.dumps(summary))
    (tmp_path / "faults.json").write_text(json.dumps(faults))
    trace = read_paths([tmp_path])
    assert sorted(col(trace, "name")) == ["host.span", "request"]
    assert sorted(col(trace, "source")) == ["sa_profile", "strace"]
    assert trace.performance_summary == summary and trace.faults == faults
    assert str(serving / "trace.json") in trace.files
    assert not any(f.endswith(".jsonl") for f in trace.files)
    # without the merge, the fragments are read instead
    (serving / "trace.json").unlink()
    trace = read_paths([tmp_path])
    assert col(trace, "file")[-1].endswith("trace.1.jsonl") and trace.spans.num_rows == 2


def test_read_paths_merges_several_logs(tmp_path):
    a = write(tmp_path, [format_anchor_record(1, 10, 20, 1), payload(pid=1), payload(pid=1)[:30]], "a.log")
    b = write(tmp_path, [format_chip_ready_payload(2, "npu:1"), payload(pid=2), payload(pid=2).replace("v=1", "v=9")], "b.txt")
    trace = read_paths([a, b, tmp_path / "a.log"])  # a path named twice is read once
    assert col(trace, "pid") == [1, 2]
    assert trace.dropped == {"torn_record": 1, "unknown_version": 1}
    assert trace.anchors.num_rows == 1 and trace.chip_devices.column("device").to_pylist() == ["npu:1"]
    assert trace.lines_read == 6 and trace.files == [str(a), str(b)]
    report = format_ingest_report(trace)
    assert "spans kept: 2 (strace 2)" in report
    assert "torn_record: 1" in report and "unknown_version: 1" in report and "dropped: 2" in report


def test_empty_directory_is_an_input_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no dsprof inputs"):
        read_paths([tmp_path / "empty"])


def test_log_read_in_pieces_numbers_lines_across_them_and_reports_progress(tmp_path, monkeypatch):
    lines = []
    for i in range(40):
        lines.append(PREFIX + payload(inv=2**64 - 1 - i, ts_ns=i, attrs={"step": i, "device": "npu:0"}))
        lines.append("unrelated text" if i % 3 else "[x] garbage [STRACE] v=1 pid=1")  # a torn record every third step
    lines.insert(7, format_anchor_record(4242, 10, 20, 1))
    path = write(tmp_path, lines)
    monkeypatch.setattr(strace_pieces, "PIECE_BYTES", 500)  # many pieces
    messages = []
    trace = read_strace_log(path, progress=messages.append)
    assert len(messages) > 10 and messages[-1].startswith(f"{path}: ") and f"{len(lines):,} lines" in messages[-1]
    assert col(trace, "ts_ns") == list(range(40)) and col(trace, "inv") == [2**64 - 1 - i for i in range(40)]
    assert col(trace, "line") == [2 * i + 1 + (2 * i >= 7) for i in range(40)]
    assert col(trace, "step") == list(range(40)) and col(trace, "device") == ["npu:0"] * 40 and col(trace, "attrs") == [[]] * 40
    assert trace.dropped == {"torn_record": 14} and trace.lines_read == len(lines)
    assert trace.anchors.to_pydict() == {"pid": [4242], "mono_ns": [10], "wall_ns": [20]}


def test_log_pieces_still_referred_to_are_never_overwritten(monkeypatch):
    import io

    import numpy as np

    monkeypatch.setattr(strace_pieces, "PIECE_BYTES", 64)
    data = b"".join(f"[{i}] line {i}\n".encode() + (b"  more of it\n" if i % 4 == 0 else b"") for i in range(60))
    held = [np.frombuffer(piece, np.uint8) for piece in strace_pieces.log_pieces(io.BytesIO(data))]  # each keeps its piece alive
    assert b"".join(h.tobytes() for h in held) == data and len(held) > 10
    assert all(h.tobytes().startswith(b"[") and h.tobytes().endswith(b"\n") for h in held)
    texts, buffers = [], set()
    for piece in strace_pieces.log_pieces(io.BytesIO(data)):
        texts.append(bytes(piece))
        buffers.add(id(piece.obj))
        del piece  # nothing refers to it any more: the next piece reuses its buffer
    assert texts == [h.tobytes() for h in held] and len(buffers) == 1
