"""Benchmark of the bundled runtime at the production shape (SPEC §4) on this machine.

Prints: wall time and decode steps of a production run, the median cadence per
rank for both metadata paths and their ratio (target device-resident /
host-shared >= 1.5), and the profiler overhead (SA_PROFILE + STRACE on vs
off, target <= 5%) as batch time and as CPU time of the rank processes — the
CPU figure is the steadier one on a shared, loaded machine — and the emitters'
own cost (records written x measured cost per record) as a share of the ranks'
CPU time, which does not depend on load at all. Cadence comes from the run's own server.log,
read with the analysis reader (dsprof.analysis).

    .venv/bin/python benchmarks/bench_runtime.py [--repeats N] [--preset production]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from dsprof.analysis.ingest import read_paths
from dsprof.analysis.pipeline import pipeline_figures
from dsprof.analysis.swimlane import build_swimlane
from dsprof.profiler import sa_profile, strace
from dsprof.runtime.config import RuntimeConfig
from dsprof.runtime.launch import run_workload


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(config: RuntimeConfig, out: Path) -> tuple[dict, float, float]:
    """(performance summary, wall seconds, CPU seconds of the rank processes)."""
    started, cpu = time.perf_counter(), children_cpu_s()
    outcome = run_workload(config, out)
    wall = time.perf_counter() - started
    if outcome.exit_status != 0:
        sys.exit(f"run failed: {outcome.message}")
    return outcome.summary, wall, children_cpu_s() - cpu


def cadence(out: Path) -> dict:
    figures = pipeline_figures(build_swimlane(read_paths([out / "server.log"])).roots)
    per_rank = {rank: block["p50"] for rank, block in sorted(figures["cadence_ms"].items(), key=lambda kv: int(kv[0]))}
    return {"per_rank_p50_ms": per_rank, "median_ms": statistics.median(per_rank.values()),
            "overlapped": f"{figures['pairs_overlapped']}/{figures['pairs_checked']}"}


def emitter_costs_us(tmp: Path) -> tuple[float, float]:
    """Measured cost of one STRACE root record and one SA_PROFILE span, in µs (this process)."""
    fd = os.open(os.devnull, os.O_WRONLY)
    strace.enable(fd)
    sa_profile.configure(tmp / "emitter-cost", "e2e,kernel")
    n = 20000
    started = time.perf_counter()
    for i in range(n):
        strace.record("chip.run", inv=i, hid="0123456789abcdef", depth=0, ts_ns=i, dur_ns=1, run_id=i, dispatch_id=i,
                      run_epoch=i, slot_id=0, generation=i, rank=0, device="cpu:0", callable="decode.main+verify+mtp", step=i)
    strace_us = (time.perf_counter() - started) / n * 1e6
    started = time.perf_counter()
    for i in range(n):
        with sa_profile.span("kernel.verify", "kernel", step=i):
            pass
    sa_us = (time.perf_counter() - started) / n * 1e6
    strace.disable()
    sa_profile.shutdown()
    os.close(fd)
    return strace_us, sa_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="production")
    parser.add_argument("--repeats", type=int, default=3, help="runs per metadata path and per profiling setting")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_runtime_") as tmp:
        tmp = Path(tmp)
        # The two metadata paths alternate, so that a change in machine load hits both alike.
        ratios = []
        for i in range(args.repeats):
            figures = {}
            for path in ("host-shared", "device-resident"):
                config = RuntimeConfig.from_preset(args.preset, metadata=path)
                summary, wall, _ = run(config, tmp / f"{path}-{i}")
                figures[path] = cadence(tmp / f"{path}-{i}")
                print(f"{path:16s} wall {wall:7.2f} s  batch {summary['batch_elapsed_s']:7.3f} s  "
                      f"decode steps {summary['decode_steps']}  tokens {summary['tokens_returned']}/{summary['tokens_expected']}  "
                      f"throughput {summary['throughput_tok_s']:.1f} tok/s  TPOT {summary['effective_tpot_ms']:.3f} ms")
                print(f"{'':16s} cadence p50 per rank (ms): "
                      + " ".join(f"{r}:{v:.2f}" for r, v in figures[path]["per_rank_p50_ms"].items())
                      + f"  median {figures[path]['median_ms']:.2f} ms  overlapped pairs {figures[path]['overlapped']}")
            ratios.append(figures["device-resident"]["median_ms"] / figures["host-shared"]["median_ms"])
        print(f"cadence ratio device-resident / host-shared: {', '.join(f'{r:.2f}' for r in ratios)} "
              f"(median {statistics.median(ratios):.2f}, target >= 1.5)")
        # Profiling off and on alternate, so that a change in machine load hits both alike.
        batch: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[float]] = {False: [], True: []}
        for i in range(args.repeats):
            for profile in (False, True):
                config = RuntimeConfig.from_preset(args.preset, profile=profile)
                summary, _, cpu_s = run(config, tmp / f"overhead-{profile}-{i}")
                batch[profile].append(summary["batch_elapsed_s"])
                cpu[profile].append(cpu_s)
        for profile in (False, True):
            print(f"profiling {'on ' if profile else 'off'}: batch {', '.join(f'{t:.3f}' for t in batch[profile])} s, "
                  f"rank CPU {', '.join(f'{t:.2f}' for t in cpu[profile])} s")
        wall_overhead = 100 * (min(batch[True]) / min(batch[False]) - 1)
        cpu_overhead = 100 * (statistics.median(cpu[True]) / statistics.median(cpu[False]) - 1)
        print(f"profiler overhead: batch time (min of {args.repeats}) {wall_overhead:+.1f}%, "
              f"rank CPU time (median) {cpu_overhead:+.1f}% (target <= 5%)")
        # The emitters' own cost, from what one profiled run wrote: steadier than run-to-run timing.
        profiled = tmp / "overhead-True-0"
        records = (profiled / "server.log").read_text().count("[STRACE]")
        events = len(json.loads((profiled / "serving-trace" / "trace.json").read_text())["traceEvents"])
        strace_us, sa_us = emitter_costs_us(tmp)
        emit_s = (records * strace_us + events * sa_us) / 1e6
        print(f"emitter cost: {records} STRACE records x {strace_us:.1f} us + {events} SA_PROFILE events x {sa_us:.1f} us "
              f"= {emit_s:.3f} s = {100 * emit_s / statistics.median(cpu[False]):.1f}% of the ranks' CPU time")

if __name__ == "__main__":
    main()
