"""The chip-run lane: async depth-2 pipeline of fused-program runs on one rank.

The rank loop binds and launches run N+1 before draining run N, so two runs
are in flight (bind, launch, drain, validate; with device-resident metadata
bind(N+1) waits for run N to drain on every rank, and the pipeline serializes).
Runs overlap on one host thread, so their STRACE spans are written with
``strace.record`` and explicit depths once the run is validated; every phase
boundary is a :class:`Mark` (host time and a host sample of the thread). The
same marks open and close the ``--torch-profiler`` labels (:mod:`.torch_profile`).
Details: docs/RUNTIME.md, "The decode step and the depth-2 pipeline", "Artifacts and profiling".
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dsprof.profiler import strace, torch_labels
from dsprof.profiler import strace_format as fmt
from dsprof.runtime import torch_profile
from dsprof.runtime.device import Fence, PhaseClock
from dsprof.runtime.injectors import thread_run_queue_ns
from dsprof.runtime.task_args import TaskArgs

PREFILL_CALLABLE = "prefill.main+mtp"
DECODE_CALLABLE = fmt.DECODE_CALLABLE


def callable_hid(name: str) -> str:
    """Content hash of a callable (the STRACE ``hid``)."""
    return hashlib.sha256(name.encode()).hexdigest()[:16]


class Mark(NamedTuple):
    """A phase boundary on the host thread: when, and what the OS had seen of the thread by then."""

    ns: int
    sample: strace.Sample | None
    rq_ns: int = -1  # the thread's run-queue wait so far, where the lane measures it (cpu_contention ground truth)


def mark(rq: bool = False) -> Mark:
    # one sample serves the span ending and the one starting here
    return Mark(time.monotonic_ns(), strace.host_sample(), thread_run_queue_ns() if rq else -1)


_UNSET = Mark(0, None)


@dataclass
class Run:
    epoch: int
    step: int  # measured decode step (-1 for prefill)
    callable: str
    slot: TaskArgs
    dispatch_id: int
    profiled: bool
    inv: int = 0
    generation: int = 0
    # phase boundaries, in the order the host thread passes them
    bind_start: Mark = _UNSET
    args_end: Mark = _UNSET  # bind.args ends, bind.prebuilt starts
    bind_end: Mark = _UNSET
    runner_start: Mark = _UNSET
    claim_start: Mark = _UNSET
    claim_end: Mark = _UNSET
    fence_start: Mark = _UNSET
    fence_end: Mark = _UNSET  # runner_run ends
    validate_start: Mark = _UNSET
    validate_end: Mark = _UNSET
    fence: Fence | None = None
    # host work done as the host starts to wait on the fence, while the program still runs
    # (faults that strike during this step's device program: a gc pause, waking a CPU neighbour)
    at_fence_wait: Callable[[Fence], object] | None = None
    drained: bool = False
    attrs: dict = field(default_factory=dict)
    labels: list = field(default_factory=list)  # torch.profiler labels open from launch to drain

    @property
    def measured_decode(self) -> bool:
        return self.profiled and self.callable == DECODE_CALLABLE and self.step >= 0

    def label(self, name: str) -> str | None:
        """The torch.profiler label of one of the run's phases (its span name); None where it records none."""
        return name if self.profiled and torch_profile.recording() else None

    def step_label(self, name: str) -> str | None:
        """``name#step`` for a measured decode step, else as :meth:`label`."""
        return torch_labels.step_label(name, self.step) if self.measured_decode and self.label(name) else self.label(name)


class ChipRunLane:
    """One rank's chip-run lane with ``len(slots)`` ping-pong TaskArgs slots."""

    def __init__(
        self,
        rank: int,
        device,
        slots: list[TaskArgs],
        *,
        device_phases: bool,
        serialize_metadata: bool,
        measure_host_rq: bool = False,
        exchange_waits: Callable[[list[tuple[str, int]]], Any] | None = None,
    ):
        """``serialize_metadata`` (device-resident metadata): bind waits for the previous dispatch to drain;
        ``measure_host_rq``: every phase boundary also reads the host thread's run-queue wait;
        ``exchange_waits``: the collective waits learn their ``peer`` from every rank's wait lengths
        (ParallelContext.exchange_waits), so a run's spans are written once that exchange is done."""
        self.rank = rank
        self.measure_host_rq = measure_host_rq
        self.exchange_waits = exchange_waits if device_phases else None
        self._unwritten: list[tuple[Run, Any]] = []  # validated runs waiting for their exchange, oldest first
        self.device = device
        self.slots = slots
        self.serialize_metadata = serialize_metadata
        self.device_phases = device_phases
        self._epoch = 0
        self._in_flight: list[Run] = []  # launched, not yet drained (oldest first)

    def bind(
        self,
        *,
        step: int,
        callable_name: str,
        dispatch_id: int,
        profiled: bool,
        stage_args: Callable[[TaskArgs], None],
        bind_prebuilt: Callable[[TaskArgs], None],
        slot: TaskArgs | None = None,
    ) -> Run:
        """Stage the next run's slot. Device-resident metadata waits for the predecessor first."""
        if self.serialize_metadata:
            for previous in list(self._in_flight):
                self.drain(previous)
        slot = slot if slot is not None else self.slots[self._epoch % len(self.slots)]
        slot.generation += 1
        run = Run(
            epoch=self._epoch,
            step=step,
            callable=callable_name,
            slot=slot,
            dispatch_id=dispatch_id,
            profiled=profiled,
            inv=strace.new_invocation(),
            generation=slot.generation,
        )
        self._epoch += 1
        with torch_profile.label(run.label(fmt.BIND)):
            run.bind_start = mark(self.measure_host_rq)
            stage_args(slot)
            run.args_end = mark(self.measure_host_rq)
            bind_prebuilt(slot)
            run.bind_end = mark(self.measure_host_rq)
        return run

    def launch(
        self, run: Run, program: Callable[[TaskArgs, PhaseClock], None], fence_delay_s: float = 0.0, measure_rq: bool = False
    ) -> None:
        """runner_run starts: queue the program on the device stream, then release the launch claim."""
        program_label = run.step_label(torch_labels.PROGRAM)
        if run.label(fmt.RUNNER_RUN):
            # opened before the mark (and closed after the drain's): their cost stays out of runner_run, and the launch
            # follows the mark as closely as without them (the CPU device's clock starts at the mark). The step last:
            # it is the Kineto reader's runner_run, nearest the marks
            names = [fmt.RUNNER_RUN] + ([torch_labels.step_label(torch_labels.PROFILER_STEP, run.step)] if run.measured_decode else [])
            run.labels = [torch_profile.open_label(name) for name in names]
        run.runner_start = mark(self.measure_host_rq)
        run.fence = self.device.submit(
            lambda clock: program(run.slot, clock),
            signal_delay_s=fence_delay_s,
            measure_rq=measure_rq,
            label=program_label,
            origin_ns=run.runner_start.ns,  # device_wall and its phases are placed from runner_run's start
        )
        with torch_profile.label(run.label(fmt.CLAIM_RELEASE)):
            run.claim_start = mark(self.measure_host_rq)
            self._in_flight.append(run)  # the successor may launch from here on
            run.claim_end = mark(self.measure_host_rq)

    def drain(self, run: Run) -> None:
        """Wait on the run's completion fence; runner_run ends here."""
        if run.drained:
            return
        assert run.fence is not None, "drained before it was launched"
        run.fence_start = mark(self.measure_host_rq)
        if run.at_fence_wait is not None:
            run.at_fence_wait(run.fence)
        run.fence.wait()
        run.fence_end = mark(self.measure_host_rq)
        for handle in reversed(run.labels):
            torch_profile.close_label(handle)
        run.drained = True
        self._in_flight.remove(run)

    def finish(self, run: Run, validate: Callable[[Run], None]) -> None:
        """Drain (if still in flight), validate, and write the run's spans."""
        self.drain(run)
        with torch_profile.label(run.label(fmt.VALIDATE)):
            run.validate_start = mark(self.measure_host_rq)
            validate(run)
            run.validate_end = mark(self.measure_host_rq)
        if not run.profiled:
            return
        if self.exchange_waits is None:
            self._emit(run)
            return
        assert run.fence is not None
        waits = [(path, dur) for path, _, dur, _ in run.fence.clock.resolve() if path.endswith(fmt.WAIT_SUFFIX)]
        self._unwritten.append((run, self.exchange_waits(waits)))
        self._write_exchanged(wait=False)

    def close(self) -> None:
        """Write the runs still waiting for their peers' wait lengths (every rank calls it: it waits for them)."""
        self._write_exchanged(wait=True)

    def _write_exchanged(self, wait: bool) -> None:
        while self._unwritten and (wait or self._unwritten[0][1].ready()):
            run, exchange = self._unwritten.pop(0)
            assert run.fence is not None
            waits = [(path, offset) for path, offset, _, _ in run.fence.clock.resolve() if path.endswith(fmt.WAIT_SUFFIX)]
            self._emit(run, dict(zip(waits, exchange.peers(), strict=True)))

    @staticmethod
    def host_phases(run: Run) -> list[tuple[int, int, int]]:
        """The run's own stretches of the host thread (bind, launch, fence wait, validate) as (start ns, end ns,
        run-queue ns): disjoint, unlike the run's spans (runner_run holds the next run's bind)."""
        bounds = ((run.bind_start, run.bind_end), (run.runner_start, run.claim_end), (run.fence_start, run.fence_end))
        return [(start.ns, end.ns, end.rq_ns - start.rq_ns) for start, end in (*bounds, (run.validate_start, run.validate_end))]

    def _emit(self, run: Run, peers: dict[tuple[str, int], int] | None = None) -> None:
        """Write the run's spans; ``peers``: (wait path, offset) -> its peer, where the waits were exchanged."""
        hid = callable_hid(run.callable)
        inv = run.inv

        def host(name: str, depth: int, start: Mark, end: Mark, **attrs) -> None:
            attrs_and_evidence: dict[str, Any] = {**attrs, **strace.evidence(start.sample, end.sample)}
            strace.record(name, inv=inv, hid=hid, depth=depth, ts_ns=start.ns, dur_ns=end.ns - start.ns, **attrs_and_evidence)

        host(fmt.BIND, 1, run.bind_start, run.bind_end)
        host(fmt.BIND_ARGS, 2, run.bind_start, run.args_end)
        host(fmt.BIND_PREBUILT, 2, run.args_end, run.bind_end)
        host(fmt.RUNNER_RUN, 1, run.runner_start, run.fence_end)
        if self.device_phases:
            host(fmt.FENCE_WAIT, 2, run.fence_start, run.fence_end)
            self._emit_device_phases(run, hid, peers or {})
        host(fmt.CLAIM_RELEASE, 1, run.claim_start, run.claim_end)
        host(fmt.VALIDATE, 1, run.validate_start, run.validate_end)
        # finish() validates after the drain, so validate's end is the run's end
        host(
            fmt.ROOT,
            0,
            run.bind_start,
            run.validate_end,
            run_id=run.epoch,
            dispatch_id=run.dispatch_id,
            run_epoch=run.epoch,
            slot_id=run.slot.slot_id,
            generation=run.generation,
            rank=self.rank,
            device=self.device.name,
            callable=run.callable,
            step=run.step,
            **run.attrs,
        )

    def _emit_device_phases(self, run: Run, hid: str, peers: dict[tuple[str, int], int]) -> None:
        """device_wall (with the executor thread's evidence) and every phase below it, on the device clock."""
        fence = run.fence
        assert fence is not None
        wall_ts, wall_dur = fence.wall()
        strace.record(
            fmt.DEVICE_WALL, inv=run.inv, hid=hid, depth=2, ts_ns=wall_ts, dur_ns=wall_dur, clk=fmt.CLK_DEVICE, **fence.evidence()
        )
        for path, offset, dur, attrs in fence.phases():
            if (path, offset) in peers:
                attrs = {**attrs, fmt.PEER_ATTR: peers[(path, offset)]}
            strace.record(
                fmt.device_phase_name(path),
                inv=run.inv,
                hid=hid,
                depth=3 + path.count("."),
                ts_ns=offset,
                dur_ns=dur,
                clk=fmt.CLK_DEVICE,
                **attrs,
            )
