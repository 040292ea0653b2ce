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
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.cluster import ray_engine as cluster
from dsprof.analysis.ingest import read_paths, sa_profile, strace_pieces
from dsprof.analysis.ingest.chrome import SpanBuilder
from dsprof.analysis.ingest.strace_log import read_strace_log
from dsprof.analysis.outputs.chrome_trace import write_chrome_trace
from dsprof.analysis.stages.invocations import invocation_query
from dsprof.analysis.store import dataset as dataset_module
from dsprof.analysis.store.dataset import DEFAULT_WINDOW_NS, open_dataset
from dsprof.analysis.store.engine import open_engine
from dsprof.analysis.store.spans import Trace, merge_traces
from dsprof.commands import analysis_job
from dsprof.commands.ingest import ingest_paths
from dsprof.errors import DsprofError
from dsprof.profiler.chrome_json import DEFAULT_LIMITS
from dsprof.testing.synthetic import SyntheticRun

# -- 1. one-line logs ------------------------------------------------------------------------------------


def test_a_giant_line_lets_its_pages_go_as_it_is_skipped(monkeypatch, tmp_path):
    """A mapped log's overlong line is read through, never held: its pages are released as the skip passes them.

    They once stayed mapped until the next piece was cut, so a log of one 2 GiB
    line held 2 GiB of page cache in the process (2.24 GB peak RSS).
    """
    monkeypatch.setattr(strace_pieces, "PIECE_BYTES", 4 * mmap.PAGESIZE)
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
    with open(log, "rb") as handle:
        mapped = strace_pieces.map_file(handle)
        assert mapped is not None
        pieces = [piece if isinstance(piece, strace_pieces.SkippedLines) else bytes(piece) for piece in strace_pieces.mapped_pieces(mapped)]
        mapped.close()
    assert pieces == [b"[head] start\n", strace_pieces.SkippedLines(1), b"after\n"]
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
    weight = analysis_job.spill_weight([given])
    assert weight >= path.stat().st_size * analysis_job.JSON_WEIGHT
    monkeypatch.setattr(analysis_job, "SPILL_BYTES", weight)  # at the bound: read into memory
    in_memory, spill = analysis_job.read_inputs([given])
    assert spill is None and in_memory.spans.num_rows == 300
    monkeypatch.setattr(analysis_job, "SPILL_BYTES", weight - 1)  # past it: a temporary span dataset
    on_disk, spill = analysis_job.read_inputs([given])
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


# -- 3. many fragments -----------------------------------------------------------------------------------


def _fragment_lines(i: int) -> list[str]:
    """A fragment's lines: kinds of content that are decided per fragment (pairs, NaN, garbage, nothing)."""
    x = {"ph": "X", "name": f"req{i}", "cat": "request", "pid": 7, "tid": 1, "ts": 100 + i, "dur": 2, "args": {"request_id": f"r{i}"}}
    begin = {"ph": "B", "name": f"b{i}", "pid": 7, "tid": 1, "ts": 50 + i, "args": {"k": i}}
    end = {"ph": "E", "pid": 7, "tid": 1, "ts": 60 + i}
    kinds = [
        [json.dumps(x)],
        [json.dumps(begin), json.dumps(x)],  # a B whose E is in the next fragment: never paired across files
        [json.dumps(end), json.dumps(begin), json.dumps(end)],
        [json.dumps(x).replace('"dur": 2', '"dur": NaN')],
        ["not json", "{"],  # no line is an event
        [],
        [json.dumps({"ph": "M", "name": "process_name", "pid": 7, "args": {"name": f"p{i}"}}), json.dumps(x)],
    ]
    return kinds[i % len(kinds)]


@pytest.mark.parametrize("with_sink", [False, True])
def test_many_small_fragments_read_in_batches_read_as_one_by_one(tmp_path, monkeypatch, with_sink):
    """Fragments are converted many at a time (a bounded number of conversions), with what each gives read alone."""
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    for i in range(150):
        (fragments / f"trace.{i + 1}.jsonl").write_text("".join(line + "\n" for line in _fragment_lines(i)))
    (fragments / "trace.1000.jsonl").write_text("".join(json.dumps(e) + "\n" for e in _chrome_events(40)))  # a big one
    monkeypatch.setattr(sa_profile, "SMALL_FRAGMENT_BYTES", 1000)
    monkeypatch.setattr(sa_profile, "BATCH_FRAGMENTS", 32)
    files = sorted(fragments.iterdir(), key=lambda p: int(p.name.split(".")[1]))
    alone = merge_traces([sa_profile._read_fragment(f, DEFAULT_LIMITS, None)[0] for f in files])
    conversions = []
    add = SpanBuilder.add
    monkeypatch.setattr(SpanBuilder, "add", lambda self, *a, **k: (conversions.append(1), add(self, *a, **k))[1])
    rows: list[pa.Table] = []
    sink = type("Sink", (), {"add": lambda self, table: rows.append(table)})() if with_sink else None
    batched = sa_profile.read_sa_profile(fragments, sink=sink)
    assert len(conversions) <= 150 // 32 + 2  # not one per fragment
    spans = pa.concat_tables(rows) if with_sink else batched.spans
    assert spans.num_rows == alone.spans.num_rows > 0
    order = ["file", "line"]
    assert spans.sort_by([(c, "ascending") for c in order]).equals(alone.spans.sort_by([(c, "ascending") for c in order]))
    if not with_sink:
        assert batched.spans.equals(alone.spans)  # in file order, as read one by one
    assert batched.dropped == {**alone.dropped} and batched.dropped["unmatched_end"] and batched.dropped["unmatched_begin"]
    assert batched.records_read == alone.records_read and batched.files == [str(f) for f in files]
    assert batched.process_names == alone.process_names
    garbage_notes = [n for n in batched.notes if "no line is a JSON event" in n]
    assert len(garbage_notes) == len(range(4, 150, 7)) and [n for n in batched.notes if "NaN" in n] == [
        n for n in alone.notes if "NaN" in n
    ]


# -- 4. sparse timestamps --------------------------------------------------------------------------------


def _sparse_log(path: Path, spans: int, gap_ns: int, first_inv: int = 1) -> Path:
    """A log of one root span per ``gap_ns``: a window (or more) apart each, as far apart as the caller likes."""
    run = SyntheticRun(ranks=1, steps=2).write(path.parent / "run")
    record = next(line for line in (run / "server.log").read_text().splitlines() if "[STRACE]" in line and " depth=1 " in line)
    head = record.partition(" ts=")[0].replace(" depth=1 ", " depth=0 ")
    path.write_text(
        "".join(f"{re.sub(r'inv=[0-9]+', f'inv={first_inv + i}', head)} ts={i * gap_ns} dur={10 + i % 3}\n" for i in range(1, spans + 1))
    )
    return path


@pytest.mark.slow
@pytest.mark.parametrize("gap_windows", [1, 1000])
def test_sparse_timestamps_make_a_bounded_number_of_windows_and_parts(tmp_path, monkeypatch, gap_windows):
    """Past MAX_WINDOWS the windows grow (parts moved, small ones merged): few windows and parts, the same rows and figures."""
    log = _sparse_log(tmp_path / "sparse.log", 200, gap_windows * DEFAULT_WINDOW_NS)
    monkeypatch.setattr(dataset_module, "MAX_WINDOWS", 10**6)
    plain = ingest_paths([log], tmp_path / "plain")
    monkeypatch.setattr(dataset_module, "MAX_WINDOWS", 8)
    monkeypatch.setattr(dataset_module, "SMALL_PART_ROWS", 50)  # some parts are too big to merge
    monkeypatch.setattr(strace_pieces, "PIECE_BYTES", 4096)  # many pieces: windows grow between them
    bounded = ingest_paths([log], tmp_path / "bounded")
    manifest = json.loads((tmp_path / "bounded" / "dataset.json").read_text())
    windows = {f["window"] for f in manifest["files"]}
    assert len(windows) <= 8 and manifest["window_ns"] > DEFAULT_WINDOW_NS
    assert len(manifest["files"]) <= 2 * 8 + 200 // 50
    assert sorted(p.relative_to(tmp_path / "bounded").as_posix() for p in (tmp_path / "bounded").rglob("*.parquet")) == sorted(
        f["path"] for f in manifest["files"]
    )  # nothing left behind by the moves and merges
    for f in manifest["files"]:  # every row in the window its part claims
        ts = pq.read_table(tmp_path / "bounded" / f["path"], columns=["ts_ns"]).column("ts_ns").to_numpy()
        assert set((ts // manifest["window_ns"]).tolist()) == {f["window"]}
    rows = [pa.concat_tables(pq.read_table(p) for p in trace.span_files).sort_by("line") for trace in (plain, bounded)]
    assert rows[0].equals(rows[1]) and rows[0].num_rows == 200
    figures = [analyze_trace(open_dataset(tmp_path / name)) for name in ("plain", "bounded")]
    for result in figures:
        result.engine.close()
    same = [{k: v for k, v in result.summary.items() if k != "inputs"} for result in figures]
    assert same[0] == same[1] and figures[0].summary["figures"]


def test_cluster_windows_of_logs_grown_apart_are_aggregated_alike(tmp_path, monkeypatch):
    """The cluster engine's logs may grow their windows differently: it regroups them on the longest, losing no invocation."""
    monkeypatch.setattr(dataset_module, "MAX_WINDOWS", 8)
    dense = _sparse_log(tmp_path / "a" / "dense.log", 40, DEFAULT_WINDOW_NS // 8)  # 5 windows: never grows
    sparse = _sparse_log(tmp_path / "b" / "sparse.log", 60, 3 * DEFAULT_WINDOW_NS, first_inv=1000)  # grows a few times
    target = tmp_path / "spans"
    parts = [cluster._ingest_log(str(log), str(target), f"log{i}", DEFAULT_WINDOW_NS) for i, log in enumerate([dense, sparse])]
    assert parts[0][2] == DEFAULT_WINDOW_NS < parts[1][2]
    by_window, window_ns = cluster._common_windows(parts, DEFAULT_WINDOW_NS)
    assert window_ns == parts[1][2] and len(by_window) <= 8
    per_window = [
        cluster._window_invocations(sorted(f for w in (k - 1, k, k + 1) for f in by_window.get(w, [])), k, window_ns, None)
        for k in sorted(by_window)
    ]
    every = [Path(f) for files in by_window.values() for f in files]
    engine = open_engine(Trace(span_files=every))
    try:
        whole = engine.arrow(invocation_query())
    finally:
        engine.close()
    assert whole.num_rows == 100
    assert (
        pa.concat_tables(per_window)
        .sort_by([("pid", "ascending"), ("inv", "ascending")])
        .equals(whole.sort_by([("pid", "ascending"), ("inv", "ascending")]))
    )


# -- 5. a memory limit the analysis cannot keep ----------------------------------------------------------


@pytest.mark.parametrize("as_dataset", [False, True])
def test_a_memory_limit_too_small_is_one_line_and_leaves_nothing(tmp_path, as_dataset):
    """DuckDB's OutOfMemoryException (7.5M spans under ``--memory-limit 300MB``; here a small run under 1 MiB) is one line."""
    run = SyntheticRun(ranks=2, steps=20).write(tmp_path / "run")
    if as_dataset:
        ingest_paths([run], tmp_path / "spans")
    given = tmp_path / "spans" if as_dataset else run
    remedy = re.escape(analysis_job.MEMORY_REMEDY)
    with pytest.raises(DsprofError, match=rf"^the analysis needs more memory than its limit \(.*\): {remedy}$"):
        analysis_job.analyze_paths([given], tmp_path / "out", memory_limit=1 << 20)
    assert not (tmp_path / "out").exists()


# -- 2b. the swimlane budgets hold for serving (Chrome) spans too --------------------------------------------


def _combined_swimlane(tmp_path: Path, events: list[dict], span_budget: int) -> dict:
    """The combined swimlane written for a Chrome trace of ``events``, as read back."""
    path = tmp_path / "kineto.json"
    path.write_text(json.dumps({"traceEvents": events}))
    result = analyze_trace(read_paths([path]))
    try:
        swimlane = write_chrome_trace(result, tmp_path / "swimlane.json", span_budget=span_budget)
    finally:
        result.engine.close()
    return json.loads(swimlane.read_text())


def test_serving_spans_past_the_budget_are_left_out_of_the_combined_swimlane_and_said(tmp_path):
    """A Chrome trace's spans are laid out and drawn up to the span budget (earliest first), not all of them.

    (The HTML report lays them out up to its own budget too: tests/test_report_html.py.)
    """
    events = _chrome_events(120)
    written = _combined_swimlane(tmp_path, events, span_budget=50)
    assert written["otherData"]["serving_spans"] == 120 and written["otherData"]["serving_spans_left_out"] == 70
    drawn = sorted(e["ts"] for e in written["traceEvents"] if e["ph"] == "X")
    assert len(drawn) == 50 and drawn == sorted(float(e["ts"]) for e in events)[:50]  # the earliest


def test_the_serving_budget_breaks_ties_at_its_last_start_by_file_and_line(tmp_path):
    """Spans starting together across the budget's edge: the budget's last start is found first, then its ties ranked."""
    events = [{**event, "ts": 1000 + (i // 4) * 10, "args": {"i": i}} for i, event in enumerate(_chrome_events(40))]
    written = _combined_swimlane(tmp_path, events, span_budget=10)
    drawn = sorted(int(e["args"]["i"]) for e in written["traceEvents"] if e["ph"] == "X")
    assert drawn == list(range(10))  # starts 1000 (4), 1010 (4), 1020 (2 of 4: the first two lines)
    assert written["otherData"]["serving_spans_left_out"] == 30
