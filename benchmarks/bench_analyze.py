"""Time and peak memory of ``analyze`` (read + figures + summary/combined-swimlane outputs).

Shapes: the production shape (8 ranks x 143 steps = 1144 roots, with the
SA_PROFILE trace and performance summary) and a generated 64 ranks x 10,000
steps run (640,000 roots; the SA_PROFILE trace holds request and per-step
scheduler spans). Targets for the large run: < 60 s and < 8 GB. Linearity:
the large shape at 1/4, 1/2 and full size. Each measurement runs in a fresh
process so its peak RSS is its own.

    .venv/bin/python benchmarks/bench_analyze.py [--steps 10000] [--ranks 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsprof.profiler.synthetic import SyntheticRun

MEASURE = """
import json, resource, sys, time
from dsprof.analysis.analyze import analyze
marks = {}
def progress(message):
    for prefix in ("swimlane:", "writing"):
        if message.startswith(prefix):
            marks.setdefault(prefix, time.perf_counter())
start = time.perf_counter()
result = analyze([sys.argv[1]], sys.argv[2], progress=progress)
end = time.perf_counter()
print(json.dumps({"seconds": end - start, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                  "read_s": marks["swimlane:"] - start, "figures_s": marks["writing"] - marks["swimlane:"],
                  "write_s": end - marks["writing"],
                  "rank_roots": result.summary["validation"]["rank_roots"], "valid": result.summary["validation"]["valid"]}))
"""


def phases(m: dict) -> str:
    return f"(read {m['read_s']:.1f} s, swimlane + figures {m['figures_s']:.1f} s, outputs {m['write_s']:.1f} s)"


def measure(artifacts: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(artifacts), str(out)], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def generate(run: SyntheticRun, where: Path) -> float:
    start = time.perf_counter()
    run.write(where)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dsprof-bench-") as tmp:
        tmp = Path(tmp)
        gen = generate(SyntheticRun(ranks=8, steps=143), tmp / "prod")
        m = measure(tmp / "prod", tmp / "prod-out")
        print(f"production shape 8 x 143: {m['rank_roots']} roots, valid={m['valid']}, "
              f"analyze {m['seconds']:.2f} s {phases(m)}, peak RSS {m['peak_rss_gb']:.2f} GB (generated in {gen:.1f} s)")

        timings = []
        for fraction in (4, 2, 1):
            steps = args.steps // fraction
            where = tmp / f"large-{steps}"
            run = SyntheticRun(ranks=args.ranks, steps=steps, bind_children=False, sa_worker_spans=False,
                               unrelated_lines_per_step=1)
            gen = generate(run, where)
            size_mb = (where / "server.log").stat().st_size / 1e6
            m = measure(where, tmp / f"large-{steps}-out")
            timings.append((m["rank_roots"], m["seconds"]))
            print(f"{args.ranks} x {steps}: {m['rank_roots']} roots, server.log {size_mb:.0f} MB, valid={m['valid']}, "
                  f"analyze {m['seconds']:.2f} s {phases(m)}, peak RSS {m['peak_rss_gb']:.2f} GB (generated in {gen:.1f} s)")
            for path in sorted(where.rglob("*"), reverse=True):
                path.unlink() if path.is_file() else path.rmdir()
        base_roots, base_seconds = timings[0]
        print("linearity (relative to the 1/4 run): "
              + ", ".join(f"{roots / base_roots:.0f}x roots -> {seconds / base_seconds:.2f}x time" for roots, seconds in timings))
        roots, seconds = timings[-1]
        print(f"target {args.ranks} x {args.steps}: < 60 s -> {'met' if seconds < 60 else 'MISSED'} ({seconds:.1f} s)")


if __name__ == "__main__":
    main()
