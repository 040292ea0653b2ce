"""``dsprof run --ab N``: does removing the injected faults save what the analysis predicts?

The same workload and seed run N times with the faults and N times without,
interleaved (faulty, clean, faulty, clean, ...) so that a drift in the load of
the machine falls on both sides alike. Each run is analysed. The predicted
saving is the median over the faulty runs of ``what_if.total_saved_ms`` (the
replay with every cause removed); the measured saving is the median over the
pairs of decode wall (faulty) − decode wall (clean). ``ab.json`` in the output
directory keeps every run's figures.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsprof.analysis.summary import Summary
from dsprof.commands.printing import Printer, note_line, print_err, safe_lines, safe_progress
from dsprof.commands.run import ProfileRunResult, default_run_dir, profile_run
from dsprof.errors import DsprofError
from dsprof.fileio import atomic_write_text
from dsprof.progress import Progress
from dsprof.runtime.config import RuntimeConfig

AB_JSON = "ab.json"
AB_SCHEMA = "dsprof.ab/1"
AB_RUNS_DIR = "ab"


@dataclass
class AbRun:
    """One analysed run of the comparison."""

    faulty: bool
    pair: int
    out_dir: Path
    exit_status: int
    decode_wall_ms: float | None  # what_if.decode_wall_ms, else tail_cost.decode_wall_ms
    predicted_saved_ms: float | None  # what_if.total_saved_ms (faulty runs; None where the analysis has no what-if)

    def to_json(self) -> dict:
        found = {"dir": str(self.out_dir), "exit_status": self.exit_status, "decode_wall_ms": self.decode_wall_ms}
        return {**found, "predicted_saved_ms": self.predicted_saved_ms} if self.faulty else found


@dataclass
class AbResult:
    """The comparison: its runs, the two savings, and what went wrong on the way."""

    config: RuntimeConfig
    runs: list[AbRun]
    problems: list[str] = field(default_factory=list)

    def pair(self, index: int) -> tuple[AbRun, AbRun]:
        faulty = next(r for r in self.runs if r.pair == index and r.faulty)
        clean = next(r for r in self.runs if r.pair == index and not r.faulty)
        return faulty, clean

    @property
    def pairs(self) -> int:
        return len({run.pair for run in self.runs})

    def pair_saving(self, index: int) -> float | None:
        """Decode wall (faulty) − decode wall (clean) of one pair; None where either run has no wall."""
        faulty, clean = self.pair(index)
        if faulty.decode_wall_ms is None or clean.decode_wall_ms is None:
            return None
        return faulty.decode_wall_ms - clean.decode_wall_ms

    @property
    def measured_saved_ms(self) -> float | None:
        savings = [s for s in (self.pair_saving(i) for i in range(self.pairs)) if s is not None]
        return statistics.median(savings) if savings else None

    @property
    def predicted_saved_ms(self) -> float | None:
        """The median prediction of the faulty runs; None ("no prediction") unless every one of them has one."""
        predictions = [run.predicted_saved_ms for run in self.runs if run.faulty]
        if not predictions or any(p is None for p in predictions):
            return None
        return statistics.median(p for p in predictions if p is not None)

    @property
    def error_share(self) -> float | None:
        """(predicted − measured) / measured, where both exist and the measured saving is positive."""
        predicted, measured = self.predicted_saved_ms, self.measured_saved_ms
        if predicted is None or measured is None or measured <= 0:
            return None
        return (predicted - measured) / measured

    @property
    def ok(self) -> bool:
        return not self.problems and self.measured_saved_ms is not None

    def to_json(self) -> dict:
        return {
            "schema": AB_SCHEMA,
            "seed": self.config.seed,
            "inject": list(self.config.inject),
            "pairs": [
                {
                    "pair": index + 1,
                    "faulty": self.pair(index)[0].to_json(),
                    "clean": self.pair(index)[1].to_json(),
                    "measured_saved_ms": _rounded(self.pair_saving(index)),
                }
                for index in range(self.pairs)
            ],
            "measured_saved_ms": _rounded(self.measured_saved_ms),
            "predicted_saved_ms": _rounded(self.predicted_saved_ms),
            "prediction": "what_if.total_saved_ms" if self.predicted_saved_ms is not None else None,
            "error_share": _rounded(self.error_share, 4),
            "problems": self.problems,
        }


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def decode_wall_ms(summary: Summary) -> float | None:
    """The decode wall time of an analysed run: the replay's measured wall, else tail cost's."""
    what_if, cost = summary.get("what_if"), summary.get("tail_cost")
    for value in (what_if.get("decode_wall_ms") if what_if else None, cost.get("decode_wall_ms") if cost else None):
        if value is not None:
            return float(value)
    return None


def predicted_saving_ms(summary: Summary) -> float | None:
    what_if = summary.get("what_if")
    value = what_if.get("total_saved_ms") if what_if else None
    return None if value is None else float(value)


def run_ab(config: RuntimeConfig, out_dir: str | Path, *, pairs: int = 3, threshold_ms: float = 5.0, progress: Progress = None) -> AbResult:
    """Run ``pairs`` faulty/clean pairs of ``config`` (interleaved) into ``out_dir``/ab/, analyse them, write ab.json."""
    if not config.inject:
        raise DsprofError("--ab compares runs with and without the injected faults: give at least one --inject")
    if pairs < 1:
        raise DsprofError(f"--ab needs at least one pair (got {pairs})")
    out = Path(out_dir)
    clean_config = dataclasses.replace(config, inject=[])
    result = AbResult(config, [])
    for index in range(pairs):
        for faulty, run_config in ((True, config), (False, clean_config)):
            name = f"{'faulty' if faulty else 'clean'}-{index + 1}"
            if progress:
                progress(f"A/B pair {index + 1}/{pairs}: {name}")
            run = profile_run(run_config, out / AB_RUNS_DIR / name, threshold_ms=threshold_ms, progress=progress)
            result.runs.append(_ab_run(run, faulty, index))
            result.problems.extend(f"{name}: {problem}" for problem in run.problems)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / AB_JSON, json.dumps(result.to_json(), indent=2) + "\n")
    return result


def _ab_run(run: ProfileRunResult, faulty: bool, pair: int) -> AbRun:
    summary = run.summary
    return AbRun(
        faulty=faulty,
        pair=pair,
        out_dir=run.out_dir,
        exit_status=run.outcome.exit_status,
        decode_wall_ms=None if summary is None else decode_wall_ms(summary),
        predicted_saved_ms=None if summary is None or not faulty else predicted_saving_ms(summary),
    )


def format_ab(result: AbResult) -> str:
    """The console block: each pair's walls, then predicted against measured."""

    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1f} ms"

    lines = [f"A/B verification: {', '.join(result.config.inject)} (seed {result.config.seed}), {result.pairs} interleaved pair(s)"]
    for index in range(result.pairs):
        faulty, clean = result.pair(index)
        saving = result.pair_saving(index)
        lines.append(
            f"  pair {index + 1}: decode wall faulty {ms(faulty.decode_wall_ms)}, clean {ms(clean.decode_wall_ms)}, difference {ms(saving)}"
        )
    measured, predicted = result.measured_saved_ms, result.predicted_saved_ms
    lines.append(f"  measured saving (median of pairs): {ms(measured)}")
    if predicted is None:
        lines.append("  predicted saving: no prediction (the analysis wrote no what_if.total_saved_ms)")
    else:
        error = result.error_share
        off = "" if error is None else f", {error * 100:+.1f}% against measured"
        lines.append(f"  predicted saving (median what_if.total_saved_ms of the faulty runs): {ms(predicted)}{off}")
    return "\n".join(lines)


def ab_command(
    preset: str = "demo",
    *,
    pairs: int = 3,
    out_dir: str | Path | None = None,
    threshold_ms: float = 5.0,
    progress: Progress = None,
    out: Printer = print,
    err: Printer = print_err,
    **settings: Any,
) -> int:
    """``dsprof run --ab N``: the A/B verification of ``preset`` with ``settings``; prints its block, returns the exit status."""
    config = RuntimeConfig.from_preset(preset, **settings)
    if out_dir is None:
        out_dir = default_run_dir(preset, "ab")
    progress, out, err = safe_progress(progress), safe_lines(out), safe_lines(err)
    result = run_ab(config, out_dir, pairs=pairs, threshold_ms=threshold_ms, progress=progress)
    out(format_ab(result))
    for line in result.problems:
        err(note_line(line))
    out(f"artifacts: {out_dir}")
    return 0 if result.ok else 1
