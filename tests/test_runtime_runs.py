"""End-to-end runs of the bundled runtime at small shapes (rank processes, gloo)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from dsprof.runtime.__main__ import main
from dsprof.runtime.config import RuntimeConfig
from dsprof.runtime.distributed import free_port
from dsprof.runtime.launch import run_workload
from dsprof.runtime.pipeline import DECODE_CALLABLE

pytestmark = pytest.mark.runtime

_RECORD = re.compile(r"\[STRACE\] v=1 pid=(\d+) tid=\d+ inv=(\d+) hid=\S+ depth=(\d+) name=(\S+) ts=(\d+) dur=(\d+)(.*)$")


def strace_runs(log_path) -> dict[tuple[int, int], dict]:
    """(pid, inv) -> {"attrs": root attributes, span name: (ts, end)} from a server.log."""
    runs: dict[tuple[int, int], dict] = defaultdict(dict)
    for line in open(log_path, encoding="utf-8"):
        match = _RECORD.search(line)
        if not match:
            continue
        pid, inv, depth, name, ts, dur, rest = match.groups()
        attrs = dict(item.split("=", 1) for item in rest.split())
        run = runs[(int(pid), int(inv))]
        if attrs.get("clk") == "dev":
            run.setdefault("dev", []).append(name)
            continue
        run[name] = (int(ts), int(ts) + int(dur))
        if name == "chip.run":
            run["attrs"] = attrs
    return runs


def decode_lanes(log_path) -> dict[int, list[dict]]:
    """Per rank, the decode runs ordered by run_epoch."""
    lanes: dict[int, list[dict]] = defaultdict(list)
    for run in strace_runs(log_path).values():
        if run["attrs"]["callable"] == DECODE_CALLABLE:
            lanes[int(run["attrs"]["rank"])].append(run)
    return {rank: sorted(runs, key=lambda r: int(r["attrs"]["run_epoch"])) for rank, runs in lanes.items()}


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


SMALL = dict(ranks=2, requests=4, prompt_tokens=8, output_tokens=14)


@pytest.fixture(scope="module")
def production_runs(tmp_path_factory):
    outcomes = {}
    for path in ("host-shared", "device-resident"):
        config = RuntimeConfig.from_preset("production", metadata=path, **SMALL)
        outcomes[path] = run_workload(config, tmp_path_factory.mktemp(path))
    return outcomes


def test_every_token_returned_and_identical_across_metadata_paths(production_runs):
    plain, legacy = production_runs["host-shared"], production_runs["device-resident"]
    for outcome in (plain, legacy):
        assert outcome.exit_status == 0, outcome.message
        summary = outcome.summary
        assert summary["tokens_returned"] == summary["tokens_expected"] == 4 * 14
        assert all(len(tokens) == 14 for tokens in outcome.tokens.values())
        assert summary["schema"] == "dsprof.performance_summary/1"
        assert summary["effective_tpot_ms"] == pytest.approx(summary["batch_elapsed_s"] * 1000 / 14, rel=1e-3)
        written = json.loads((outcome.out_dir / "performance_summary.json").read_text())
        assert written == summary and written["workload"]["dp"] == 2
        assert (outcome.out_dir / "serving-trace" / "trace.json").is_file()
    assert plain.tokens == legacy.tokens
    assert plain.summary["acceptance_rate"] == legacy.summary["acceptance_rate"]


def test_host_shared_pipelines_and_device_resident_serializes(production_runs):
    for path, expect_overlap in (("host-shared", True), ("device-resident", False)):
        outcome = production_runs[path]
        lanes = decode_lanes(outcome.out_dir / "server.log")
        assert sorted(lanes) == [0, 1]
        steps = outcome.summary["decode_steps"]
        for rank, runs in lanes.items():
            assert [int(r["attrs"]["step"]) for r in runs] == list(range(steps))
            for run, successor in zip(runs, runs[1:]):
                assert overlaps(successor["chip.run.bind"], run["chip.run.runner_run"]) is expect_overlap, (path, rank)
                # the successor never launches before the predecessor released its claim
                assert successor["chip.run.runner_run"][0] >= run["chip.run.claim_release"][0]


def test_span_tree_and_identity_attributes(production_runs):
    log = production_runs["host-shared"].out_dir / "server.log"
    text = log.read_text()
    assert text.count("[chip_process pid=") == 2 and text.count("[CLOCK_ANCHOR]") == 2
    runs = strace_runs(log)
    decode = [r for r in runs.values() if r["attrs"]["callable"] == DECODE_CALLABLE]
    prefill = [r for r in runs.values() if r["attrs"]["callable"] != DECODE_CALLABLE]
    assert len(prefill) == 2 and len(decode) == 2 * production_runs["host-shared"].summary["decode_steps"]
    for run in decode:
        assert {"run_id", "dispatch_id", "run_epoch", "slot_id", "generation", "rank", "device", "step"} <= set(run["attrs"])
        assert run["attrs"]["device"] == f"cpu:{run['attrs']['rank']}"
        for child in ("bind", "bind.args", "bind.prebuilt", "runner_run", "runner_run.native_fence_wait",
                      "claim_release", "validate"):
            assert f"chip.run.{child}" in run
        assert "chip.run.runner_run.device_wall" in run["dev"]
        root = run["chip.run"]
        assert root[0] <= run["chip.run.bind"][0] and run["chip.run.validate"][1] <= root[1]
        fence = run["chip.run.runner_run.native_fence_wait"]
        assert run["chip.run.runner_run"][0] <= fence[0] and fence[1] == run["chip.run.runner_run"][1]


def test_microbench_shape_both_paths_and_no_device_phases(tmp_path):
    outcomes = {}
    for path in ("host-shared", "device-resident"):
        config = RuntimeConfig.from_preset("microbench", rounds=6, warmup=2, device_phases=False, metadata=path)
        outcomes[path] = outcome = run_workload(config, tmp_path / path)
        assert outcome.exit_status == 0, outcome.message
        assert outcome.summary["decode_steps"] == 6 and outcome.summary["workload"]["tp"] == 4
        assert outcome.summary["tokens_returned"] == outcome.summary["tokens_expected"] > 4 * 8
        lanes = decode_lanes(tmp_path / path / "server.log")
        # four TP ranks, warm-up not profiled, measured steps numbered from 0
        assert sorted(lanes) == [0, 1, 2, 3]
        assert all([int(r["attrs"]["step"]) for r in runs] == list(range(6)) for runs in lanes.values())
        text = (tmp_path / path / "server.log").read_text()
        assert "native_fence_wait" not in text and "device_wall" not in text
    assert outcomes["host-shared"].tokens == outcomes["device-resident"].tokens


def test_injected_faults_land_where_the_ground_truth_says(tmp_path):
    config = RuntimeConfig.from_preset("demo", ranks=2, requests=4, output_tokens=12, seed=5,
                                       inject=["fence_tail:p=0.5,ms=60", "slow_bind:rank=1,ms=80,step=2"])
    outcome = run_workload(config, tmp_path)
    assert outcome.exit_status == 0, outcome.message
    truth = json.loads((tmp_path / "faults.json").read_text())
    assert truth["schema"] == "dsprof.faults/1" and truth["seed"] == 5
    fences = {(f["rank"], f["step"]) for f in truth["faults"] if f["kind"] == "fence_delay"}
    binds = [(f["rank"], f["step"]) for f in truth["faults"] if f["kind"] == "slow_bind"]
    assert binds == [(1, 2)] and fences
    lanes = decode_lanes(tmp_path / "server.log")
    for rank, runs in lanes.items():
        for run in runs:
            step = int(run["attrs"]["step"])
            wait = run["chip.run.runner_run.native_fence_wait"]
            if (rank, step) in fences:  # the host reaches the wait before the late fence fires
                assert wait[1] - wait[0] >= 40e6
            bind = run["chip.run.bind"]
            assert (bind[1] - bind[0] >= 80e6) is ((rank, step) == (1, 2))


def test_a_crashed_rank_fails_the_job_and_is_named(tmp_path):
    config = RuntimeConfig.from_preset("demo", ranks=3, requests=6, output_tokens=30, inject=["crash:rank=1,step=4"])
    started = time.monotonic()
    outcome = run_workload(config, tmp_path)
    assert time.monotonic() - started < 30
    assert outcome.exit_status != 0 and outcome.failed_rank == 1
    assert "rank 1" in outcome.message and "crashed at decode step 4" in outcome.message
    assert outcome.summary["exit_status"] == outcome.exit_status
    assert outcome.summary["tokens_returned"] < outcome.summary["tokens_expected"]
    # effective TPOT counts the tokens each request got back, not the planned 30
    summary = outcome.summary
    if summary["tokens_returned"]:
        returned_per_request = summary["tokens_returned"] / 6
        assert summary["effective_tpot_ms"] == pytest.approx(summary["batch_elapsed_s"] * 1000 / returned_per_request, rel=1e-3)
    assert "InjectedCrash" in (tmp_path / "server.log").read_text()
    json.loads((tmp_path / "serving-trace" / "trace.json").read_text())
    truth = json.loads((tmp_path / "faults.json").read_text())
    assert {"kind": "crash", "rank": 1, "step": 4, "delay_ms": None} in truth["faults"]


def test_cli_exit_status(tmp_path, capsys):
    assert main(["--ranks", "2", "--requests", "2", "--output-tokens", "5", "--prompt-tokens", "4",
                 "--no-profile", "-o", str(tmp_path)]) == 0
    assert not (tmp_path / "serving-trace").exists()
    assert "[STRACE]" not in (tmp_path / "server.log").read_text()
    assert main(["--inject", "crash:rank=1", "-o", str(tmp_path)]) == 2
    assert "crash:rank=1" in capsys.readouterr().err


def test_torchrun_style_launch_reads_the_rank_environment(tmp_path):
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with open(tmp_path / "server.log", "wb") as log:
        done = subprocess.run([sys.executable, "-m", "dsprof.runtime", "--ranks", "1", "--requests", "2",
                               "--prompt-tokens", "4", "--output-tokens", "6", "-o", str(tmp_path)],
                              env=env, stderr=log, timeout=120)
    assert done.returncode == 0
    summary = json.loads((tmp_path / "performance_summary.json").read_text())
    assert summary["tokens_returned"] == summary["tokens_expected"] == 12
    assert len(decode_lanes(tmp_path / "server.log")[0]) == summary["decode_steps"]
