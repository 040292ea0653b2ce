"""Time ``dsprof analyze --steps A:B`` on a span dataset: a 1,000-step window read and analysed, beside the whole run.

Target (issue 20, "Windows"): on the 64 x 100,000 dataset (57.8M spans from
14.8 GB of log) the 1,000-step window is read and analysed in under 5 s, the
whole command (outputs written) printed beside it; ``--check`` reads the
window again from far more row groups (or all) and compares the figures, so
pruning changes what is read, never a figure.

Shapes:

* default: 64 x 10,000, generated in a temporary folder (a minute);
* ``--large`` (or ``DSPROF_BENCH_LARGE=1``): 64 x 100,000 (14.8 GB of log: 7 min to generate and 4 min to
  ingest on a shared 2-core machine, done once and reused from ``--keep``,
  default /work/runs/b64x100k).

Each timing runs in a child process (``analyze`` as the command) or in this
one (the window's read and figures through :func:`analyze_paths`, the part
the target is about; outputs are the same for any window of 1,000 steps).

    .venv/bin/python benchmarks/bench_window.py [--large] [--keep DIR] [--steps 50000:50999] [--full] [--check STEPS]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from child_process import run_child

from dsprof.analysis import window_cut
from dsprof.analysis.store.dataset import open_dataset
from dsprof.analysis.window import parse_window
from dsprof.analysis.window_cut import cut_trace
from dsprof.commands.analysis_job import analyze_paths
from dsprof.testing.synthetic import SyntheticRun

DSPROF = Path(sys.executable).with_name("dsprof")
TARGET_S = 5.0
LARGE_DIR = Path("/work/runs/b64x100k")


def dataset(base: Path, ranks: int, steps: int) -> Path:
    """``base/spans``: the span dataset of a synthetic run with host evidence, generated and ingested once."""
    run, spans = base / "run", base / "spans"
    if not (run / "server.log").exists():
        started = time.perf_counter()
        SyntheticRun(ranks=ranks, steps=steps, host_evidence=True, sa_worker_spans=False).write(run)
        print(f"  generated {ranks} x {steps}: {(run / 'server.log').stat().st_size / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s")
    if not (spans / "dataset.json").exists():
        measured = run_child([str(DSPROF), "ingest", str(run), "-o", f"{spans}/"])
        print(f"  ingested: {measured.seconds:.0f} s, peak RSS {measured.peak_rss_mib / 1024:.2f} GB")
    return spans


def time_window(spans: Path, steps: str) -> dict:
    """The window's read (row groups read of all) and its figures, in this process."""
    spec = parse_window(steps)
    assert spec is not None
    started, cpu = time.perf_counter(), time.process_time()
    outcome = analyze_paths([spans], None, window=spec)
    analysed_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    outcome.result.engine.close()
    started = time.perf_counter()
    _, _, facts = cut_trace(open_dataset(spans), spec)
    read_s = time.perf_counter() - started
    return {"read_s": read_s, "analysed_s": analysed_s, "cpu_s": cpu_s, "facts": facts, "summary": outcome.summary}


def wide_margin_figures(spans: Path, steps: str, margin: int) -> dict:
    """The same window read with row groups ``margin`` steps either side (``1 << 62``: every row group):
    the figures the pruned read must give."""
    spec = parse_window(steps)
    keep = window_cut.MARGIN_STEPS
    window_cut.MARGIN_STEPS = margin
    try:
        outcome = analyze_paths([spans], None, window=spec)
    finally:
        window_cut.MARGIN_STEPS = keep
    outcome.result.engine.close()
    return outcome.summary


FIGURES = ("figures", "per_step", "late_starts", "tail_steps", "slow_steps", "what_if", "trends", "tail_cost")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--large", action="store_true", help="the 64 x 100,000 dataset (14.8 GB of log)")
    parser.add_argument("--keep", type=Path, help=f"generate and keep the inputs here (default with --large: {LARGE_DIR})")
    parser.add_argument("--steps", help="the window (default: 1,000 steps in the middle of the run)")
    parser.add_argument("--full", action="store_true", help="also time the whole run's analyze, for the ratio")
    parser.add_argument(
        "--check",
        type=int,
        metavar="STEPS",
        help="also read the window with this margin (e.g. 5000; 0: every row group) and compare the figures",
    )
    args = parser.parse_args()
    args.large = args.large or os.environ.get("DSPROF_BENCH_LARGE") == "1"  # as bench_analyze.py
    ranks, steps = 64, 100_000 if args.large else 10_000
    base = args.keep or (LARGE_DIR if args.large else Path(tempfile.mkdtemp(prefix="dsprof-bench-window-")))
    window = args.steps or f"{steps // 2}:{steps // 2 + 999}"
    try:
        print(f"== {ranks} x {steps:,}: analyze --steps {window}; target < {TARGET_S:.0f} s")
        spans = dataset(base, ranks, steps)
        result = time_window(spans, window)
        cpu_s = result["cpu_s"]
        facts = result["facts"]
        print(
            f"  window read: {result['read_s']:.2f} s ({facts.row_groups_read} of {facts.row_groups} row groups, {facts.invocations:,} invocations)"
        )
        print(f"  window read and figures (analyze_paths, no outputs): {result['analysed_s']:.2f} s wall, {cpu_s:.2f} s CPU")
        ok = result["analysed_s"] < TARGET_S
        print(f"  {'meets' if ok else 'misses'} the {TARGET_S:.0f} s target")
        out = base / "out-window"
        shutil.rmtree(out, ignore_errors=True)
        command = run_child([str(DSPROF), "analyze", str(spans), "--steps", window, "-o", str(out)])
        print(
            f"  dsprof analyze --steps (all outputs written): {command.seconds:.1f} s wall, peak RSS {command.peak_rss_mib / 1024:.2f} GB"
        )
        if args.check is not None:
            margin = args.check or 1 << 62
            started = time.perf_counter()
            wide = wide_margin_figures(spans, window, margin)
            same = {k: result["summary"][k] for k in FIGURES} == {k: wide[k] for k in FIGURES}
            what = "every row group" if not args.check else f"row groups within {args.check:,} steps"
            print(f"  figures equal to those read from {what} ({time.perf_counter() - started:.0f} s): {'yes' if same else 'NO'}")
        if args.full:
            out = base / "out-full"
            shutil.rmtree(out, ignore_errors=True)
            whole = run_child([str(DSPROF), "analyze", str(spans), "-o", str(out)])
            print(
                f"  whole run: {whole.seconds:.1f} s wall, peak RSS {whole.peak_rss_mib / 1024:.2f} GB; "
                f"the window takes {command.seconds / whole.seconds:.1%} of it"
            )
    finally:
        if args.keep is None and not args.large:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
