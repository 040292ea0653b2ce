"""Peak RSS and time of ``dsprof analyze`` on the hostile input shapes of issue 21 (bounded memory and time).

Each case writes its input under a temporary directory (or ``--keep DIR``),
then runs ``dsprof analyze`` on it in a child process of its own
(benchmarks/child_process.py: its own peak RSS) and prints seconds, CPU and
peak RSS. The bar (issue 21): one line and exit 2, or a result, under 1 GB
and 120 s. ``--scale`` shrinks every input (0.1: a tenth) for a quick look.

* ``one-line``: a small run's log and one 2 GiB line (skipped, counted as ``overlong_line``);
* ``chrome``: a 350 MB Chrome JSON trace of 2.24M ``X`` events;
* ``fragments``: 100,000 one-event SA_PROFILE fragments;
* ``sparse``: 20,000 root spans 2**34 ns apart (a time window each, unbounded).

    python benchmarks/bench_hostile_bounds.py [--cases one-line,chrome,...] [--scale 1.0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from child_process import run_child

from dsprof.analysis.store.dataset import DEFAULT_WINDOW_NS
from dsprof.testing.synthetic import SyntheticRun

DSPROF = [sys.executable, "-c", "import sys; from dsprof.cli.main import cli; cli(sys.argv[1:])"]


def one_line(folder: Path, scale: float) -> Path:
    """A small run's log, then one giant line (so that the analysis has spans to give a result from)."""
    run = SyntheticRun(ranks=1, steps=4).write(folder / "run")
    path = folder / "one-line.log"
    block = b"a" * (1 << 20)
    with open(path, "wb") as out:
        out.write((run / "server.log").read_bytes())
        out.writelines(block for _ in range(int(2048 * scale)))
        out.write(b"\n")
    return path


def chrome(folder: Path, scale: float) -> Path:
    path = folder / "big.json"
    with open(path, "w") as out:
        out.write('{"traceEvents": [\n')
        for i in range(int(2_240_000 * scale)):
            out.write(
                f'{{"ph":"X","name":"op_{i % 50}","cat":"cpu_op","pid":{1 + i % 4},"tid":{i % 8},"ts":{1000 + i * 10}.5,'
                f'"dur":3.25,"args":{{"External id":{i},"Sequence number":{i}}}}},\n'
            )
        out.write('{"ph":"i","name":"end","pid":1,"tid":0,"ts":1,"s":"t"}\n]}\n')
    return path


def fragments(folder: Path, scale: float) -> Path:
    directory = folder / "fragments"
    directory.mkdir()
    for i in range(int(100_000 * scale)):
        event = {"ph": "X", "name": "request", "cat": "request", "pid": i + 1, "tid": 1, "ts": 1000 + i, "dur": 5}
        (directory / f"trace.{i + 1}.jsonl").write_text(json.dumps(event) + "\n")
    return folder


def sparse(folder: Path, scale: float) -> Path:
    run = SyntheticRun(ranks=1, steps=2).write(folder / "run")
    record = next(line for line in (run / "server.log").read_text().splitlines() if "[STRACE]" in line and " depth=1 " in line)
    head = record.partition(" ts=")[0].replace(" depth=1 ", " depth=0 ")
    path = folder / "sparse.log"
    with open(path, "w") as out:
        for i in range(1, int(20_000 * scale) + 1):
            out.write(f"{re.sub(r'inv=[0-9]+', f'inv={i}', head)} ts={i * DEFAULT_WINDOW_NS} dur=10\n")
    return path


CASES: dict[str, Callable[[Path, float], Path]] = {"one-line": one_line, "chrome": chrome, "fragments": fragments, "sparse": sparse}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--keep", type=Path, help="write the inputs and outputs here (default: a temporary directory, removed)")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        print(f"{'case':<10} {'input MB':>9} {'seconds':>8} {'cpu s':>7} {'peak RSS MiB':>13}  outcome")
        for name in args.cases.split(","):
            folder = root / name
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            given = CASES[name](folder, args.scale)
            size = sum(p.stat().st_size for p in ([given] if given.is_file() else given.rglob("*")) if p.is_file())
            try:
                run = run_child([*DSPROF, "analyze", str(given), "-o", str(folder / "out")])
                outcome = "result"
            except SystemExit as failed:  # an exit 2 is an outcome too: one line, no traceback
                print(f"{name:<10} {size / 1e6:>9.1f} {'':>8} {'':>7} {'':>13}  {str(failed)[-300:]}")
                continue
            print(f"{name:<10} {size / 1e6:>9.1f} {run.seconds:>8.1f} {run.cpu_s:>7.1f} {run.peak_rss_mib:>13.0f}  {outcome}")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
