"""Depth-2 pipeline check, cadence and achieved depth (SPEC §3).

For adjacent decode runs N, N+1 of one rank (ordered by ``run_epoch``, or by
start time where roots lack it) the pair *overlaps* when bind(N+1) intersects
runner_run(N) and runner_run(N+1) does not start before claim_release(N)
starts; a pair that fails either condition is a violation, with the reason.
``serialized`` is true when fewer than half the pairs overlap. Achieved depth
per rank is the sum of root durations over the union of the time the roots
cover (1.0 = one run at a time, 2.0 = always two in flight).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dsprof.analysis.skew import grouped_percentile_blocks, ns_to_ms, root_durations

FIRST_VIOLATIONS = 10


def ordered_pairs(roots: pd.DataFrame) -> pd.DataFrame:
    """Each decode root joined with the next run of its rank."""
    order_key = roots["run_epoch"].astype("float64").fillna(roots["root_ts_ns"].astype("float64"))
    runs = roots.assign(order_key=order_key).sort_values(["rank", "order_key", "root_ts_ns"], kind="stable")
    nxt = runs.groupby("rank").shift(-1)
    pairs = pd.DataFrame(
        {
            "rank": runs["rank"].astype("int64"),
            "run_epoch": runs["run_epoch"],
            "step": runs["step"],
            "runner_ts_ns": runs["runner_ts_ns"],
            "runner_end_ns": runs["runner_end_ns"],
            "claim_ts_ns": runs["claim_ts_ns"],
            "next_bind_ts_ns": nxt["bind_ts_ns"],
            "next_bind_end_ns": nxt["bind_end_ns"],
            "next_runner_ts_ns": nxt["runner_ts_ns"],
            "has_next": nxt["root_ts_ns"].notna(),
        }
    )
    return pairs[pairs["has_next"]].reset_index(drop=True)


def _union_ns(roots: pd.DataFrame) -> pd.Series:
    """Per rank: length of the union of root intervals (sort, merge touching runs with a cumulative max)."""
    frame = roots[["rank", "root_ts_ns", "root_end_ns"]].sort_values(["rank", "root_ts_ns"]).astype("int64")
    reach = frame.groupby("rank")["root_end_ns"].cummax()
    previous_reach = reach.groupby(frame["rank"]).shift()
    new_block = (previous_reach.isna() | (frame["root_ts_ns"] > previous_reach)).astype("int64")
    block = new_block.groupby(frame["rank"]).cumsum()
    spans = frame.assign(block=block, reach=reach).groupby(["rank", "block"]).agg(start=("root_ts_ns", "min"), end=("reach", "max"))
    return (spans["end"] - spans["start"]).groupby(level="rank").sum()


def pipeline_figures(roots: pd.DataFrame) -> dict:
    """The ``pipeline`` block of summary.json."""
    pairs = ordered_pairs(roots)
    bind_overlaps = (pairs["next_bind_ts_ns"] < pairs["runner_end_ns"]) & (pairs["next_bind_end_ns"] > pairs["runner_ts_ns"])
    claim_ordered = pairs["next_runner_ts_ns"] >= pairs["claim_ts_ns"]
    bind_overlaps = bind_overlaps.fillna(False).astype(bool)
    claim_ordered = claim_ordered.fillna(False).astype(bool)
    overlapped = bind_overlaps & claim_ordered
    checked = int(len(pairs))
    n_overlapped = int(overlapped.sum())
    reason = np.where(
        ~bind_overlaps & ~claim_ordered,
        "bind(N+1) does not overlap runner_run(N); runner_run(N+1) starts before claim_release(N)",
        np.where(~bind_overlaps, "bind(N+1) does not overlap runner_run(N)", "runner_run(N+1) starts before claim_release(N)"),
    )
    bad = pairs.assign(reason=reason)[~overlapped].head(FIRST_VIOLATIONS)
    first_violations = [
        {"rank": int(r.rank), "run_epoch": None if pd.isna(r.run_epoch) else int(r.run_epoch),
         "step": None if pd.isna(r.step) else int(r.step), "reason": r.reason}
        for r in bad.itertuples(index=False)  # at most FIRST_VIOLATIONS rows
    ]

    starts = roots[["rank", "runner_ts_ns"]].dropna().astype("int64").sort_values(["rank", "runner_ts_ns"])
    starts["cadence_ns"] = starts.groupby("rank")["runner_ts_ns"].diff()
    cadence = grouped_percentile_blocks(starts, "rank", "cadence_ns")
    cadence_p50 = starts["cadence_ns"].median()

    durations = root_durations(roots)
    depth = durations.groupby("rank")["root_ns"].sum() / _union_ns(roots) if len(roots) else pd.Series(dtype=float)
    serialized = checked > 0 and n_overlapped < checked / 2
    return {
        "pairs_checked": checked,
        "pairs_overlapped": n_overlapped,
        "violations": checked - n_overlapped,
        "claim_order_violations": int((~claim_ordered).sum()),
        "serialized": bool(serialized),
        "first_violations": first_violations,
        "cadence_ms": cadence,
        "cadence_p50_ms": None if pd.isna(cadence_p50) else ns_to_ms(cadence_p50),
        "achieved_depth": {str(k): round(float(v), 3) for k, v in depth.items()},
        "diagnosis": _diagnosis(pairs, bind_overlaps, overlapped, serialized, cadence_p50, durations),
    }


def _diagnosis(pairs, bind_overlaps, overlapped, serialized, cadence_p50, durations) -> str:
    checked = len(pairs)
    if checked == 0:
        return "not checked: no rank has two adjacent decode runs"
    ranks = pairs["rank"].nunique()
    cadence = "n/a" if pd.isna(cadence_p50) else f"{ns_to_ms(cadence_p50):.3f} ms"
    if not serialized:
        where = "every rank" if overlapped.all() else f"{int(overlapped.sum())} of {checked} pairs"
        return f"pipelined: bind(N+1) overlaps runner_run(N) on {where}; cadence p50 {cadence}"
    not_overlapping = pairs[~bind_overlaps]
    if len(not_overlapping) * 2 < checked:
        # bind does overlap: the pairs fail on launch order instead
        early = int((~overlapped).sum()) - len(not_overlapping)
        return (f"unordered: runner_run(N+1) starts before claim_release(N) in {early} of {checked} pairs; "
                f"cadence p50 {cadence}")
    ranks_serial = not_overlapping["rank"].nunique()
    on = "all ranks" if ranks_serial == ranks else f"{ranks_serial} of {ranks} ranks"
    bind_ms = ns_to_ms(durations["bind_ns"].median())
    runner_ms = ns_to_ms(durations["runner_ns"].median())
    root_ms = ns_to_ms(durations["root_ns"].median())
    return (
        f"serialized: bind(N+1) starts after runner_run(N) ends in {len(not_overlapping)} of {checked} pairs on {on}; "
        f"cadence {cadence} ≈ bind {bind_ms:.3f} + runner_run {runner_ms:.3f} ms (root {root_ms:.3f} ms)"
    )
