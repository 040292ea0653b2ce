"""``dsprof ingest`` against the serving stack's STRACE reader, as whole processes.

Generates two logs shaped like the runtime's ``server.log`` (on disk, a block
of steps at a time, never the whole log in memory):

* ~1M records: 16 ranks x 8,929 steps x 7 spans (~260 MB);
* ~1.1 GB: 64 ranks x 10,000 steps x 7 spans (~4.5M records).

Every record sits behind a ``[mono_ns=..][T0x..][INFO] strace_span:`` prefix
and closes in span order (bind, fence wait, device wall, runner_run, claim,
validate, root); host spans carry the host-evidence attributes ``os.cpu_ns
os.rq_ns os.nivcsw os.majflt``, roots their identity (``run_id dispatch_id
run_epoch slot_id generation rank device callable step``), the device-wall span
``clk=dev`` and a percent-encoded ``phase``; some values are percent-encoded,
one line in 50 is unrelated log text, and here and there two records share a
line, a record is torn by a crash, or a three-line traceback (lines that do not
start with '[') follows a record.

Then it times, side by side and interleaved (min and median of --repeats runs),
each as its own process:

* ``peer``: the serving stack's reader (``parse_spans`` over the file's lines),
  only when ``DSPROF_PEER_READER`` names a copy of its ``strace_timing.py``;
* ``fast``: ``dsprof ingest LOG -o DIR/`` (the span dataset), compiled scanner;
* ``python``: the same with ``DSPROF_PURE_PYTHON=1`` (the pure-Python reader);
* ``wc -l``: the physical floor, one pass over the file's bytes;

each reading bytecode compiled beforehand, as an install has it (child_process.py),
and prints wall times, the peak RSS of each process (its own rusage, from
``wait4``) and the ratios of the medians against the targets (issue 30): fast
>= 10x the peer on both logs (the goal: 25x), peak RSS <= 600 MB.

    python benchmarks/bench_ingest.py [--repeats 3] [--keep DIR] [--only small|large]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from child_process import byte_compile, run_child

from dsprof.profiler import strace_format as fmt

PEER_ENV = "DSPROF_PEER_READER"
PEER_SCRIPT = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("strace_timing", sys.argv[1])
strace_timing = sys.modules["strace_timing"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(strace_timing)
lines = open(sys.argv[2], errors="replace").readlines()
print(sum(1 for _ in strace_timing.parse_spans(lines)))
"""
RSS_TARGET_MIB = 600
DECODE_HID = "9f3c2a71d04be815"
# One decode step of one rank, in span-close order: name, depth, clock, offset and length (ns) within the step.
STEP_SPANS = (
    (fmt.BIND, 1, fmt.CLK_HOST, 0, 180_000),
    (fmt.FENCE_WAIT, 2, fmt.CLK_HOST, 260_000, 9_000_000),
    (fmt.DEVICE_WALL, 2, fmt.CLK_DEVICE, 0, 9_400_000),
    (fmt.RUNNER_RUN, 1, fmt.CLK_HOST, 200_000, 9_700_000),
    (fmt.CLAIM_RELEASE, 1, fmt.CLK_HOST, 9_900_000, 60_000),
    (fmt.VALIDATE, 1, fmt.CLK_HOST, 9_950_000, 1_300_000),
    (fmt.ROOT, 0, fmt.CLK_HOST, 0, 11_300_000),
)
STEP_NS = 20_000_000
T0_NS = 5_000_000_000_000
WALL0_NS = 1_764_470_000_123_456_789
NOISE_EVERY = 50  # one unrelated log line per this many records
TWO_ON_A_LINE_EVERY = 4_999  # a record written without its newline, so the next shares its line
TORN_EVERY = 99_991  # a record cut short by a crash (dropped as torn_record)
TRACEBACK_EVERY = 250_007  # three lines that do not start with '[' after a record
STEPS_PER_BLOCK = 256


def _text(values) -> pa.Array:
    return pa.array(values).cast(pa.string())


def _join(*parts) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def _step_block(ranks: int, first_step: int, steps: int, rng: np.random.Generator) -> pa.Array:
    """The records of steps [first_step, first_step + steps) of every rank, in close order, one string each."""
    grid = np.meshgrid(np.arange(len(STEP_SPANS)), np.arange(first_step, first_step + steps), np.arange(ranks), indexing="ij")
    kinds, step, rank = (axis.transpose(1, 0, 2).ravel() for axis in grid)  # step-major, then span kind, then rank
    n = len(kinds)
    name = np.array([s[0] for s in STEP_SPANS])[kinds]
    depth = np.array([s[1] for s in STEP_SPANS])[kinds]
    device = np.array([s[2] == fmt.CLK_DEVICE for s in STEP_SPANS])[kinds]
    jitter = rng.integers(0, 40_000, n)
    start = T0_NS + step * STEP_NS + rank * 3_000 + np.array([s[3] for s in STEP_SPANS])[kinds] + jitter
    dur = np.array([s[4] for s in STEP_SPANS])[kinds] + rng.integers(0, 300_000, n)
    ts = np.where(device, np.array([s[3] for s in STEP_SPANS])[kinds] + jitter, start)  # device spans: per-invocation origin
    close = start + dur
    pid = 41_000 + rank
    inv = (np.uint64(0x9E3779B97F4A7C15) * (pid.astype(np.uint64) + np.uint64(1))) + step.astype(np.uint64)  # per-process base + counter
    cpu = (dur * rng.uniform(0.2, 0.95, n)).astype(np.int64)
    evidence = _join(
        " os.cpu_ns=",
        _text(cpu),
        " os.rq_ns=",
        _text(rng.integers(0, 60_000, n)),
        " os.nivcsw=",
        _text(rng.integers(0, 3, n)),
        " os.majflt=",
        _text((rng.random(n) < 0.001).astype(np.int64)),
    )
    root = _join(
        " run_id=",
        _text(step * ranks + rank),
        " dispatch_id=0 run_epoch=",
        _text(step),
        " slot_id=",
        _text(step % 2),
        " generation=",
        _text(step // 2),
        " rank=",
        _text(rank),
        " device=npu:",
        _text(rank),
        " callable=",
        fmt.encode_value(fmt.DECODE_CALLABLE),
        " step=",
        _text(step),
    )
    dev = pa.scalar(" clk=dev phase=" + fmt.encode_value("attn moe [fused]"))
    claim = name == fmt.CLAIM_RELEASE  # too short to sample: no host evidence
    tail = pc.if_else(pa.array(device), dev, pc.if_else(pa.array(claim), pa.scalar(""), evidence))
    tail = pc.if_else(pa.array(name == fmt.ROOT), _join(evidence, root), tail)
    return _join(
        "[mono_ns=",
        _text(close),
        "][T0x7f3a",
        _text(rank + 1000),
        "c4700][INFO] strace_span: ",
        fmt.STRACE_MARKER,
        " v=",
        str(fmt.STRACE_VERSION),
        " pid=",
        _text(pid),
        " tid=",
        _text(pid + 3),
        " inv=",
        _text(inv),
        " hid=",
        DECODE_HID,
        " depth=",
        _text(depth),
        " name=",
        _text(name),
        " ts=",
        _text(ts),
        " dur=",
        _text(dur),
        tail,
    )


def _layout(records: pa.Array, first_index: int, noise: str) -> memoryview:
    """The block's log text: newlines after records, except where two share a line or one is torn; noise lines between."""
    n = len(records)
    index = np.arange(first_index, first_index + n)
    traceback = '\nTraceback (most recent call last):\n  File "worker.py", line 88, in step\nRuntimeError: slow peer\n'
    separator = np.where(index % NOISE_EVERY == NOISE_EVERY - 1, "\n" + noise + "\n", "\n")
    separator = np.where(index % TRACEBACK_EVERY == TRACEBACK_EVERY // 2, traceback, separator)
    separator = np.where(index % TWO_ON_A_LINE_EVERY == TWO_ON_A_LINE_EVERY // 3, "", separator)
    torn = index % TORN_EVERY == TORN_EVERY // 5
    text = records
    if torn.any():
        text = pc.replace_with_mask(records, pa.array(torn), pc.utf8_slice_codeunits(records.filter(pa.array(torn)), 0, 150))
    joined = pc.binary_join_element_wise(text, pa.array(separator, pa.string()), "")
    offsets = np.frombuffer(joined.buffers()[1], np.int32)[joined.offset : joined.offset + n + 1]
    return memoryview(joined.buffers()[2])[offsets[0] : offsets[-1]]


def generate_log(path: Path, ranks: int, steps: int, seed: int = 13) -> int:
    """Write the log (see the module docstring) a block of steps at a time; returns the number of records."""
    rng = np.random.default_rng(seed)
    noise = (
        fmt.format_prefix(T0_NS, 0x7F3A00C4700, "WARN", "scheduler")
        + "queue depth "
        + fmt.encode_value("high water mark [2]")
        + " (no span)"
    )
    written = 0
    with open(path, "wb") as out:
        for rank in range(ranks):
            pid = 41_000 + rank
            out.write((fmt.format_anchor_record(pid, T0_NS, WALL0_NS + rank, 0x7F3A00C4700) + "\n").encode())
            out.write(
                (
                    fmt.format_prefix(T0_NS, 0x7F3A00C4700, "INFO", "chip_process")
                    + fmt.format_chip_ready_payload(pid, f"npu:{rank}")
                    + "\n"
                ).encode()
            )
        for first in range(0, steps, STEPS_PER_BLOCK):
            block = _step_block(ranks, first, min(STEPS_PER_BLOCK, steps - first), rng)
            out.write(_layout(block, written, noise))
            written += len(block)
    return written


@dataclass
class Timing:
    """Wall seconds and peak RSS (MiB) of each run of one tool on one log."""

    seconds: list[float] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)

    def line(self) -> str:
        return f"min {min(self.seconds):6.2f} s  median {statistics.median(self.seconds):6.2f} s  peak RSS {max(self.rss_mib):5.0f} MiB"


def tools(log: Path, work: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Command and environment of each tool to time on ``log``."""
    base = {k: v for k, v in os.environ.items() if k != "DSPROF_PURE_PYTHON"}
    ingest = [sys.executable, "-m", "dsprof.cli.main", "ingest", str(log), "-o"]
    found = {}
    peer = os.environ.get(PEER_ENV)
    if peer:
        byte_compile(Path(peer))  # as the product's own modules are (child_process.py)
        found["peer"] = ([sys.executable, "-c", PEER_SCRIPT, str(Path(peer).resolve()), str(log)], base)
    found["wc -l"] = (["wc", "-l", str(log)], base)  # the floor: streaming the file's bytes once
    found["fast"] = (ingest + [str(work / "fast") + "/"], base)
    found["python"] = (ingest + [str(work / "python") + "/"], base | {"DSPROF_PURE_PYTHON": "1"})
    return found


def time_log(label: str, log: Path, work: Path, repeats: int) -> dict[str, Timing]:
    """Time every tool on one log, interleaved: run 1 of each, then run 2 of each, ..."""
    found = tools(log, work)
    timings = {name: Timing() for name in found}
    for _ in range(repeats):
        for name, (command, env) in found.items():
            measured = run_child(command, env)
            timings[name].seconds.append(measured.seconds)
            timings[name].rss_mib.append(measured.peak_rss_mib)
    print(f"\n{label}: {log.stat().st_size / 2**20:,.0f} MiB")
    for name, timing in timings.items():
        print(f"  {name:7s} {timing.line()}")
    return timings


def report(label: str, timings: dict[str, Timing], target: float) -> None:
    """The ratios of medians (issue 30), the ratio of minimums beside each."""

    def ratio(slow: str, quick: str) -> tuple[float, float]:
        a, b = timings[slow].seconds, timings[quick].seconds
        return statistics.median(a) / statistics.median(b), min(a) / min(b)

    print("  python / fast: {:5.1f}x (minimums {:.1f}x)".format(*ratio("python", "fast")))
    print("  fast / wc -l:  {:5.1f}x (minimums {:.1f}x; the floor: one pass over the bytes)".format(*ratio("fast", "wc -l")))
    if "peer" in timings:
        medians, minimums = ratio("peer", "fast")
        verdict = "met" if medians >= target else "NOT met"
        print(f"  peer / fast:   {medians:5.1f}x (minimums {minimums:.1f}x; target >= {target:g}x of the medians: {verdict})")
    else:
        print(f"  peer: not timed (set {PEER_ENV} to a copy of the serving stack's strace_timing.py)")
    rss = max(timings["fast"].rss_mib)
    print(f"  fast peak RSS: {rss:,.0f} MiB (target <= {RSS_TARGET_MIB}: {'met' if rss <= RSS_TARGET_MIB else 'NOT met'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="generate the logs here (reused when present) instead of a temporary directory")
    parser.add_argument("--only", choices=["small", "large"], help="time only one of the two logs")
    args = parser.parse_args()
    logs = {
        "small": ("1M-record log (16 ranks x 8,929 steps)", 16, 8_929, 10.0),
        "large": ("1 GB log (64 ranks x 10,000 steps)", 64, 10_000, 10.0),
    }
    print(f"machine: {os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at start")
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        for key, (label, ranks, steps, target) in logs.items():
            if args.only and key != args.only:
                continue
            log = where / f"server-{ranks}x{steps}.log"
            if not log.exists():
                start = time.perf_counter()
                records = generate_log(log, ranks, steps)
                print(
                    f"generated {log.name}: {records:,} records, {log.stat().st_size / 2**20:,.0f} MiB in {time.perf_counter() - start:.1f} s"
                )
            work = Path(tempfile.mkdtemp(dir=tmp))
            report(label, time_log(label, log, work, args.repeats), target)
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")


if __name__ == "__main__":
    main()
