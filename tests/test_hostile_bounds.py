"""Hostile corpus, round 2 (issue 21): memory and time bounded for every reader, whatever the input's shape.

The inputs here are small, with the readers' limits scaled down to them where
the shape matters (a line longer than the longest line kept, more windows than
the bound), so each test is quick; the full-size figures (peak RSS, seconds)
are measured by benchmarks/bench_hostile_bounds.py.
"""

from __future__ import annotations

import gzip
import json
import mmap
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsprof.analysis.ingest import strace_pieces
from dsprof.analysis.ingest.strace_log import read_strace_log
from dsprof.commands import analyze as analyze_module

# -- 1. one-line logs ------------------------------------------------------------------------------------


def test_a_giant_line_lets_its_pages_go_as_it_is_skipped(monkeypatch, tmp_path):
    """A mapped log's overlong line is read through, never held: its pages are released as the skip passes them.

    They once stayed mapped until the next piece was cut, so a log of one 2 GiB
    line held 2 GiB of page cache in the process (2.24 GB peak RSS).
    """
    monkeypatch.setattr(strace_pieces, "CHUNK_BYTES", 4 * mmap.PAGESIZE)
    monkeypatch.setattr(strace_pieces, "MAX_LINE_BYTES", mmap.PAGESIZE)
    released: list[int] = []
    drop_pages = strace_pieces._drop_pages

    def recording(mapped, done, upto):
        released.append(upto)
        return drop_pages(mapped, done, upto)

    monkeypatch.setattr(strace_pieces, "_drop_pages", recording)
    giant = b"x" * (40 * mmap.PAGESIZE)
    log = tmp_path / "one-line.log"
    log.write_bytes(b"[head] start\n" + giant + b"\nafter\n")
    with open(log, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        pieces = [piece if isinstance(piece, int) else bytes(piece) for piece in strace_pieces.mapped_pieces(mapped)]
    assert pieces == [b"[head] start\n", 1, b"after\n"]
    line_end = len(b"[head] start\n") + len(giant)
    assert max(released) >= line_end - mmap.PAGESIZE  # all but the line's last page let go
    assert read_strace_log(log).dropped == {"overlong_line": 1}


# -- 2. Chrome JSON goes through the span dataset when large ---------------------------------------------


def _chrome_events(n: int) -> list[dict]:
    return [
        {
            "ph": "X",
            "name": f"op{i % 7}",
            "cat": "cpu_op",
            "pid": 1 + i % 3,
            "tid": i % 4,
            "ts": 1000 + i * 10,
            "dur": 3.5,
            "args": {"i": i},
        }
        for i in range(n)
    ]


@pytest.mark.parametrize("layout", ["kineto.json", "kineto.json.gz", "run/serving-trace/fragments/trace.7.jsonl"])
def test_large_json_inputs_are_spilled_like_text_logs(tmp_path, monkeypatch, layout):
    """JSON counts towards the spill (weighted: its rows take many times its text), and the spilled read is the same."""
    events = _chrome_events(300)
    path = tmp_path / layout
    path.parent.mkdir(parents=True, exist_ok=True)
    if layout.endswith(".jsonl"):
        path.write_text("".join(json.dumps(e) + "\n" for e in events))
        given = tmp_path / "run"
    else:
        text = json.dumps({"traceEvents": events}).encode()
        path.write_bytes(gzip.compress(text) if layout.endswith(".gz") else text)
        given = path
    weight = analyze_module.spill_weight([given])
    assert weight >= path.stat().st_size * analyze_module.JSON_WEIGHT
    monkeypatch.setattr(analyze_module, "SPILL_BYTES", weight)  # at the bound: read into memory
    in_memory, spill = analyze_module.read_inputs([given])
    assert spill is None and in_memory.spans.num_rows == 300
    monkeypatch.setattr(analyze_module, "SPILL_BYTES", weight - 1)  # past it: a temporary span dataset
    on_disk, spill = analyze_module.read_inputs([given])
    try:
        assert spill is not None and on_disk.spans.num_rows == 0 and on_disk.span_files
        written = pa.concat_tables(pq.read_table(f) for f in on_disk.span_files)
        columns = ["file", "line", "pid", "tid", "name", "ts_ns", "dur_ns"]
        assert (
            written.select(columns)
            .cast(in_memory.spans.select(columns).schema)
            .sort_by("line")
            .equals(in_memory.spans.select(columns).sort_by("line"))
        )
    finally:
        shutil.rmtree(spill, ignore_errors=True)
