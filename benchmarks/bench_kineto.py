"""Kineto traces: dsprof's device-time breakdown and load against Holistic Trace Analysis (HTA), side by side.

Inputs: a directory of per-rank Kineto traces (``--traces DIR``), or traces it
makes: ``--torch-job`` runs the 4-rank gloo job of ``dsprof.testing.kineto_job``
under torch.profiler (CPU: no device activities, so only the load is
compared), ``--synthetic`` writes ``--ranks`` per-rank traces of about
``--mb`` MB each with GPU-shaped kernels (compute, NCCL, memcpy), their
launches and correlations, for the breakdown too.

Measured, each in its own process (``child_process.run_child``: wall time,
and the peak memory of that process and the workers it starts together, as
PSS): dsprof reading the traces
(``read_inputs``, as ``dsprof analyze`` reads: into a span dataset on disk past
``SPILL_BYTES`` of weight), and, when ``--hta PYTHON`` names the interpreter of a
separate virtualenv with ``pip install holistictraceanalysis`` (never dsprof's
own), HTA's ``TraceAnalysis(trace_dir=...)`` load. Then each rank's idle,
compute and non-compute time from dsprof's ``device_time.ranks`` and from
HTA's ``get_temporal_breakdown``, with their relative difference (target
within 0.5%), and the speed and memory ratios (targets: 3x faster, 1/3 of the
memory).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from child_process import ChildRun, run_child

# every kernel its steps launched: the last step's too (SPEC §1.1's window; HTA leaves it out by default)
HTA_LOAD = "import sys; from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)"
HTA_BREAKDOWN = """import json, sys
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
df = analysis.get_temporal_breakdown(visualize=False)
print(json.dumps(df.to_dict(orient="records"), default=float))"""
# what `dsprof analyze` does to read its inputs: in memory, or, past SPILL_BYTES of weight, into a span dataset on disk
DSPROF_LOAD = (
    "import sys; from dsprof.commands.analysis_job import read_inputs; from dsprof.tempdirs import remove_owned_dir; "
    "trace, spill = read_inputs([sys.argv[1]]); remove_owned_dir(spill)"
)


def synthetic_rank(rank: int, ranks: int, target_bytes: int, seed: int) -> dict:
    """One rank's trace: steps of compute kernels, a memcpy and an NCCL all-to-all, each launched from the host.

    Times are whole microseconds, as HTA reads them (it rounds ``ts`` down to the µs).
    """
    rng = random.Random(seed * 1000 + rank)
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
    ]
    t, correlation, step, size = 1000, 0, 0, 0
    while size < target_bytes:
        start, device_t = t, t + 5
        for k in range(40):
            correlation += 1
            name, cat, dur = (
                ("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 4) if k == 0 else ("sm90_gemm_kernel", "kernel", rng.randint(5, 40))
            )
            if k == 39:
                name, dur = "ncclDevKernel_AllToAll_RING_LL(ncclDevComm*)", rng.randint(20, 80)
            launch = {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": t,
                "dur": 2.0,
                "args": {"correlation": correlation, "External id": correlation},
            }
            device_t = max(device_t, t + 3) + rng.choice((0, 0, rng.randint(1, 30)))  # gaps: the device idles
            kernel = {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 0,
                "tid": 7,
                "ts": device_t,
                "dur": dur,
                "args": {"device": 0, "stream": 7, "correlation": correlation, "External id": correlation},
            }
            events += [launch, kernel]
            device_t += dur
            t += 3
        t = max(t, device_t) + rng.randint(1, 10)
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": 1,
                "tid": 1,
                "ts": start,
                "dur": t - start,
                "args": {},
            }
        )
        step += 1
        size += 40 * 2 * 260
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "synthetic"}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": ranks},
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "traceEvents": events,
    }


def write_synthetic(directory: Path, ranks: int, mb: float) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        (directory / f"rank{rank}.pt.trace.json").write_text(json.dumps(synthetic_rank(rank, ranks, int(mb * 1e6), 7)))


def dsprof_breakdown(directory: Path) -> dict[str, dict[str, float]]:
    from dsprof.analysis.analyze import analyze_trace
    from dsprof.analysis.ingest import read_paths

    result = analyze_trace(read_paths([directory]))
    try:
        return dict(result.summary.get("device_time", {}).get("ranks", {}))
    finally:
        result.engine.close()


def _memory(run: ChildRun) -> str:
    """Both readings: HTA parses ranks in a pool of worker processes, so its tree holds more than its largest process."""
    return f"PSS of the process tree {run.peak_tree_pss_mib:.0f} MiB (largest process's RSS {run.peak_rss_mib:.0f} MiB)"


def compare(directory: Path, hta: str | None) -> None:
    size = sum(p.stat().st_size for p in directory.glob("*.json")) / 2**20
    print(f"traces: {directory} ({len(list(directory.glob('*.json')))} files, {size:.1f} MiB)")
    ours = run_child([sys.executable, "-c", DSPROF_LOAD, str(directory)], tree=True)
    print(f"dsprof read_inputs (as analyze reads): {ours.seconds:.2f} s, peak {_memory(ours)}")
    breakdown = dsprof_breakdown(directory)
    if hta is None:
        print("HTA: not given (--hta PYTHON of a virtualenv with holistictraceanalysis)")
        for rank, figures in sorted(breakdown.items()):
            print(f"rank {rank}: {figures}")
        return
    theirs = run_child([hta, "-c", HTA_LOAD, str(directory)], tree=True)
    print(f"HTA TraceAnalysis load: {theirs.seconds:.2f} s, peak {_memory(theirs)}")
    share = ours.peak_tree_pss_mib / theirs.peak_tree_pss_mib if theirs.peak_tree_pss_mib else float("nan")
    print(f"speed: {theirs.seconds / ours.seconds:.2f}x (target >= 3x); memory (process trees): {share:.2f} of HTA's (target <= 0.33)")
    if not breakdown:
        print("breakdown: the traces have no device activities")
        return
    records = json.loads(subprocess.run([hta, "-c", HTA_BREAKDOWN, str(directory)], check=True, capture_output=True, text=True).stdout)
    worst = 0.0
    for record in sorted(records, key=lambda r: int(r["rank"])):
        ours_rank = breakdown[str(int(record["rank"]))]
        line = []
        for figure, column in (
            ("idle_ms", "idle_time(us)"),
            ("compute_ms", "compute_time(us)"),
            ("non_compute_ms", "non_compute_time(us)"),
        ):
            theirs_ms = float(record[column]) / 1000
            difference = abs(ours_rank[figure] - theirs_ms) / max(theirs_ms, 1e-9)
            worst = max(worst, difference)
            line.append(f"{figure} {ours_rank[figure]:.3f} vs {theirs_ms:.3f} ({difference:.3%})")
        print(f"rank {int(record['rank'])}: " + ", ".join(line))
    print(f"breakdown: worst relative difference {worst:.3%} (target <= 0.5%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--traces", type=Path, help="a directory of per-rank Kineto traces")
    source.add_argument("--torch-job", action="store_true", help="run the 4-rank gloo job under torch.profiler (CPU)")
    source.add_argument("--synthetic", action="store_true", help="write GPU-shaped per-rank traces")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--mb", type=float, default=100.0, help="--synthetic: MB per rank")
    parser.add_argument("--steps", type=int, default=200, help="--torch-job: profiled steps")
    parser.add_argument("--keep", type=Path, help="write (and reuse) the generated traces here")
    parser.add_argument("--hta", help="the python of a virtualenv with holistictraceanalysis installed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-kineto-") as scratch:
        directory = args.traces or args.keep or Path(scratch) / "traces"
        if args.synthetic and not any(directory.glob("*.json")):
            write_synthetic(directory, args.ranks, args.mb)
        elif args.torch_job and not any(directory.glob("*.json")):
            from dsprof.testing.kineto_job import run_job

            run_job(directory, ranks=4, steps=args.steps, faults={}, ops=200, timeout=3600)
        compare(directory, args.hta)


if __name__ == "__main__":
    main()
