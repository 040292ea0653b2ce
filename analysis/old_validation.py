"""The verdict on a swimlane: named checks, each with its detail, and the problems found.

Checks never stop the analysis: a partial or inconsistent artifact still gets
every figure that can be computed, and the verdict says what is wrong.
"""

from __future__ import annotations

import pandas as pd

from dsprof.analysis.swimlane import Swimlane

# SA_PROFILE categories a serving trace must have (SPEC §1 level e2e)
REQUIRED_SERVING_CATEGORIES = ("request", "scheduler", "worker")


def _check(checks: list, problems: list, name: str, ok: bool, detail: str) -> None:
    checks.append({"name": name, "ok": bool(ok), "detail": detail})
    if not ok:
        problems.append(detail)


def validate(swimlane: Swimlane, *, expect_ranks: int | None = None, dropped: dict | None = None) -> dict:
    """The ``validation`` block of summary.json."""
    roots = swimlane.roots
    checks: list[dict] = []
    problems: list[str] = []
    processes = swimlane.processes
    devices = sorted(processes["device"].astype(str).unique().tolist()) if len(processes) else []
    steps_per_rank = roots.groupby("rank").size() if len(roots) else pd.Series(dtype="int64")
    ranks = int(processes["rank"].nunique()) if len(processes) else 0
    decode_steps = int(steps_per_rank.max()) if len(steps_per_rank) else 0
    rank_roots = int(len(roots))

    found = f"{len(devices)} devices found ({', '.join(devices)})" if devices else "no devices found"
    if expect_ranks is not None:
        _check(checks, problems, "devices", ranks == expect_ranks, f"{found}; {ranks} ranks, expected {expect_ranks}")
    else:
        _check(checks, problems, "devices", len(devices) > 0, found)
    duplicated = processes[processes["rank"].duplicated(keep=False)] if len(processes) else processes
    if len(duplicated):
        _check(checks, problems, "distinct_ranks", False,
               f"rank {int(duplicated['rank'].iloc[0])} is claimed by {len(duplicated[duplicated['rank'] == duplicated['rank'].iloc[0]])} processes")
    _check(checks, problems, "decode_steps", decode_steps > 0,
           f"{decode_steps} decode steps (callable {swimlane.decode_label})" if decode_steps else "no decode steps found")
    if rank_roots == 0:
        roots_detail = "no rank roots"
    elif rank_roots == decode_steps * ranks:
        roots_detail = f"{rank_roots} = {decode_steps} x {ranks}"
    else:
        roots_detail = f"{rank_roots} rank roots, expected {decode_steps} x {ranks} = {decode_steps * ranks}"
    _check(checks, problems, "rank_roots", rank_roots == decode_steps * ranks and rank_roots > 0, roots_detail)

    counts = steps_per_rank.value_counts()
    if len(counts) > 1:
        common = int(counts.idxmax())
        odd = steps_per_rank[steps_per_rank != common]
        detail = "; ".join(f"rank {int(r)} has {int(n)} decode steps" for r, n in odd.items()) + f", others {common}"
        _check(checks, problems, "equal_steps", False, detail)
    else:
        _check(checks, problems, "equal_steps", True, f"every rank has {decode_steps} decode steps")
    ranks_per_step = roots.groupby("step")["rank"].nunique() if len(roots) else pd.Series(dtype="int64")
    partial = ranks_per_step[ranks_per_step < ranks]
    if len(partial):
        first, last = int(partial.index.min()), int(partial.index.max())
        where = f"step {first}" if first == last else f"{len(partial)} steps between {first} and {last}"
        _check(checks, problems, "complete_steps", False,
               f"{where} present on only {int(partial.min())}-{int(partial.max())} of {ranks} ranks; "
               "their figures use the ranks that have them")
    if expect_ranks is not None:
        missing = sorted(set(range(expect_ranks)) - set(int(r) for r in steps_per_rank.index))
        if missing:
            _check(checks, problems, "ranks_present", False, "no decode steps on rank " + ", ".join(map(str, missing)))

    # the roots' own step attributes (where present) must run without gaps on every rank
    attr = roots.dropna(subset=["step_attr"]).sort_values(["rank", "step"])
    gaps = attr.groupby("rank")["step_attr"].diff().dropna()
    gap_ranks = attr.loc[gaps[gaps != 1].index, "rank"].unique()
    _check(checks, problems, "contiguous_steps", len(gap_ranks) == 0,
           "decode steps are contiguous on every rank" if len(gap_ranks) == 0
           else "step numbers jump on rank " + ", ".join(str(int(r)) for r in gap_ranks))

    if swimlane.rootless_invocations:
        _check(checks, problems, "complete_invocations", False,
               f"{swimlane.rootless_invocations} invocations have spans but no chip.run root (torn or crashed run)")
    if swimlane.duplicate_roots:
        _check(checks, problems, "unique_roots", False, f"{swimlane.duplicate_roots} invocations have more than one root")

    has_serving = len(swimlane.serving) > 0
    if has_serving:
        present = set(swimlane.serving["cat"].dropna().astype(str).unique())
        missing_cats = [c for c in REQUIRED_SERVING_CATEGORIES if c not in present]
        _check(checks, problems, "serving_categories", not missing_cats,
               "serving categories present: " + ", ".join(REQUIRED_SERVING_CATEGORIES) if not missing_cats
               else "serving trace lacks categories: " + ", ".join(missing_cats))

    on_host = int((swimlane.runtime["clk"] == "dev").sum())
    _check(checks, problems, "device_clock_off_host", on_host == 0,
           f"{len(swimlane.device_clock)} device-clock spans kept off the host axis" if on_host == 0
           else f"{on_host} device-clock spans on the host axis")
    unanchored = swimlane.unanchored_pids
    _check(checks, problems, "anchored", not unanchored,
           "every pid has a CLOCK_ANCHOR" if not unanchored
           else "no CLOCK_ANCHOR for pid " + ", ".join(map(str, unanchored)))

    return {
        "valid": not problems,
        "decode_steps": decode_steps,
        "rank_roots": rank_roots,
        "ranks": ranks,
        "devices": devices,
        "expected_ranks": expect_ranks,
        "steps_per_rank": {str(int(r)): int(n) for r, n in steps_per_rank.items()},
        "left_out_invocations": int(swimlane.left_out_invocations),
        "dropped": dict(dropped or {}),
        "problems": problems,
        "checks": checks,
    }
