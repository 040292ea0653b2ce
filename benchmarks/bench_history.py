"""Change points over a run history: accuracy on simulated series and the speed of ``dsprof history check`` (issue 29).

**accuracy**: Hunter's evaluation method. ``--series`` (200) series of ``--runs``
(40) runs around 100 with Gaussian noise of ``--noise`` (3%); every other series
gets one step change of 5-20% (up or down, size and sign uniform) whose first
run after the change is uniform over runs ``--first-change`` (3) .. 39: dsprof
needs a level of 3 runs (``change_points.MIN_LEVEL_RUNS``) before a change. A detection within ±1 run of the
true change is a true positive (one per series); every other detection is a
false positive. ``--repeats`` (5) such sets, seeds ``--seed`` (29) on, are
scored together: one set has only 100 changes, and its recall moves by ±0.05
from seed to seed. Targets: precision and recall >= 0.9. ``--detector`` picks the
library: ``dsprof`` (ruptures + t-test, what dsprof uses), ``ruptures-only``
(the same segmentation without the t-test), ``spa`` (MongoDB's
signal-processing-algorithms, E-divisive) or ``otava`` (Apache Otava, Hunter's
windowed E-divisive + t-test). The last two do not install beside dsprof's
numpy and scipy (docs/GATE_RULES.md): run them with a Python that has them,
e.g. ``/tmp/spa/bin/python benchmarks/bench_history.py --detector spa``.

**contention** (real runs, minutes): the subtle regression. ``--healthy`` (10)
runs of the bundled runtime (production preset, 2 ranks, 8 requests x 64
tokens), then ``--faulty`` (3) with ``--fault`` (``cpu_contention:rank=1,p=1,ms=0.5``),
each added to a history and gated with ``examples/ci-rules.toml``. Prints, per
faulty run, whether the shipped rules pass it and the changes for the worse
that ``history check`` locates at the first faulty run. Target: located at the
first faulty run while the shipped rules pass every faulty run.

**speed**: a store of ``--store-runs`` (1,000) runs x ``--figures`` (40) figures,
built through the history store's own add, then ``check_history`` over every
figure, timed. Target: under 5 s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

Detector = Callable[[np.ndarray], list[int]]


def simulated_series(count: int, runs: int, noise: float, seed: int, first: int = 3) -> list[tuple[np.ndarray, int | None]]:
    """``(series, index of the first run after the step or None)``; the same seed gives the same series."""
    rng = np.random.default_rng(seed)
    out: list[tuple[np.ndarray, int | None]] = []
    for i in range(count):
        series = 100.0 * (1.0 + noise * rng.standard_normal(runs))
        if i % 2:
            at = int(rng.integers(first, runs))
            step = rng.uniform(0.05, 0.20) * rng.choice([-1.0, 1.0])
            series[at:] += 100.0 * step
            out.append((series, at))
        else:
            out.append((series, None))
    return out


def score(cases: list[tuple[np.ndarray, int | None]], detect: Detector) -> tuple[float, float, int, int, int]:
    """Precision, recall, true positives, false positives, missed."""
    tp = fp = missed = 0
    for series, truth in cases:
        found = detect(series)
        hit = truth is not None and any(abs(index - truth) <= 1 for index in found)
        tp += hit
        fp += len(found) - hit
        missed += truth is not None and not hit
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + missed) if tp + missed else 1.0
    return precision, recall, tp, fp, missed


def _detector(name: str, checked: int = 1) -> Detector:
    if name == "dsprof":
        from dsprof.analysis.policy.change_points import ALPHA, change_points

        return lambda series: [c.index for c in change_points(series, alpha=ALPHA / checked)]
    if name == "ruptures-only":
        import ruptures

        from dsprof.analysis.policy.change_points import PENALTY_PER_LOG_N, noise_scale

        def segment(series: np.ndarray) -> list[int]:
            scaled = ((series - np.median(series)) / noise_scale(series)).reshape(-1, 1)
            return ruptures.KernelCPD(kernel="linear", min_size=1).fit(scaled).predict(pen=PENALTY_PER_LOG_N * np.log(series.size))[:-1]

        return segment
    if name == "spa":
        from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive

        return lambda series: sorted(e_divisive(series, pvalue=0.01, permutations=100))
    if name == "otava":
        from otava.analysis import compute_change_points

        return lambda series: sorted(cp.index for cp in compute_change_points(series.tolist(), window_len=30, max_pvalue=0.001)[0])
    raise SystemExit(f"unknown detector {name!r}")


def accuracy(args: argparse.Namespace) -> bool:
    cases = [
        case for seed in range(args.seed, args.seed + args.repeats) for case in simulated_series(args.series, args.runs, args.noise, seed)
    ]
    detect = _detector(args.detector, args.checked)
    started = time.perf_counter()
    precision, recall, tp, fp, missed = score(cases, detect)
    elapsed = time.perf_counter() - started
    met = precision >= 0.9 and recall >= 0.9
    print(
        f"accuracy [{args.detector}, {args.checked} figure(s) checked] {args.repeats} x {args.series} series x {args.runs} runs, {args.noise:.0%} noise: "
        f"precision {precision:.3f}, recall {recall:.3f} (tp {tp}, fp {fp}, missed {missed}) in {elapsed:.2f} s "
        f"-- target precision and recall >= 0.9: {'met' if met else 'NOT met'}"
    )
    return met


def _fake_summary(rng: np.random.Generator, run: int, figures: int) -> dict:
    """A summary whose figures block holds ``figures`` percentile figures (4 per block), a step in half of them at run 700."""
    blocks = {}
    for b in range(figures // 4):
        level = 10.0 * (1 + b) * (1.1 if b % 2 and run >= 700 else 1.0)
        blocks[f"block{b}_ms"] = {k: float(round(level * (1 + 0.03 * rng.standard_normal()), 3)) for k in ("p50", "p95", "p99", "max")}
    return {"schema": "dsprof.summary/1", "figures": blocks, "run": {"exit_status": 0}, "_run": run}


def speed(args: argparse.Namespace) -> bool:
    from dsprof.analysis.policy.history import HistoryStore, check_history

    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-history-") as tmp:
        store = Path(tmp) / "history.duckdb"
        started = time.perf_counter()
        with HistoryStore.open_for_write(store) as history:
            for run in range(args.store_runs):
                history.add(_fake_summary(rng, run, args.figures), source=f"run{run}", label=f"run{run}", commit=f"{run:040x}")
        built = time.perf_counter() - started
        started = time.perf_counter()
        result = check_history(store, newest=5)
        elapsed = time.perf_counter() - started
    met = elapsed < 5.0
    print(
        f"speed: store of {args.store_runs} runs x {args.figures} figures built in {built:.1f} s; "
        f"check over {len(result.series)} figures: {elapsed:.2f} s, {len(result.change_points)} change point(s) "
        f"-- target < 5 s: {'met' if met else 'NOT met'}"
    )
    return met


def _dsprof(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsprof.cli.main", *args], capture_output=True, text=True, check=False)


def contention(args: argparse.Namespace) -> bool:
    from dsprof.analysis.policy.history import add_run, check_history

    shape = ("--preset", "production", "--ranks", "2", "--requests", "8", "--output-tokens", "64", "--seed", "1")
    rules = Path(__file__).resolve().parents[1] / "examples" / "ci-rules.toml"
    rules_pass = True
    found: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-history-") as tmp:
        store = Path(tmp) / "history.duckdb"
        for index in range(args.healthy + args.faulty):
            faulty = index >= args.healthy
            out = Path(tmp) / f"run{index}"
            run = _dsprof("run", *shape, *(("--inject", args.fault) if faulty else ()), "-o", str(out))
            if run.returncode != 0:
                raise SystemExit(f"run {index} failed: {run.stderr[-500:]}")
            add_run(store, out, label=f"run{index}")
            if not faulty:
                continue
            passed = _dsprof("gate", str(out), "--rules", str(rules)).returncode == 0
            found = [c.describe() for c in check_history(store).regressions if c.index == args.healthy]
            rules_pass &= passed
            print(
                f"contention run {index}: shipped rules {'pass' if passed else 'FAIL'}; at the first faulty run: {found or 'nothing yet'}"
            )
        located = bool(found)
    met = located and rules_pass
    print(
        f"contention: located at the first faulty run {located}, shipped rules pass every faulty run {rules_pass} -- {'met' if met else 'NOT met'}"
    )
    return met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="accuracy,speed", help="comma-separated: accuracy, speed")
    parser.add_argument("--detector", default="dsprof", choices=["dsprof", "ruptures-only", "spa", "otava"])
    parser.add_argument(
        "--checked", type=int, default=1, help="figures a check tests together: dsprof's alpha is divided among them, as history check does"
    )
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--noise", type=float, default=0.03)
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--first-change", type=int, default=3, help="the earliest run a simulated change starts at")
    parser.add_argument("--repeats", type=int, default=5, help="sets of --series, seeds --seed, --seed + 1, ...: scored together")
    parser.add_argument("--store-runs", type=int, default=1000)
    parser.add_argument("--figures", type=int, default=40)
    parser.add_argument("--healthy", type=int, default=10)
    parser.add_argument("--faulty", type=int, default=3)
    parser.add_argument("--fault", default="cpu_contention:rank=1,p=1,ms=0.5")
    args = parser.parse_args(argv)
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    met = True
    if "accuracy" in sections:
        met &= accuracy(args)
    if "speed" in sections:
        met &= speed(args)
    if "contention" in sections:
        met &= contention(args)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
