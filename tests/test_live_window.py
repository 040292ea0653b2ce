"""Which steps of a live window are complete (analysis/live/live_analysis.py ``StepRing``): with ``--expect-ranks``, every rank's."""

from __future__ import annotations

import pytest

from dsprof.analysis.live.live_analysis import LiveAnalysis
from dsprof.testing.coupled import Shape, scenario_for
from dsprof.testing.coupled_log import write_log

SHAPE = Shape(ranks=4, steps=60, layers=2, seed=11)


@pytest.fixture(scope="module")
def log_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    scenario = scenario_for(SHAPE)
    path = tmp_path_factory.mktemp("faulty") / "server.log"
    write_log(scenario, scenario.run(), path)
    return path.read_bytes()


def test_with_expect_ranks_a_step_waits_for_a_rank_whose_log_is_not_there_yet(tmp_path, log_bytes):
    """Per-rank logs: the fourth rank's log appears after the first refresh; only --expect-ranks holds its steps back."""
    lines = log_bytes.decode().splitlines(keepends=True)
    pids = sorted({line.split(" pid=")[1].split()[0] for line in lines if "[STRACE]" in line})
    for rank, pid in enumerate(pids):
        (tmp_path / f"rank{rank}.txt").write_text("".join(line for line in lines if f"pid={pid} " in line or f"pid={pid}]" in line))
    logs = tmp_path / "logs"
    logs.mkdir()
    for rank in range(len(pids) - 1):
        (tmp_path / f"rank{rank}.txt").rename(logs / f"rank{rank}.log")
    default = LiveAnalysis([logs], tmp_path / "a", window=100)
    expecting = LiveAnalysis([logs], tmp_path / "b", window=100, expect_ranks=len(pids))
    default.poll()
    expecting.poll()
    early = default.window()
    assert early is not None and len(early.summary["figures"]["per_rank"]) == len(pids) - 1  # shown without the last rank
    early.engine.close()
    assert expecting.window() is None  # no step has every rank yet
    (tmp_path / f"rank{len(pids) - 1}.txt").rename(logs / f"rank{len(pids) - 1}.log")
    expecting.poll()
    full = expecting.window()
    assert full is not None and len(full.summary["figures"]["per_rank"]) == len(pids)
    assert full.summary["validation"]["valid"], full.summary["validation"]["problems"]
    full.engine.close()
    default.abort()
    expecting.abort()
