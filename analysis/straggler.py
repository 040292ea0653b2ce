"""The straggler verdict: a rank whose own causes cost the run a material share of its decode time.

Counting late steps is not enough: on a shared host every rank is late now
and then (scheduling noise), and a rank that is late rarely but badly (a
collection every few steps) can cost more than one that is late often by a
little. So the verdict weighs effect, not counts: a rank is a straggler when
removing its own causes would save at least :data:`MATERIAL_SHARE` of the
decode wall time in the what-if replay, and its causes recur over the run
(:data:`MIN_STEPS` steps or more, in :data:`SPREAD_PARTS` of the run's
:data:`RUN_PARTS` quarters: a burst of noise is not a straggler). A rank behind most of the flagged steps
(tails and slow steps) is named whatever its fault rate when their excess is
that material, even where the replay saves little (runs paced by a clock, not
by their dependencies, recover from a late step by themselves).
The verdict names the mechanism that saves the most on that rank.
"""

from __future__ import annotations

from dsprof.analysis.summary_model import SlowStep, Straggler, TailStep, WhatIf, WhatIfItem
from dsprof.profiler import strace_format as fmt

# the culprit cause of a flagged step: a tail step or a slow step
Flagged = TailStep | SlowStep

MATERIAL_SHARE = 0.05
# a rank behind more than this share of the flagged steps: their excess is its effect
BEHIND_MOST = 0.5
MIN_STEPS = 3
# ... spread over the run: causes in at least this many of its quarters (a burst of noise is not a straggler)
SPREAD_PARTS = 3
RUN_PARTS = 4

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


def straggler_verdict(what_if: WhatIf, flagged: list[Flagged], step_numbers: list[int], devices: dict[int, str]) -> Straggler:
    """The ``straggler`` block: which rank, its device, its share of the decode wall, mechanism and ms per step.

    ``flagged`` are the culprit causes of tail and slow steps (one per step);
    ``what_if`` is the what-if block (``by_rank`` savings and per-cause items);
    ``step_numbers`` every decode step of the run, in order.
    """
    total_steps = len(step_numbers)
    verdict = Straggler(verdict="none", rank=None, device=None, share=0.0, mechanism=None, ms_per_step=None, saved_ms=None, steps=0)
    wall = what_if.get("decode_wall_ms") or 0.0
    by_rank = {int(r): float(ms) for r, ms in (what_if.get("by_rank") or {}).items()}
    if not wall or not total_steps or not (by_rank or flagged):
        return verdict
    late_ms = _late_ms_per_rank(flagged)
    candidates = set(by_rank) | set(late_ms)
    if not candidates:  # flagged steps whose causes name no rank
        return verdict

    def effect_of(r: int) -> float:
        """The replay's saving where it is material; else, for a rank behind most flagged steps, their excess."""
        saved = by_rank.get(r, 0.0)
        return saved if saved >= MATERIAL_SHARE * wall else min(wall, max(saved, _behind(flagged, r, late_ms)))

    rank = max(candidates, key=lambda r: (effect_of(r), -r))
    saved = by_rank.get(rank, 0.0)
    effect = effect_of(rank)
    items = [i for i in what_if.get("items", []) if i["rank"] == rank]
    cause_steps = {i["step"] for i in items} | {c["step"] for c in flagged if c.get("rank") == rank}
    steps = len(cause_steps)
    verdict["share"], verdict["steps"] = round(effect / wall, 4), steps
    if steps < MIN_STEPS or effect / wall < MATERIAL_SHARE or _parts_of_run(cause_steps, step_numbers) < SPREAD_PARTS:
        return verdict
    mechanism = _dominant_mechanism(items, [c for c in flagged if c.get("rank") == rank])
    device = devices.get(rank)
    per_step = round(effect / total_steps, 3)
    where = f" ({device})" if device else ""
    verdict["verdict"] = (
        f"rank {rank}{where} costs {effect / wall:.1%} of the decode time ({per_step:.3f} ms a step), by {MECHANISM_WORDS[mechanism]}"
    )
    verdict["rank"], verdict["device"], verdict["mechanism"] = rank, device, mechanism
    verdict["ms_per_step"], verdict["saved_ms"] = per_step, round(saved, 3)
    return verdict


def _parts_of_run(cause_steps: set[int], step_numbers: list[int]) -> int:
    """In how many of the run's :data:`RUN_PARTS` equal parts (by step position) the causes fall."""
    position = {step: i for i, step in enumerate(step_numbers)}
    return len({position[s] * RUN_PARTS // len(step_numbers) for s in cause_steps if s in position})


def _late_ms_per_rank(flagged: list[Flagged]) -> dict[int, float]:
    """Per culprit rank, the summed excess of the flagged steps it was behind."""
    late: dict[int, float] = {}
    for cause in flagged:  # one per flagged step
        rank = cause.get("rank")
        if rank is not None and cause.get("mechanism") not in (fmt.MECH_CARRIED_OVER, fmt.MECH_PEER_WAIT):
            late[rank] = late.get(rank, 0.0) + float(cause.get("excess_ms") or 0.0)
    return late


def _behind(flagged: list[Flagged], rank: int, late_ms: dict[int, float]) -> float:
    """The excess of the flagged steps behind ``rank`` where it is behind most of them, else 0."""
    count = sum(1 for cause in flagged if cause.get("rank") == rank)
    return late_ms.get(rank, 0.0) if flagged and count > BEHIND_MOST * len(flagged) else 0.0


def _dominant_mechanism(items: list[WhatIfItem], causes: list[Flagged]) -> str:
    """The mechanism that saves the most in the replay; by evidence where the replay saves nothing."""
    weight: dict[str, float] = {}
    for item in items:
        weight[item["mechanism"]] = weight.get(item["mechanism"], 0.0) + item["saved_ms"]
    if not any(weight.values()):
        for cause in causes:
            weight[cause["mechanism"]] = weight.get(cause["mechanism"], 0.0) + float(cause.get("evidence_ms") or 0.0)
    own = {m: w for m, w in weight.items() if m not in (fmt.MECH_CARRIED_OVER, fmt.MECH_PEER_WAIT)} or weight
    return max(own, key=lambda m: (own[m], m)) if own else fmt.MECH_UNATTRIBUTED
