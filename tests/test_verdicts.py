"""Verdicts that hold (docs/FIGURES.md "Noise floor", "Evidence for a mechanism", "Straggler verdict", "Verdict").

Known-answer logs of the coupled decode loop (an independent producer: its
own simulation, with seeded jitter on every span) with faults written in, and
crafted causes for the evidence rule. The floors are recomputed here from the
simulation's own timeline, never from dsprof's tables.
"""

from __future__ import annotations

from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.ingest import read_paths
from dsprof.analysis.stages.noise import require_evidence
from dsprof.analysis.stages.straggler import most_hit_chance, rank_label_p
from dsprof.testing.coupled import MS, Fault, Scenario, Shape, step_intervals
from dsprof.testing.coupled_log import write_log

SHAPE = Shape(ranks=4, steps=80, layers=2, seed=5, peer=True)
FAULT_STEPS = list(range(6, 78, 6))  # twelve faults, far apart


def _summary(tmp_path: Path, faults: list[Fault]) -> tuple[dict, Scenario]:
    scenario = Scenario(SHAPE, faults)
    write_log(scenario, scenario.run(), tmp_path / "server.log")
    result = analyze_trace(read_paths([tmp_path / "server.log"]))
    try:
        return result.summary, scenario  # type: ignore[return-value]
    finally:
        result.engine.close()


def _settled_floor_ms(values: np.ndarray) -> float:
    """FIGURES.md "Noise floor", written again from its words: z * 1.4826 * MAD of the values left once those above
    median + 1.5 * z * 1.4826 * MAD are set aside, round after round; z for all the values."""
    z = NormalDist().inv_cdf(1 - 0.05 / len(values))
    kept = values
    while True:
        level, mad = np.median(kept), np.median(np.abs(kept - np.median(kept)))
        now = values[values <= level + 1.5 * z * 1.4826 * mad]
        if len(now) == len(kept):
            return float(z * 1.4826 * mad)
        kept = now


def _late_items(summary: dict) -> list[dict]:
    return [*summary["late_starts"]["items"], *summary["tail_steps"]["items"], *summary["slow_steps"]["items"]]


def test_a_healthy_run_is_healthy_within_its_own_noise(tmp_path):
    summary, scenario = _summary(tmp_path, [])
    intervals = step_intervals(scenario.run()) / MS
    mad = np.median(np.abs(intervals - np.median(intervals)))
    plain = NormalDist().inv_cdf(1 - 0.05 / len(intervals)) * 1.4826 * mad
    assert summary["noise"]["slow_steps_ms"] == pytest.approx(_settled_floor_ms(intervals), abs=2e-3)  # from the simulation
    assert summary["noise"]["slow_steps_ms"] == pytest.approx(plain, rel=0.1)  # a healthy run sets (almost) nothing aside
    assert summary["verdict"]["status"] == "healthy" and summary["verdict"]["noise_floor_ms"] == summary["noise"]["floor_ms"]
    assert summary["tail_steps"]["straggler"]["rank"] is None and summary["tail_steps"]["straggler"]["pattern"] == "none"
    assert all(item["noise"] for item in _late_items(summary) if item["excess_ms"] <= summary["noise"]["slow_steps_ms"])
    assert list(summary)[:3] == ["schema", "dsprof_version", "verdict"]


def test_a_rank_hit_at_every_fault_is_a_significant_straggler(tmp_path):
    summary, _ = _summary(tmp_path, [Fault(step, 2, "device", 25 * MS) for step in FAULT_STEPS])
    straggler = summary["tail_steps"]["straggler"]
    assert (straggler["pattern"], straggler["rank"], straggler["mechanism"]) == ("rank", 2, "device"), straggler
    assert straggler["p_value"] < 0.01 and straggler["parts"] >= 3
    low, high = straggler["share_ci"]
    assert 0 < low <= straggler["share"] <= high
    assert summary["verdict"]["status"] == "degraded" and summary["verdict"]["headline"].startswith("rank 2 ")
    slow = [item for item in summary["slow_steps"]["items"] if not item["noise"]]
    assert {item["step"] for item in slow} >= set(FAULT_STEPS)  # every fault stands out against the jitter
    assert all(item["rank"] == 2 for item in slow)


def test_faults_at_a_third_of_the_steps_do_not_widen_the_floor_over_them(tmp_path):
    """Every third step a rank's device is slow by 12 ms: the plain MAD of the intervals grows past what the healthy
    steps vary by, and a 12 ms fault would hide under a floor sized by the faults themselves."""
    faults = [Fault(step, step % 4, "device", 12 * MS) for step in range(3, 78, 3)]
    summary, scenario = _summary(tmp_path, faults)
    intervals = step_intervals(scenario.run()) / MS
    healthy = step_intervals(Scenario(SHAPE, []).run()) / MS
    z = NormalDist().inv_cdf(1 - 0.05 / len(intervals))
    plain = z * 1.4826 * np.median(np.abs(intervals - np.median(intervals)))
    floor = summary["noise"]["slow_steps_ms"]
    assert floor == pytest.approx(_settled_floor_ms(intervals), abs=2e-3)
    assert floor < plain and floor < 1.5 * _settled_floor_ms(healthy), (floor, plain, _settled_floor_ms(healthy))
    slow = {item["step"] for item in summary["slow_steps"]["items"] if not item["noise"]}
    assert len(slow & {f.step for f in faults}) >= 0.9 * len(faults), sorted(slow)


def test_faults_spread_over_ranks_name_no_rank(tmp_path):
    summary, _ = _summary(tmp_path, [Fault(step, i % 4, "device", 25 * MS) for i, step in enumerate(FAULT_STEPS)])
    straggler = summary["tail_steps"]["straggler"]
    assert (straggler["pattern"], straggler["rank"]) == ("spread", None), straggler
    assert straggler["by_rank_counts"] == {"0": 3, "1": 3, "2": 3, "3": 3}
    assert straggler["chance"] == pytest.approx(1.0) and straggler["cost_ms"] == summary["what_if"]["total_saved_ms"]
    assert straggler["verdict"].startswith("spread over ranks: 12 late steps") and "no rank more often than chance" in straggler["verdict"]
    assert summary["verdict"]["status"] == "degraded"


def test_a_rank_late_at_four_of_seven_faults_by_luck_is_no_straggler(tmp_path):
    """Four ranks, faults drawn 4 to rank 2 and one to each other rank: some rank gets 4 of 7 in 28% of fair draws."""
    steps = FAULT_STEPS[::2] + FAULT_STEPS[-1:]  # spread over the run, so every other test of the verdict is met
    faults = [Fault(step, {1: 0, 3: 1, 5: 3}.get(i, 2), "device", 25 * MS) for i, step in enumerate(steps)]
    summary, _ = _summary(tmp_path, faults)
    straggler = summary["tail_steps"]["straggler"]
    assert straggler["p_value"] >= 0.1 and straggler["pattern"] != "rank", straggler  # a bootstrap over the steps said p 0.053
    assert straggler["share"] >= 0.05 and straggler["steps"] >= 4 and straggler["parts"] >= 3  # only luck is against it


def test_the_same_trace_gives_the_same_verdict(tmp_path):
    faults = [Fault(step, 1, "run_queue", 20 * MS) for step in FAULT_STEPS[::2]]
    first, _ = _summary(tmp_path / "a", faults)
    second, _ = _summary(tmp_path / "b", faults)
    assert first["verdict"] == second["verdict"] and first["tail_steps"]["straggler"] == second["tail_steps"]["straggler"]


def test_every_named_mechanism_has_evidence_for_half_its_excess(tmp_path):
    summary, _ = _summary(
        tmp_path, [Fault(step, i % 3, ("device", "gc_bind", "host_cpu")[i % 3], 20 * MS) for i, step in enumerate(FAULT_STEPS)]
    )
    causes = [*_late_items(summary), *(late for tail in summary["tail_steps"]["items"] for late in tail["ranks"])]
    for cause in causes:
        if cause["mechanism"] != "unattributed":
            assert cause["evidence_ms"] >= 0.5 * cause["excess_ms"] - 1e-3, cause


def test_evidence_under_half_the_excess_leaves_the_item_unattributed():
    weak = {"mechanism": "run_queue", "evidence_ms": 2.673, "detail": "2.673 ms runnable but waiting for a CPU in bind", "role": "culprit"}
    require_evidence(weak, 49.0)
    assert (weak["mechanism"], weak["partial_mechanism"], weak["explained_share"], weak["evidence_ms"]) == (
        "unattributed",
        "run_queue",
        0.055,
        2.673,
    )
    assert weak["detail"].endswith("explains 5% of the 49.000 ms excess, too little to name it")
    strong = {"mechanism": "gc", "evidence_ms": 35.6, "detail": "35.600 ms collection", "role": "culprit"}
    require_evidence(strong, 49.0)
    assert (strong["mechanism"], strong["explained_share"]) == ("gc", 0.727) and "partial_mechanism" not in strong
    chained = {"mechanism": "carried_over", "evidence_ms": 1.0, "detail": "held back", "from_step": 3, "role": "culprit"}
    require_evidence(chained, 10.0)
    assert chained["mechanism"] == "unattributed" and "from_step" not in chained  # the chain stops at a weak link
    victim = {"mechanism": "peer_wait", "evidence_ms": 1.0, "detail": "waited", "role": "victim", "rank": 3, "peer": 3, "late_rank": 1}
    require_evidence(victim, 10.0)
    assert (victim["role"], victim["rank"], "peer" in victim) == ("culprit", 1, False)


@pytest.mark.parametrize(
    ("items", "most", "ranks", "chance"), [(12, 3, 4, 1.0), (16, 9, 2, 2 * 26333 / 65536), (12, 12, 4, 4 * 0.25**12), (0, 0, 4, 1.0)]
)
def test_the_chance_of_a_rank_hit_that_often(items, most, ranks, chance):
    assert most_hit_chance(items, most, ranks) == pytest.approx(chance)


@pytest.mark.parametrize(
    ("costs", "ranks", "exact"),
    [
        ({0: [1.0] * 5, 1: [1.0] * 2}, 2, 58 / 128),  # 5 of 7 on one of two ranks, or 2 of 7: P(Bin(7, 1/2) >= 5 or <= 2)
        ({0: [1.0] * 5}, 2, 2 / 32),  # all five on the same rank
        ({0: [1.0] * 5}, 4, 4 * 0.25**5),
        ({0: [100.0], 1: [1.0] * 6}, 2, 1.0),  # one big cost is the costliest rank whichever rank it lands on
        ({0: [1.0] * 12}, 2, 2 / 4096),
    ],
)
def test_the_chance_that_a_fair_draw_of_ranks_makes_one_as_costly(costs, ranks, exact):
    cost = {rank: np.array([*values, 0.0, 0.0]) for rank, values in costs.items()}
    p = rank_label_p(cost, ranks)
    draws = 2000
    assert abs(p - exact) <= 4 * np.sqrt(exact * (1 - exact) / draws) + 2 / draws, (p, exact)
    assert p == rank_label_p(cost, ranks)  # seeded: the same costs, the same p
