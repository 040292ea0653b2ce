"""The straggler verdict: one rank significantly costlier than the others, or late work spread over ranks.

On a shared host every rank is late now and then, so counting late steps
names the unlucky. A rank is a straggler only when it stands out: what its
own causes cost in the what-if replay (findings above the noise floor only) is
more than luck would give the costliest rank, were each cost's rank a fair
draw (p below :data:`ALPHA`); it costs more than the others' mean in
:data:`SPREAD_PARTS` of the run's :data:`RUN_PARTS` quarters, on
:data:`MIN_STEPS` steps or more, with a material effect (:data:`MATERIAL_SHARE`
of the decode wall time). Late work that names no such rank but costs more
than host noise alone (:data:`SPREAD_SHARE`) is ``spread``: the per-rank
counts, the chance that one rank would be hit that often, and the total cost.
docs/FIGURES.md "Straggler" has the method.
"""

from __future__ import annotations

import math

import numpy as np

from dsprof.analysis.stages.noise import Findings
from dsprof.analysis.stages.runner import stage
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.summary_schema import Figures, SlowStep, StepRow, Straggler, TailStep, WhatIf, WhatIfItem
from dsprof.profiler import strace_format as fmt

# the culprit cause of a flagged step: a tail step or a slow step
Flagged = TailStep | SlowStep

# a straggler's p below this (docs/FIGURES.md "Straggler")
ALPHA = 0.05
MATERIAL_SHARE = 0.05
# late work on no standing-out rank is tested for its size only: it must exceed what host noise alone costs (FIGURES.md)
SPREAD_SHARE = 0.10
MIN_STEPS = 3
# a rank behind more than this share of the flagged steps: where the replay saves little, their excess is its cost
BEHIND_MOST = 0.5
# ... and whose replay saves under this share of their excess: the run is paced by a clock, not by its dependencies
CLOCK_PACED = 0.1
# ... spread over the run: costlier than the other ranks' mean in at least this many of its quarters
SPREAD_PARTS = 3
RUN_PARTS = 4
RANDOM_DRAWS = 2000
_RANDOM_SEED = 0  # fixed: the same trace gives the same verdict
TIE_SHARE = 0.05
_DRAW_CELLS = 4_000_000  # the randomization test draws this many (draw, cost) labels at a time: bounded memory
_NOT_OWN = (fmt.MECH_CARRIED_OVER, fmt.MECH_PEER_WAIT)

# Plain words for each mechanism, for the one-line verdict.
MECHANISM_WORDS = {
    fmt.MECH_DEVICE: "device work",
    fmt.MECH_HOST_CPU: "host CPU work",
    fmt.MECH_RUN_QUEUE: "run-queue wait (CPU contention)",
    fmt.MECH_GC: "garbage collection",
    fmt.MECH_CARRIED_OVER: "lateness carried over from earlier steps",
    fmt.MECH_PEER_WAIT: "waiting on a peer rank",
    fmt.MECH_UNATTRIBUTED: "unattributed time",
}


@stage("straggler", reads=())
def straggler_block(engine: Engine, what_if: WhatIf, findings: Findings, skew: tuple[Figures, list[StepRow]]) -> Straggler:
    """The ``straggler`` block of summary.json, from the culprit of each tail and slow step above the noise floor."""
    devices = {int(rank): figures["device"] for rank, figures in skew[0]["per_rank"].items()}  # the skew stage's map
    tails = [t for t in findings.tail_steps if not t.get("noise")]
    tail_steps = {t["step"] for t in tails}
    flagged: list[Flagged] = [*tails, *(item for item in findings.slow_steps if not item.get("noise") and item["step"] not in tail_steps)]
    return straggler_verdict(what_if, flagged, [row["step"] for row in skew[1]], devices)


def straggler_verdict(what_if: WhatIf, flagged: list[Flagged], step_numbers: list[int], devices: dict[int, str]) -> Straggler:
    """The ``straggler`` block: a significant rank with its effect and confidence, or the spread of late work.

    ``flagged`` are the culprit causes of the tail and slow steps above the
    noise floor (one per step); ``what_if`` the what-if block of those
    findings; ``step_numbers`` every decode step of the run, in order.
    """
    verdict = Straggler(
        verdict="none", rank=None, device=None, share=0.0, mechanism=None, ms_per_step=None, saved_ms=None, steps=0, pattern="none"
    )
    wall = what_if.get("decode_wall_ms") or 0.0
    cost = _cost_per_step(what_if, flagged, step_numbers)
    if not wall or not step_numbers or not cost:
        return verdict
    ranks = sorted(set(cost) | set(devices), key=lambda r: (-float(cost[r].sum()) if r in cost else 0.0, r))
    worst = ranks[0]
    others = np.zeros(len(step_numbers))  # what one of the other ranks costs at each step, on average
    for rank in ranks[1:]:
        others += cost.get(rank, 0.0) / (len(ranks) - 1)
    p_value = rank_label_p(cost, len(ranks))
    share_ci = _share_interval(cost[worst], wall)
    parts = _parts_costlier(cost[worst], others)
    steps = int(np.count_nonzero(cost[worst]))
    share = float(cost[worst].sum()) / wall
    verdict["share"], verdict["steps"], verdict["parts"] = round(share, 4), steps, parts
    verdict["p_value"], verdict["share_ci"] = round(p_value, 4), share_ci
    if p_value < ALPHA and parts >= SPREAD_PARTS and steps >= MIN_STEPS and share >= MATERIAL_SHARE:
        return _named(verdict, worst, what_if, flagged, devices, len(step_numbers), wall)
    return _spread(verdict, what_if, flagged, len(ranks))


def _named(
    verdict: Straggler, rank: int, what_if: WhatIf, flagged: list[Flagged], devices: dict[int, str], total_steps: int, wall: float
) -> Straggler:
    items = [i for i in what_if.get("items", []) if i["rank"] == rank]
    mechanism = _dominant_mechanism(items, [c for c in flagged if c.get("rank") == rank])
    device = devices.get(rank)
    effect = verdict["share"] * wall
    per_step = round(effect / total_steps, 3)
    where = f" ({device})" if device else ""
    ci = verdict.get("share_ci") or [verdict["share"], verdict["share"]]
    verdict["verdict"] = (
        f"rank {rank}{where} costs {verdict['share']:.1%} of the decode time ({per_step:.3f} ms a step; 95% CI {ci[0]:.1%}–{ci[1]:.1%}, "
        f"p {verdict.get('p_value', 0):.3f}), by {MECHANISM_WORDS[mechanism]}"
    )
    verdict["rank"], verdict["device"], verdict["mechanism"] = rank, device, mechanism
    verdict["ms_per_step"], verdict["pattern"] = per_step, "rank"
    saved = {int(r): float(ms) for r, ms in (what_if.get("by_rank") or {}).items()}
    verdict["saved_ms"] = round(saved.get(rank, 0.0), 3)
    return verdict


def _spread(verdict: Straggler, what_if: WhatIf, flagged: list[Flagged], ranks: int) -> Straggler:
    """Late work that costs the run a material share but stands out on no rank: counts, chance and cost."""
    counts: dict[int, int] = {}
    for cause in flagged:
        if cause.get("rank") is not None and cause.get("mechanism") not in _NOT_OWN:
            counts[int(cause["rank"])] = counts.get(int(cause["rank"]), 0) + 1  # type: ignore[arg-type]
    found = sum(counts.values())
    share = float(what_if.get("share_of_decode_wall") or 0.0)
    if found < MIN_STEPS or share < SPREAD_SHARE:
        return verdict
    most = max(counts.values())
    chance = most_hit_chance(found, most, max(ranks, len(counts)))
    by_rank = ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items()))
    if chance >= ALPHA:
        how = f"no rank more often than chance (p {chance:.2f})"
    else:
        top = min(r for r, n in counts.items() if n == most)
        how = f"rank {top} most often (chance {chance:.3f}), but its cost does not stand out against the other ranks' (p {verdict.get('p_value', 1):.2f})"
    verdict["verdict"] = (
        f"spread over ranks: {found} late steps ({by_rank}), {how}; they cost {share:.1%} of the decode time "
        f"({what_if.get('total_saved_ms')} ms)"
    )
    verdict["pattern"], verdict["chance"] = "spread", round(chance, 4)
    verdict["by_rank_counts"] = {str(r): n for r, n in sorted(counts.items())}
    verdict["cost_ms"] = what_if.get("total_saved_ms")
    return verdict


def most_hit_chance(items: int, most: int, ranks: int) -> float:
    """The chance that, with ``items`` spread uniformly over ``ranks``, some rank is hit ``most`` times or more (union bound)."""
    if ranks <= 1 or items <= 0:
        return 1.0
    p = 1.0 / ranks
    tail = sum(math.comb(items, k) * p**k * (1 - p) ** (items - k) for k in range(most, items + 1))
    return min(1.0, ranks * tail)


def _cost_per_step(what_if: WhatIf, flagged: list[Flagged], step_numbers: list[int]) -> dict[int, np.ndarray]:
    """Per rank, what its own causes cost at each step (ms): the replay's saving.

    Runs paced by a clock, not by their dependencies, recover from a late step
    by themselves, so the replay can save little where a rank is still late at
    step after step: for a rank behind most of the flagged steps whose replay
    saves under :data:`CLOCK_PACED` of their excess, that excess is the measure.
    """
    position = {step: i for i, step in enumerate(step_numbers)}
    saved: dict[int, np.ndarray] = {}
    late: dict[int, np.ndarray] = {}
    for item in what_if.get("items") or []:
        if int(item["step"]) in position:
            saved.setdefault(int(item["rank"]), np.zeros(len(step_numbers)))[position[int(item["step"])]] += max(0.0, item["saved_ms"])
    for cause in flagged:
        rank = cause.get("rank")
        if rank is not None and cause.get("mechanism") not in _NOT_OWN and int(cause["step"]) in position:
            late.setdefault(int(rank), np.zeros(len(step_numbers)))[position[int(cause["step"])]] += float(cause.get("excess_ms") or 0.0)
    cost = {r: v for r, v in saved.items() if v.any()}
    for rank, excess in late.items():
        behind_most = np.count_nonzero(excess) > BEHIND_MOST * len(flagged)
        if behind_most and float(saved.get(rank, np.zeros(1)).sum()) < CLOCK_PACED * float(excess.sum()):
            cost[rank] = np.maximum(excess, saved.get(rank, 0.0))
    return cost


def rank_label_p(cost: dict[int, np.ndarray], ranks: int) -> float:
    """The chance that, were the rank of each cost a fair draw, some rank would cost as much as the costliest does.

    A randomization test that knows the costliest rank was picked after the
    fact: each (rank, step) cost keeps its size and gets a uniform random
    rank, :data:`RANDOM_DRAWS` times (a fixed seed), and p is the share of
    draws whose costliest rank costs as much as the observed one (within
    :data:`TIE_SHARE`: equal faults save a few percent more or less in the
    replay, and which rank drew the larger ones is no evidence). On a shared
    host late steps land on random ranks: five of seven on one of two ranks is
    luck (p 0.06 or more), where a bootstrap over the steps called it p 0.004.
    """
    values = np.concatenate([v[v > 0] for v in cost.values()])
    observed = max(float(v.sum()) for v in cost.values())
    if ranks <= 1 or not values.size:
        return 1.0
    rng = np.random.default_rng(_RANDOM_SEED)
    chunk = max(1, _DRAW_CELLS // (values.size * ranks))
    at_least = 0
    for start in range(0, RANDOM_DRAWS, chunk):
        draws = min(chunk, RANDOM_DRAWS - start)
        labels = rng.integers(0, ranks, size=(draws, values.size)) + ranks * np.arange(draws)[:, None]
        sums = np.bincount(labels.ravel(), weights=np.broadcast_to(values, labels.shape).ravel(), minlength=draws * ranks)
        at_least += int(np.count_nonzero(sums.reshape(draws, ranks).max(axis=1) >= observed * (1 - TIE_SHARE)))
    return (1 + at_least) / (RANDOM_DRAWS + 1)


def _share_interval(worst: np.ndarray, wall: float) -> list[float] | None:
    """The 95% bootstrap interval of the costliest rank's share of the decode wall time, over the run's steps.

    Resampling N steps with replacement only moves the few steps with a cost:
    their counts are one multinomial draw, so a day-long run costs what its late
    steps cost.
    """
    n = len(worst)
    moving = np.flatnonzero(worst)
    if not len(moving):
        return None
    rng = np.random.default_rng(_RANDOM_SEED)
    rest = max(0.0, 1.0 - len(moving) / n)
    counts = rng.multinomial(n, [1.0 / n] * len(moving) + [rest], size=RANDOM_DRAWS)[:, : len(moving)]
    low, high = np.percentile(counts @ worst[moving] / wall, [2.5, 97.5])
    return [round(float(low), 4), round(float(high), 4)]


def _parts_costlier(worst: np.ndarray, others: np.ndarray) -> int:
    """In how many of the run's :data:`RUN_PARTS` equal parts (by step position) the worst rank cost more than the others' mean."""
    parts = np.array_split(np.arange(len(worst)), RUN_PARTS)
    return sum(1 for part in parts if len(part) and worst[part].sum() > others[part].sum())


def _dominant_mechanism(items: list[WhatIfItem], causes: list[Flagged]) -> str:
    """The mechanism that saves the most in the replay; by evidence where the replay saves nothing."""
    weight: dict[str, float] = {}
    for item in items:
        weight[item["mechanism"]] = weight.get(item["mechanism"], 0.0) + item["saved_ms"]
    if not any(weight.values()):
        for cause in causes:
            weight[cause["mechanism"]] = weight.get(cause["mechanism"], 0.0) + float(cause.get("evidence_ms") or 0.0)
    own = {m: w for m, w in weight.items() if m not in _NOT_OWN} or weight
    return max(own, key=lambda m: (own[m], m)) if own else fmt.MECH_UNATTRIBUTED
