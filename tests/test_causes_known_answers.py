"""Known-answer tests of the diagnosis (SPEC §2.1, §3) on a hand-built STRACE log.

The log is written here record by record in SPEC's text format — not through
dsprof's emitter or generator — the way another producer would write it:
attributes in another order, roots written before their children, host
evidence on some spans and not others. A small simulator lays out each run
with the depth-2 rules of SPEC §3 (a run starts when its ping-pong slot is free;
runner_run(N+1) waits for claim_release(N)), so the consequences of every
injected fault — carry-over chains included — are known exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from dsprof.commands.analysis_job import analyze_paths

MS = 1_000_000
T0 = 10**12
PERIOD = 20 * MS
RANKS, STEPS = 4, 36
THRESHOLD_MS = 5.0


@dataclass
class Run:
    """One rank's run: times in ns and what the spans carry."""

    bind_ns: int = 1 * MS
    bind_cpu_ns: int = 1 * MS
    bind_rq_ns: int = 0
    evidence: bool = True
    fence_ns: int = int(9.5 * MS)
    forward_ns: int = 5 * MS
    wait_ns: int = int(0.2 * MS)
    verify_ns: int = 3 * MS
    mtp_ns: int = int(1.4 * MS)
    gc_in_fence_ns: int = 0
    times: dict = field(default_factory=dict)


def plan() -> dict[tuple[int, int], Run]:
    """Every (rank, step) with its injected fault, and the answer the analysis must give."""
    runs = {(r, s): Run() for r in range(RANKS) for s in range(STEPS)}
    runs[1, 2].fence_ns += 30 * MS  # A: fence signalled late -> device
    runs[2, 5].verify_ns += 20 * MS  # B: slow device work -> device, device_wall.verify
    runs[2, 5].fence_ns += 20 * MS
    runs[3, 8].bind_ns += 12 * MS  # C: bind burns CPU -> host_cpu
    runs[3, 8].bind_cpu_ns += 12 * MS
    runs[0, 11].bind_ns += 15 * MS  # D: bind waits for a CPU -> run_queue
    runs[0, 11].bind_rq_ns += 15 * MS
    runs[1, 14].fence_ns += 40 * MS  # E: a collection in the fence wait -> gc
    runs[1, 14].gc_in_fence_ns = 40 * MS
    runs[1, 16].fence_ns += 30 * MS  # E': another, on a run that started late (carried from 14)
    runs[1, 16].gc_in_fence_ns = 30 * MS
    runs[2, 20].fence_ns += 100 * MS  # F: a long collection: a carry-over chain follows
    runs[2, 20].gc_in_fence_ns = 100 * MS
    runs[0, 29].forward_ns += 18 * MS  # G: rank 0 is slow before the all-to-all ...
    runs[0, 29].fence_ns += 18 * MS
    runs[3, 29].forward_ns += 18 * MS  # ... and rank 3 waits for it inside it
    runs[3, 29].wait_ns += 18 * MS
    runs[3, 29].fence_ns += 18 * MS
    runs[1, 32].bind_ns += 10 * MS  # H: a slow bind with no host evidence
    runs[1, 32].evidence = False
    return runs


def simulate(runs: dict[tuple[int, int], Run]) -> None:
    """Lay out every run (ns): slot reuse and launch admission as SPEC §3 states them; one host thread binds in order."""
    for r in range(RANKS):
        for s in range(STEPS):
            run = runs[r, s]
            slot_free = runs[r, s - 2].times["root_end"] if s >= 2 else 0
            previous_bind = runs[r, s - 1].times["bind_end"] if s >= 1 else 0
            start = max(T0 + s * PERIOD, slot_free, previous_bind)
            bind_end = start + run.bind_ns
            claim_prev = runs[r, s - 1].times["claim"] if s >= 1 else 0
            runner = max(bind_end + int(0.1 * MS), claim_prev)
            fence = runner + int(0.2 * MS)
            runner_end = fence + run.fence_ns + int(0.2 * MS)
            validate = runner_end + int(0.2 * MS)
            run.times = {
                "root": start,
                "bind_end": bind_end,
                "runner": runner,
                "fence": fence,
                "runner_end": runner_end,
                "claim": runner + int(0.1 * MS),
                "validate": validate,
                "root_end": validate + int(0.6 * MS),
            }


def record(pid: int, inv: int, depth: int, name: str, ts: int, dur: int, attrs: str = "") -> str:
    return (
        f"[mono_ns={ts + dur}][T0x{pid:x}][INFO] span_close: [STRACE] v=1 pid={pid} tid={pid} inv={inv} hid=5eed "
        f"depth={depth} name={name} ts={ts} dur={dur}{attrs}"
    )


def evidence(cpu: int, rq: int) -> str:
    return f" os.rq_ns={rq} os.nivcsw={rq // MS} os.cpu_ns={cpu} os.majflt=0"


def write_log(runs: dict[tuple[int, int], Run], path: Path) -> None:
    lines = []
    gc_inv = 10**15
    for r in range(RANKS):
        pid = 500 + r
        lines.append(
            f"[mono_ns={T0 - MS}][T0x{pid:x}][TIMING] clock_anchor: [CLOCK_ANCHOR] v=1 pid={pid} mono_ns={T0 - MS} "
            f"wall_ns={1_700_000_000_000_000_000 + r}"
        )
        lines.append(f"[mono_ns={T0 - MS}][T0x{pid:x}][INFO] chip_process: [chip_process pid={pid} dev=npu:{r}] ready")
        for s in range(STEPS):
            run, t, inv = runs[r, s], runs[r, s].times, (r + 1) * 100_000 + s
            ev = (lambda cpu, rq: evidence(cpu, rq)) if run.evidence else (lambda cpu, rq: "")
            identity = (
                f" step={s} callable=decode.main+verify+mtp rank={r} device=npu:{r} run_id={s + 1} dispatch_id=0 "
                f"run_epoch={s + 1} slot_id={s % 2} generation={s // 2}"
            )
            lines.append(record(pid, inv, 0, "chip.run", t["root"], t["root_end"] - t["root"], identity + ev(2 * MS, 0)))
            lines.append(record(pid, inv, 1, "chip.run.bind", t["root"], run.bind_ns, ev(run.bind_cpu_ns, run.bind_rq_ns)))
            lines.append(record(pid, inv, 1, "chip.run.runner_run", t["runner"], t["runner_end"] - t["runner"], ev(int(0.5 * MS), 0)))
            lines.append(record(pid, inv, 2, "chip.run.runner_run.native_fence_wait", t["fence"], run.fence_ns, ev(int(0.1 * MS), 0)))
            device = run.forward_ns + run.verify_ns + run.mtp_ns
            lines.append(record(pid, inv, 2, "chip.run.runner_run.device_wall", 1000, device, " clk=dev" + ev(device, 0)))
            lines.append(record(pid, inv, 3, "chip.run.runner_run.device_wall.forward", 1000, run.forward_ns, " clk=dev"))
            lines.append(
                record(
                    pid,
                    inv,
                    4,
                    "chip.run.runner_run.device_wall.forward.a2a_wait",
                    1000 + run.forward_ns - run.wait_ns,
                    run.wait_ns,
                    " clk=dev",
                )
            )
            lines.append(record(pid, inv, 3, "chip.run.runner_run.device_wall.verify", 1000 + run.forward_ns, run.verify_ns, " clk=dev"))
            lines.append(
                record(pid, inv, 3, "chip.run.runner_run.device_wall.mtp", 1000 + run.forward_ns + run.verify_ns, run.mtp_ns, " clk=dev")
            )
            lines.append(record(pid, inv, 1, "chip.run.claim_release", t["claim"], int(0.05 * MS)))
            lines.append(record(pid, inv, 1, "chip.run.validate", t["validate"], int(0.6 * MS), ev(int(0.6 * MS), 0)))
            if run.gc_in_fence_ns:
                gc_inv += 1
                lines.append(
                    record(pid, gc_inv, 0, "host.gc", t["fence"] + MS, run.gc_in_fence_ns, " gen=2 collected=81234").replace(
                        "hid=5eed", "hid=0"
                    )
                )
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory):
    runs = plan()
    simulate(runs)
    out = tmp_path_factory.mktemp("causes")
    write_log(runs, out / "server.log")
    outcome = analyze_paths([out / "server.log"], out / "analysis", threshold_ms=THRESHOLD_MS)
    return runs, outcome.summary


def _tail(summary: dict, step: int) -> dict:
    return next(item for item in summary["tail_steps"]["items"] if item["step"] == step)


def _late(summary: dict, step: int, rank: int) -> dict:
    return next(item for item in summary["late_starts"]["items"] if item["step"] == step and item["late_rank"] == rank)


def test_the_log_is_a_valid_swimlane_numbered_by_the_producer(diagnosed):
    _, summary = diagnosed
    assert summary["validation"]["valid"], summary["validation"]["problems"]
    assert summary["validation"]["step_numbering"] == "producer"
    assert summary["validation"]["rank_roots"] == RANKS * STEPS


@pytest.mark.parametrize(
    "step, rank, phase, mechanism, evidence_ms",
    [
        (2, 1, "native_fence_wait", "device", 30.0),
        (5, 2, "device_wall.verify", "device", 20.0),
        (8, 3, "bind", "host_cpu", 12.0),
        (11, 0, "bind", "run_queue", 15.0),
        (14, 1, "native_fence_wait", "gc", 40.0),
        (20, 2, "native_fence_wait", "gc", 100.0),
    ],
)
def test_each_mechanism_names_its_rank_phase_and_evidence(diagnosed, step, rank, phase, mechanism, evidence_ms):
    _, summary = diagnosed
    tail = _tail(summary, step)
    assert (tail["rank"], tail["phase"], tail["mechanism"], tail["evidence_ms"], tail["role"]) == (
        rank,
        phase,
        mechanism,
        evidence_ms,
        "culprit",
    )
    assert [r["rank"] for r in tail["ranks"]] == [rank]


def test_late_starts_of_slow_binds_have_their_host_cause(diagnosed):
    _, summary = diagnosed
    assert (_late(summary, 8, 3)["mechanism"], _late(summary, 8, 3)["evidence_ms"]) == ("host_cpu", 12.0)
    assert (_late(summary, 11, 0)["mechanism"], _late(summary, 11, 0)["evidence_ms"]) == ("run_queue", 15.0)
    assert _late(summary, 32, 1)["mechanism"] == "unattributed"
    assert "no host evidence" in _late(summary, 32, 1)["detail"]


def test_carry_over_chains_name_the_step_where_they_began(diagnosed):
    runs, summary = diagnosed
    late_cells = [(i["step"], i["late_rank"]) for i in summary["late_starts"]["items"] if (i["step"], i["late_rank"]) != (32, 1)]
    carried = [i for i in summary["late_starts"]["items"] if i["mechanism"] == "carried_over"]
    # rank 1: the gc at 14 delays 16, whose own gc then starts a chain of its own (18 comes from 16, not 14);
    # rank 2: every late start after the gc at 20 is carried over from it
    assert {(i["step"], i["rank"], i["from_step"]) for i in carried} == (
        {(16, 1, 14), (18, 1, 16)} | {(s, 2, 20) for s in range(21, STEPS) if (s, 2) in late_cells}
    )
    assert (_tail(summary, 16)["mechanism"], _tail(summary, 16)["evidence_ms"]) == ("gc", 30.0)
    chain = {i["step"]: i["detail"] for i in carried if i["rank"] == 2}
    assert min(chain) == 22 and len(chain) >= 4  # 20's slot is reused by 22 ...
    assert chain[22].endswith("slot reuse") and chain[23].endswith("claim_release")  # ... whose late launch admits 23 late
    # each carried start is late by exactly what its rank's runs say
    for item in carried:
        t = {r: runs[r, item["step"]].times for r in range(RANKS)}
        assert item["excess_ms"] == round((t[item["rank"]]["runner"] - min(x["runner"] for x in t.values())) / MS, 3)
    tails = [t for t in summary["tail_steps"]["items"] if t["mechanism"] == "carried_over"]
    assert tails and all(t["from_step"] in (14, 16, 20) for t in tails)


def test_a_rank_that_waited_for_a_slow_peer_is_a_victim_not_a_culprit(diagnosed):
    _, summary = diagnosed
    tail = _tail(summary, 29)
    assert (tail["rank"], tail["mechanism"], tail["phase"]) == (0, "device", "device_wall.forward")
    roles = {r["late_rank"]: (r["role"], r["rank"], r["mechanism"]) for r in tail["ranks"]}
    assert roles == {0: ("culprit", 0, "device"), 3: ("victim", 0, "peer_wait")}


def test_no_invented_culprit_around_the_faults(diagnosed):
    _, summary = diagnosed
    injected = {(1, 2), (2, 5), (3, 8), (0, 11), (1, 14), (1, 16), (2, 20), (0, 29), (3, 29), (1, 32)}
    for tail in summary["tail_steps"]["items"]:
        for cause in tail["ranks"]:
            cell = (cause["late_rank"], tail["step"])
            assert cell in injected or cause["mechanism"] == "carried_over", (tail["step"], cause)


def test_tail_cost_is_the_sum_of_each_steps_excess_over_the_median_end(diagnosed):
    runs, summary = diagnosed
    ends = np.array([[runs[r, s].times["runner_end"] for s in range(STEPS)] for r in range(RANKS)], dtype=np.float64)
    total = float((ends.max(axis=0) - np.median(ends, axis=0)).sum())
    roots = [runs[r, s].times for r in range(RANKS) for s in range(STEPS)]
    wall = max(t["root_end"] for t in roots) - min(t["root"] for t in roots)
    assert summary["tail_cost"] == {
        "total_ms": round(total / MS, 3),
        "share_of_decode_wall": round(total / wall, 4),
        "decode_wall_ms": round(wall / MS, 3),
    }


def test_summary_round_trips_as_json(diagnosed, tmp_path):
    _, summary = diagnosed
    assert json.loads(json.dumps(summary, allow_nan=False)) == summary
