"""The chip-run lane: async depth-2 pipeline of fused-program runs on one rank.

A run goes through ``bind`` (stage its ping-pong slot's TaskArgs), ``launch``
(``runner_run`` starts: the program is queued on the device stream, then
``claim_release`` lets the successor launch), ``drain`` (the host waits on the
completion fence: ``native_fence_wait``; ``runner_run`` ends) and ``validate``.
The rank loop binds and launches run N+1 before draining run N, so two runs
are in flight. With device-resident metadata every metadata update waits for
a global metadata predecessor: the previous dispatch must have drained here
(so bind(N+1) cannot start before runner_run(N) ends) and on every other rank
(each device-resident update in bind.args first passes a host-side barrier);
the pipeline serializes.

Runs overlap on one host thread, so their STRACE spans are written with
``strace.record`` and explicit depths once the run is validated.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dsprof.profiler import strace
from dsprof.profiler.strace_format import DECODE_CALLABLE
from dsprof.runtime.device import Fence, PhaseClock
from dsprof.runtime.task_args import TaskArgs

PREFILL_CALLABLE = "prefill.main+mtp"
ROOT = "chip.run"


def callable_hid(name: str) -> str:
    """Content hash of a callable (the STRACE ``hid``)."""
    return hashlib.sha256(name.encode()).hexdigest()[:16]


@dataclass
class Run:
    epoch: int
    step: int  # decode step (-1 for prefill)
    callable: str
    slot: TaskArgs
    dispatch_id: int
    profiled: bool
    inv: int = 0
    generation: int = 0
    bind: tuple[int, int] = (0, 0)  # (ts_ns, dur_ns)
    bind_args: tuple[int, int] = (0, 0)
    bind_prebuilt: tuple[int, int] = (0, 0)
    runner_ts_ns: int = 0
    runner_end_ns: int = 0
    fence: Fence | None = None
    fence_wait: tuple[int, int] = (0, 0)
    claim: tuple[int, int] = (0, 0)
    validate: tuple[int, int] = (0, 0)
    drained: bool = False
    attrs: dict = field(default_factory=dict)


class ChipRunLane:
    """One rank's chip-run lane with ``len(slots)`` ping-pong TaskArgs slots."""

    def __init__(self, rank: int, device, slots: list[TaskArgs], *, device_phases: bool, serialize_metadata: bool):
        """``serialize_metadata`` (device-resident metadata): bind waits for the previous dispatch to drain."""
        self.rank = rank
        self.device = device
        self.slots = slots
        self.serialize_metadata = serialize_metadata
        self.device_phases = device_phases
        self._epoch = 0
        self._in_flight: list[Run] = []  # launched, not yet drained (oldest first)

    def bind(self, *, step: int, callable_name: str, dispatch_id: int, profiled: bool,
             stage_args: Callable[[TaskArgs], None], bind_prebuilt: Callable[[TaskArgs], None],
             slot: TaskArgs | None = None) -> Run:
        """Stage the next run's slot. Device-resident metadata waits for the predecessor first."""
        if self.serialize_metadata:
            for previous in list(self._in_flight):
                self.drain(previous)
        slot = slot if slot is not None else self.slots[self._epoch % len(self.slots)]
        slot.generation += 1
        run = Run(epoch=self._epoch, step=step, callable=callable_name, slot=slot, dispatch_id=dispatch_id,
                  profiled=profiled, inv=strace.new_invocation(), generation=slot.generation)
        self._epoch += 1
        t0 = time.monotonic_ns()
        stage_args(slot)
        t1 = time.monotonic_ns()
        bind_prebuilt(slot)
        t2 = time.monotonic_ns()
        run.bind, run.bind_args, run.bind_prebuilt = (t0, t2 - t0), (t0, t1 - t0), (t1, t2 - t1)
        return run

    def launch(self, run: Run, program: Callable[[TaskArgs, PhaseClock], None], fence_delay_s: float = 0.0) -> None:
        """runner_run starts: queue the program on the device stream, then release the launch claim."""
        run.runner_ts_ns = time.monotonic_ns()
        run.fence = self.device.submit(lambda clock: program(run.slot, clock), signal_delay_s=fence_delay_s)
        claim_ts = time.monotonic_ns()
        self._in_flight.append(run)  # the successor may launch from here on
        run.claim = (claim_ts, time.monotonic_ns() - claim_ts)

    def drain(self, run: Run) -> None:
        """Wait on the run's completion fence; runner_run ends here."""
        if run.drained:
            return
        t0 = time.monotonic_ns()
        run.fence.wait()
        t1 = time.monotonic_ns()
        run.fence_wait = (t0, t1 - t0)
        run.runner_end_ns = t1
        run.drained = True
        self._in_flight.remove(run)

    def finish(self, run: Run, validate: Callable[[Run], None]) -> None:
        """Drain (if still in flight), validate, and write the run's spans."""
        self.drain(run)
        t0 = time.monotonic_ns()
        validate(run)
        run.validate = (t0, time.monotonic_ns() - t0)
        if run.profiled:
            self._emit(run)

    def _emit(self, run: Run) -> None:
        hid = callable_hid(run.callable)
        inv = run.inv

        def rec(name: str, depth: int, span: tuple[int, int], **attrs) -> None:
            strace.record(name, inv=inv, hid=hid, depth=depth, ts_ns=span[0], dur_ns=span[1], **attrs)

        rec(f"{ROOT}.bind", 1, run.bind)
        rec(f"{ROOT}.bind.args", 2, run.bind_args)
        rec(f"{ROOT}.bind.prebuilt", 2, run.bind_prebuilt)
        rec(f"{ROOT}.runner_run", 1, (run.runner_ts_ns, run.runner_end_ns - run.runner_ts_ns))
        if self.device_phases:
            rec(f"{ROOT}.runner_run.native_fence_wait", 2, run.fence_wait)
            phases = run.fence.device_phases()
            wall = phases[0]
            strace.record(f"{ROOT}.runner_run.device_wall", inv=inv, hid=hid, depth=2, ts_ns=wall[1],
                          dur_ns=wall[2], clk="dev")
            for name, offset, dur in phases[1:]:
                strace.record(f"{ROOT}.runner_run.device_wall.{name}", inv=inv, hid=hid, depth=3, ts_ns=offset,
                              dur_ns=dur, clk="dev")
        rec(f"{ROOT}.claim_release", 1, run.claim)
        rec(f"{ROOT}.validate", 1, run.validate)
        end = max(run.validate[0] + run.validate[1], run.runner_end_ns)
        rec(ROOT, 0, (run.bind[0], end - run.bind[0]), run_id=run.epoch, dispatch_id=run.dispatch_id,
            run_epoch=run.epoch, slot_id=run.slot.slot_id, generation=run.generation, rank=self.rank,
            device=self.device.name, callable=run.callable, step=run.step, **run.attrs)
