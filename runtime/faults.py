"""Faults injected on purpose (``--inject``), seeded so a run can be repeated.

Grammar (one spec per ``--inject``; see docs/RUNTIME.md)::

    fence_tail:p=<0..1>,ms=<delay>          completion-fence delay on a random rank, per decode step with probability p
    straggler:rank=<r>,ms=<delay>           rank r's device is slower by <delay> every decode step
    slow_bind:rank=<r>,ms=<delay>[,step=K]  rank r's bind takes <delay> longer (every step, or only step K)
    crash:rank=<r>,step=<K>                 rank r dies at decode step K

Every rank derives the same plan from the seed; each event a rank applies is
reported to the launcher, which writes them to ``faults.json`` (ground truth).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dsprof.errors import DsprofError

FAULTS_SCHEMA = "dsprof.faults/1"

# kind -> (required keys, optional keys)
_GRAMMAR: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "fence_tail": (("p", "ms"), ()),
    "straggler": (("rank", "ms"), ()),
    "slow_bind": (("rank", "ms"), ("step",)),
    "crash": (("rank", "step"), ()),
}
_INT_KEYS = {"rank", "step"}


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    rank: int | None = None
    step: int | None = None
    ms: float | None = None
    p: float | None = None


def parse_fault(text: str, ranks: int) -> FaultSpec:
    """Parse one ``kind:key=value,...`` spec; DsprofError names the spec and what is wrong."""
    def bad(what: str) -> DsprofError:
        return DsprofError(f"bad --inject spec {text!r}: {what}")

    kind, sep, body = text.strip().partition(":")
    if kind not in _GRAMMAR:
        raise bad(f"unknown fault kind {kind!r} (expected one of {', '.join(_GRAMMAR)})")
    required, optional = _GRAMMAR[kind]
    values: dict[str, float | int] = {}
    for item in filter(None, (part.strip() for part in body.split(","))) if sep else ():
        key, eq, raw = item.partition("=")
        if not eq or key not in required + optional:
            raise bad(f"unexpected {item!r} (keys for {kind}: {', '.join(required + optional)})")
        if key in values:
            raise bad(f"{key} given twice")
        try:
            values[key] = int(raw) if key in _INT_KEYS else float(raw)
        except ValueError:
            raise bad(f"{key}={raw!r} is not a number") from None
    missing = [k for k in required if k not in values]
    if missing:
        raise bad(f"missing {', '.join(missing)}")
    if "rank" in values and not 0 <= values["rank"] < ranks:
        raise bad(f"rank {values['rank']} is outside 0..{ranks - 1}")
    if "step" in values and values["step"] < 0:
        raise bad("step must be >= 0")
    if "ms" in values and not values["ms"] > 0:
        raise bad("ms must be > 0")
    if "p" in values and not 0 < values["p"] <= 1:
        raise bad("p must be in (0, 1]")
    return FaultSpec(kind=kind, **values)


def parse_faults(texts: list[str], ranks: int) -> list[FaultSpec]:
    return [parse_fault(text, ranks) for text in texts]


class FaultPlan:
    """What each rank injects at each decode step; identical on every rank for one seed."""

    def __init__(self, specs: list[FaultSpec], ranks: int, seed: int):
        self.specs = specs
        self.ranks = ranks
        self.seed = seed

    def _fence_tail_rank(self, index: int, step: int) -> int | None:
        spec = self.specs[index]
        draw = random.Random(f"fence_tail:{self.seed}:{index}:{step}")
        hit = draw.random() < spec.p
        rank = draw.randrange(self.ranks)
        return rank if hit else None

    def fence_delay_ms(self, rank: int, step: int) -> float:
        return sum(spec.ms for i, spec in enumerate(self.specs)
                   if spec.kind == "fence_tail" and self._fence_tail_rank(i, step) == rank)

    def straggler_ms(self, rank: int) -> float:
        return sum(spec.ms for spec in self.specs if spec.kind == "straggler" and spec.rank == rank)

    def slow_bind_ms(self, rank: int, step: int) -> float:
        return sum(spec.ms for spec in self.specs if spec.kind == "slow_bind" and spec.rank == rank
                   and (spec.step is None or spec.step == step))

    def crashes(self, rank: int, step: int) -> bool:
        return any(spec.kind == "crash" and spec.rank == rank and spec.step == step for spec in self.specs)


def fault_event(kind: str, rank: int, step: int | None, delay_ms: float | None) -> dict:
    """One faults.json entry."""
    return {"kind": kind, "rank": rank, "step": step, "delay_ms": delay_ms}
