"""Where the findings go in the Perfetto exports: one marker per late item, and arrows from a slow step to what it blames.

The items are read from the summary (an item marked ``noise`` gets no marker)
and placed with the engine's ``decode`` table, where the culprit's lateness
shows; a culprit is the item's ``rank``, else its ``late_rank``. Nothing here
recomputes a figure: the marker's name and args are the item's. Placement and
arrows: docs/REPORTS.md, "Perfetto exports" (Findings, Flows).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from dsprof.analysis.outputs.findings import LATE_LISTS, item_line, value
from dsprof.analysis.stages.slow_steps import VIA_STEP_END
from dsprof.analysis.store.engine import Engine
from dsprof.profiler import strace_format as fmt

# summary section -> the marker's kind, and which end of the culprit's runner_run it sits at
SLOW_STEP = "slow step"
KINDS = {"slow_steps": (SLOW_STEP, "end"), "tail_steps": ("tail step", "end"), "late_starts": ("late start", "start")}
MARKER_CATEGORY = "finding"
_ITEM_TYPES = {
    "marker": pa.int64(),
    "kind": pa.string(),
    "at": pa.string(),
    "step": pa.int64(),
    "rank": pa.int64(),
    "evidence_step": pa.int64(),
    "mechanism": pa.string(),
    "phase": pa.string(),
    "excess_ms": pa.float64(),
    "evidence_ms": pa.float64(),
    "name": pa.string(),
    "finding": pa.string(),
}
_VICTIM_TYPES = {"marker": pa.int64(), "rank": pa.int64(), "phase": pa.string(), "evidence_ns": pa.int64()}


def marker_name(kind: str, item: Mapping[str, Any], rank: int) -> str:
    """``slow step 12: rank 1 run_queue +8.5 ms``."""
    return f"{kind} {item.get('step')}: rank {rank} {item.get('mechanism') or fmt.MECH_UNATTRIBUTED} +{value(item.get('excess_ms'))} ms"


def _items(summary: Mapping[str, Any]) -> tuple[pa.Table, pa.Table]:
    """The findings (one row per item that is not noise, numbered from 1) and each slow step's victims at its collective."""
    items: dict[str, list] = {name: [] for name in _ITEM_TYPES}
    victims: dict[str, list] = {name: [] for name in _VICTIM_TYPES}
    for section, _ in LATE_LISTS:
        kind, at = KINDS[section]
        for item in (summary.get(section) or {}).get("items") or []:  # one per late item: the few findings
            rank = item.get("rank") if item.get("rank") is not None else item.get("late_rank")
            if item.get("noise") or rank is None or item.get("step") is None:
                continue
            marker = len(items["marker"]) + 1
            row = {
                **{name: item.get(name) for name in _ITEM_TYPES},
                "marker": marker,
                "kind": kind,
                "at": at,
                "rank": rank,
                "name": marker_name(kind, item, rank),
                "finding": item_line(item),
            }
            for name in _ITEM_TYPES:
                items[name].append(row[name])
            for victim in _victims(item, marker) if section == "slow_steps" else []:
                for name in _VICTIM_TYPES:
                    victims[name].append(victim[name])
    return (
        pa.table({name: pa.array(items[name], type) for name, type in _ITEM_TYPES.items()}),
        pa.table({name: pa.array(victims[name], type) for name, type in _VICTIM_TYPES.items()}),
    )


def _victims(item: Mapping[str, Any], marker: int) -> list[dict]:
    """The ranks a slow step's culprit held at the collective its critical path went through (none: via the step's end)."""
    if (item.get("critical_path") or {}).get("via") in (None, VIA_STEP_END):
        return []
    return [
        {
            "marker": marker,
            "rank": cause["rank"],
            "phase": cause.get("phase"),
            "evidence_ns": round(float(cause.get("evidence_ms") or 0) * 1e6),
        }
        for cause in item.get("ranks") or []  # the step's ranks: a few
        if cause.get("role") == "victim" and cause.get("rank") is not None
    ]


def build_finding_markers(engine: Engine, summary: Mapping[str, Any]) -> None:
    """Create ``finding_markers`` (the items' columns with the culprit's ``pid`` and the marker's ``ts_ns``) and
    ``finding_victims`` (marker, rank, phase, evidence_ns)."""
    items, victims = _items(summary)
    engine.con.register("finding_items", items)
    engine.con.register("finding_victims_in", victims)
    engine.run("""CREATE OR REPLACE TEMP TABLE finding_markers AS
        SELECT f.*, d.pid, CASE WHEN f.at = 'start' THEN coalesce(d.runner_ts_ns, d.root_ts_ns)
                               ELSE coalesce(d.runner_end_ns, d.root_end_ns) END AS ts_ns
        FROM finding_items f JOIN decode d ON d.step = f.step AND d.rank = f.rank
        WHERE ts_ns IS NOT NULL
        QUALIFY row_number() OVER (PARTITION BY f.marker ORDER BY d.root_ts_ns, d.pid, d.inv) = 1;
        CREATE OR REPLACE TEMP TABLE finding_victims AS SELECT * FROM finding_victims_in""")
    engine.con.unregister("finding_items")
    engine.con.unregister("finding_victims_in")
