"""Throughput and peak memory of the STRACE log reader.

Generates a log of N records (default 1,000,000) shaped like the runtime's
``server.log``: every record behind a ``[mono_ns=..][T0x..][INFO] func:``
prefix, eight ranks, decode span trees with root identity attributes, 64-bit
invocation ids, ``clk=dev`` device spans, a few percent-encoded values and
unrelated log lines in between. The read runs in a child process so that its
peak RSS is its own.

Targets: >= 1,000,000 records/s on one core; peak memory < 1 GB. Both wall
time and the child's CPU time are printed: on a machine shared with other work
the CPU figure is the one that measures the reader.

With ``--linearity`` the read is also timed at N/4 and N/2 records: the
reader works through the log a piece at a time, so CPU time per record should
stay flat as the log grows.

    python benchmarks/bench_ingest.py [--records N] [--keep PATH] [--linearity]
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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.profiler.strace_format import encode_value, format_anchor_payload, format_chip_ready_payload, format_prefix

SPAN_NAMES = np.array(
    [
        "chip.run",
        "chip.run.bind",
        "chip.run.bind.args",
        "chip.run.bind.prebuilt",
        "chip.run.runner_run",
        "chip.run.runner_run.native_fence_wait",
        "chip.run.runner_run.device_wall",
        "chip.run.claim_release",
        "chip.run.validate",
    ]
)
SPAN_DEPTHS = np.array([0, 1, 2, 2, 1, 2, 2, 1, 1])
RANKS = 8


def _text(values) -> pa.Array:
    return pa.array(values).cast(pa.string())


def generate_log(path: str, records: int, seed: int = 7) -> int:
    """Write ``records`` STRACE records (plus anchors, ready lines and noise); returns lines written."""
    rng = np.random.default_rng(seed)
    kind = np.arange(records) % len(SPAN_NAMES)
    invocation = np.arange(records) // len(SPAN_NAMES)
    rank = invocation % RANKS
    pid = 41000 + rank
    mono = 5_000_000_000_000 + np.arange(records, dtype=np.int64) * 1_700
    ts = mono - rng.integers(1_000, 900_000, records)
    dur = mono - ts
    inv = (np.uint64(0x9E3779B97F4A7C15) * (invocation.astype(np.uint64) + np.uint64(1))) | np.uint64(1 << 63)
    is_root = kind == 0
    is_dev = kind == 6
    root_attrs = pc.binary_join_element_wise(
        " run_id=", _text(invocation), " dispatch_id=0 run_epoch=", _text(invocation // RANKS),
        " slot_id=", _text(invocation % 2), " generation=", _text(invocation // 2),
        " rank=", _text(rank), " device=npu%3A", _text(rank), " callable=decode.main+verify+mtp step=", _text(invocation // RANKS), "",
    )
    tail = pc.if_else(pa.array(is_root), root_attrs, pc.if_else(pa.array(is_dev), pa.scalar(" clk=dev phase=attn%20moe"), pa.scalar(" lane=0")))
    record = pc.binary_join_element_wise(
        "[mono_ns=", _text(mono), "][T0x7f", _text(rank + 1000), "a2b40][INFO] span_close: [STRACE] v=1 pid=", _text(pid),
        " tid=", _text(pid + 3), " inv=", _text(inv), " hid=9f3c2a71d04be815 depth=", _text(SPAN_DEPTHS[kind]),
        " name=", _text(SPAN_NAMES[kind]), " ts=", _text(ts), " dur=", _text(dur), tail, "",
    )
    noise_every = 50
    header = [format_prefix(1, 1, "INFO", "clock") + format_anchor_payload(41000 + r, 5_000_000_000_000, 1_764_470_000_123_456_789) for r in range(RANKS)]
    header += [format_prefix(2, 1, "INFO", "chip_process") + format_chip_ready_payload(41000 + r, f"npu:{r}") for r in range(RANKS)]
    noise = format_prefix(3, 1, "WARN", "scheduler") + "queue depth " + encode_value("high water mark reached") + " (no span)"
    lines = 0
    with open(path, "w", encoding="utf-8") as out:
        out.write("\n".join(header) + "\n")
        lines += len(header)
        chunk = 100_000
        for start in range(0, records, chunk):
            part = record.slice(start, chunk).to_pylist()
            body = []
            for i in range(0, len(part), noise_every):
                body.extend(part[i : i + noise_every])
                body.append(noise)
            out.write("\n".join(body) + "\n")
            lines += len(body)
    return lines


def read_in_child(path: str) -> dict:
    """Run in the child: time the read and report this process's own peak RSS."""
    from dsprof.analysis.ingest import read_strace_log

    cpu_start = time.process_time()
    start = time.perf_counter()
    trace = read_strace_log(path)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "cpu_seconds": time.process_time() - cpu_start, "spans": len(trace.spans), "dropped": trace.dropped, "peak_rss_mib": peak_rss_mib()}


def peak_rss_mib() -> float:
    """This process's peak resident memory. VmHWM starts afresh at exec, while
    ru_maxrss would carry over the generating parent's peak from the fork."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keep", help="write the generated log here and keep it")
    parser.add_argument("--linearity", action="store_true", help="also read N/4 and N/2 records and compare CPU time per record")
    parser.add_argument("--child-read", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_read:
        print(json.dumps(read_in_child(args.child_read)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or os.path.join(tmp, "server.log")
        start = time.perf_counter()
        lines = generate_log(path, args.records)
        size_mib = os.path.getsize(path) / 2**20
        print(f"generated {args.records:,} STRACE records, {lines:,} lines, {size_mib:,.1f} MiB in {time.perf_counter() - start:.1f} s")
        baseline = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); import dsprof.analysis.ingest, bench_ingest; print(bench_ingest.peak_rss_mib())"], check=True, capture_output=True, text=True)
        child = subprocess.run([sys.executable, __file__, "--child-read", path], check=True, capture_output=True, text=True)
        result = json.loads(child.stdout)
    assert result["spans"] == args.records, result
    rate = args.records / result["seconds"]
    cpu_rate = args.records / result["cpu_seconds"]
    print(f"read: {result['seconds']:.2f} s wall, {rate:,.0f} records/s, {size_mib / result['seconds']:,.0f} MiB/s (target >= 1,000,000 records/s on one core)")
    print(f"      {result['cpu_seconds']:.2f} s CPU, {cpu_rate:,.0f} records per CPU-second (the figure that holds on a shared machine)")
    print(f"peak RSS of the reading process: {result['peak_rss_mib']:,.0f} MiB (target < 1024; interpreter + imports alone: {float(baseline.stdout):,.0f} MiB)")
    print(f"spans kept: {result['spans']:,}; dropped: {result['dropped'] or 'none'}")
    if args.linearity:
        print_linearity(args.records, result)


def print_linearity(records: int, full: dict) -> None:
    """Read N/4 and N/2 records too; CPU microseconds per record should not grow with N."""
    per_record = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fraction in (4, 2):
            path = os.path.join(tmp, f"server-{fraction}.log")
            generate_log(path, records // fraction)
            child = subprocess.run([sys.executable, __file__, "--child-read", path], check=True, capture_output=True, text=True)
            result = json.loads(child.stdout)
            per_record[records // fraction] = (result["cpu_seconds"], result["peak_rss_mib"])
            os.unlink(path)
    per_record[records] = (full["cpu_seconds"], full["peak_rss_mib"])
    print("linearity: " + ", ".join(f"{n:,} records -> {cpu:.2f} s CPU ({cpu / n * 1e6:.2f} us/record), peak {peak:,.0f} MiB" for n, (cpu, peak) in per_record.items()))


if __name__ == "__main__":
    main()
