"""Benchmark of the bundled runtime at the production shape (SPEC §4) on this machine.

Prints: wall time and decode steps of a production run, the median cadence per
rank for both metadata paths and their ratio (target device-resident /
host-shared >= 1.5), and the profiler overhead (SA_PROFILE + STRACE on vs
off, target <= 5%) as batch time and as CPU time of the rank processes — the
CPU figure is the steadier one on a shared, loaded machine. Cadence comes from the run's own server.log,
read with the analysis reader (dsprof.analysis).

    .venv/bin/python benchmarks/bench_runtime.py [--repeats N] [--preset production]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from dsprof.analysis.ingest import read_paths
from dsprof.analysis.pipeline import pipeline_figures
from dsprof.analysis.swimlane import build_swimlane
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="production")
    parser.add_argument("--repeats", type=int, default=2, help="runs per profiling setting (the minimum is kept)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_runtime_") as tmp:
        tmp = Path(tmp)
        figures = {}
        for path in ("host-shared", "device-resident"):
            config = RuntimeConfig.from_preset(args.preset, metadata=path)
            summary, wall, _ = run(config, tmp / path)
            figures[path] = cadence(tmp / path)
            print(f"{path:16s} wall {wall:7.2f} s  batch {summary['batch_elapsed_s']:7.3f} s  "
                  f"decode steps {summary['decode_steps']}  tokens {summary['tokens_returned']}/{summary['tokens_expected']}  "
                  f"throughput {summary['throughput_tok_s']:.1f} tok/s  TPOT {summary['effective_tpot_ms']:.3f} ms")
            print(f"{'':16s} cadence p50 per rank (ms): "
                  + " ".join(f"{r}:{v:.2f}" for r, v in figures[path]["per_rank_p50_ms"].items())
                  + f"  median {figures[path]['median_ms']:.2f} ms  overlapped pairs {figures[path]['overlapped']}")
        ratio = figures["device-resident"]["median_ms"] / figures["host-shared"]["median_ms"]
        print(f"cadence ratio device-resident / host-shared: {ratio:.2f} (target >= 1.5)")
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

if __name__ == "__main__":
    main()
