"""Serving layer: requests, the DP scheduler, and one rank's prefill + decode loop.

The synthetic acceptance rate: random weights almost never make the target
model agree with the MTP draft, so whether a draft is accepted is decided by a
seeded draw per (request, decode step) at ``acceptance_rate`` (default 0.79).
The draw is a function of the seed and the global request id only, so it is
the same on every rank and for both metadata paths; the real compute (target
forward over last token + draft, verify, MTP draft) still runs every step and
the emitted tokens are the model's own argmax tokens.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dsprof.profiler import sa_profile
from dsprof.profiler.strace_format import DEVICE_FORWARD, DEVICE_MTP, DEVICE_VERIFY
from dsprof.runtime import faults as fault_kinds
from dsprof.runtime.config import RuntimeConfig
from dsprof.runtime.device import Fence, PhaseClock, running_on_cuda
from dsprof.runtime.distributed import ParallelContext
from dsprof.runtime.faults import FaultPlan, StepFaults
from dsprof.runtime.injectors import CpuNeighbour, GcPause, burn_cpu
from dsprof.runtime.kv_cache import PagedKVCache, context_slots, slots_for
from dsprof.runtime.model import DeepSeekLite
from dsprof.runtime.pipeline import DECODE_CALLABLE, PREFILL_CALLABLE, ChipRunLane, Run
from dsprof.runtime.task_args import Placement, TaskArgs
from dsprof.runtime.worker import DistributedWorker

DECODE_TOKENS = 2  # last accepted token + one MTP draft
_HOST_WAIT_LIMIT_S = 5.0  # a fault inside the program waits this long at most for the host to wait on it


class InjectedCrash(RuntimeError):
    """A crash requested with ``--inject crash:...``."""


def acceptance_table(config: RuntimeConfig, request_id: int, steps: int) -> list[bool]:
    """Seeded synthetic draft-acceptance decisions of one request, per decode step."""
    gen = torch.Generator().manual_seed(config.seed * 1_000_003 + request_id)
    return (torch.rand(steps, generator=gen) < config.acceptance_rate).tolist()


def prompt_of(config: RuntimeConfig, request_id: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(config.seed * 7_368_787 + request_id)
    return torch.randint(0, config.vocab, (config.prompt_tokens,), generator=gen)


@dataclass
class ServingPlan:
    """What the DP scheduler decided before serving: request placement and step count."""

    requests_of_dp: list[list[int]]  # global request ids per DP group
    decode_steps: int  # decode runs every rank executes (warm-up included)
    warmup: int
    tokens_expected: dict[int, int]  # per global request id
    accept: dict[int, list[bool]]


def plan_serving(config: RuntimeConfig) -> ServingPlan:
    """Spread requests round-robin over DP groups and fix the number of decode steps.

    Every rank must run the same number of decode steps (the MoE all-to-all is
    collective); with the synthetic acceptance schedule known in advance the
    scheduler plans it exactly: enough steps for the slowest request, or
    ``warmup + rounds`` for the microbenchmark.
    """
    dp = config.dp
    per_dp = [list(range(g, config.requests, dp)) for g in range(dp)]
    horizon = config.output_tokens if config.rounds is None else config.warmup + config.rounds
    accept = {rid: acceptance_table(config, rid, horizon) for rid in range(config.requests)}
    steps_needed, produced_after = {}, {}
    for rid in range(config.requests):
        produced, step = 1, 0  # prefill emits the first token
        while produced < config.output_tokens and step < horizon:
            produced += 2 if accept[rid][step] and config.output_tokens - produced >= 2 else 1
            step += 1
        steps_needed[rid], produced_after[rid] = step, produced
    steps = horizon if config.rounds is not None else max(steps_needed.values())
    return ServingPlan(per_dp, steps, config.warmup if config.rounds is not None else 0, produced_after, accept)


@dataclass
class Injectors:
    """A rank's fault plan and the mechanisms it prepared at start-up for it (runtime/injectors.py)."""

    plan: FaultPlan
    neighbour: CpuNeighbour | None = None  # cpu_contention
    gc_pause: GcPause | None = None  # gc_pause at=host, calibrated on the host thread
    gc_pause_device: GcPause | None = None  # gc_pause at=device, calibrated on the executor thread
    cpu_mates: frozenset[int] = frozenset()  # the ranks pinned to this rank's CPU, itself included (cpu_contention)


# What a rank measured of the faults of one run: fault kind -> {"loss_ms": ..., ...} (faults.json "measured").
Probe = dict[str, dict]


class RankServer:
    """One rank: model shard, paged KV cache, device state, fused programs, and the lane."""

    def __init__(
        self, config: RuntimeConfig, par: ParallelContext, device, worker: DistributedWorker, plan: ServingPlan, sink, injectors: Injectors
    ):
        self.config, self.par, self.device, self.worker = config, par, device, worker
        self.host_tid = threading.get_native_id()  # the rank's host thread (a CPU neighbour must not starve it)
        self.plan, self.sink, self.injectors = plan, sink, injectors
        self.requests = plan.requests_of_dp[par.dp_rank]
        self.returns_tokens = par.tp_rank == 0  # one rank per DP replica answers the caller
        B = len(self.requests)
        self.batch = B
        # tokens each rank routes through the MoE all-to-all (equal on every rank)
        largest_batch = max(len(r) for r in plan.requests_of_dp)
        self.prefill_capacity = -(-largest_batch * config.prompt_tokens // par.tp)
        self.decode_capacity = -(-largest_batch * DECODE_TOKENS // par.tp)
        self.model = DeepSeekLite(config, par, worker)
        max_tokens = config.prompt_tokens + config.output_tokens + 2 * DECODE_TOKENS + 2
        self.cache = PagedKVCache(worker, config.layers, B, max_tokens, config.block_size, config.kv_latent)
        # device-resident decode state, advanced by the programs in stream order
        self.state = {name: self._device_tensor(f"state.{name}", (B,))[1] for name in ("ctx", "produced", "last", "draft")}
        limit_base, self.state["limit"] = self._device_tensor("state.limit", (B,))
        worker.copy_to(limit_base, torch.full((B,), config.output_tokens, dtype=torch.int64))
        placement = Placement.HOST_SHARED if config.metadata == "host-shared" else Placement.DEVICE_RESIDENT
        mb = self.cache.max_blocks_per_seq
        self.slots = [self._slot(i, placement, DECODE_TOKENS, mb) for i in range(config.depth)]
        self.prefill_slot = self._slot(0, placement, config.prompt_tokens, mb, prompt=True)
        self.lane = ChipRunLane(
            par.rank,
            device,
            self.slots,
            device_phases=config.device_phases,
            serialize_metadata=config.metadata == "device-resident",
            measure_host_rq=bool(injectors.cpu_mates),
            exchange_waits=None if par.stamps_arrivals else par.exchange_waits,
        )
        # host view of each request, as of the last validated run
        self.ctx_known = [0] * B
        self.produced_known = [0] * B
        self.prefill_validated = False
        self.unvalidated = 0
        self.staged_first: dict[int, list[int]] = {}  # decode step -> worst-case first positions staged
        self.verified = 0
        self.accepted = 0
        self.tokens: dict[int, list[int]] = {rid: [] for rid in self.requests}

    def _device_tensor(self, tag: str, shape: tuple[int, ...]) -> tuple[int, torch.Tensor]:
        """An int64 device buffer: (allocation base, view)."""
        base = self.worker.malloc(max(1, torch.Size(shape).numel()) * 8, tag=tag)
        return base, self.worker.view(base, torch.int64, shape)

    def _slot(self, slot_id: int, placement: Placement, tokens: int, max_blocks: int, prompt: bool = False) -> TaskArgs:
        legacy = self.config.metadata == "device-resident"
        args = TaskArgs(slot_id, self.worker, self.par.wait_global_predecessor if legacy else None)
        B = self.batch
        if prompt:
            args.add("prompt", placement, torch.int64, (B, tokens))
        else:
            args.add("accept", placement, torch.int64, (B,))
        args.add("block_table", placement, torch.int64, (B, max_blocks))
        args.add("seq_lens", placement, torch.int64, (B,))
        args.add("slot_mapping", placement, torch.int64, (B, tokens))
        args.add("block_counts", placement, torch.int64, (B,))
        for name, shape in (("out_tokens", (B, DECODE_TOKENS)), ("out_counts", (B,)), ("out_delta", (B,)), ("out_accepted", (B,))):
            args.add(name, Placement.DEVICE_RESIDENT, torch.int64, shape)
        return args

    # -- prefill ----------------------------------------------------------------------------

    def _start_prefill(self) -> Run:
        """Bind and launch the prefill; it is profiled unless warm-up rounds follow it (they are not)."""
        config = self.config
        P = config.prompt_tokens

        def stage(slot: TaskArgs) -> None:
            for i in range(self.batch):
                self.cache.ensure(i, P)
            meta = self.cache.metadata([0] * self.batch, P, [True] * self.batch)
            slot.stage("prompt", torch.stack([prompt_of(config, rid) for rid in self.requests]))
            self._stage_meta(slot, meta)

        with sa_profile.span("worker.prefill", "worker", rank=self.par.rank, requests=self.batch):
            run = self.lane.bind(
                step=-1,
                callable_name=PREFILL_CALLABLE,
                dispatch_id=1,
                profiled=self.plan.warmup == 0,
                stage_args=stage,
                bind_prebuilt=self._bind_prebuilt,
                slot=self.prefill_slot,
            )
            self.lane.launch(run, self._prefill_program)
        return run

    def _prefill_program(self, slot: TaskArgs, clock: PhaseClock) -> None:
        P = self.config.prompt_tokens
        with sa_profile.span("executor.run", "executor", callable=PREFILL_CALLABLE):
            with clock.phase(DEVICE_FORWARD), sa_profile.span("kernel.prefill_fwd", "kernel", tokens=self.batch * P):
                arg = self._arg_reader(slot)
                positions = torch.arange(P, device=self.device.torch_device).expand(self.batch, P)
                h, logits = self.model.forward(
                    arg("prompt"),
                    positions,
                    arg("slot_mapping"),
                    context_slots(arg("block_table"), slot.scalars["max_blocks"], self.config.block_size),
                    slot.prebuilt["kv_pools"],
                    self.prefill_capacity,
                )
                first = logits[:, -1].argmax(-1)
            with clock.phase(DEVICE_MTP), sa_profile.span("kernel.mtp_draft", "kernel"):
                draft = self.model.mtp_draft(h[:, -1], first)
            st = slot.prebuilt["state"]
            st["ctx"].fill_(P)
            st["produced"].fill_(1)
            st["last"].copy_(first)
            st["draft"].copy_(draft)
            slot["out_tokens"][:, 0] = first
            slot["out_tokens"][:, 1] = -1
            slot["out_counts"].fill_(1)
            slot["out_delta"].zero_()
            slot["out_accepted"].zero_()

    # -- decode ---------------------------------------------------------------------------

    def _stage_meta(self, slot: TaskArgs, meta) -> None:
        slot.stage("block_table", meta.block_table)
        slot.stage("seq_lens", meta.seq_lens)
        slot.stage("slot_mapping", meta.slot_mapping)
        slot.stage("block_counts", meta.block_counts)
        slot.scalars["max_blocks"] = meta.max_blocks

    def _arg_reader(self, slot: TaskArgs):
        """Read a launch argument on the device: host-shared ones are used in place on
        CPU and read asynchronously from pinned memory on CUDA."""
        device = self.device.torch_device
        return lambda name: slot[name].to(device, non_blocking=True)

    def _bind_prebuilt(self, slot: TaskArgs) -> None:
        """Bind the prebuilt device arguments (KV pools, decode state) to the slot by reference."""
        slot.prebuilt["kv_pools"] = self.cache.pools
        slot.prebuilt["state"] = self.state

    def _host_view(self, i: int) -> tuple[int, int]:
        """(context length, tokens produced) of request ``i`` as of the last validated run.

        Decode step 0 is bound while the prefill is still on the device: the
        prefill's outcome is fixed by its shape (the whole prompt in context,
        one token out), so the host need not wait for it.
        """
        if not self.prefill_validated:
            return self.config.prompt_tokens, 1
        return self.ctx_known[i], self.produced_known[i]

    def _stage_decode(self, step: int, slow_bind_ms: float, probe: Probe):
        def stage(slot: TaskArgs) -> None:
            with sa_profile.span("scheduler.step", "scheduler", step=step, rank=self.par.rank):
                if slow_bind_ms:  # host CPU work, not a sleep (fault injection)
                    probe[fault_kinds.SLOW_BIND] = {"loss_ms": round(burn_cpu(slow_bind_ms), 3)}
                # Worst case: every unvalidated run in flight accepted its draft.
                ahead = 2 * self.unvalidated
                first, active = [], []
                for i in range(self.batch):
                    ctx, produced = self._host_view(i)
                    live = produced < self.config.output_tokens
                    first.append(ctx + ahead if live else 0)
                    active.append(live)
                    if live:
                        self.cache.ensure(i, first[-1] + DECODE_TOKENS)
                meta = self.cache.metadata(first, DECODE_TOKENS, active)
                self.staged_first[step - self.plan.warmup] = first  # keyed like Run.step
                slot.stage("accept", torch.tensor([int(self.plan.accept[rid][step]) for rid in self.requests]))
                self._stage_meta(slot, meta)

        return stage

    def _decode_program(self, step: int, faults: StepFaults, probe: Probe, host_waits: threading.Event):
        straggle_ms = faults.ms(fault_kinds.STRAGGLER)
        strike = self._strike_in_program(faults, probe, host_waits)
        profiled = step >= self.plan.warmup

        def program(slot: TaskArgs, clock: PhaseClock) -> None:
            st, bs = slot.prebuilt["state"], self.config.block_size
            arg = self._arg_reader(slot)
            with _span(profiled, "executor.run", "executor", callable=DECODE_CALLABLE, step=step):
                with clock.phase(DEVICE_FORWARD), _span(profiled, "kernel.decode_fwd", "kernel", step=step):
                    if strike is not None:  # faults inside the program, before its first all-to-all
                        strike()
                    active = st["produced"] < st["limit"]
                    pos_wc = arg("seq_lens") - DECODE_TOKENS
                    block_table = arg("block_table")
                    delta = torch.where(active, pos_wc - st["ctx"], torch.zeros_like(pos_wc))
                    positions = st["ctx"].unsqueeze(1) + torch.arange(DECODE_TOKENS, device=block_table.device)
                    slots = slots_for(block_table, positions, bs, active)  # device-side correction
                    tokens = torch.stack([st["last"], st["draft"]], 1)
                    h, logits = self.model.forward(
                        tokens,
                        positions,
                        slots,
                        context_slots(block_table, slot.scalars["max_blocks"], bs),
                        slot.prebuilt["kv_pools"],
                        self.decode_capacity,
                    )
                with clock.phase(DEVICE_VERIFY), _span(profiled, "kernel.verify", "kernel", step=step):
                    argmax = logits.argmax(-1)
                    remaining = st["limit"] - st["produced"]
                    acc = (arg("accept") == 1) & active & (remaining >= DECODE_TOKENS)
                    counts = torch.where(active, 1 + acc.long(), torch.zeros_like(remaining))
                    next_last = torch.where(acc, argmax[:, 1], argmax[:, 0])
                    h_sel = torch.where(acc.unsqueeze(1), h[:, 1], h[:, 0])
                    if straggle_ms:  # a slower device: more device work (fault injection)
                        probe[fault_kinds.STRAGGLER] = {"loss_ms": round(burn_cpu(straggle_ms), 3)}
                with clock.phase(DEVICE_MTP), _span(profiled, "kernel.mtp_draft", "kernel", step=step):
                    draft = self.model.mtp_draft(h_sel, next_last)
                slot["out_tokens"][:, 0] = torch.where(acc, st["draft"], argmax[:, 0])
                slot["out_tokens"][:, 1] = torch.where(acc, argmax[:, 1], torch.full_like(next_last, -1))
                slot["out_counts"].copy_(counts)
                slot["out_delta"].copy_(delta)
                slot["out_accepted"].copy_(acc.long())
                st["ctx"].add_(counts)
                st["produced"].add_(counts)
                st["last"].copy_(torch.where(active, next_last, st["last"]))
                st["draft"].copy_(torch.where(active, draft, st["draft"]))

        return program

    def _validate(self, run: Run) -> None:
        """Check the run's outputs and accept its tokens (returned to the caller)."""
        with _span(run.profiled, "worker.validate", "worker", step=run.step):
            slot = run.slot
            B = self.batch
            tokens = self.worker.copy_from(slot.base("out_tokens"), torch.int64, (B, DECODE_TOKENS)).tolist()
            counts = self.worker.copy_from(slot.base("out_counts"), torch.int64, (B,)).tolist()
            deltas = self.worker.copy_from(slot.base("out_delta"), torch.int64, (B,)).tolist()
            accepted = self.worker.copy_from(slot.base("out_accepted"), torch.int64, (B,)).tolist()
            decode = run.callable == DECODE_CALLABLE
            # the device's correction must equal the staged worst case minus the real position
            staged = self.staged_first.pop(run.step) if decode else []
            returned: dict[int, list[int]] = {}
            for i, rid in enumerate(self.requests):
                limit = self.config.output_tokens
                live = self.produced_known[i] < limit
                expected_counts = (1, 2) if live else (0,)
                if counts[i] not in expected_counts:
                    raise RuntimeError(
                        f"rank {self.par.rank} step {run.step}: request {rid} produced {counts[i]} tokens, expected {expected_counts}"
                    )
                if decode and live and deltas[i] != staged[i] - self.ctx_known[i]:
                    raise RuntimeError(
                        f"rank {self.par.rank} step {run.step}: request {rid} position corrected by "
                        f"{deltas[i]}, expected {staged[i] - self.ctx_known[i]}"
                    )
                new = tokens[i][: counts[i]]
                if any(not 0 <= t < self.config.vocab for t in new):
                    raise RuntimeError(f"rank {self.par.rank} step {run.step}: token out of vocabulary for request {rid}")
                if decode and live and limit - self.produced_known[i] >= 2:
                    self.verified += 1
                    self.accepted += accepted[i]
                if decode:
                    self.ctx_known[i] += counts[i]
                else:
                    self.ctx_known[i] = self.config.prompt_tokens
                    self.prefill_validated = True
                self.produced_known[i] += counts[i]
                if new:
                    returned[rid] = new
                    self.tokens[rid].extend(new)
                if live and self.produced_known[i] >= limit:
                    self.cache.release(i)
            if decode:
                self.unvalidated -= 1
            if self.returns_tokens:
                self.sink.tokens(self.par.rank, run.step, returned, self.verified, self.accepted)

    def serve(self) -> None:
        """Prefill, then the depth-2 decode loop: bind+launch run N+1, then drain and validate run N.

        The prefill is run 0 of the same pipeline: decode step 0 is bound and
        launched while it is on the device.
        """
        steps = self.plan.decode_steps
        runs: dict[int, tuple[Run, Probe]] = {}
        prefill = self._start_prefill()
        if steps:
            runs[0] = self._start_decode(0)
        self.lane.finish(prefill, self._validate)
        for step in range(steps):
            if step + 1 < steps:
                runs[step + 1] = self._start_decode(step + 1)
            run, probe = runs.pop(step)
            self.lane.finish(run, self._validate)
            self._report_measured(run, probe)
        self.lane.close()

    def _fault_details(self, kind: str) -> dict:
        """What faults.json should also know of an event on this rank: whether the CPU neighbour ran realtime."""
        neighbour = self.injectors.neighbour
        return {"realtime": neighbour.realtime} if kind == fault_kinds.CPU_CONTENTION and neighbour is not None else {}

    def _start_decode(self, step: int) -> tuple[Run, Probe]:
        """Bind and launch decode step ``step`` (warm-up included), with the faults planned for it."""
        rank, measured = self.par.rank, step - self.plan.warmup
        faults = self.injectors.plan.at(rank, measured) if measured >= 0 else StepFaults(())
        for event in faults.events:
            if event.kind == fault_kinds.CRASH or not faults.crash:  # after a crash nothing else happens
                self.sink.fault(event.to_json(self._fault_details(event.kind)))
        if faults.crash:
            raise InjectedCrash(f"rank {rank} crashed at decode step {measured} (injected)")
        probe: Probe = {}
        run = self.lane.bind(
            step=measured,
            callable_name=DECODE_CALLABLE,
            dispatch_id=step + 2,
            profiled=measured >= 0,
            stage_args=self._stage_decode(step, faults.ms(fault_kinds.SLOW_BIND), probe),
            bind_prebuilt=self._bind_prebuilt,
        )
        host_waits = threading.Event()
        run.at_fence_wait = self._strike_at_fence_wait(faults, probe, host_waits)
        self.unvalidated += 1
        mates = set(self.injectors.cpu_mates)
        contended = measured >= 0 and any(self.injectors.plan.contention_at(near, mates) for near in (measured - 1, measured, measured + 1))
        self.lane.launch(
            run,
            self._decode_program(step, faults, probe, host_waits),
            fence_delay_s=faults.ms(fault_kinds.FENCE_DELAY) / 1000.0,
            measure_rq=contended,
        )
        return run, probe

    def _strike_in_program(self, faults: StepFaults, probe: Probe, host_waits: threading.Event) -> Callable[[], None] | None:
        """The faults struck inside this step's device program (``at=device``), before its first all-to-all.

        They wait until the host thread waits for this program: in the depth-2
        pipeline the host is still validating the previous step and binding the next
        one when the program starts, and a CPU neighbour (which takes the whole CPU)
        or a collection (which holds the GIL) would delay that work too, i.e. land on
        other steps. Then the rank reaches the all-to-all late: its peers wait for it.
        """
        contention_ms = faults.ms(fault_kinds.CPU_CONTENTION, fault_kinds.AT_DEVICE)
        gc_ms = faults.ms(fault_kinds.GC_PAUSE, fault_kinds.AT_DEVICE)
        neighbour, pauser = self.injectors.neighbour, self.injectors.gc_pause_device
        assert neighbour is not None or not contention_ms, "cpu_contention planned on a rank without its neighbour"
        assert pauser is not None or not gc_ms, "gc_pause planned on a rank that did not calibrate it"
        if not contention_ms and not gc_ms:
            return None

        def strike() -> None:
            # on CUDA the program is enqueued by the host thread itself: there is nothing to wait for
            struck = running_on_cuda() or host_waits.wait(_HOST_WAIT_LIMIT_S)
            if contention_ms and neighbour is not None:
                started_ns = neighbour.burn(contention_ms, after_sleeps=self.host_tid if struck else 0)
                # struck False: the host never came to wait (it failed)
                probe[fault_kinds.CPU_CONTENTION] = {"struck": struck, "burn_start_ns": started_ns}
            if gc_ms and pauser is not None:
                probe[fault_kinds.GC_PAUSE] = pauser.pause(gc_ms)

        return strike

    def _strike_at_fence_wait(self, faults: StepFaults, probe: Probe, host_waits: threading.Event) -> Callable[[Fence], None]:
        """What the host thread does as it starts to wait for this step's program, which still runs.

        It says so to the program (``host_waits``), and a gc pause aimed at the host
        collects now: the collection overlaps this step's program (holding the GIL,
        it stalls a CPU executor too), never the next one's.
        """
        gc_ms, pauser = faults.ms(fault_kinds.GC_PAUSE, fault_kinds.AT_HOST), self.injectors.gc_pause
        assert pauser is not None or not gc_ms, "gc_pause planned on a rank that did not calibrate it"

        def at_fence_wait(_fence: Fence) -> None:
            host_waits.set()
            if gc_ms and pauser is not None:
                probe[fault_kinds.GC_PAUSE] = pauser.pause(gc_ms)

        return at_fence_wait

    def _report_measured(self, run: Run, probe: Probe) -> None:
        """Send what this rank measured of the faults of ``run``'s step (faults.json ``measured``).

        Near a cpu_contention step on its CPU, a rank also sends its program's window
        and the executor's run-queue wait over it: the neighbour starves every rank
        pinned to that CPU, in whichever program it runs (the launcher adds up the
        programs that overlapped the burn, see faults.contention_loss).
        """
        rank, step, fence = self.par.rank, run.step, run.fence
        if step < 0 or fence is None:
            return
        for event in self.injectors.plan.at(rank, step).events:
            if event.kind == fault_kinds.FENCE_DELAY:
                self.sink.measured(event, rank, {"loss_ms": round(fence.late_ns / 1e6, 3)})
            elif event.kind in probe:
                self.sink.measured(event, rank, probe[event.kind])
        if fence.rq_ns >= 0:  # measured near a cpu_contention step on this rank's CPU
            self.sink.send("program", rank, step, fence.start_ns, fence.end_ns, fence.rq_ns, fence.threads_rq_ns)
            if self.lane.measure_host_rq:
                self.sink.send("host_phases", rank, step, self.lane.host_phases(run))


def _span(on: bool, name: str, cat: str, **args):
    """An SA_PROFILE span, or nothing for runs outside the profiled window (warm-up)."""
    return sa_profile.span(name, cat, **args) if on else contextlib.nullcontext()
