"""Per-step skew, gap, validate, bind and root figures with their percentiles (SPEC §3).

All figures come from the decode-root table of the swimlane (one row per rank
and step) through groupby reductions. Percentiles interpolate linearly between
order statistics of the nanosecond values and are reported in ms with three
decimals.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PERCENTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))


def ns_to_ms(value: float) -> float:
    return round(float(value) / 1e6, 3)


def percentile_block(values_ns) -> dict:
    """``{"p50", "p95", "p99", "max", "count"}`` in ms of ns values (nulls ignored)."""
    values = pd.to_numeric(pd.Series(values_ns), errors="coerce").dropna().to_numpy(np.float64)
    if len(values) == 0:
        return {name: None for name, _ in PERCENTILES} | {"count": 0}
    points = np.quantile(values, [q for _, q in PERCENTILES], method="linear")
    return {name: ns_to_ms(v) for (name, _), v in zip(PERCENTILES, points)} | {"count": int(len(values))}


def grouped_percentile_blocks(frame: pd.DataFrame, by: str, column: str) -> dict:
    """A percentile block of ``column`` per value of ``by`` (keys as strings), in one groupby."""
    data = frame[[by, column]].dropna()
    if len(data) == 0:
        return {}
    data = data.astype({column: "float64"})
    quantiles = data.groupby(by)[column].quantile([q for _, q in PERCENTILES]).unstack()
    counts = data.groupby(by)[column].size()
    blocks = {}
    for key, row in quantiles.iterrows():  # one iteration per rank, not per span
        blocks[str(key)] = {name: ns_to_ms(row[q]) for name, q in PERCENTILES} | {"count": int(counts[key])}
    return blocks


def root_durations(roots: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step) durations and gaps in ns (nullable where a phase is missing)."""
    return pd.DataFrame(
        {
            "rank": roots["rank"],
            "step": roots["step"],
            "device": roots["device"],
            "bind_ns": roots["bind_end_ns"] - roots["bind_ts_ns"],
            "runner_ns": roots["runner_end_ns"] - roots["runner_ts_ns"],
            "root_ns": roots["root_end_ns"] - roots["root_ts_ns"],
            "validate_ns": roots["validate_end_ns"] - roots["validate_ts_ns"],
            "runner_to_validate_gap_ns": roots["validate_ts_ns"] - roots["runner_end_ns"],
        }
    )


def per_step(roots: pd.DataFrame) -> pd.DataFrame:
    """One row per step: runner start/end skew (ns), the latest ranks, and how many ranks have the step."""
    have = roots.dropna(subset=["runner_ts_ns", "runner_end_ns"]).astype({"runner_ts_ns": "int64", "runner_end_ns": "int64"})
    if len(have) == 0:
        return pd.DataFrame(columns=["step", "ranks", "runner_start_skew_ns", "runner_end_skew_ns",
                                     "min_start_ns", "min_end_ns", "latest_start_rank", "latest_end_rank"])
    grouped = have.groupby("step")
    table = pd.DataFrame(
        {
            "ranks": grouped["rank"].nunique(),
            "min_start_ns": grouped["runner_ts_ns"].min(),
            "runner_start_skew_ns": grouped["runner_ts_ns"].max() - grouped["runner_ts_ns"].min(),
            "min_end_ns": grouped["runner_end_ns"].min(),
            "runner_end_skew_ns": grouped["runner_end_ns"].max() - grouped["runner_end_ns"].min(),
            "latest_start_rank": have.loc[grouped["runner_ts_ns"].idxmax(), ["step", "rank"]].set_index("step")["rank"],
            "latest_end_rank": have.loc[grouped["runner_end_ns"].idxmax(), ["step", "rank"]].set_index("step")["rank"],
        }
    )
    return table.reset_index().astype({"step": "int64"})


def skew_figures(roots: pd.DataFrame) -> tuple[dict, list[dict], pd.DataFrame]:
    """The ``figures`` block, the ``per_step`` list of summary.json, and the per-step table."""
    steps = per_step(roots)
    durations = root_durations(roots)
    figures = {
        "runner_start_skew_ms": percentile_block(steps["runner_start_skew_ns"]),
        "runner_end_skew_ms": percentile_block(steps["runner_end_skew_ns"]),
        "runner_to_validate_gap_ms": percentile_block(durations["runner_to_validate_gap_ns"]),
        "validate_ms": percentile_block(durations["validate_ns"]),
        "bind_ms": percentile_block(durations["bind_ns"]),
        "runner_run_ms": percentile_block(durations["runner_ns"]),
        "root_ms": percentile_block(durations["root_ns"]),
    }
    per_rank: dict[str, dict] = {}
    blocks = {
        name: grouped_percentile_blocks(durations, "rank", column)
        for name, column in (("bind_ms", "bind_ns"), ("root_ms", "root_ns"), ("validate_ms", "validate_ns"),
                             ("runner_to_validate_gap_ms", "runner_to_validate_gap_ns"))
    }
    devices = durations.drop_duplicates("rank").set_index("rank")["device"]
    for rank, device in devices.items():  # one entry per rank
        key = str(rank)
        per_rank[key] = {name: blocks[name].get(key, percentile_block([])) for name in blocks} | {"device": str(device)}
    figures["per_rank"] = per_rank
    step_list = [
        {
            "step": int(row.step),
            "ranks": int(row.ranks),
            "runner_start_skew_ms": ns_to_ms(row.runner_start_skew_ns),
            "runner_end_skew_ms": ns_to_ms(row.runner_end_skew_ns),
            "latest_start_rank": int(row.latest_start_rank),
            "latest_end_rank": int(row.latest_end_rank),
        }
        for row in steps.itertuples(index=False)  # output rows of summary.json, one per step
    ]
    return figures, step_list, steps
