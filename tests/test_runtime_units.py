"""Unit tests of the runtime's pieces that need no rank processes."""

from __future__ import annotations

import math
import time

import pytest
import torch

from dsprof.errors import DsprofError
from dsprof.runtime.config import RuntimeConfig
from dsprof.runtime.device import CpuDevice
from dsprof.runtime.faults import FaultPlan, parse_fault, parse_faults
from dsprof.runtime.kv_cache import PagedKVCache, slots_for
from dsprof.runtime.serving import acceptance_table, plan_serving
from dsprof.runtime.task_args import Placement, TaskArgs
from dsprof.runtime.worker import DistributedWorker


@pytest.fixture
def device():
    dev = CpuDevice(0)
    yield dev
    dev.close()


def test_presets_match_the_spec_shapes():
    prod = RuntimeConfig.from_preset("production")
    assert (prod.ranks, prod.dp, prod.ep, prod.tp, prod.requests, prod.prompt_tokens, prod.output_tokens, prod.depth) == \
        (8, 8, 8, 1, 32, 64, 256, 2)
    micro = RuntimeConfig.from_preset("microbench")
    assert (micro.ranks, micro.ep, micro.tp, micro.warmup, micro.rounds) == (4, 4, 4, 5, 1000)
    assert RuntimeConfig.from_preset("microbench", rounds=7).rounds == 7
    demo = RuntimeConfig.from_preset()
    assert demo.preset == "demo" and demo.metadata == "host-shared" and demo.acceptance_rate == 0.79


@pytest.mark.parametrize("overrides, fragment", [
    ({"ranks": 0}, "ranks must be a positive integer"),
    ({"ranks": 4, "tp": 3}, "tp=3 must divide ranks=4"),
    ({"metadata": "gpu"}, "metadata must be one of"),
    ({"acceptance_rate": 1.5}, "acceptance_rate"),
    ({"profile_level": "e2e,loud"}, "profile_level"),
    ({"requests": 2, "ranks": 4}, "requests=2 must be at least dp=4"),
    ({"inject": ["straggler:rank=9,ms=3"]}, "straggler:rank=9,ms=3"),
    ({"colour": 3}, "unknown runtime option"),
])
def test_bad_config_values_raise_a_clear_error(overrides, fragment):
    with pytest.raises(DsprofError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        RuntimeConfig.from_preset("demo", **overrides)
    with pytest.raises(DsprofError, match="unknown preset"):
        RuntimeConfig.from_preset("huge")


def test_fault_grammar():
    spec = parse_fault("slow_bind:rank=1,ms=10,step=4", ranks=4)
    assert (spec.kind, spec.rank, spec.ms, spec.step) == ("slow_bind", 1, 10.0, 4)
    assert parse_fault("fence_tail:p=0.05,ms=20", 4).p == 0.05
    for bad, why in [("nap:rank=1", "unknown fault kind"), ("crash:rank=1", "missing step"),
                     ("straggler:rank=1,ms=x", "not a number"), ("fence_tail:p=2,ms=1", "p must be"),
                     ("slow_bind:rank=1,ms=3,colour=2", "unexpected"), ("crash:rank=5,step=1", "outside 0..3")]:
        with pytest.raises(DsprofError, match=why) as info:
            parse_faults([bad], ranks=4)
        assert bad in str(info.value)


def test_fault_plan_is_seeded_and_hits_the_configured_share_of_steps():
    specs = parse_faults(["fence_tail:p=0.25,ms=20", "slow_bind:rank=2,ms=5,step=3", "straggler:rank=1,ms=8"], 4)
    plan = FaultPlan(specs, ranks=4, seed=11)
    again = FaultPlan(specs, ranks=4, seed=11)
    hits = [(r, s) for s in range(2000) for r in range(4) if plan.fence_delay_ms(r, s)]
    assert hits == [(r, s) for s in range(2000) for r in range(4) if again.fence_delay_ms(r, s)]
    # at most one rank per step, in ~25% of steps (binomial sd ~ 1%)
    assert len({s for _, s in hits}) == len(hits)
    assert 0.21 < len(hits) / 2000 < 0.29
    assert {r for r, _ in hits} == {0, 1, 2, 3}
    assert plan.slow_bind_ms(2, 3) == 5 and plan.slow_bind_ms(2, 4) == 0 and plan.slow_bind_ms(1, 3) == 0
    assert plan.straggler_ms(1) == 8 and plan.straggler_ms(0) == 0


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
    free = cache.free_blocks()
    cache.release(0)
    assert cache.free_blocks() == free + 2


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
    wall = late.device_phases()[0]
    assert wall[0] == "device_wall" and wall[1] >= 15e6  # queued behind the first program
    failing = device.submit(lambda clock: 1 / 0)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        failing.wait()
    assert math.isfinite(wall[2])
