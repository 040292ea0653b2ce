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

from dsprof.profiler.strace_format import (
    A2A_WAIT,
    BIND,
    BIND_ARGS,
    BIND_PREBUILT,
    CLAIM_RELEASE,
    DECODE_CALLABLE,
    DEVICE_FORWARD,
    DEVICE_WALL,
    FENCE_WAIT,
    GC,
    HOST_EVIDENCE_ATTRS,
    OS_CPU_NS,
    OS_RQ_NS,
    ROOT,
    RUNNER_RUN,
    VALIDATE,
    device_phase_name,
)
from dsprof.runtime.__main__ import main
from dsprof.runtime.config import RuntimeConfig
from dsprof.runtime.distributed import free_port
from dsprof.runtime.launch import run_workload

pytestmark = pytest.mark.runtime

_RECORD = re.compile(r"\[STRACE\] v=1 pid=(\d+) tid=\d+ inv=(\d+) hid=\S+ depth=(\d+) name=(\S+) ts=(\d+) dur=(\d+)(.*)$")


def strace_runs(log_path) -> dict[tuple[int, int], dict]:
    """(pid, inv) -> {"pid", "attrs": root attributes, span name: (ts, end, attrs), "dev": [(name, depth, ts, dur, attrs)]}.

    Only the runtime's chip.run trees; host.gc spans are read by :func:`gc_spans`.
    """
    runs: dict[tuple[int, int], dict] = defaultdict(dict)
    for line in open(log_path, encoding="utf-8"):
        match = _RECORD.search(line)
        if not match or not match.group(4).startswith(ROOT):
            continue
        pid, inv, depth, name, ts, dur, rest = match.groups()
        attrs = dict(item.split("=", 1) for item in rest.split())
        run = runs[(int(pid), int(inv))]
        run["pid"] = int(pid)
        if attrs.get("clk") == "dev":
            run.setdefault("dev", []).append((name, int(depth), int(ts), int(dur), attrs))
            continue
        run[name] = (int(ts), int(ts) + int(dur), attrs)
        if name == ROOT:
            run["attrs"] = attrs
    return runs


def gc_spans(log_path) -> list[tuple[int, int, int, dict]]:
    """Every host.gc span of a server.log: (pid, ts, dur, attributes)."""
    found = []
    for line in open(log_path, encoding="utf-8"):
        match = _RECORD.search(line)
        if match and match.group(4) == GC:
            pid, _, depth, _, ts, dur, rest = match.groups()
            assert depth == "0"
            found.append((int(pid), int(ts), int(dur), dict(item.split("=", 1) for item in rest.split())))
    return found


def lanes(log_path, callable_name: str | None = DECODE_CALLABLE) -> dict[int, list[dict]]:
    """Per rank, the runs of ``callable_name`` (None: every run, prefill included) ordered by run_epoch."""
    found: dict[int, list[dict]] = defaultdict(list)
    for run in strace_runs(log_path).values():
        if callable_name is None or run["attrs"]["callable"] == callable_name:
            found[int(run["attrs"]["rank"])].append(run)
    return {rank: sorted(runs, key=lambda r: int(r["attrs"]["run_epoch"])) for rank, runs in found.items()}


def decode_lanes(log_path) -> dict[int, list[dict]]:
    return lanes(log_path)


def span(run: dict, name: str) -> tuple[int, int]:
    return run[name][:2]


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def peer_reader() -> str | None:
    """The serving stack's STRACE checker, where this machine has it (it is never committed)."""
    path = os.environ.get("DSPROF_PEER_READER", "/work/peer/strace_timing.py")
    return path if os.path.isfile(path) else None


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
        every_run = lanes(outcome.out_dir / "server.log", None)
        assert sorted(every_run) == [0, 1]
        steps = outcome.summary["decode_steps"]
        for rank, runs in every_run.items():
            # the prefill is run 0 of the pipeline: decode step 0 binds while it is on the device
            assert [int(r["attrs"]["step"]) for r in runs] == [-1, *range(steps)]
            assert [int(r["attrs"]["dispatch_id"]) for r in runs] == list(range(1, steps + 2))
            for run, successor in zip(runs, runs[1:], strict=False):
                assert overlaps(span(successor, BIND), span(run, RUNNER_RUN)) is expect_overlap, (path, rank)
                # the successor never launches before the predecessor released its claim
                assert span(successor, RUNNER_RUN)[0] >= span(run, CLAIM_RELEASE)[0]


@pytest.mark.parametrize("path, passes", [("host-shared", True), ("device-resident", False)])
def test_the_serving_stacks_checker_accepts_host_shared_logs_only(production_runs, path, passes):
    """The stack's own --assert-native-overlap on the runtime's server.log (host evidence and gc spans in it)."""
    reader = peer_reader()
    if reader is None:
        pytest.skip("the serving stack's strace_timing.py is not on this machine (set DSPROF_PEER_READER)")
    log = production_runs[path].out_dir / "server.log"
    assert "os.rq_ns=" in log.read_text()
    done = subprocess.run(
        [sys.executable, reader, "--assert-native-overlap", str(log)], capture_output=True, text=True, timeout=120, check=False
    )
    if passes:
        assert done.returncode == 0, done.stderr
        assert "Native overlap verified for" in done.stdout and "warning" not in done.stderr
    else:
        assert done.returncode != 0 and "preparation did not overlap" in done.stderr


def test_span_tree_identity_evidence_and_peer_waits(production_runs):
    log = production_runs["host-shared"].out_dir / "server.log"
    text = log.read_text()
    assert text.count("[chip_process pid=") == 2 and text.count("[TIMING] clock_anchor: [CLOCK_ANCHOR]") == 2
    runs = strace_runs(log)
    decode = [r for r in runs.values() if r["attrs"]["callable"] == DECODE_CALLABLE]
    prefill = [r for r in runs.values() if r["attrs"]["callable"] != DECODE_CALLABLE]
    assert len(prefill) == 2 and len(decode) == 2 * production_runs["host-shared"].summary["decode_steps"]
    for run in decode:
        assert {"run_id", "dispatch_id", "run_epoch", "slot_id", "generation", "rank", "device", "step"} <= set(run["attrs"])
        assert run["attrs"]["device"] == f"cpu:{run['attrs']['rank']}"
        for child in (BIND, BIND_ARGS, BIND_PREBUILT, RUNNER_RUN, FENCE_WAIT, CLAIM_RELEASE, VALIDATE, ROOT):
            assert child in run
            # host evidence of the host thread over the span: CPU never more than the span lasted
            evidence = run[child][2]
            assert set(HOST_EVIDENCE_ATTRS) <= set(evidence), child
            ts, end = span(run, child)
            assert 0 <= int(evidence[OS_CPU_NS]) <= end - ts + 1_000_000 and int(evidence[OS_RQ_NS]) >= 0
        root = span(run, ROOT)
        assert root[0] <= span(run, BIND)[0] and span(run, VALIDATE)[1] <= root[1]
        fence = span(run, FENCE_WAIT)
        assert span(run, RUNNER_RUN)[0] <= fence[0] and fence[1] == span(run, RUNNER_RUN)[1]
        device = {name: (depth, ts, dur, attrs) for name, depth, ts, dur, attrs in run["dev"]}
        wall = device[DEVICE_WALL]
        # device_wall: the executor thread's evidence (the CPU "device" is a thread)
        assert wall[0] == 2 and set(HOST_EVIDENCE_ATTRS) <= set(wall[3]) and int(wall[3][OS_CPU_NS]) > 0
        forward = device[device_phase_name(DEVICE_FORWARD)]
        waits = [(depth, ts, dur) for name, depth, ts, dur, _ in run["dev"] if name == device_phase_name(f"{DEVICE_FORWARD}.{A2A_WAIT}")]
        # one MoE layer: the dispatch and the combine all-to-all, each inside forward on the device clock
        assert len(waits) == 2 and forward[0] == 3
        for depth, ts, dur in waits:
            assert depth == 4 and forward[1] <= ts and ts + dur <= forward[1] + forward[2]
        # each wait names the last rank to reach the collective (SPEC §2.1 peer)
        assert all(attrs["peer"] in ("0", "1") for name, _, _, _, attrs in run["dev"] if name.endswith("_wait"))
        assert wall[1] <= forward[1] and forward[1] + forward[2] <= wall[1] + wall[2]
    assert all(int(attrs["collected"]) >= 0 and attrs["gen"] in "012" for _, _, _, attrs in gc_spans(log))


def test_microbench_shape_both_paths_and_no_device_phases(tmp_path):
    outcomes = {}
    for path in ("host-shared", "device-resident"):
        config = RuntimeConfig.from_preset(
            "microbench", rounds=6, warmup=2, device_phases=False, metadata=path, inject=["slow_bind:rank=2,ms=30,step=1"]
        )
        outcomes[path] = outcome = run_workload(config, tmp_path / path)
        assert outcome.exit_status == 0, outcome.message
        assert outcome.summary["decode_steps"] == 6 and outcome.summary["workload"]["tp"] == 4
        assert outcome.summary["tokens_returned"] == outcome.summary["tokens_expected"] > 4 * 8
        log = tmp_path / path / "server.log"
        every_run = lanes(log, None)
        # four TP ranks; neither the warm-up nor the prefill before it is profiled; measured steps from 0
        assert sorted(every_run) == [0, 1, 2, 3]
        assert all([int(r["attrs"]["step"]) for r in runs] == list(range(6)) for runs in every_run.values())
        text = log.read_text()
        assert "native_fence_wait" not in text and "device_wall" not in text
        # faults.json numbers steps as the roots do: warm-up excluded
        truth = json.loads((tmp_path / path / "faults.json").read_text())["faults"]
        assert [(f["kind"], f["rank"], f["step"]) for f in truth] == [("slow_bind", 2, 1)]
        slow = [r for r in every_run[2] if int(r[BIND][2][OS_CPU_NS]) >= 30e6]
        assert [int(r["attrs"]["step"]) for r in slow] == [1]
    assert outcomes["host-shared"].tokens == outcomes["device-resident"].tokens
    reader = peer_reader()
    if reader is not None:  # the warm-up is not profiled: the first profiled pair is steps 0 and 1
        done = subprocess.run(
            [sys.executable, reader, "--assert-native-overlap", str(tmp_path / "host-shared" / "server.log")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr


def test_injected_faults_land_where_the_ground_truth_says(tmp_path):
    config = RuntimeConfig.from_preset(
        "demo", ranks=2, requests=4, output_tokens=12, seed=5, inject=["fence_tail:p=0.5,ms=60", "slow_bind:rank=1,ms=80,step=2"]
    )
    outcome = run_workload(config, tmp_path)
    assert outcome.exit_status == 0, outcome.message
    truth = json.loads((tmp_path / "faults.json").read_text())
    assert truth["schema"] == "dsprof.faults/1" and truth["seed"] == 5
    fences = {(f["rank"], f["step"]) for f in truth["faults"] if f["kind"] == "fence_delay"}
    binds = [(f["rank"], f["step"]) for f in truth["faults"] if f["kind"] == "slow_bind"]
    assert binds == [(1, 2)] and fences
    for fault in truth["faults"]:
        assert (fault["mechanism"], fault["phase"]) == {"fence_delay": ("device", "native_fence_wait"), "slow_bind": ("host_cpu", "bind")}[
            fault["kind"]
        ]
    for rank, runs in decode_lanes(tmp_path / "server.log").items():
        for run in runs:
            step = int(run["attrs"]["step"])
            wait = span(run, FENCE_WAIT)
            if (rank, step) in fences:  # the host reaches the wait before the late fence fires
                assert wait[1] - wait[0] >= 40e6
            # slow_bind is host CPU work, and the bind's evidence says so
            bind_cpu = int(run[BIND][2][OS_CPU_NS])
            assert (bind_cpu >= 80e6) is ((rank, step) == (1, 2))


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
    assert {"kind": "crash", "rank": 1, "step": 4, "delay_ms": None, "mechanism": None, "phase": None} in truth["faults"]


def test_cli_exit_status(tmp_path, capsys):
    assert (
        main(["--ranks", "2", "--requests", "2", "--output-tokens", "5", "--prompt-tokens", "4", "--no-profile", "-o", str(tmp_path)]) == 0
    )
    assert not (tmp_path / "serving-trace").exists()
    assert "[STRACE]" not in (tmp_path / "server.log").read_text()
    assert main(["--inject", "crash:rank=1", "-o", str(tmp_path)]) == 2
    assert "crash:rank=1" in capsys.readouterr().err


def test_torchrun_style_launch_reads_the_rank_environment(tmp_path):
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with open(tmp_path / "server.log", "wb") as log:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "dsprof.runtime",
                "--ranks",
                "1",
                "--requests",
                "2",
                "--prompt-tokens",
                "4",
                "--output-tokens",
                "6",
                "-o",
                str(tmp_path),
            ],
            env=env,
            stderr=log,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0
    summary = json.loads((tmp_path / "performance_summary.json").read_text())
    assert summary["tokens_returned"] == summary["tokens_expected"] == 12
    assert len(decode_lanes(tmp_path / "server.log")[0]) == summary["decode_steps"]
