"""``--memory-limit`` bounds the whole analysis, the memory sized by steps included (issue 28 item 8, issue 30 item 3).

Shapes, each generated here (or reused from ``--keep``):

* 1 rank x 1,000,000 steps (11M spans, 2.4 GB of log): every step-sized
  structure at its largest per rank (the replay's host chains, per_step);
* 64 ranks x 30,000 steps (17M spans, 4.4 GB of log).

Each is analysed twice in a child process: without a limit (the engine's
default, a tenth of RAM), and with ``--memory-limit 1GB``. Targets: both
complete, the limited run's peak RSS (``wait4``) stays under 4 GiB, and its
summary.json is the one the unlimited run wrote; 64 x 30k without a limit
under 2.5 GB (issue 30). Peak RSS and wall time of both are printed.

``--cap as`` runs the limited analysis under a 4 GiB address-space cap
(``RLIMIT_AS``, ``ulimit -v``), as issue 28 asks: the log is mapped 256 MiB at
a time and the allocators reserve little beyond what they use
(dsprof/allocators.py), so the cap holds what the analysis uses. ``--cap data``
caps the data segment (``RLIMIT_DATA``) instead.

    .venv/bin/python benchmarks/bench_step_memory.py [--keep DIR] [--only 1x1000000] [--cap data|as]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from child_process import run_child

from dsprof.testing.synthetic import SyntheticRun

DSPROF = Path(sys.executable).with_name("dsprof")
SHAPES = ((1, 1_000_000), (64, 30_000))
LIMIT = "1GB"
CAP_BYTES = 4 << 30
_CAPS = {"data": resource.RLIMIT_DATA, "as": resource.RLIMIT_AS}
TARGET_RSS_GIB = 4
# issue 30: the analysis without a limit, in GB (10**9 bytes) of peak RSS, for the shapes it names
UNLIMITED_TARGET_GB = {(64, 30_000): 2.5}
# sets the cap, then becomes the command (the same process: wait4 measures it)
_CAPPED = "import os, resource, sys; resource.setrlimit({}, ({cap}, {cap})); os.execv(sys.argv[1], sys.argv[1:])"


def generate(directory: Path, ranks: int, steps: int) -> Path:
    if not (directory / "server.log").exists():
        started = time.perf_counter()
        SyntheticRun(ranks=ranks, steps=steps, host_evidence=True, sa_worker_spans=False).write(directory)
        size = (directory / "server.log").stat().st_size
        print(f"  generated {ranks} x {steps:,}: {size / 1e9:.2f} GB of log in {time.perf_counter() - started:.0f} s")
    return directory


def analyze(run: Path, out: Path, *extra: str, cap: int | None = None) -> tuple[str, float, dict | None]:
    """``dsprof analyze`` in a child process (under ``cap``, a resource limit of 4 GiB): its figures, peak RSS (GiB) and
    summary (None: it failed)."""
    shutil.rmtree(out, ignore_errors=True)
    command = [str(DSPROF), "analyze", str(run), "-o", str(out), *extra]
    if cap is not None:
        command = [sys.executable, "-c", _CAPPED.format(cap, cap=CAP_BYTES), *command]
    try:
        measured = run_child(command)
    except SystemExit as failed:
        return f"FAILED: {str(failed.code)[-300:]}", 0.0, None
    summary = json.loads((out / "summary.json").read_text())
    rss = measured.peak_rss_mib / 1024
    return f"{measured.seconds:.0f} s wall, {measured.cpu_s:.0f} s CPU, peak RSS {rss:.2f} GiB", rss, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="generate and keep the inputs here (reused when present)")
    parser.add_argument("--only", help="one shape, RANKSxSTEPS (e.g. 1x1000000)")
    parser.add_argument("--cap", choices=sorted(_CAPS), help="run the limited analysis under a 4 GiB rlimit: data segment or address space")
    args = parser.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="dsprof-bench-step-memory-"))
    base.mkdir(parents=True, exist_ok=True)
    failed = False
    try:
        for ranks, steps in SHAPES:
            if args.only and args.only != f"{ranks}x{steps}":
                continue
            capped = f", {args.cap} rlimit 4 GiB" if args.cap else ""
            print(f"== {ranks} x {steps:,}: without a limit, then --memory-limit {LIMIT}{capped}; target peak RSS < {TARGET_RSS_GIB} GiB")
            run = generate(base / f"r{ranks}x{steps}", ranks, steps)
            figures, unlimited_rss, unlimited = analyze(run, base / "out-unlimited")
            print(f"  no limit: {figures}")
            target = UNLIMITED_TARGET_GB.get((ranks, steps))
            if target is not None:
                met = unlimited is not None and unlimited_rss * 2**30 < target * 1e9
                print(f"  no limit: peak RSS {unlimited_rss * 2**30 / 1e9:.2f} GB {'meets' if met else 'misses'} issue 30's {target} GB")
                failed |= not met
            cap = _CAPS[args.cap] if args.cap else None
            figures, rss, limited = analyze(run, base / "out-limited", "--memory-limit", LIMIT, cap=cap)
            print(f"  --memory-limit {LIMIT}{capped}: {figures}")
            same = unlimited is not None and limited is not None and limited == unlimited
            bounded = limited is not None and rss < TARGET_RSS_GIB
            print(f"  summary.json the same: {'yes' if same else 'NO'}; peak RSS {'meets' if bounded else 'misses'} the target")
            failed |= not same or not bounded
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
