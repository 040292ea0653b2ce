"""Benchmark of the bundled runtime on this machine: profiler overhead, injected-fault costs, pipeline cadence.

Sections (``--sections``, default all):

* ``overhead`` — the production shape (SPEC §4) with profiling off, profiling
  on without host evidence, and profiling on with host evidence (the default),
  interleaved ``--repeats`` times so that load from other jobs hits all three
  alike. Prints batch time and the rank processes' CPU time per setting, the
  overheads side by side (target: profiling with evidence ≤ 5% over off), and
  the emitters' own cost (records written × measured cost per record) as a
  share of the ranks' CPU time — the figure that does not move with load.
* ``faults`` — one demo run per fault kind (30 ms faults), and for every
  injected event the evidence of its mechanism on the rank and step
  faults.json names (run-queue wait of the device for cpu_contention, the
  host.gc span for gc_pause, bind CPU for slow_bind, device CPU over the
  other rank's for straggler, fence wait for fence_delay) and what it cost
  the run: the two step intervals from the event's step on, over twice the
  median interval of steps without events.
* ``cadence`` — the median cadence per rank for both metadata paths and their
  ratio (target device-resident / host-shared ≥ 1.5), read with the analysis
  (skipped, saying why, when the analysis does not import).

    .venv/bin/python benchmarks/bench_runtime.py [--sections overhead,faults,cadence] [--repeats N] [--preset production]
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

import duckdb

from dsprof.analysis.ingest import read_paths
from dsprof.profiler import artifacts, sa_profile, strace
from dsprof.profiler import strace_format as fmt
from dsprof.runtime.config import RuntimeConfig
from dsprof.runtime.launch import run_workload

FAULT_MS = 30
# specs per fault kind; p small enough that most events are three steps from the next one
FAULT_SPECS = {
    "cpu_contention": [f"cpu_contention:rank=1,p=0.15,ms={FAULT_MS}"],
    "gc_pause": [f"gc_pause:rank=1,p=0.15,ms={FAULT_MS}"],
    "slow_bind": [f"slow_bind:rank={step % 2},ms={FAULT_MS},step={step}" for step in (10, 20, 30, 40, 50)],
    "fence_delay": [f"fence_tail:p=0.15,ms={FAULT_MS}"],
    "straggler": [f"straggler:rank=1,ms={FAULT_MS}"],
}
SETTINGS = {"profiling off": {"profile": False}, "evidence off": {"host_evidence": False}, "evidence on": {}}


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


# -- overhead ------------------------------------------------------------------------------------


def emitter_costs_us(tmp: Path) -> dict[str, float]:
    """Measured cost in this process of one STRACE root record, the evidence of one span, and one SA_PROFILE span (µs)."""
    fd = os.open(os.devnull, os.O_WRONLY)
    strace.set_host_evidence(True)
    strace.enable(fd, gc_spans=False)
    sa_profile.configure(tmp / "emitter-cost", "e2e,kernel")
    n = 20000
    costs = {}
    started = time.process_time_ns()
    for i in range(n):
        strace.record(
            fmt.ROOT,
            inv=i,
            hid="0123456789abcdef",
            depth=0,
            ts_ns=i,
            dur_ns=1,
            run_id=i,
            dispatch_id=i,
            run_epoch=i,
            slot_id=0,
            generation=i,
            rank=0,
            device="cpu:0",
            callable=fmt.DECODE_CALLABLE,
            step=i,
        )
    costs["record"] = (time.process_time_ns() - started) / n / 1000
    # what evidence adds to a record the lane writes: one sample at the boundary, four attributes
    started = time.process_time_ns()
    previous = strace.host_sample()
    for i in range(n):
        sample = strace.host_sample()
        strace.record(fmt.BIND, inv=i, hid="0123456789abcdef", depth=1, ts_ns=i, dur_ns=1, **strace.evidence(previous, sample))
        previous = sample
    costs["evidence"] = (time.process_time_ns() - started) / n / 1000 - _plain_record_us(n)
    started = time.process_time_ns()
    for i in range(n):
        with sa_profile.span("kernel.verify", "kernel", step=i):
            pass
    costs["sa_profile"] = (time.process_time_ns() - started) / n / 1000
    strace.disable()
    sa_profile.shutdown()
    os.close(fd)
    return costs


def _plain_record_us(n: int) -> float:
    started = time.process_time_ns()
    for i in range(n):
        strace.record(fmt.BIND, inv=i, hid="0123456789abcdef", depth=1, ts_ns=i, dur_ns=1)
    return (time.process_time_ns() - started) / n / 1000


def overhead(args, tmp: Path) -> None:
    batch: dict[str, list[float]] = {name: [] for name in SETTINGS}
    cpu: dict[str, list[float]] = {name: [] for name in SETTINGS}
    names = list(SETTINGS)
    for i in range(args.repeats):
        # interleaved, and in a rotated order: load changes and drift within a repeat hit every setting alike
        for name in names[i % len(names) :] + names[: i % len(names)]:
            config = RuntimeConfig.from_preset(args.preset, **SETTINGS[name])
            summary, _, cpu_s = run(config, tmp / f"overhead-{name.replace(' ', '-')}-{i}")
            batch[name].append(summary["batch_elapsed_s"])
            cpu[name].append(cpu_s)
    for name in SETTINGS:
        print(
            f"{name:14s} batch {', '.join(f'{t:.3f}' for t in batch[name])} s (min {min(batch[name]):.3f}), "
            f"rank CPU {', '.join(f'{t:.2f}' for t in cpu[name])} s (median {statistics.median(cpu[name]):.2f})"
        )

    def over(a: str, b: str) -> str:
        return (
            f"batch (min of {args.repeats}) {100 * (min(batch[a]) / min(batch[b]) - 1):+.1f}%, "
            f"rank CPU (median) {100 * (statistics.median(cpu[a]) / statistics.median(cpu[b]) - 1):+.1f}%"
        )

    print(f"host evidence on vs off:       {over('evidence on', 'evidence off')}")
    print(f"profiling (evidence on) vs off: {over('evidence on', 'profiling off')} (target <= 5%)")
    print(f"profiling (evidence off) vs off: {over('evidence off', 'profiling off')}")
    # The emitters' own cost, from what one profiled run wrote: steadier than run-to-run timing.
    profiled = tmp / "overhead-evidence-on-0"
    log = (profiled / artifacts.SERVER_LOG).read_text()
    records, with_evidence = log.count("[STRACE]"), log.count(f" {fmt.OS_CPU_NS}=")
    gc_records = log.count(f" name={fmt.GC} ")
    events = len(json.loads((profiled / artifacts.SERVING_TRACE_DIR / artifacts.MERGED_TRACE).read_text())["traceEvents"])
    costs = emitter_costs_us(tmp)
    emit_s = (records * costs["record"] + events * costs["sa_profile"]) / 1e6
    evidence_s = with_evidence * costs["evidence"] / 1e6
    ranks_cpu = statistics.median(cpu["profiling off"])
    print(
        f"emitter cost: {records} STRACE records ({gc_records} host.gc) x {costs['record']:.1f} us + {events} SA_PROFILE "
        f"events x {costs['sa_profile']:.1f} us = {emit_s:.3f} s = {100 * emit_s / ranks_cpu:.1f}% of the ranks' CPU time; "
        f"host evidence on {with_evidence} records x {costs['evidence']:.1f} us = {evidence_s:.3f} s = "
        f"{100 * evidence_s / ranks_cpu:.2f}%"
    )


# -- faults --------------------------------------------------------------------------------------

# Per (rank, step) of the decode roots: runner_run's end, and the evidence of each phase, joined on (pid, inv).
_STEP_TABLE = f"""
WITH roots AS (SELECT pid, inv, rank, step FROM spans WHERE name = '{fmt.ROOT}' AND callable = '{fmt.DECODE_CALLABLE}'),
     phase AS (SELECT pid, inv, name, ts_ns, dur_ns, os_cpu_ns, os_rq_ns FROM spans)
SELECT r.rank, r.step, r.pid,
       max(p.ts_ns + p.dur_ns) FILTER (WHERE p.name = '{fmt.RUNNER_RUN}') AS runner_end,
       max(p.os_cpu_ns) FILTER (WHERE p.name = '{fmt.BIND}') AS bind_cpu,
       max(p.ts_ns) FILTER (WHERE p.name = '{fmt.FENCE_WAIT}') AS fence_ts,
       max(p.dur_ns) FILTER (WHERE p.name = '{fmt.FENCE_WAIT}') AS fence_dur,
       max(p.dur_ns) FILTER (WHERE p.name = '{fmt.DEVICE_WALL}') AS device_dur,
       max(p.os_cpu_ns) FILTER (WHERE p.name = '{fmt.DEVICE_WALL}') AS device_cpu,
       max(p.os_rq_ns) FILTER (WHERE p.name = '{fmt.DEVICE_WALL}') AS device_rq
FROM roots r JOIN phase p USING (pid, inv)
GROUP BY r.rank, r.step, r.pid
"""


def read_steps(log: Path) -> tuple[dict, list, dict[int, int]]:
    """A run's decode steps per (rank, step), its host.gc spans, and the interval between consecutive step ends."""
    con = duckdb.connect()
    con.register("spans", read_paths([log]).spans)
    steps = {(rank, step): row for rank, step, *row in con.execute(_STEP_TABLE).fetchall()}
    gcs = con.execute(f"SELECT pid, ts_ns, dur_ns FROM spans WHERE name = '{fmt.GC}'").fetchall()
    ends: dict[int, int] = {}
    for (_, step), row in steps.items():
        ends[step] = max(ends.get(step, 0), row[1])
    return steps, gcs, {step: ends[step] - ends[step - 1] for step in ends if step - 1 in ends}


def fault_costs(log: Path, faults: list[dict], clean_interval_ns: float) -> list[tuple[int, int, float, float]]:
    """(rank, step, evidence ms, run cost ms) per injected event that has no other event near it.

    The cost is what the intervals ending at steps s-1, s and s+1 took beyond
    three clean intervals, clean meaning the median interval of this run's steps
    without an event near them: a late bind of step s also delays the drain of
    s-1 (one host thread), and a late run delays its successor through the
    depth-2 pipeline. A straggler hits every step, so its cost is its own
    step's excess over ``clean_interval_ns`` (the median of a run without faults).
    The evidence of a fence delay is the fence wait's excess over the rank's median.
    """
    steps, gcs, intervals = read_steps(log)
    hit = {f["step"] for f in faults}
    quiet = [dur for step, dur in intervals.items() if not {step - 1, step, step + 1} & hit]
    baseline = statistics.median(quiet) if quiet else clean_interval_ns
    fence_median = {rank: statistics.median(row[4] for (r, _), row in steps.items() if r == rank) for rank, _ in steps}
    found = []
    for fault in faults:
        kind, rank, step = fault["kind"], fault["rank"], fault["step"]
        window = (step - 1, step, step + 1)
        if kind != "straggler" and ({step - 3, step - 2, step - 1, step + 1, step + 2} & hit or not set(window) <= set(intervals)):
            continue  # another event nearby would be counted here too (or the window leaves the run)
        pid, _, bind_cpu, fence_ts, fence_dur, _, device_cpu, device_rq = steps[(rank, step)]
        evidence = {
            "cpu_contention": device_rq,
            "gc_pause": sum(dur for gc_pid, ts, dur in gcs if gc_pid == pid and fence_ts <= ts <= fence_ts + fence_dur),
            "slow_bind": bind_cpu,
            "straggler": device_cpu - steps[(1 - rank, step)][6],
            "fence_delay": fence_dur - fence_median[rank],
        }[kind]
        if kind == "straggler":
            cost = intervals.get(step, baseline) - clean_interval_ns
        else:
            cost = sum(intervals[k] for k in window) - len(window) * baseline
        found.append((rank, step, evidence / 1e6, cost / 1e6))
    return found


def faults(args, tmp: Path) -> None:
    print(f"injected {FAULT_MS} ms faults, demo shape on 2 ranks: evidence of the mechanism and the cost to the run per event")

    def config(inject: list[str]) -> RuntimeConfig:
        return RuntimeConfig.from_preset("demo", ranks=2, requests=4, output_tokens=200, seed=1, inject=inject)

    run(config([]), tmp / "faults-none")
    baseline_ns = statistics.median(read_steps(tmp / "faults-none" / artifacts.SERVER_LOG)[2].values())
    print(f"{'no fault':15s} step interval median {baseline_ns / 1e6:.1f} ms (the baseline of the costs below)")
    for kind, specs in FAULT_SPECS.items():
        out = tmp / f"faults-{kind}"
        run(config(specs), out)
        truth = json.loads((out / artifacts.FAULTS).read_text())["faults"]
        found = fault_costs(out / artifacts.SERVER_LOG, truth, baseline_ns)
        if not found:
            print(f"{kind:15s} no isolated event")
            continue
        if args.verbose:
            for rank, step, evidence_ms, cost_ms in found:
                print(f"{'':15s} rank {rank} step {step:3d}: evidence {evidence_ms:6.1f} ms, run cost {cost_ms:6.1f} ms")
        evidence = [e for _, _, e, _ in found]
        cost = [c for _, _, _, c in found]
        print(
            f"{kind:15s} {len(found):3d} events  evidence median {statistics.median(evidence):6.1f} ms "
            f"[{min(evidence):.1f}..{max(evidence):.1f}]  run cost median {statistics.median(cost):6.1f} ms "
            f"[{min(cost):.1f}..{max(cost):.1f}]  ({truth[0]['mechanism']}, {truth[0]['phase']})"
        )


# -- cadence -------------------------------------------------------------------------------------


def cadence(args, tmp: Path) -> None:
    try:
        from dsprof.analysis.analyze import analyze_trace
    except ImportError as error:
        print(f"cadence: skipped, the analysis does not import on this branch ({error})")
        return
    ratios = []
    for i in range(args.repeats):
        medians = {}
        for path in ("host-shared", "device-resident"):  # alternating, so that load changes hit both alike
            out = tmp / f"{path}-{i}"
            summary, wall, _ = run(RuntimeConfig.from_preset(args.preset, metadata=path), out)
            result = analyze_trace(read_paths([out / artifacts.SERVER_LOG]))
            figures = result.summary["pipeline"]
            result.engine.close()
            per_rank = {rank: block["p50"] for rank, block in sorted(figures["cadence_ms"].items(), key=lambda kv: int(kv[0]))}
            medians[path] = statistics.median(per_rank.values())
            print(
                f"{path:16s} wall {wall:7.2f} s  batch {summary['batch_elapsed_s']:7.3f} s  decode steps {summary['decode_steps']}  "
                f"cadence p50 median {medians[path]:.2f} ms  overlapped pairs {figures['pairs_overlapped']}/{figures['pairs_checked']}"
            )
        ratios.append(medians["device-resident"] / medians["host-shared"])
    print(
        f"cadence ratio device-resident / host-shared: {', '.join(f'{r:.2f}' for r in ratios)} "
        f"(median {statistics.median(ratios):.2f}, target >= 1.5)"
    )


SECTIONS = {"overhead": overhead, "faults": faults, "cadence": cadence}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="production", help="shape of the overhead and cadence runs")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per setting")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    parser.add_argument("--verbose", action="store_true", help="faults: print every event")
    args = parser.parse_args()
    with open("/proc/loadavg") as load:
        print(f"load average at start: {load.read().split()[0]} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="bench_runtime_") as tmp:
        for section in args.sections.split(","):
            print(f"== {section}")
            SECTIONS[section.strip()](args, Path(tmp))


if __name__ == "__main__":
    main()
