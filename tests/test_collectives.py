"""Who reached a collective last, in its one home (analysis/stages/collectives.py), on hand-made waits."""

from __future__ import annotations

import duckdb
import pytest

from dsprof.analysis.stages.collectives import ALIGNMENT_TOLERANCE_NS, SOURCE_ARRIVAL, SOURCE_PEER, collective_instances
from dsprof.analysis.store.engine import Engine

A2A, AR = "device_wall.a2a_wait", "device_wall.allreduce_wait"


def _collectives(runs: dict[tuple[int, int], tuple[int, list[tuple[int, int, str, int | None]]]]) -> dict[tuple, dict]:
    """The ``collectives`` rows of decode runs {(step, rank): (launch, [(offset, wait, name, peer)])}, by (step, name, occurrence, rank)."""
    engine = Engine(duckdb.connect(), trace=None)  # type: ignore[arg-type]
    engine.run("""CREATE TABLE decode (step BIGINT, rank BIGINT, runner_ts_ns BIGINT,
                                       device_waits STRUCT(ts_ns BIGINT, dur_ns BIGINT, "name" VARCHAR, peer BIGINT)[])""")
    for (step, rank), (launch, waits) in runs.items():
        engine.run(
            "INSERT INTO decode VALUES (?, ?, ?, ?)",
            [step, rank, launch, [dict(zip(("ts_ns", "dur_ns", "name", "peer"), w, strict=True)) for w in waits]],
        )
    engine.written["decode"] = "swimlane"
    collective_instances(engine)
    table = engine.arrow("SELECT * FROM collectives").to_pylist()
    return {(r["step"], r["name"], r["occurrence"], r["rank"]): r for r in table}


def test_on_an_aligned_clock_the_last_arrival_on_the_host_axis_is_last_and_ties_go_to_the_lowest_rank():
    # ranks 1 and 2 arrive together last (at 300); everyone leaves at 500, rank 0 stalled until 900 after the release
    rows = _collectives({(0, 0): (0, [(100, 800, A2A, None)]), (0, 1): (0, [(300, 200, A2A, None)]), (0, 2): (0, [(300, 200, A2A, None)])})
    first = rows[(0, A2A, 1, 0)]
    assert first["aligned"] and first["last_arrival_ns"] == 300 and first["first_exit_ns"] == 500
    assert {r["last_rank"] for r in rows.values()} == {1} and first["source"] == SOURCE_ARRIVAL
    assert [rows[(0, A2A, 1, r)]["ahead_ns"] for r in range(3)] == [200, 0, 0]
    assert first["exit_ns"] == 900  # the stall is its own, not a wait for a late peer


def test_on_an_unaligned_clock_the_rank_that_waited_least_arrived_last():
    # device offsets from launches that do not line up: rank 2 "leaves" long before rank 0 "arrives"
    rows = _collectives({(3, 0): (10_000_000, [(0, 50, A2A, None)]), (3, 1): (0, [(0, 20, A2A, None)]), (3, 2): (0, [(5, 20, A2A, None)])})
    assert not rows[(3, A2A, 1, 0)]["aligned"]
    assert {r["last_rank"] for r in rows.values()} == {1}
    assert [rows[(3, A2A, 1, r)]["ahead_ns"] for r in range(3)] == [30, 0, 0]


def test_an_exit_just_before_the_last_arrival_is_clock_noise():
    late = ALIGNMENT_TOLERANCE_NS - 1
    rows = _collectives({(0, 0): (0, [(0, 1_000, A2A, None)]), (0, 1): (0, [(1_000 + late, 0, A2A, None)])})
    assert rows[(0, A2A, 1, 0)]["aligned"] and rows[(0, A2A, 1, 0)]["last_rank"] == 1


def test_the_producers_peer_names_the_last_rank_and_occurrences_are_counted_per_collective():
    waits = [(0, 10, A2A, 1), (20, 10, AR, 1), (40, 10, A2A, 0)]
    rows = _collectives({(0, 0): (0, waits), (0, 1): (0, waits)})
    assert rows[(0, A2A, 1, 0)]["source"] == SOURCE_PEER and rows[(0, A2A, 1, 0)]["last_rank"] == 1
    assert rows[(0, A2A, 2, 1)]["last_rank"] == 0 and rows[(0, A2A, 2, 1)]["wait_index"] == 2
    assert rows[(0, AR, 1, 0)]["wait_index"] == 1


@pytest.mark.parametrize("ranks", [1, 4])
def test_the_latest_of_staggered_arrivals_is_last_a_lone_rank_included(ranks):
    rows = _collectives({(0, r): (0, [(10 * r, 100, A2A, None)]) for r in range(ranks)})
    assert {r["last_rank"] for r in rows.values()} == {ranks - 1}
