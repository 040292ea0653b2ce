"""Throughput and peak memory of the SA_PROFILE readers on the fragments of a 64-rank run.

Generates the ``fragments/`` directory of a 64-rank run (64 ``trace.<pid>.jsonl``
files, default 20,000 events each, about 300 MB in all) shaped like what the
runtime records: process and thread names, scheduler / worker / executor /
kernel / request spans with integer and text args, instants. Then reads

* the fragments (the JSON-lines reader), and
* their merge, ``trace.json`` (the streaming document reader),

each in a child process of its own, so that its peak RSS is its own; prints
events/s (wall and CPU) and peak RSS. Both are also read with a sink that
counts the rows and keeps none (``+sink``): the reader's own memory, which
must not grow with the input. With ``--baseline-rev REV`` the same
reads also run against the readers of git revision REV (checked out into a
temporary directory and imported ahead of this checkout), side by side in the
same run, and the ratios are printed.

    python benchmarks/bench_json_readers.py [--ranks 64] [--events 20000] [--baseline-rev REV] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parent.parent
KINDS = np.array(
    ["scheduler.step", "worker.execute_model", "executor.run", "kernel.decode_fwd", "kernel.mtp_draft", "request", "serving.token"]
)
CATEGORIES = np.array(["scheduler", "worker", "executor", "kernel", "kernel", "request", "serving"])


def _text(values) -> pa.Array:
    return pa.array(values).cast(pa.string())


def fragment_lines(rank: int, events: int, seed: int) -> list[str]:
    """One rank's fragment: two metadata lines and ``events`` spans and instants (serialised vectorised)."""
    rng = np.random.default_rng(seed + rank)
    pid = 50_000 + rank
    kind = np.arange(events) % len(KINDS)
    step = np.arange(events) // len(KINDS)
    ts = 7_000_000_000 + step * 60_000 + kind * 700 + rng.integers(0, 300, events)
    dur = rng.integers(5, 40_000, events)
    tid = np.where(kind == 3, pid + 1, pid)
    common = pc.binary_join_element_wise(
        '{"name":"',
        _text(KINDS[kind]),
        '","cat":"',
        _text(CATEGORIES[kind]),
        '","ph":"',
        _text(np.where(kind == 6, "i", "X")),
        '","ts":',
        _text(ts),
        pc.if_else(pa.array(kind == 6), pa.scalar(',"s":"t"'), pc.binary_join_element_wise(',"dur":', _text(dur), "")),
        ',"pid":',
        _text(np.full(events, pid)),
        ',"tid":',
        _text(tid),
        ',"args":{',
        "",
    )
    args = pc.binary_join_element_wise(
        '"rank":',
        _text(np.full(events, rank)),
        ',"step":',
        _text(step),
        ',"request_id":"req-',
        _text(step % 32),
        "-r",
        _text(np.full(events, rank)),
        '","tokens":',
        _text(rng.integers(1, 257, events)),
        ',"callable":"decode.main+verify+mtp","ok":true}}',
        "",
    )
    lines = pc.binary_join_element_wise(common, args, "").to_pylist()
    meta = [
        json.dumps({"name": "process_name", "ph": "M", "pid": pid, "tid": pid, "args": {"name": f"rank {rank} (npu:{rank})"}}),
        json.dumps({"name": "thread_name", "ph": "M", "pid": pid, "tid": pid + 1, "args": {"name": f"device executor (rank {rank})"}}),
    ]
    return meta + lines


def generate(output: Path, ranks: int, events: int, seed: int = 11) -> int:
    """Write ``ranks`` fragments under ``output/fragments``; returns the number of lines written."""
    fragments = output / "fragments"
    fragments.mkdir(parents=True, exist_ok=True)
    total = 0
    for rank in range(ranks):
        lines = fragment_lines(rank, events, seed)
        (fragments / f"trace.{50_000 + rank}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        total += len(lines)
    return total


def baseline_tree(rev: str, into: Path) -> Path:
    """The ``dsprof`` package of git revision ``rev``, laid out for import from ``into`` (package-dir map applied)."""
    source = into / "src"
    source.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    package_dirs = tomllib.loads((source / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = into / "importable"
    for package, folder in sorted(package_dirs.items()):
        target = root.joinpath(*package.split("."))
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.symlink_to(source / folder, target_is_directory=True)
    return root


class CountingSink:
    """A span sink that keeps nothing: what is left in memory is the reader's own."""

    rows = 0

    def add(self, table: pa.Table) -> None:
        self.rows += table.num_rows


def read_in_child(path: str, kind: str) -> dict:
    """Run in the child: read ``path`` with the SA_PROFILE reader and report time and this process's peak RSS."""
    from dsprof.analysis.ingest.sa_profile import read_sa_profile

    sink = CountingSink() if kind.endswith("+sink") else None
    cpu_start = time.process_time()
    start = time.perf_counter()
    trace = read_sa_profile(path) if sink is None else read_sa_profile(path, sink=sink)
    seconds = time.perf_counter() - start
    return {
        "kind": kind,
        "seconds": seconds,
        "cpu_seconds": time.process_time() - cpu_start,
        "spans": len(trace.spans) if sink is None else sink.rows,
        "dropped": trace.dropped,
        "peak_rss_mib": peak_rss_mib(),
    }


def peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM starts afresh at exec; ru_maxrss would carry the parent's)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(path: Path, kind: str, pythonpath: Path | None) -> dict:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    child = subprocess.run(
        [sys.executable, __file__, "--child-read", str(path), "--kind", kind], check=True, capture_output=True, text=True, env=env
    )
    return json.loads(child.stdout)


def report(label: str, result: dict, events: int, size_mib: float) -> None:
    print(
        f"  {label:<10} {result['kind']:<15} {result['seconds']:7.2f} s wall {events / result['seconds']:>11,.0f} events/s"
        f" | {result['cpu_seconds']:7.2f} s CPU {events / result['cpu_seconds']:>11,.0f} events/CPU-s"
        f" | {size_mib / result['seconds']:6.1f} MiB/s | peak RSS {result['peak_rss_mib']:7,.0f} MiB | spans {result['spans']:,}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--events", type=int, default=20_000, help="events per rank fragment")
    parser.add_argument("--baseline-rev", help="also measure the readers of this git revision, side by side")
    parser.add_argument("--keep", type=Path, help="generate into this directory and keep it")
    parser.add_argument("--child-read", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_read:
        print(json.dumps(read_in_child(args.child_read, args.kind)))
        return

    from dsprof.profiler.sa_profile import merge_fragments

    with tempfile.TemporaryDirectory() as tmp:
        output = args.keep or Path(tmp) / "serving-trace"
        start = time.perf_counter()
        lines = generate(output, args.ranks, args.events)
        fragments = output / "fragments"
        size_mib = sum(p.stat().st_size for p in fragments.iterdir()) / 2**20
        print(f"generated {args.ranks} fragments, {lines:,} lines, {size_mib:,.1f} MiB in {time.perf_counter() - start:.1f} s")
        merge_start = time.perf_counter()
        merged = merge_fragments(output)
        print(f"merged into {merged.path.name}: {merged.events:,} events in {time.perf_counter() - merge_start:.1f} s")
        spans = args.ranks * args.events
        trees: list[tuple[str, Path | None]] = [("current", None)]
        if args.baseline_rev:
            trees.insert(0, (args.baseline_rev[:10], baseline_tree(args.baseline_rev, Path(tmp))))
        results: dict[tuple[str, str], dict] = {}
        for kind, path in (("fragments", fragments), ("trace.json", merged.path)):
            for label, pythonpath in trees:
                result = run_child(path, kind, pythonpath)
                assert result["spans"] == spans, result
                results[(label, kind)] = result
                report(label, result, spans, size_mib)
        for kind, path in (("fragments+sink", fragments), ("trace.json+sink", merged.path)):
            result = run_child(path, kind, None)
            assert result["spans"] == spans, result
            report("current", result, spans, size_mib)
        if args.baseline_rev:
            base = trees[0][0]
            for kind in ("fragments", "trace.json"):
                old, new = results[(base, kind)], results[("current", kind)]
                print(
                    f"  {kind}: {old['cpu_seconds'] / new['cpu_seconds']:.1f}x the events per CPU-second of {base},"
                    f" peak RSS {new['peak_rss_mib']:,.0f} MiB vs {old['peak_rss_mib']:,.0f} MiB"
                )


if __name__ == "__main__":
    main()
