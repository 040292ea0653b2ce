"""Do verdicts hold over repeated runs? Rates over seeds of the bundled runtime (docs/FIGURES.md "Verdict").

Each case runs ``dsprof run`` at ``--seeds`` seeds (from ``--first-seed``) and prints, per run, the verdict and
straggler, and per case the rates the project's targets are stated in:

* healthy runs (the default demo, 4 ranks on 2 cores; production on 2 ranks): ``verdict.status`` healthy, no
  straggler, and examples/ci-rules.toml passes;
* the README's contention fault (production, 2 ranks, cpu_contention:rank=1,p=0.08,ms=25): not healthy, straggler
  rank 1 by run_queue, and the CI rules fail it with a line that names rank 1;
* the truth-test shape with 40 ms faults: injected faults of 20 ms or more found at their step, rank and
  mechanism, above the noise floor, and the named culprits within two steps of a fault;
* fence tails on random ranks (production, 2 ranks): no straggler rank, ``pattern: "spread"``.

    .venv/bin/python benchmarks/bench_verdicts.py [--seeds 10] [--first-seed 0] [--cases healthy,readme,faults,spread] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from dsprof.analysis.outputs.gate_outputs import format_verdict
from dsprof.analysis.policy.gate import evaluate_gate
from dsprof.analysis.stages.cause_rules import EXPLAINS_SHARE
from dsprof.testing.truth import culprits_near_faults, found_faults, scored_faults

ROOT = Path(__file__).resolve().parents[1]
CI_RULES = ROOT / "examples" / "ci-rules.toml"
DSPROF = Path(sys.executable).with_name("dsprof")
PRODUCTION_2 = ["--preset", "production", "--ranks", "2"]
TRUTH_SHAPE = ["--ranks", "4", "--requests", "8", "--output-tokens", "128"]
# the late-item sections, and the mechanisms that name no cause (a named one needs evidence for EXPLAINS_SHARE of the excess)
LATE_SECTIONS = ("late_starts", "tail_steps", "slow_steps")
UNNAMED = ("unattributed", None)
CASES: dict[str, list[tuple[str, list[str]]]] = {
    "healthy": [("demo", []), ("production-2", PRODUCTION_2)],
    "readme": [("readme contention", [*PRODUCTION_2, "--inject", "cpu_contention:rank=1,p=0.08,ms=25"])],
    "faults": [
        (kind, [*TRUTH_SHAPE, "--inject", spec])
        for kind, spec in (("gc_pause", "gc_pause:p=0.25,ms=40"), ("fence_tail", "fence_tail:p=0.25,ms=40"))
    ],
    "spread": [("fence tails, random ranks", [*PRODUCTION_2, "--inject", "fence_tail:p=0.1,ms=30"])],
}


@dataclass
class Tally:
    runs: int = 0
    good: int = 0
    gate_ok: int = 0
    found: int = 0
    faults: int = 0
    near: int = 0
    named: int = 0
    mechanisms: int = 0
    evidenced: int = 0
    notes: list[str] = field(default_factory=list)


def run_once(out: Path, args: list[str], seed: int) -> tuple[dict, list[dict]]:
    proc = subprocess.run([str(DSPROF), "run", *args, "--seed", str(seed), "-o", str(out)], capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1) or not (out / "summary.json").exists():
        raise SystemExit(f"dsprof run {' '.join(args)} --seed {seed} failed: {proc.stderr[-2000:]}")
    faults = json.loads((out / "faults.json").read_text())["faults"] if (out / "faults.json").exists() else []
    return json.loads((out / "summary.json").read_text()), faults


def judge(case: str, name: str, summary: dict, faults: list[dict], tally: Tally) -> str:
    """One run's line, and its count into the case's tally."""
    verdict, straggler = summary["verdict"], summary["tail_steps"]["straggler"]
    gate = evaluate_gate(summary, CI_RULES)
    tally.runs += 1
    named = [i for section in LATE_SECTIONS for i in summary[section]["items"] if i["mechanism"] not in UNNAMED]
    tally.mechanisms += len(named)
    tally.evidenced += sum((i["explained_share"] or 0) >= EXPLAINS_SHARE for i in named)
    if case == "healthy":
        tally.good += verdict["status"] == "healthy" and straggler["rank"] is None
        tally.gate_ok += gate.passed
    elif case == "readme":
        tally.good += verdict["status"] != "healthy" and (straggler["rank"], straggler["mechanism"]) == (1, "run_queue")
        tally.gate_ok += not gate.passed and "rank 1" in format_verdict(gate).splitlines()[-1]
    elif case == "spread":
        tally.good += straggler["rank"] is None and straggler.get("pattern") == "spread"
        tally.gate_ok += not gate.passed
    else:
        scored = scored_faults(faults)
        tally.faults += len(scored)
        tally.found += len(found_faults(summary, scored))
        near, named = culprits_near_faults(summary, faults)
        tally.near, tally.named = tally.near + near, tally.named + named
        tally.good += verdict["status"] != "healthy"
        tally.gate_ok += not gate.passed
    line = f"  {name}: {verdict['status']} · {verdict['headline']} · gate {'PASSED' if gate.passed else 'FAILED'}"
    if case == "spread" and straggler["rank"] is not None:  # random ranks can still land lopsided: say how they fell
        line += f" · injected by rank {dict(sorted(Counter(f['rank'] for f in faults).items()))}"
    return line


def _share(a: int, b: int) -> str:
    return f"{a}/{b} ({100 * a / b:.0f}%)" if b else "n/a"


def rates(case: str, name: str, t: Tally) -> str:
    share = _share
    if case == "healthy":
        return f"{name}: healthy, no straggler {share(t.good, t.runs)}; CI rules pass {share(t.gate_ok, t.runs)}"
    if case == "readme":
        return f"{name}: not healthy, rank 1 / run_queue {share(t.good, t.runs)}; CI rules fail naming rank 1 {share(t.gate_ok, t.runs)}"
    if case == "spread":
        return f"{name}: no rank, pattern spread {share(t.good, t.runs)}; CI rules fail {share(t.gate_ok, t.runs)}"
    return (
        f"{name}: faults found at step, rank and mechanism {share(t.found, t.faults)}; named culprits within 2 steps of a fault "
        f"{share(t.near, t.named)}; not healthy {share(t.good, t.runs)}; CI rules fail {share(t.gate_ok, t.runs)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--keep", type=Path, help="keep every run's artifacts here")
    options = parser.parse_args(argv)
    work = options.keep or Path(tempfile.mkdtemp(prefix="dsprof-verdicts-"))
    summary_lines = []
    evidence = [0, 0]
    try:
        for case in options.cases.split(","):
            for name, args in CASES[case]:
                tally = Tally()
                print(f"== {name} ({' '.join(args) or 'defaults'})", flush=True)
                for seed in range(options.first_seed, options.first_seed + options.seeds):
                    summary, faults = run_once(work / f"{name.replace(' ', '_').replace(',', '')}-{seed}", args, seed)
                    print(judge(case, f"seed {seed}", summary, faults, tally), flush=True)
                summary_lines.append(rates(case, name, tally))
                evidence = [evidence[0] + tally.evidenced, evidence[1] + tally.mechanisms]
        summary_lines.append(f"every run: named mechanisms with evidence for at least half their excess {_share(*evidence)}")
        print("\n".join(["", "rates:", *summary_lines]))
    finally:
        if options.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
