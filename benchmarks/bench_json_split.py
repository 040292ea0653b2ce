"""dsprof's own JSON splitter and span dataset layout against the libraries that could replace them (issue 25, item 6).

Two sections, each alternative in a child process of its own (its own wall
time, peak RSS and, from ``/proc/self/io``, the bytes it read), interleaved
over ``--repeats`` rounds; medians are printed with their ratio to dsprof's.

**json**: a merged Chrome trace (``{"traceEvents": [...], "otherData": ...}``,
the ``trace.json`` of ``bench_json_readers.py``'s 64-rank fragments merged by
``merge_fragments``) of about ``--mb`` MB, read to its events by

* ``dsprof``: :class:`~dsprof.analysis.ingest.json_stream.ChromeDocument` (the
  NumPy structure scan cutting ``traceEvents`` into events, msgspec decoding a
  buffer of them at a time into ``TraceEvent`` structs), what every Chrome /
  Kineto / SA_PROFILE reader of dsprof goes through;
* ``msgspec-whole``: the file read whole and decoded in one call into a struct
  holding ``traceEvents: list[TraceEvent]`` (the same typed decode, unbounded);
* ``ijson``: ``ijson.items(f, "traceEvents.item")`` streaming, with the
  backend it picks (yajl2_c when built), where ijson is installed (it is not
  a dsprof dependency: ``.venv/bin/pip install ijson`` to include it);
* ``duckdb``: ``SELECT count(*) FROM (SELECT unnest(traceEvents) FROM
  read_json(path, maximum_object_size=...))``: DuckDB reads a JSON document
  as one row, so the whole object must fit ``maximum_object_size``; its
  ``memory_limit`` is left at the default.

Times count the read or write alone (the libraries imported first); the peak RSS is the
process's, imports included: ``imports_rss_mib`` is what the imports alone held.

Then each is handed a malformed copy (one event with a
``;`` for a ``:``) and a copy cut at 60% of its bytes (a crash while writing),
and what it does is printed: the events it returned and its error's first line.

**dataset**: a 64-rank log of ``--steps`` steps (``bench_ingest.generate_log``)
ingested once into a span dataset; its spans, gathered into one Parquet file
in log order, are then written by

* ``dsprof``: :class:`~dsprof.analysis.store.dataset.SpanDatasetWriter` fed
  pieces of 65,536 rows (as a reader hands them over), the manifest last;
* ``duckdb``: ``COPY (SELECT *, window FROM read_parquet(...)) TO dir (FORMAT
  parquet, PARTITION_BY (time_window))``, the window computed as dsprof's is
  (the invocation's earliest host start, over the whole table), and
  ``duckdb-ts``: the same with ``ts_ns // window_ns`` (no window function);

and a window of ``--window-s`` seconds in the middle of the run is read back
from each, ``count(*), sum(dur_ns)`` by DuckDB over ``read_parquet(...,
hive_partitioning=true)`` with the partition filter and the ``ts_ns`` range
(zone maps prune row groups), plus dsprof's own window read
(``cut_trace`` of ``analyze --since/--until``: whole invocations, row groups
chosen from the footers' statistics).

    .venv/bin/python benchmarks/bench_json_split.py [--sections json,dataset] [--mb 100] [--steps 4000] [--repeats 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
BYTES_PER_EVENT = 300e6 / (64 * 20_000)  # bench_json_readers' fragments: 300 MB for 64 x 20,000 events
PIECE_ROWS = 65_536


# -- in the child --------------------------------------------------------------------------------------


def _proc_figures() -> dict:
    """Peak RSS (VmHWM, MiB) and bytes read through read(2)/pread(2) (rchar) of this process."""
    figures = {"peak_rss_mib": 0.0, "read_bytes": 0}
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                figures["peak_rss_mib"] = int(line.split()[1]) / 1024
    with open("/proc/self/io") as io:
        for line in io:
            if line.startswith("rchar:"):
                figures["read_bytes"] = int(line.split()[1])
    return figures


def json_reader(kind: str) -> Callable[[str], int]:
    """``kind``'s reader, imported: it returns the events of a path's ``traceEvents`` and raises as the library raises."""
    if kind == "dsprof":
        from dsprof.analysis.ingest.json_stream import ChromeDocument

        return lambda path: sum(len(batch.events) for batch in ChromeDocument(Path(path)).batches())
    if kind == "msgspec-whole":
        import msgspec

        from dsprof.profiler.chrome_json import TraceEvent

        document = msgspec.defstruct("Document", [("traceEvents", list[TraceEvent])])
        return lambda path: len(msgspec.json.decode(Path(path).read_bytes(), type=document).traceEvents)
    if kind == "ijson":
        import ijson

        def read(path: str) -> int:
            with open(path, "rb") as f:
                return sum(1 for _ in ijson.items(f, "traceEvents.item", use_float=True))

        return read
    if kind == "duckdb":
        import duckdb

        def query(path: str) -> int:
            size = os.path.getsize(path)
            sql = f"SELECT count(*) FROM (SELECT unnest(traceEvents) FROM read_json(?, maximum_object_size={size + 1}))"
            row = duckdb.connect().execute(sql, [path]).fetchone()
            assert row is not None
            return int(row[0])

        return query
    raise ValueError(kind)


def dataset_write(kind: str, source: str, manifest_of: str, target: str, window_ns: int) -> dict:
    shutil.rmtree(target, ignore_errors=True)
    if kind == "dsprof":
        import pyarrow as pa
        import pyarrow.parquet as pq

        from dsprof.analysis.store.dataset import SpanDatasetWriter, open_dataset

        writer = SpanDatasetWriter(target, window_ns=window_ns)
        for batch in pq.ParquetFile(source).iter_batches(PIECE_ROWS):
            writer.add(pa.Table.from_batches([batch]))
        writer.finish(open_dataset(manifest_of))
        return {"files": len(writer.files)}
    import duckdb

    if kind == "duckdb":
        window = (
            "(CASE WHEN inv IS NULL THEN ts_ns ELSE coalesce(min(CASE WHEN clk <> 'dev' THEN ts_ns END)"
            f" OVER (PARTITION BY pid, inv), ts_ns) END) // {window_ns}"
        )
    else:
        window = f"ts_ns // {window_ns}"
    duckdb.connect().execute(
        f"COPY (SELECT *, {window} AS time_window FROM read_parquet(?)) TO '{target}' (FORMAT parquet, PARTITION_BY (time_window))",
        [source],
    )
    return {"files": sum(1 for _ in Path(target).rglob("*.parquet"))}


def dataset_read(kind: str, directory: str, since_ns: int, until_ns: int, window_ns: int, offsets: str) -> dict:
    if kind == "dsprof-cut":
        from dsprof.analysis.store.dataset import open_dataset
        from dsprof.analysis.window import parse_window
        from dsprof.analysis.window_cut import cut_trace

        since, until = offsets.split(",")
        spec = parse_window(since=since, until=until)
        assert spec is not None
        trace, _, facts = cut_trace(open_dataset(directory), spec)
        return {"rows": trace.spans.num_rows, "row_groups": f"{facts.row_groups_read}/{facts.row_groups}"}
    import duckdb

    first, last = since_ns // window_ns - 1, (until_ns - 1) // window_ns + 1
    row = (
        duckdb.connect()
        .execute(
            f"SELECT count(*), sum(dur_ns) FROM read_parquet('{directory}/time_window=*/*.parquet', hive_partitioning=true)"
            " WHERE time_window BETWEEN ? AND ? AND ts_ns >= ? AND ts_ns < ?",
            [first, last, since_ns, until_ns],
        )
        .fetchone()
    )
    assert row is not None
    return {"rows": int(row[0]), "dur_sum": int(row[1] or 0)}


def child(args: argparse.Namespace) -> None:
    task, kind, *rest = args.child
    outcome: dict
    imported_rss = 0.0
    if task == "json":
        reader = json_reader(kind)
    else:  # what the write or read imports, before the clock starts
        import duckdb  # noqa: F401
        import pyarrow.parquet  # noqa: F401

        import dsprof.analysis.window_cut  # noqa: F401
    imported_rss = _proc_figures()["peak_rss_mib"]
    started = time.perf_counter()
    if task == "json":
        try:
            outcome = {"events": reader(rest[0])}
        except Exception as error:  # what the library says of bad input is the figure here
            outcome = {"error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]}
    elif task == "write":
        outcome = dataset_write(kind, rest[0], rest[1], rest[2], int(rest[3]))
    else:
        outcome = dataset_read(kind, rest[0], int(rest[1]), int(rest[2]), int(rest[3]), rest[4])
    outcome["seconds"] = time.perf_counter() - started
    outcome.update(_proc_figures())
    outcome["imports_rss_mib"] = round(imported_rss)
    print(json.dumps(outcome))


# -- the harness ---------------------------------------------------------------------------------------


def run(*argv: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", *argv], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def rounds(cases: dict[str, tuple[str, ...]], repeats: int) -> dict[str, list[dict]]:
    """Every case once per round, the rounds one after the other (interleaved: the machine's load falls on all alike)."""
    results: dict[str, list[dict]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, argv in cases.items():
            results[name].append(run(*argv))
    return results


def table(results: dict[str, list[dict]], base: str, what: str) -> None:
    ref = statistics.median(r["seconds"] for r in results[base])
    ref_rss = statistics.median(r["peak_rss_mib"] for r in results[base])
    print(f"  {'':<14} {'median s':>9} {'x ' + base:>10} {'peak RSS MiB':>13} {'x ' + base:>10} {'MiB read':>9}  {what}")
    for name, runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        rss = statistics.median(r["peak_rss_mib"] for r in runs)
        read = statistics.median(r["read_bytes"] for r in runs) / 2**20
        extra = {k: v for k, v in runs[0].items() if k not in ("seconds", "peak_rss_mib", "read_bytes")}
        spread = "/".join(f"{r['seconds']:.2f}" for r in runs)
        print(
            f"  {name:<14} {seconds:9.2f} {seconds / ref:9.2f}x {rss:13,.0f} {rss / ref_rss:9.2f}x {read:9,.0f}  {extra} (runs {spread} s)"
        )


def json_section(work: Path, mb: float, repeats: int, only: list[str] | None) -> None:
    sys.path.insert(0, str(HERE))
    from bench_json_readers import generate

    from dsprof.profiler.sa_profile import merge_fragments

    trace = work / "serving-trace" / "trace.json"
    if not trace.exists():
        events = max(1, round(mb * 1e6 / BYTES_PER_EVENT / 64))
        started = time.perf_counter()
        generate(work / "serving-trace", 64, events)
        merge_fragments(work / "serving-trace")
        shutil.rmtree(work / "serving-trace" / "fragments")
        print(f"  generated {trace.stat().st_size / 1e6:,.0f} MB ({64 * events:,} events) in {time.perf_counter() - started:.0f} s")
    kinds = ["dsprof", "msgspec-whole", "duckdb"]
    try:
        import ijson

        kinds.insert(2, "ijson")
        print(f"  ijson {ijson.__version__}, backend {ijson.backend}")
    except ImportError:
        print("  ijson not installed (`.venv/bin/pip install ijson` to include it)")
    kinds = [kind for kind in kinds if only is None or kind in only]
    size_mb = trace.stat().st_size / 1e6
    print(f"== json: {size_mb:,.0f} MB Chrome trace, {repeats} rounds")
    results = rounds({kind: ("json", kind, str(trace)) for kind in kinds}, repeats)
    table(results, "dsprof", "events")
    data = trace.read_bytes()
    bad = bytearray(data)
    at = data.index(b'"ts":', len(data) // 2)
    bad[at + 4 : at + 5] = b";"
    cut = data[: int(len(data) * 0.6)]
    del data
    (work / "bad.json").write_bytes(bytes(bad))
    (work / "cut.json").write_bytes(cut)
    line = bytes(bad[:at]).count(b"\n") + 1
    del bad, cut
    print(f"  malformed copy (';' for ':' on line {line:,}) and a copy cut at 60%:")
    for kind in kinds:
        for name in ("bad.json", "cut.json"):
            outcome = run("json", kind, str(work / name))
            said = f"{outcome['events']:,} events, no error" if "events" in outcome else outcome["error"]
            print(f"    {kind:<14} {name:<9} {outcome['seconds']:6.2f} s  {said}")
    (work / "bad.json").unlink()
    (work / "cut.json").unlink()


def dataset_section(work: Path, steps: int, repeats: int, window_s: float) -> None:
    sys.path.insert(0, str(HERE))
    import pyarrow.parquet as pq
    from bench_ingest import STEP_NS, T0_NS, generate_log

    from dsprof.analysis.store.dataset import DEFAULT_WINDOW_NS, open_dataset

    log, ingested, source = work / "server.log", work / "ingested", work / "spans.parquet"
    if not (ingested / "dataset.json").exists():
        started = time.perf_counter()
        generate_log(log, 64, steps)
        subprocess.run(
            [str(Path(sys.executable).with_name("dsprof")), "ingest", str(log), "-o", f"{ingested}/"], check=True, capture_output=True
        )
        log.unlink()
        print(f"  generated and ingested 64 x {steps:,} steps in {time.perf_counter() - started:.0f} s")
    if not source.exists():
        files = open_dataset(ingested).span_files
        with pq.ParquetWriter(source, pq.read_schema(files[0])) as writer:  # one file, in log order (line)
            for path in sorted(files, key=lambda p: pq.ParquetFile(p).read_row_group(0, columns=["line"]).column(0)[0].as_py()):
                writer.write_table(pq.read_table(path))
    rows = pq.ParquetFile(source).metadata.num_rows
    window_ns = DEFAULT_WINDOW_NS
    print(f"== dataset: 64 x {steps:,} steps, {rows:,} spans ({source.stat().st_size / 1e6:,.0f} MB as one Parquet file), {repeats} rounds")
    print(f"  write ({window_ns / 1e9:.1f} s windows; the run lasts {steps * STEP_NS / 1e9:.0f} s):")
    targets = {kind: work / f"out-{kind}" for kind in ("dsprof", "duckdb", "duckdb-ts")}
    results = rounds(
        {kind: ("write", kind, str(source), str(ingested), str(target), str(window_ns)) for kind, target in targets.items()}, repeats
    )
    table(results, "dsprof", "")
    for kind, target in targets.items():
        print(f"    {kind}: {sum(p.stat().st_size for p in target.rglob('*.parquet')) / 1e6:,.0f} MB on disk")
    middle = steps * STEP_NS / 2e9
    since_s, until_s = middle - window_s / 2, middle + window_s / 2
    since_ns, until_ns = T0_NS + int(since_s * 1e9), T0_NS + int(until_s * 1e9)
    print(f"  read the window +{since_s:.0f}s..+{until_s:.0f}s:")
    cases = {
        f"sql {kind}": ("read", "sql", str(target), str(since_ns), str(until_ns), str(window_ns), "") for kind, target in targets.items()
    }
    cases["dsprof-cut"] = ("read", "dsprof-cut", str(targets["dsprof"]), "0", "0", str(window_ns), f"+{since_s:.3f}s,+{until_s:.3f}s")
    table(rounds(cases, repeats), "sql dsprof", "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="json,dataset")
    parser.add_argument("--mb", type=float, default=100, help="size of the Chrome trace (MB)")
    parser.add_argument("--steps", type=int, default=4000, help="steps of the 64-rank log for the dataset section")
    parser.add_argument("--window-s", type=float, default=10.0, help="length of the window read back (s)")
    parser.add_argument("--readers", help="json: only these, comma-separated (dsprof,msgspec-whole,ijson,duckdb)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="generate into this directory and keep (and reuse) it")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    work = args.keep or Path(tempfile.mkdtemp(prefix="dsprof-bench-split-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        sections = args.sections.split(",")
        if "json" in sections:
            json_section(work, args.mb, args.repeats, args.readers.split(",") if args.readers else None)
        if "dataset" in sections:
            dataset_section(work, args.steps, args.repeats, args.window_s)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
