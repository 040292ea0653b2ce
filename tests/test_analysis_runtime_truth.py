"""The analysis against the runtime's own ground truth: injected faults are found where faults.json says."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from dsprof.commands.analyze import analyze_paths
from dsprof.runtime.config import RuntimeConfig
from dsprof.runtime.launch import run_workload

pytestmark = pytest.mark.runtime

# Far above the few ms of scheduling skew that four ranks on two cores show.
FENCE_DELAY_MS = 40


def test_every_injected_fence_tail_is_found_on_its_rank(tmp_path):
    config = RuntimeConfig.from_preset("demo", ranks=4, requests=8, output_tokens=24, seed=11,
                                       inject=[f"fence_tail:p=0.12,ms={FENCE_DELAY_MS}"])
    outcome = run_workload(config, tmp_path)
    assert outcome.exit_status == 0, outcome.message

    delayed_ranks_by_step: dict[int, set[int]] = defaultdict(set)
    for fault in json.loads((tmp_path / "faults.json").read_text())["faults"]:
        assert fault["kind"] == "fence_delay" and fault["delay_ms"] == FENCE_DELAY_MS
        delayed_ranks_by_step[fault["step"]].add(fault["rank"])
    assert delayed_ranks_by_step, "seed 11 injects at least one fence delay"

    summary = analyze_paths([tmp_path], None, expect_ranks=4).summary
    assert summary["validation"]["valid"], summary["validation"]["problems"]
    tails = {item["step"]: item for item in summary["tail_steps"]["items"]}
    for step, ranks in sorted(delayed_ranks_by_step.items()):
        if len(ranks) == 4:
            continue  # every rank waited alike: no skew to find
        assert step in tails, f"injected fence delay at step {step} on ranks {sorted(ranks)} not reported"
        assert tails[step]["rank"] in ranks
        assert tails[step]["runner_end_skew_ms"] >= FENCE_DELAY_MS / 2
        # At depth 2, run N+2 is bound only once run N has drained, so a delay
        # two steps earlier on the same rank makes this run start late: its cause
        # is then the carry-over from that step, not its own fence.
        delayed_two_steps_before = ranks & delayed_ranks_by_step.get(step - 2, set())
        if delayed_two_steps_before:
            assert (tails[step]["mechanism"], tails[step]["from_step"]) == ("carried_over", step - 2), tails[step]
        else:
            assert (tails[step]["phase"], tails[step]["mechanism"]) == ("native_fence_wait", "device"), tails[step]
            assert tails[step]["evidence_ms"] >= FENCE_DELAY_MS / 2
    # seed 11 puts two delays on rank 1 at steps 10 and 12: both cases above are exercised
    assert delayed_ranks_by_step == {10: {1}, 12: {1}}
