"""Scoring a diagnosis of the bundled runtime against its faults.json (test and benchmark support).

The runtime writes where each injected fault struck and what the ranks
measured of it; these helpers say which of those faults a summary found, at
their step, on a rank that lost the time, with their mechanism, above the
noise floor. Nothing in the product imports this.
"""

from __future__ import annotations

OWN_MECHANISMS_ASIDE = ("unattributed", "carried_over", "peer_wait")


def late_cells(summary: dict) -> dict[tuple[int, int], list[dict]]:
    """(step, rank) -> the causes named for that rank at that step (late starts, tails, slow steps)."""
    cells: dict[tuple[int, int], list[dict]] = {}
    for item in summary["late_starts"]["items"]:
        cells.setdefault((item["step"], item["late_rank"]), []).append(item)
    for tail in summary["tail_steps"]["items"]:
        for cause in tail["ranks"]:
            cells.setdefault((tail["step"], cause["late_rank"]), []).append(cause)
    for slow in (summary.get("slow_steps") or {}).get("items", []):
        for cause in slow["ranks"]:
            cells.setdefault((slow["step"], cause["rank"]), []).append(cause)
    return cells


def names_a_culprit(cause: dict) -> bool:
    """A finding (above the noise floor) that names a culprit's own mechanism."""
    return cause["role"] == "culprit" and not cause.get("noise") and cause["mechanism"] not in OWN_MECHANISMS_ASIDE


def losers(fault: dict) -> set[tuple[int, int]]:
    """(step, rank) where the fault measurably cost time: a third of its delay or more.

    A contention loss says per step where each rank on the CPU lost it (``steps``); any other is at the fault's step.
    """
    least = fault["delay_ms"] / 3
    return {
        (int(step), int(rank))
        for rank, found in fault["measured"].items()
        for step, lost in found.get("steps", {fault["step"]: found["loss_ms"]}).items()
        if lost >= least
    }


def alone_faults(faults: list[dict], persistent: bool = False) -> list[dict]:
    """The injected faults of 20 ms or more, a random one within two steps of another left out.

    Every rank meets every other at the all-to-all, so all are still late from
    the first fault when a second strikes, and the second can cost nothing.
    """
    injected = [f for f in faults if (f["delay_ms"] or 0) >= 20]
    struck = {f["step"] for f in injected}
    return [f for f in injected if persistent or not {f["step"] - 1, f["step"] - 2} & struck]


def scored_faults(faults: list[dict], persistent: bool = False) -> list[dict]:
    """Of :func:`alone_faults`, those the ranks measured a cost of (``effective``)."""
    return [f for f in alone_faults(faults, persistent) if f["effective"]]


def found_faults(summary: dict, faults: list[dict], mechanism: bool = True) -> list[dict]:
    """The faults found at a (step, rank) where they cost time, with their mechanism, as a culprit above the noise floor.

    ``mechanism=False``: any culprit there will do (a source that lacks the evidence of a mechanism, e.g. a Kineto
    trace without host evidence, can still find where a fault struck).
    """
    cells = late_cells(summary)
    return [
        f
        for f in faults
        if any(
            (c["mechanism"] == f["mechanism"] or not mechanism) and c["role"] == "culprit" and not c.get("noise")
            for cell in losers(f)
            for c in cells.get(cell, [])
        )
    ]


def culprits_near_faults(summary: dict, faults: list[dict], steps: int = 2) -> tuple[int, int]:
    """(named culprits within ``steps`` of an injected fault, named culprits)."""
    near = {f["step"] + d for f in faults for d in range(-steps, steps + 1)}
    named = [step for (step, _), causes in late_cells(summary).items() for c in causes if names_a_culprit(c)]
    return sum(step in near for step in named), len(named)


def tail_cells(summary: dict) -> dict[tuple[int, int], list[dict]]:
    """(step, rank) -> the causes named for that rank in the tail steps."""
    cells: dict[tuple[int, int], list[dict]] = {}
    for tail in summary["tail_steps"]["items"]:
        for cause in tail["ranks"]:
            cells.setdefault((tail["step"], cause["late_rank"]), []).append(cause)
    return cells


def device_timeline_agreement(alone: dict, joined: dict, faults: list[dict], persistent: bool = False) -> tuple[list, list]:
    """The tail cells a summary of STRACE ``alone`` leaves unattributed that the injected ``faults`` explain, and of
    them those the ``joined`` summary (STRACE with a device timeline) names in agreement: (agreeing, explained).

    Of the faults, those of :func:`alone_faults` explain: a cell where one cost its rank time (:func:`losers`; it
    agrees when named with that fault's mechanism), where one did one or two steps before on its rank (it agrees
    when ``carried_over`` from there, or names that carry-over beside a cause of its own), or where one cost another
    rank time at that step (it agrees when named
    ``peer_wait`` on such a rank). A cell where a fault left out cost time is left out too, as are the cells that
    no fault explains (the machine's own noise).
    """
    kept = alone_faults(faults, persistent)
    mixed = {cell for fault in faults if fault not in kept for cell in losers(fault)}
    struck: dict[tuple[int, int], list[dict]] = {}
    for fault in kept:
        for cell in losers(fault):
            struck.setdefault(cell, []).append(fault)
    named = tail_cells(joined)
    explained, agreeing = [], []
    for (step, rank), causes in sorted(tail_cells(alone).items()):
        if not any(c["mechanism"] == "unattributed" and c["role"] == "culprit" and not c.get("noise") for c in causes):
            continue
        peers = {r for s, r in struck if s == step and r != rank}
        earlier = {s for s in (step - 1, step - 2) if (s, rank) in struck}
        if (step, rank) in mixed or ((step, rank) not in struck and not peers and not earlier):
            continue
        explained.append((step, rank))
        mine = {f["mechanism"] for f in struck.get((step, rank), [])}
        if any(
            not c.get("noise")
            and (
                c["mechanism"] in mine
                or (c["mechanism"] == "peer_wait" and c.get("peer") in peers)
                or (c["mechanism"] == "carried_over" and c.get("from_step") in earlier)
                or (c.get("carried_over") or {}).get("from_step") in earlier
            )
            for c in named.get((step, rank), [])
        ):
            agreeing.append((step, rank))
    return agreeing, explained
