"""The STRACE log reader against every messy case SPEC §2 lists, with hand-known answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsprof.analysis.ingest import format_ingest_report, read_paths, read_strace_log
from dsprof.analysis.spans import SPAN_COLUMNS
from dsprof.errors import InputError
from dsprof.profiler.strace_format import (
    encode_value,
    format_anchor_payload,
    format_chip_ready_payload,
    format_prefix,
    format_strace_payload,
)

PREFIX = format_prefix(5_000_000_123, 0x7F3A2B1C, "INFO", "chip_run")


def payload(**over) -> str:
    fields = dict(pid=4242, tid=4243, inv=7, hid="9f3c2a71d04be815", depth=0, name="chip.run", ts_ns=1_000_000, dur_ns=2_500)
    fields.update(over)
    return format_strace_payload(**fields)


def write(tmp_path: Path, lines: list[str], name: str = "server.log") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def attrs_of(trace, row: int = 0) -> dict:
    return dict(trace.spans["attrs"].iloc[row])


def test_clean_records_exact_fields(tmp_path):
    path = write(
        tmp_path,
        [
            PREFIX + payload(inv=2**64 - 1, ts_ns=2**63 - 1, dur_ns=0, attrs={"run_id": 12, "callable": "decode.main+verify+mtp"}),
            payload(pid=1, tid=2, inv=0, depth=3, name="chip.run.validate", ts_ns=-5, dur_ns=9),  # no prefix
            "some text before " + payload(pid=9, name="x") + "",
        ],
    )
    trace = read_strace_log(path)
    spans = trace.spans
    assert list(spans.columns) == list(SPAN_COLUMNS)
    assert len(spans) == 3 and trace.dropped == {}
    first = spans.iloc[0]
    assert (first["source"], first["file"], first["line"]) == ("strace", str(path), 1)
    assert (first["pid"], first["tid"], first["hid"], first["depth"], first["name"]) == (4242, 4243, "9f3c2a71d04be815", 0, "chip.run")
    assert int(first["inv"]) == 2**64 - 1  # exact, not through a float
    assert int(first["ts_ns"]) == 2**63 - 1 and first["dur_ns"] == 0
    assert (first["ph"], first["cat"], first["clk"]) == ("X", "", "host")
    assert attrs_of(trace) == {"run_id": "12", "callable": "decode.main+verify+mtp"}
    assert spans["line"].tolist() == [1, 2, 3]
    assert spans["ts_ns"].tolist()[1] == -5 and spans["depth"].tolist() == [0, 3, 0]
    assert spans["pid"].tolist() == [4242, 1, 9]
    assert trace.records_read == 3 and trace.extras["lines_read"] == 3


def test_two_records_on_one_physical_line(tmp_path):
    a = payload(name="a", attrs={"k": "v"})
    b = payload(name="b", inv=8)
    c = payload(name="c", inv=9)
    path = write(tmp_path, [PREFIX + a + PREFIX + b, PREFIX + b + c + " trailing words"])
    trace = read_strace_log(path)
    assert trace.spans["name"].tolist() == ["a", "b", "b", "c"]
    assert trace.spans["line"].tolist() == [1, 1, 2, 2]
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
    record = payload(inv=2**64 - 2, attrs={"run_id": 77, "clk": "host"})
    head, tail = cut(record)
    path = write(tmp_path, ["unrelated start", PREFIX + head, tail, "unrelated end " + PREFIX + payload(name="next")])
    trace = read_strace_log(path)
    assert trace.dropped == {}
    assert trace.spans["name"].tolist() == ["chip.run", "next"]
    assert trace.spans["line"].tolist() == [2, 4]
    assert int(trace.spans["inv"].iloc[0]) == 2**64 - 2
    assert attrs_of(trace) == {"run_id": "77"}


def test_record_split_over_three_lines(tmp_path):
    record = payload(ts_ns=123456789, attrs={"a": "b"})
    i, j = record.index("inv=") + 2, record.index("ts=") + 4
    path = write(tmp_path, [PREFIX + record[:i], record[i:j], record[j:]])
    trace = read_strace_log(path)
    assert trace.dropped == {} and len(trace.spans) == 1
    assert trace.spans["ts_ns"].iloc[0] == 123456789 and attrs_of(trace) == {"a": "b"}


def test_torn_records_dropped_and_counted(tmp_path):
    record = payload(attrs={"x": 1})
    path = tmp_path / "crash.log"
    # torn mid-record, then the next process's line; and torn at end of file without newline
    path.write_text(PREFIX + record[:50] + "\n" + PREFIX + payload(name="ok") + "\n" + PREFIX + record[: record.index("dur=") + 2])
    trace = read_strace_log(path)
    assert trace.spans["name"].tolist() == ["ok"]
    assert trace.dropped == {"torn_record": 2}
    assert trace.records_read == 3


def test_torn_record_followed_by_record_on_same_line(tmp_path):
    path = write(tmp_path, [PREFIX + payload()[:60] + PREFIX + payload(name="whole")])
    trace = read_strace_log(path)
    assert trace.spans["name"].tolist() == ["whole"] and trace.dropped == {"torn_record": 1}


def test_interleaved_text_is_ignored_not_dropped(tmp_path):
    lines = ["Traceback (most recent call last):", "  File x, line 3", PREFIX + "plain log message k=v", "", "[not a marker] STRACE v=1"]
    path = write(tmp_path, lines + [PREFIX + payload()] + lines)
    trace = read_strace_log(path)
    assert len(trace.spans) == 1 and trace.spans["line"].iloc[0] == 6
    assert trace.dropped == {}
    assert trace.extras["lines_read"] == 11


def test_unknown_versions_skipped_and_counted(tmp_path):
    v2_same_layout = payload().replace("v=1", "v=2", 1)
    v3_other_layout = "[STRACE] v=3 span=chip.run start=1 end=2"
    path = write(tmp_path, [PREFIX + v2_same_layout, PREFIX + v3_other_layout, PREFIX + payload(name="v1")])
    trace = read_strace_log(path)
    assert trace.spans["name"].tolist() == ["v1"]
    assert trace.dropped == {"unknown_version": 2}


def test_percent_encoded_names_keys_and_values(tmp_path):
    name = "ext.prod.odd name[1]=%"
    attrs = {"path": "/a b/c", "eq=key": "x=y", "ctl": "tab\there\nnl", "brackets": "[x]", "capped": "v" * 400}
    path = write(tmp_path, [PREFIX + payload(name=name, hid=encode_value("a b"), attrs=attrs)])
    trace = read_strace_log(path)
    assert trace.spans["name"].iloc[0] == name
    assert trace.spans["hid"].iloc[0] == "a b"
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
    assert trace.spans["clk"].tolist() == ["dev", "host"]
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
    ],
)
def test_garbled_required_fields_dropped_with_reason(tmp_path, record, reason):
    path = write(tmp_path, [PREFIX + record, PREFIX + payload(name="good")])
    trace = read_strace_log(path)
    assert trace.spans["name"].tolist() == ["good"]
    assert trace.dropped == {reason: 1}


def test_int64_extremes_are_kept(tmp_path):
    path = write(tmp_path, [payload(ts_ns=-(2**63), dur_ns=2**63 - 1, pid=2**63 - 1), payload(inv=0).replace("inv=0", "inv=" + "0" * 30 + "42")])
    trace = read_strace_log(path)
    assert trace.dropped == {}
    assert int(trace.spans["ts_ns"].iloc[0]) == -(2**63) and int(trace.spans["pid"].iloc[0]) == 2**63 - 1
    assert int(trace.spans["inv"].iloc[1]) == 42  # leading zeros, plain path


def test_anchors_and_chip_processes(tmp_path):
    wall = 1_764_470_000_123_456_789  # > 2**53: must stay exact
    path = write(
        tmp_path,
        [
            format_prefix(1, 1, "INFO", "clock") + format_anchor_payload(101, 5_000_000_000, wall),
            format_prefix(2, 1, "INFO", "clock") + format_anchor_payload(102, 5_000_000_007, wall + 3),
            format_prefix(3, 1, "INFO", "chip_process") + format_chip_ready_payload(101, "npu:0"),
            format_prefix(4, 1, "INFO", "chip_process") + format_chip_ready_payload(102, "cpu dev[1]"),
            "[CLOCK_ANCHOR] v=1 pid=103 mono_ns=",  # torn anchor
            # an anchor and a record on one physical line
            format_prefix(5, 1, "INFO", "clock") + format_anchor_payload(104, 9, 10) + PREFIX + payload(pid=104),
        ],
    )
    trace = read_strace_log(path)
    assert trace.anchors.to_dict("list") == {"pid": [101, 102, 104], "mono_ns": [5_000_000_000, 5_000_000_007, 9], "wall_ns": [wall, wall + 3, 10]}
    assert trace.spans["pid"].tolist() == [104]
    assert str(trace.anchors["wall_ns"].dtype) == "int64"
    assert trace.chip_devices["pid"].tolist() == [101, 102]
    assert trace.chip_devices["device"].tolist() == ["npu:0", "cpu dev[1]"]
    assert trace.dropped == {"bad_anchor": 1}


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
    assert trace.spans["name"].tolist() == ["kept", "kept"]
    assert trace.spans["line"].tolist() == [1, 3]


def test_text_log_without_records_is_empty_not_an_error(tmp_path):
    trace = read_strace_log(write(tmp_path, ["just", "text"]))
    assert len(trace.spans) == 0 and trace.dropped == {} and trace.extras["lines_read"] == 2


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
    faults = {"schema": "dsprof.faults/1", "seed": 3, "specs": [], "faults": [{"kind": "straggler", "rank": 2, "step": 5, "delay_ms": 12.5}]}
    (tmp_path / "performance_summary.json").write_text(json.dumps(summary))
    (tmp_path / "faults.json").write_text(json.dumps(faults))
    trace = read_paths([tmp_path])
    assert sorted(trace.spans["name"].tolist()) == ["host.span", "request"]
    assert sorted(trace.spans["source"].tolist()) == ["sa_profile", "strace"]
    assert trace.extras["performance_summary"] == summary and trace.extras["faults"] == faults
    assert str(serving / "trace.json") in trace.files
    assert not any(f.endswith(".jsonl") for f in trace.files)
    # without the merge, the fragments are read instead
    (serving / "trace.json").unlink()
    trace = read_paths([tmp_path])
    assert trace.spans["file"].tolist()[-1].endswith("trace.1.jsonl") and len(trace.spans) == 2


def test_read_paths_merges_several_logs(tmp_path):
    a = write(tmp_path, [format_anchor_payload(1, 10, 20), payload(pid=1), payload(pid=1)[:30]], "a.log")
    b = write(tmp_path, [format_chip_ready_payload(2, "npu:1"), payload(pid=2), payload(pid=2).replace("v=1", "v=9")], "b.txt")
    trace = read_paths([a, b, tmp_path / "a.log"])  # a path named twice is read once
    assert trace.spans["pid"].tolist() == [1, 2]
    assert trace.dropped == {"torn_record": 1, "unknown_version": 1}
    assert len(trace.anchors) == 1 and trace.chip_devices["device"].tolist() == ["npu:1"]
    assert trace.extras["lines_read"] == 6 and trace.files == [str(a), str(b)]
    report = format_ingest_report(trace)
    assert "spans kept: 2 (strace 2)" in report
    assert "torn_record: 1" in report and "unknown_version: 1" in report and "dropped: 2" in report


def test_empty_directory_is_an_input_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no dsprof inputs"):
        read_paths([tmp_path / "empty"])


def test_log_read_in_pieces_numbers_lines_across_them_and_reports_progress(tmp_path, monkeypatch):
    from dsprof.analysis.ingest import strace_log

    lines = []
    for i in range(40):
        lines.append(PREFIX + payload(inv=2**64 - 1 - i, ts_ns=i, attrs={"step": i, "device": "npu:0"}))
        lines.append("unrelated text" if i % 3 else "[x] garbage [STRACE] v=1 pid=1")  # a torn record every third step
    lines.insert(7, format_prefix(1, 1, "INFO", "clock") + format_anchor_payload(4242, 10, 20))
    path = write(tmp_path, lines)
    monkeypatch.setattr(strace_log, "CHUNK_BYTES", 500)  # many pieces
    messages = []
    trace = read_strace_log(path, progress=messages.append)
    assert len(messages) > 10 and messages[-1].startswith(f"{path}: ") and f"{len(lines):,} lines" in messages[-1]
    spans = trace.spans
    assert spans["ts_ns"].tolist() == list(range(40)) and [int(v) for v in spans["inv"]] == [2**64 - 1 - i for i in range(40)]
    assert spans["line"].tolist() == [2 * i + 1 + (2 * i >= 7) for i in range(40)]
    assert [dict(a) for a in spans["attrs"]] == [{"step": str(i), "device": "npu:0"} for i in range(40)]
    assert trace.dropped == {"torn_record": 14} and trace.extras["lines_read"] == len(lines)
    assert trace.anchors.to_dict("list") == {"pid": [4242], "mono_ns": [10], "wall_ns": [20]}


def test_log_pieces_still_referred_to_are_never_overwritten(monkeypatch):
    import io

    import numpy as np

    from dsprof.analysis.ingest import strace_log

    monkeypatch.setattr(strace_log, "CHUNK_BYTES", 64)
    data = b"".join(f"[{i}] line {i}\n".encode() + (b"  more of it\n" if i % 4 == 0 else b"") for i in range(60))
    held = [np.frombuffer(piece, np.uint8) for piece in strace_log._chunks(io.BytesIO(data))]  # each keeps its piece alive
    assert b"".join(h.tobytes() for h in held) == data and len(held) > 10
    assert all(h.tobytes().startswith(b"[") and h.tobytes().endswith(b"\n") for h in held)
    texts, buffers = [], set()
    for piece in strace_log._chunks(io.BytesIO(data)):
        texts.append(bytes(piece))
        buffers.add(id(piece.obj))
        del piece  # nothing refers to it any more: the next piece reuses its buffer
    assert texts == [h.tobytes() for h in held] and len(buffers) == 1
