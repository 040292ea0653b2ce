"""Late starts, tail steps with phase attribution, and the straggler verdict (SPEC §3).

Attribution compares the late rank's phase durations with the median of the
*other* ranks for the same step:

* a late start (start(runner_run) − min_r start > threshold) is explained
  against the others' median start (the lateness beyond a typical rank): by
  ``bind`` when the rank's bind took at least half of it longer than the
  others' median bind; else by ``previous step's runner_run`` when the rank's
  previous run released its slot (claim_release start) at least half of it
  after the others' median start (the launch had to wait for it); else by
  ``before bind: run started late`` when the rank's root began at least half
  of it after the others' median root start; otherwise it is
  ``before runner_run, unattributed`` (between bind and launch);
* a tail step (runner-end skew > threshold) names the rank that ended last. Its
  lateness splits into a late start (start − others' median start) and a longer
  runner_run (dur − others' median dur). When the start part is the larger the
  late-start attribution applies; otherwise the deepest runner phase whose
  excess covers at least half the runner excess: ``device_wall`` (the device
  was slow, so the host waited), else ``native_fence_wait`` (the host waited on
  a fence the device had already passed), else — and always when the run has
  no device-phase markers — ``inside runner_run, unattributed``.

Straggler rule: a rank is *the* straggler when it is the late rank in at least
half of the flagged steps (steps with a tail or a late start), late in at least
10% of all steps, and late more often than chance explains: if lateness fell on
ranks at random (each flagged step flags a rank with probability
flagged (step, rank) pairs / (flagged steps x ranks)), the chance of one rank
being flagged that often, times the number of ranks, must be under 1%
(one-sided binomial test with a Bonferroni correction). Scheduling noise on an
oversubscribed host flags ranks at random and so names nobody; a healthy run
has no flagged steps at all. Either way the verdict is ``none``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dsprof.analysis.skew import ns_to_ms, root_durations

UNATTRIBUTED_RUNNER = "inside runner_run, unattributed"
UNATTRIBUTED_START = "before runner_run, unattributed"
PREVIOUS_RUN = "previous step's runner_run"
LATE_ARRIVAL = "before bind: run started late"
EXPLAINS_SHARE = 0.5
STRAGGLER_SHARE_OF_FLAGGED = 0.5
STRAGGLER_SHARE_OF_STEPS = 0.10
STRAGGLER_SIGNIFICANCE = 0.01


def _with_others_median(flagged: pd.DataFrame, table: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """For each flagged (step, rank): the median of ``columns`` over the other ranks of that step."""
    pairs = flagged[["step", "rank"]].merge(table[["step", "rank", *columns]], on="step", suffixes=("", "_other"))
    pairs = pairs[pairs["rank"] != pairs["rank_other"]]
    medians = pairs.groupby(["step", "rank"])[columns].median().add_suffix("_others_median").reset_index()
    return flagged.merge(medians, on=["step", "rank"], how="left")


def _phase_table(roots: pd.DataFrame) -> pd.DataFrame:
    """Per (step, rank): runner_run start/end and the ``*_ts_ns`` times attribution compares,
    plus phase durations (``runner_ns``, ``bind_ns``, ``fence_ns``, ``device_wall_ns``).

    Float columns, so that a phase a run lacks is NaN and drops out of the medians.
    """
    durations = root_durations(roots)
    table = pd.DataFrame(
        {
            "step": roots["step"].astype("int64"),
            "rank": roots["rank"].astype("int64"),
            "device": roots["device"].astype(str),
            "start_ns": roots["runner_ts_ns"].astype("float64"),
            "end_ns": roots["runner_end_ns"].astype("float64"),
            "runner_ns": durations["runner_ns"].astype("float64"),
            "bind_ns": durations["bind_ns"].astype("float64"),
            "fence_ns": roots["fence_wait_dur_ns"].astype("float64"),
            "device_wall_ns": roots["device_wall_dur_ns"].astype("float64"),
            "claim_ts_ns": roots["claim_ts_ns"].astype("float64"),
            "root_ts_ns": roots["root_ts_ns"].astype("float64"),
        }
    ).dropna(subset=["start_ns", "end_ns"])
    table = table.sort_values(["rank", "step"])
    # when the rank's previous run released its slot (claim_release start): a launch waits for it
    table["previous_claim_ts_ns"] = table.groupby("rank")["claim_ts_ns"].shift()
    return table


def _start_attribution(rows: pd.DataFrame, delay: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Why runner_run started ``delay`` late: a slow bind, the previous run holding the slot, a late root, or unknown."""
    bind_excess = rows["bind_ns"] - rows["bind_ns_others_median"]
    held_back = rows["previous_claim_ts_ns"] - rows["start_ns_others_median"]
    arrived_late = rows["root_ts_ns"] - rows["root_ts_ns_others_median"]
    half = EXPLAINS_SHARE * delay
    is_bind = bind_excess >= half
    is_previous = ~is_bind & (held_back.fillna(-np.inf) >= half)
    is_arrival = ~is_bind & ~is_previous & (arrived_late >= half)
    phase = np.select([is_bind, is_previous, is_arrival], ["bind", PREVIOUS_RUN, LATE_ARRIVAL], UNATTRIBUTED_START)
    excess = np.select([is_bind, is_previous, is_arrival], [bind_excess, held_back, arrived_late], delay)
    return pd.Series(phase, index=rows.index), pd.Series(excess, index=rows.index)


def find_late_starts(roots: pd.DataFrame, threshold_ms: float = 5.0) -> pd.DataFrame:
    """(step, rank) whose runner_run started more than ``threshold_ms`` after the step's first rank."""
    table = _phase_table(roots)
    table["excess_ns"] = table["start_ns"] - table.groupby("step")["start_ns"].transform("min")
    late = table[table["excess_ns"] > threshold_ms * 1e6]
    late = _with_others_median(late, table, ["start_ns", "bind_ns", "root_ts_ns"])
    # attribution explains the lateness against the typical rank (the others' median start)
    phase, phase_excess = _start_attribution(late, late["start_ns"] - late["start_ns_others_median"])
    return late.assign(phase=phase, phase_excess_ns=phase_excess).sort_values(["step", "rank"]).reset_index(drop=True)


def find_tail_steps(roots: pd.DataFrame, steps: pd.DataFrame, threshold_ms: float = 5.0) -> pd.DataFrame:
    """Steps whose runner-end skew exceeds ``threshold_ms``, with the rank that ended last and why."""
    table = _phase_table(roots)
    tails = steps[steps["runner_end_skew_ns"] > threshold_ms * 1e6][["step", "latest_end_rank", "runner_end_skew_ns"]]
    tails = tails.rename(columns={"latest_end_rank": "rank"}).astype({"rank": "int64"})
    tails = tails.merge(table, on=["step", "rank"], how="left")
    tails = _with_others_median(tails, table, ["start_ns", "root_ts_ns", "runner_ns", "bind_ns", "fence_ns", "device_wall_ns"])
    start_delay = tails["start_ns"] - tails["start_ns_others_median"]
    runner_excess = tails["runner_ns"] - tails["runner_ns_others_median"]
    device_excess = tails["device_wall_ns"] - tails["device_wall_ns_others_median"]
    fence_excess = tails["fence_ns"] - tails["fence_ns_others_median"]

    start_phase, start_phase_excess = _start_attribution(tails, start_delay)
    half = EXPLAINS_SHARE * runner_excess
    runner_phase = np.select(
        [device_excess.fillna(-np.inf) >= half, fence_excess.fillna(-np.inf) >= half],
        ["device_wall", "native_fence_wait"],
        UNATTRIBUTED_RUNNER,
    )
    runner_phase_excess = np.select(
        [runner_phase == "device_wall", runner_phase == "native_fence_wait"], [device_excess, fence_excess], runner_excess
    )
    late_start_dominates = start_delay > runner_excess
    tails["phase"] = np.where(late_start_dominates, start_phase, runner_phase)
    tails["phase_excess_ns"] = np.where(late_start_dominates, start_phase_excess, runner_phase_excess)
    tails["excess_ns"] = tails["runner_end_skew_ns"]
    return tails.sort_values("step").reset_index(drop=True)


def binomial_upper_tail(successes: int, trials: int, probability: float) -> float:
    """P(X >= successes) for X ~ Binomial(trials, probability), summed in log space."""
    if successes <= 0:
        return 1.0
    if probability <= 0.0:
        return 0.0
    if probability >= 1.0:
        return 1.0
    log_p, log_q = math.log(probability), math.log1p(-probability)
    log_terms = [
        math.lgamma(trials + 1) - math.lgamma(k + 1) - math.lgamma(trials - k + 1) + k * log_p + (trials - k) * log_q
        for k in range(successes, trials + 1)  # at most one term per step of the run
    ]
    peak = max(log_terms)
    return min(1.0, math.exp(peak) * sum(math.exp(t - peak) for t in log_terms))


def straggler_verdict(late: pd.DataFrame, tails: pd.DataFrame, total_steps: int, ranks: int) -> dict:
    """Name a rank that is late in most flagged steps, a real share of all steps, and beyond chance (module docstring)."""
    flagged = pd.concat([late[["step", "rank", "device"]], tails[["step", "rank", "device"]]]).drop_duplicates(["step", "rank"])
    flagged_steps = flagged["step"].nunique()
    if flagged_steps == 0 or total_steps == 0:
        return {"verdict": "none", "rank": None, "device": None, "share": 0.0, "p_value": None}
    per_rank = flagged.groupby("rank").agg(steps=("step", "nunique"), device=("device", "first"))
    top_rank = int(per_rank["steps"].idxmax())
    top = per_rank.loc[top_rank]
    top_steps = int(top["steps"])
    share = top_steps / total_steps
    chance_per_step = len(flagged) / (flagged_steps * max(ranks, 1))
    p_value = min(1.0, binomial_upper_tail(top_steps, flagged_steps, chance_per_step) * max(ranks, 1))
    is_straggler = (
        top_steps >= STRAGGLER_SHARE_OF_FLAGGED * flagged_steps
        and share >= STRAGGLER_SHARE_OF_STEPS
        and p_value < STRAGGLER_SIGNIFICANCE
    )
    verdict = {"verdict": "none", "rank": None, "device": None, "share": round(share, 4), "p_value": round(p_value, 6)}
    if is_straggler:
        verdict.update(verdict=f"rank {top_rank} ({top['device']})", rank=top_rank, device=str(top["device"]))
    return verdict


def tail_figures(roots: pd.DataFrame, steps: pd.DataFrame, threshold_ms: float = 5.0) -> tuple[dict, dict, pd.DataFrame, pd.DataFrame]:
    """The ``late_starts`` and ``tail_steps`` blocks of summary.json, plus the tables behind them."""
    late = find_late_starts(roots, threshold_ms)
    tails = find_tail_steps(roots, steps, threshold_ms)
    late_block = {
        "threshold_ms": threshold_ms,
        "count": int(len(late)),
        "items": [
            {"step": int(r.step), "rank": int(r.rank), "device": r.device, "excess_ms": ns_to_ms(r.excess_ns),
             "phase": r.phase, "phase_excess_ms": ns_to_ms(r.phase_excess_ns)}
            for r in late.itertuples(index=False)  # output items, one per late start
        ],
    }
    devices = tails["device"].dropna().unique()
    tail_block = {
        "threshold_ms": threshold_ms,
        "count": int(len(tails)),
        "items": [
            {"step": int(r.step), "rank": int(r.rank), "device": r.device,
             "runner_end_skew_ms": ns_to_ms(r.runner_end_skew_ns), "excess_ms": ns_to_ms(r.excess_ns),
             "phase": r.phase, "phase_excess_ms": ns_to_ms(r.phase_excess_ns)}
            for r in tails.itertuples(index=False)  # output items, one per tail step
        ],
        "same_device": None if len(devices) == 0 else bool(len(devices) == 1),
        "devices": {str(k): int(v) for k, v in tails["device"].value_counts().items()},
        "straggler": straggler_verdict(
            late, tails, int(steps["step"].nunique()) if len(steps) else 0, int(roots["rank"].nunique())
        ),
    }
    return late_block, tail_block, late, tails
