"""Unit tests of the runtime's pieces that need no rank processes."""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
import time

import pytest
import torch

from dsprof.errors import DsprofError
from dsprof.profiler import strace
from dsprof.profiler.strace_format import MECHANISMS
from dsprof.runtime.config import RuntimeConfig
from dsprof.runtime.device import CpuDevice, device_wait
from dsprof.runtime.distributed import last_arrival
from dsprof.runtime.faults import (
    CPU_CONTENTION,
    FENCE_DELAY,
    GC_PAUSE,
    GROUND_TRUTH,
    SLOW_BIND,
    STRAGGLER,
    FaultPlan,
    FaultSpec,
    contention_loss,
    parse_fault,
    parse_faults,
    with_measured,
)
from dsprof.runtime.injectors import CpuNeighbour, GcPause, ThreadRunQueues, burn_cpu, thread_run_queue_ns
from dsprof.runtime.kv_cache import PagedKVCache, slots_for
from dsprof.runtime.launch import _Collector, _drain
from dsprof.runtime.serving import acceptance_table, plan_serving
from dsprof.runtime.task_args import Placement, TaskArgs
from dsprof.runtime.worker import DistributedWorker

pytestmark = pytest.mark.runtime  # imports torch


@pytest.fixture
def device():
    dev = CpuDevice(0)
    yield dev
    dev.close()


def test_presets_match_the_spec_shapes():
    prod = RuntimeConfig.from_preset("production")
    assert (prod.ranks, prod.dp, prod.ep, prod.tp, prod.requests, prod.prompt_tokens, prod.output_tokens, prod.depth) == (
        8,
        8,
        8,
        1,
        32,
        64,
        256,
        2,
    )
    micro = RuntimeConfig.from_preset("microbench")
    assert (micro.ranks, micro.ep, micro.tp, micro.warmup, micro.rounds) == (4, 4, 4, 5, 1000)
    assert RuntimeConfig.from_preset("microbench", rounds=7).rounds == 7
    demo = RuntimeConfig.from_preset()
    assert demo.preset == "demo" and demo.metadata == "host-shared" and demo.acceptance_rate == 0.79


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"ranks": 0}, "ranks must be a positive integer"),
        ({"ranks": 4, "tp": 3}, "tp=3 must divide ranks=4"),
        ({"metadata": "gpu"}, "metadata must be one of"),
        ({"acceptance_rate": 1.5}, "acceptance_rate"),
        ({"profile_level": "e2e,loud"}, "profile_level"),
        ({"requests": 2, "ranks": 4}, "requests=2 must be at least dp=4"),
        ({"inject": ["straggler:rank=9,ms=3"]}, "straggler:rank=9,ms=3"),
        ({"colour": 3}, "unknown runtime option"),
    ],
)
def test_bad_config_values_raise_a_clear_error(overrides, fragment):
    with pytest.raises(DsprofError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        RuntimeConfig.from_preset("demo", **overrides)
    with pytest.raises(DsprofError, match="unknown preset"):
        RuntimeConfig.from_preset("huge")


def test_fault_grammar():
    spec = parse_fault("slow_bind:rank=1,ms=10,step=4", ranks=4)
    assert (spec.kind, spec.rank, spec.ms, spec.step) == ("slow_bind", 1, 10.0, 4)
    assert parse_fault("fence_tail:p=0.05,ms=20", 4).p == 0.05
    assert parse_fault("cpu_contention:p=0.1,ms=30", 4) == FaultSpec("cpu_contention", ms=30.0, p=0.1, at="device")
    assert parse_fault("gc_pause:rank=2,p=1,ms=15", 4) == FaultSpec("gc_pause", rank=2, ms=15.0, p=1.0, at="host")
    assert parse_fault("gc_pause:p=1,ms=15,at=device", 4).at == "device"
    assert parse_fault("fence_tail:rank=3,p=0.2,ms=20", 4) == FaultSpec("fence_tail", rank=3, ms=20.0, p=0.2)
    for bad, why in [
        ("nap:rank=1", "unknown fault kind"),
        ("crash:rank=1", "missing step"),
        ("straggler:rank=1,ms=x", "not a number"),
        ("fence_tail:p=2,ms=1", "p must be"),
        ("slow_bind:rank=1,ms=3,colour=2", "unexpected"),
        ("crash:rank=5,step=1", "outside 0..3"),
        ("cpu_contention:ms=30", "missing p"),
        ("gc_pause:p=0.1,ms=0", "ms must be > 0"),
        ("gc_pause:p=0.1,ms=5,step=2", "unexpected"),
        ("cpu_contention:rank=4,p=1,ms=1", "outside 0..3"),
        ("cpu_contention:p=1,ms=1,at=host", "expected device"),  # a CPU neighbour cannot spare the executor
        ("gc_pause:p=1,ms=1,at=gpu", "expected host or device"),
        ("gc_pause:p=1,ms=1,at=host,at=device", "given twice"),
        ("straggler:rank=1,ms=3,at=host", "unexpected"),
        ("fence_tail:rank=4,p=1,ms=1", "outside 0..3"),
    ]:
        with pytest.raises(DsprofError, match=why) as info:
            parse_faults([bad], ranks=4)
        assert bad in str(info.value)


def test_fault_plan_is_seeded_and_hits_the_configured_share_of_steps():
    specs = parse_faults(
        [
            "fence_tail:p=0.25,ms=20",
            "slow_bind:rank=2,ms=5,step=3",
            "straggler:rank=1,ms=8",
            "cpu_contention:p=0.1,ms=30",
            "gc_pause:rank=3,p=0.2,ms=15",
        ],
        4,
    )
    plan = FaultPlan(specs, ranks=4, seed=11)
    again = FaultPlan(specs, ranks=4, seed=11)

    def hits(kind: str) -> list[tuple[int, int]]:
        return [(r, s) for s in range(2000) for r in range(4) if plan.at(r, s).ms(kind)]

    fences = hits(FENCE_DELAY)
    assert fences == [(r, s) for s in range(2000) for r in range(4) if again.at(r, s).ms(FENCE_DELAY)]
    # at most one rank per step, in ~25% of steps (binomial sd ~ 1%)
    assert len({s for _, s in fences}) == len(fences)
    assert 0.21 < len(fences) / 2000 < 0.29
    assert {r for r, _ in fences} == {0, 1, 2, 3}
    contention = hits(CPU_CONTENTION)  # no rank given: a seeded random rank per event
    assert 0.08 < len(contention) / 2000 < 0.12 and {r for r, _ in contention} == {0, 1, 2, 3}
    assert contention != [(r, s) for s in range(2000) for r in range(4) if FaultPlan(specs, 4, 12).at(r, s).ms(CPU_CONTENTION)]
    pauses = hits(GC_PAUSE)
    assert {r for r, _ in pauses} == {3} and 0.17 < len(pauses) / 2000 < 0.23
    assert plan.at(2, 3).ms(SLOW_BIND) == 5 and plan.at(2, 4).ms(SLOW_BIND) == 0 and plan.at(1, 3).ms(SLOW_BIND) == 0
    assert plan.at(1, 0).ms(STRAGGLER) == plan.at(1, 999).ms(STRAGGLER) == 8 and plan.at(0, 5).ms(STRAGGLER) == 0
    assert plan.injects("cpu_contention") and not plan.injects("crash")
    assert plan.most_ms("gc_pause", 3) == 15 and plan.most_ms("gc_pause", 0) == 0 and plan.most_ms("cpu_contention", 0) == 30
    assert plan.most_ms("gc_pause", 3, "host") == 15 and plan.most_ms("gc_pause", 3, "device") == 0
    # the contention events on a set of ranks (those pinned to one CPU) at a step
    assert plan.contention_at(7, {0, 2}) == [e for r in (0, 2) for e in plan.at(r, 7).events if e.kind == CPU_CONTENTION]


def test_fence_tail_on_one_rank_and_faults_aimed_at_the_device_program():
    plan = FaultPlan(parse_faults(["fence_tail:rank=1,p=0.5,ms=20", "gc_pause:rank=0,p=1,ms=10,at=device"], 2), 2, 3)
    fences = [(r, s) for s in range(200) for r in range(2) if plan.at(r, s).ms(FENCE_DELAY)]
    assert {r for r, _ in fences} == {1} and 60 < len(fences) < 140
    step = plan.at(0, 5)
    assert step.ms(GC_PAUSE) == step.ms(GC_PAUSE, "device") == 10 and step.ms(GC_PAUSE, "host") == 0
    entry = step.events[0].to_json()
    assert (entry["mechanism"], entry["phase"], entry["at"]) == ("gc", "device_wall", "device")


def test_fault_events_carry_the_ground_truth_the_analysis_should_find():
    plan = FaultPlan(parse_faults(["slow_bind:rank=0,ms=5", "straggler:rank=0,ms=3", "crash:rank=0,step=2"], 2), 2, 0)
    events = {event.kind: event.to_json() for event in plan.at(0, 2).events}
    assert events["slow_bind"] == {"kind": "slow_bind", "rank": 0, "step": 2, "delay_ms": 5.0, "mechanism": "host_cpu", "phase": "bind"}
    assert "at" not in events["slow_bind"]  # only the kinds that can be aimed say where
    assert (events["straggler"]["mechanism"], events["straggler"]["phase"]) == ("device", "device_wall")
    assert (events["crash"]["mechanism"], events["crash"]["phase"], events["crash"]["delay_ms"]) == (None, None, None)
    assert plan.at(0, 2).crash and not plan.at(0, 1).crash and not plan.at(1, 2).events
    assert GROUND_TRUTH == {
        ("fence_delay", None): ("device", "native_fence_wait"),
        ("straggler", None): ("device", "device_wall"),
        ("slow_bind", None): ("host_cpu", "bind"),
        ("cpu_contention", "device"): ("run_queue", "device_wall"),
        ("gc_pause", "host"): ("gc", "native_fence_wait"),
        ("gc_pause", "device"): ("gc", "device_wall"),
        ("crash", None): (None, None),
    }
    assert {m for m, _ in GROUND_TRUTH.values() if m} <= set(MECHANISMS)


def test_measured_loss_says_whether_a_fault_cost_anything():
    entry = {"kind": "fence_delay", "rank": 1, "step": 4, "delay_ms": 30.0}
    hit = with_measured(entry, {1: {"loss_ms": 27.5}})
    assert hit["measured"] == {"1": {"loss_ms": 27.5}} and hit["lost_ms"] == 27.5 and hit["effective"]
    missed = with_measured(entry, {1: {"loss_ms": 9.0}})  # below a third of the delay: visible as such
    assert missed["lost_ms"] == 9.0 and not missed["effective"]
    assert not with_measured(entry, {})["effective"]
    crash = {"kind": "crash", "rank": 0, "step": 2, "delay_ms": None}
    assert with_measured(crash, {}) == crash


def test_contention_loss_adds_up_what_overlapped_the_burn():
    ms = 1_000_000
    entry = {"kind": "cpu_contention", "rank": 0, "step": 10, "delay_ms": 30.0}
    burn = {0: {"struck": True, "burn_start_ns": 1000 * ms}}
    programs = {
        (0, 9): (950 * ms, 990 * ms, 2 * ms, 2 * ms),  # ended before the burn
        (0, 10): (995 * ms, 1040 * ms, 31 * ms, 32 * ms),  # the struck program
        (2, 9): (980 * ms, 1010 * ms, 12 * ms, 25 * ms),  # a CPU mate, in the step before, blocked in its all-to-all
        (2, 10): (1012 * ms, 1050 * ms, 4 * ms, 4 * ms),
        (2, 12): (1020 * ms, 1060 * ms, 9 * ms, 9 * ms),  # not near the step
    }
    host = {
        (0, 10): [(960 * ms, 962 * ms, 1 * ms), (996 * ms, 1041 * ms, 0)],  # asleep on the fence meanwhile
        (2, 11): [(1005 * ms, 1020 * ms, 14 * ms), (1040 * ms, 1050 * ms, 3 * ms)],  # a mate binding its next step
    }
    losses = contention_loss(entry, burn, programs, host)
    assert losses[0] == {"loss_ms": 32.0, "device_ms": 32.0, "rq_ms": 31.0, "host_ms": 0.0, "steps": {"10": 32.0}, "struck": True}
    assert losses[2] == {"loss_ms": 29.0, "device_ms": 29.0, "rq_ms": 16.0, "host_ms": 14.0, "steps": {"9": 25.0, "10": 4.0, "11": 14.0}}
    assert contention_loss(entry, {}, programs, host) == {}  # the struck rank never reported its burn


def test_the_last_arrival_is_the_peer_ties_to_the_lowest_rank():
    assert last_arrival([5, 9, 7]) == 1
    assert last_arrival([9, 3, 9]) == 0
    assert last_arrival([4]) == 0


def test_copy_needs_the_allocation_base(device):
    worker = DistributedWorker(0, device)
    pool = worker.malloc(256, tag="mtp.proj")
    other = worker.malloc(64, tag="mtp.ffn")
    worker.copy_to(pool, torch.arange(64, dtype=torch.float32))
    assert torch.equal(worker.copy_from(pool, torch.float32, (64,)), torch.arange(64, dtype=torch.float32))
    with pytest.raises(ValueError, match="allocation base") as info:
        worker.copy_to(pool + 16, torch.zeros(4))
    assert "16 bytes inside" in str(info.value) and "mtp.proj" in str(info.value)
    with pytest.raises(ValueError, match="allocation base"):
        worker.copy_from(pool + 4, torch.float32, (4,))
    with pytest.raises(ValueError, match="overruns"):
        worker.copy_to(other, torch.zeros(32))
    worker.free(other)
    with pytest.raises(ValueError, match="not a device allocation"):
        worker.copy_to(other, torch.zeros(1))


def test_task_args_placements(device):
    worker = DistributedWorker(0, device)
    args = TaskArgs(1, worker)
    shared = args.add("seq_lens", Placement.HOST_SHARED, torch.int64, (3,))
    resident = args.add("block_table", Placement.DEVICE_RESIDENT, torch.int64, (3, 2))
    assert args.names() == ["seq_lens", "block_table"]
    assert worker.allocations() == 1  # only the device-resident argument took device memory
    args.stage("seq_lens", torch.tensor([5, 6, 7]))
    assert shared.is_shared() and shared.tolist() == [5, 6, 7] and args["seq_lens"] is shared
    args.stage("block_table", torch.tensor([[1, 2], [3, 4], [5, 6]]))
    assert worker.copy_from(args.base("block_table"), torch.int64, (3, 2)).tolist() == [[1, 2], [3, 4], [5, 6]]
    assert args["block_table"].data_ptr() == args.base("block_table") == resident.data_ptr()
    with pytest.raises(ValueError, match="host-shared"):
        args.base("seq_lens")


def test_paged_cache_metadata_known_answer(device):
    worker = DistributedWorker(0, device)
    cache = PagedKVCache(worker, layers=1, batch=2, max_tokens_per_seq=40, block_size=16, latent=4)
    cache.ensure(0, 18)  # 2 blocks
    cache.ensure(1, 5)  # 1 block
    meta = cache.metadata([16, 3], 2, [True, True])
    b0, b1 = cache.tables[0], cache.tables[1]
    assert len(b0) == 2 and len(b1) == 1 and 0 not in b0 + b1
    assert meta.block_counts.tolist() == [2, 1] and meta.max_blocks == 2
    assert meta.seq_lens.tolist() == [18, 5]
    assert meta.slot_mapping.tolist() == [[b0[1] * 16 + 0, b0[1] * 16 + 1], [b1[0] * 16 + 3, b1[0] * 16 + 4]]
    inactive = slots_for(meta.block_table, torch.tensor([[16, 17]]).expand(2, 2), 16, torch.tensor([True, False]))
    assert inactive[1].tolist() == [0, 1]  # the null block
    free = len(cache._free)
    cache.release(0)
    assert len(cache._free) == free + 2


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_planned_steps_known_answer(rate):
    config = RuntimeConfig.from_preset("demo", acceptance_rate=rate, requests=8, output_tokens=21)
    plan = plan_serving(config)
    # prefill gives token 1; each decode step gives 2 tokens (all accepted) or 1 (none)
    assert plan.decode_steps == (10 if rate == 1.0 else 20)
    assert set(plan.tokens_expected.values()) == {21}
    assert sorted(r for rids in plan.requests_of_dp for r in rids) == list(range(8))


def test_acceptance_draws_are_seeded_per_request():
    config = RuntimeConfig.from_preset("demo", seed=3)
    draws = acceptance_table(config, 5, 4000)
    assert draws == acceptance_table(config, 5, 4000) != acceptance_table(config, 6, 4000)
    assert abs(sum(draws) / 4000 - 0.79) < 0.03


def test_cpu_device_is_in_order_and_fences_can_be_late(device):
    order = []
    first = device.submit(lambda clock: (time.sleep(0.02), order.append(1)))
    late = device.submit(lambda clock: order.append(2), signal_delay_s=0.05)
    t0 = time.monotonic()
    late.wait()
    assert order == [1, 2] and first.done()
    assert time.monotonic() - t0 >= 0.05
    start, dur = late.wall()
    assert start >= 15e6  # queued behind the first program
    failing = device.submit(lambda clock: 1 / 0)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        failing.wait()
    assert math.isfinite(dur)


def test_the_device_clock_starts_at_the_launch_the_host_marked(device):
    """A program's device_wall offset is from the origin its caller marked (runner_run's start), however late the
    submit follows the mark: the readers place the device timeline from runner_run's start."""
    marked = time.monotonic_ns()
    time.sleep(0.01)  # the host thread held up between its mark and the submit (the GIL, a preemption)
    before = time.monotonic_ns()
    fence = device.submit(lambda clock: None, origin_ns=marked)
    fence.wait()
    start, _ = fence.wall()
    assert marked + start == fence.start_ns and fence.start_ns >= before and start >= 10_000_000


def test_device_phases_nest_and_collective_waits_land_inside_them(device, tmp_path):
    """device_wait times a collective inside the running program's innermost phase; the executor is sampled."""
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT, 0o644)
    strace.enable(fd, gc_spans=False)
    strace.set_host_evidence(True)
    try:

        def program(clock) -> None:
            with clock.phase("forward"):
                burn_cpu(5)
                with device_wait("a2a_wait") as attrs:
                    time.sleep(0.02)
                    attrs["peer"] = 3
                with device_wait("a2a_wait"):
                    time.sleep(0.01)
            with clock.phase("mtp"):
                burn_cpu(3)

        fence = device.submit(program)
        fence.wait()
    finally:
        strace.disable()
        os.close(fd)
    phases = fence.phases()
    assert [path for path, _, _, _ in phases] == ["forward", "forward.a2a_wait", "forward.a2a_wait", "mtp"]
    (_, fwd_start, fwd_dur, _), (_, w1_start, w1_dur, w1), (_, w2_start, w2_dur, w2), (_, mtp_start, _, _) = phases
    # what the body learnt goes with its phase; with host evidence on, the device threads' run-queue wait in it
    assert w1.pop("peer") == 3 and set(w1) == set(w2) == {"os.rq_ns"}
    assert 0 <= w1["os.rq_ns"] <= w1_dur and 0 <= w2["os.rq_ns"] <= w2_dur
    assert w1_dur >= 20e6 and w2_dur >= 10e6 and fwd_dur >= w1_dur + w2_dur + 5e6
    assert fwd_start <= w1_start < w2_start and w2_start + w2_dur <= fwd_start + fwd_dur <= mtp_start
    wall_start, wall_dur = fence.wall()
    assert wall_start <= fwd_start and mtp_start <= wall_start + wall_dur
    # what the OS saw of the executor thread: its CPU work, not its sleeps
    evidence = fence.evidence()
    assert 8e6 <= evidence["os.cpu_ns"] < wall_dur - 25e6 and "os.rq_ns" in evidence
    with device_wait("a2a_wait") as attrs:  # outside a device program it times nothing
        attrs["peer"] = 1


def test_injected_gc_pause_and_cpu_work_take_about_what_they_are_asked(tmp_path):
    pauser = GcPause(longest_ms=30)
    for _ in range(3):
        # CPU time: the wall time of a pause also holds whatever waits the load of this
        # shared machine adds, which the runtime's evidence reports separately (os.rq_ns)
        started = time.thread_time_ns()
        took = pauser.pause(30)
        collect_ms = took["cpu_ms"]
        cpu_ms = (time.thread_time_ns() - started) / 1e6  # building the garbage included
        assert 15 < collect_ms < 60 and collect_ms <= cpu_ms < 2 * collect_ms, (collect_ms, cpu_ms)
        # wall times hold the CPU time and any wait. The CPU clock (the scheduler's) and the
        # monotonic clock are two clocks whose rates may differ slightly (CI once saw 27.968 ms
        # CPU in 27.965 ms wall), so: each rounded to the µs, and 0.1% apart at most when equal
        assert took["cpu_ms"] <= took["gc_ms"] * 1.001 + 0.002, took
        assert took["gc_ms"] <= took["loss_ms"] + 0.002, took
    started = time.thread_time_ns()
    burn_cpu(15)
    assert time.thread_time_ns() - started >= 15e6


def test_cpu_neighbour_takes_the_cpu_it_is_pinned_to():
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    neighbour = CpuNeighbour(cpu)
    try:
        os.sched_setaffinity(0, {cpu})
        started = time.monotonic_ns()
        burn_started = neighbour.burn(40)  # returns as the burn starts, with the neighbour's clock
        burn_cpu(10)
        took = time.monotonic_ns() - started
    finally:
        os.sched_setaffinity(0, before)
        neighbour.close()
    # 10 ms of our CPU work waited for the whole burn (SCHED_FIFO), or shared the CPU with it
    assert took >= (50e6 if neighbour.realtime else 15e6)
    assert started <= burn_started <= started + took
    with pytest.raises(ChildProcessError):
        os.waitpid(neighbour.pid, os.WNOHANG)  # reaped: gone


def test_peer_source_is_checked():
    RuntimeConfig.from_preset("demo", peer_source="waits").validate()
    with pytest.raises(DsprofError, match="peer_source must be one of auto, stamps, waits"):
        RuntimeConfig.from_preset("demo", peer_source="guess").validate()


def test_run_queue_waits_are_read_per_thread():
    before = thread_run_queue_ns()
    burn_cpu(2)
    assert 0 <= before <= thread_run_queue_ns()
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    threads = ThreadRunQueues(but=threading.get_native_id())
    other.start()
    try:
        assert other.native_id not in threads.read()  # a thread started since is read after a refresh
        threads.refresh()
        seen = threads.read()
        assert other.native_id in seen and threading.get_native_id() not in seen and min(seen.values()) >= 0
        assert threads.most_since(seen) >= 0
    finally:
        stop.set()
        other.join()
    threads.refresh()  # the ended thread's file is closed
    assert other.native_id not in threads.read()
    threads.close()


def test_the_launcher_drains_reports_up_to_one_torn_by_an_interrupt():
    """Ctrl-C can stop the launcher inside a report it was reading; the drain after it then meets the rest of that
    report (garbage to unpickle), which must end the drain, not replace the interrupt with a traceback."""
    config = RuntimeConfig.from_preset("demo")
    collector = _Collector(config, plan_serving(config), None)
    channel = multiprocessing.get_context("fork").Queue()
    channel.put(("fault", {"kind": "gc_pause", "rank": 0}))
    deadline = time.monotonic() + 10
    while channel.empty() and time.monotonic() < deadline:  # the feeder thread has written it
        time.sleep(0.01)
    # what the next read meets after one stopped inside a report: bytes that are no pickle (taken as put() takes them)
    channel._sem.acquire()
    channel._writer.send_bytes(b"\x80\x05\x95 the rest of a report cut short")
    _drain(channel, collector)
    assert collector.faults == [{"kind": "gc_pause", "rank": 0}]
    channel.close()
