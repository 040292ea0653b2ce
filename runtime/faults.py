"""Faults injected on purpose (``--inject``), seeded so a run can be repeated, with their ground truth.

Kinds: ``fence_tail``, ``straggler``, ``slow_bind``, ``cpu_contention``,
``gc_pause``, ``crash``. Every rank derives the same plan from the seed; each
event a rank applies is reported to the launcher, which writes ``faults.json``
with the mechanism and phase an analysis should name for it and what the ranks
measured of it. Grammar, steps, timing and faults.json: docs/RUNTIME.md,
"Fault injection (``--inject``)".
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dsprof.errors import DsprofError
from dsprof.profiler import strace_format as fmt

# Event kinds, as faults.json names them (a fence_tail spec produces fence_delay events).
FENCE_DELAY, STRAGGLER, SLOW_BIND = "fence_delay", "straggler", "slow_bind"
CPU_CONTENTION, GC_PAUSE, CRASH = "cpu_contention", "gc_pause", "crash"

# Where a fault strikes (``at=``): the host thread's path, or inside the device program.
AT_HOST, AT_DEVICE = "host", "device"

# spec kind -> (required keys, optional keys)
_GRAMMAR: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "fence_tail": (("p", "ms"), ("rank",)),
    STRAGGLER: (("rank", "ms"), ()),
    SLOW_BIND: (("rank", "ms"), ("step",)),
    CPU_CONTENTION: (("p", "ms"), ("rank", "at")),
    GC_PAUSE: (("p", "ms"), ("rank", "at")),
    CRASH: (("rank", "step"), ()),
}
_EVENT_KIND = {"fence_tail": FENCE_DELAY}  # spec kinds whose events are named otherwise
_INT_KEYS = {"rank", "step"}
# spec kind -> the targets ``at=`` may name, the default first. A CPU neighbour starves every
# thread of the rank's CPU, the device executor with the host thread, and in the depth-2
# pipeline the executor always runs a program while the host works: it cannot strike the
# host path alone, so cpu_contention strikes the device program only.
_TARGETS: dict[str, tuple[str, ...]] = {CPU_CONTENTION: (AT_DEVICE,), GC_PAUSE: (AT_HOST, AT_DEVICE)}

# What an analysis should find for each event: (mechanism, phase). A fence that
# fires late keeps the host in native_fence_wait although the device is done; a
# straggler's extra work is inside device_wall; slow_bind is host CPU work in
# bind; the CPU neighbour wakes when the device program starts, so the executor
# thread waits in the run queue during device_wall; the gc pause runs on the
# host thread inside native_fence_wait (and holds the GIL, so the CPU executor
# stalls with it). A crash has no mechanism: the rank is gone.
GROUND_TRUTH: dict[tuple[str, str | None], tuple[str | None, str | None]] = {
    (FENCE_DELAY, None): (fmt.MECH_DEVICE, fmt.PHASE_FENCE_WAIT),
    (STRAGGLER, None): (fmt.MECH_DEVICE, fmt.PHASE_DEVICE_WALL),
    (SLOW_BIND, None): (fmt.MECH_HOST_CPU, fmt.PHASE_BIND),
    (CPU_CONTENTION, AT_DEVICE): (fmt.MECH_RUN_QUEUE, fmt.PHASE_DEVICE_WALL),
    (GC_PAUSE, AT_HOST): (fmt.MECH_GC, fmt.PHASE_FENCE_WAIT),
    (GC_PAUSE, AT_DEVICE): (fmt.MECH_GC, fmt.PHASE_DEVICE_WALL),
    (CRASH, None): (None, None),
}
# A fault whose measured loss is below this share of its delay_ms cost (almost) nothing: faults.json says so.
EFFECTIVE_SHARE = 1 / 3


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    rank: int | None = None
    step: int | None = None
    ms: float | None = None
    p: float | None = None
    at: str | None = None  # AT_HOST / AT_DEVICE for the kinds that take it (their default when left out)


@dataclass(frozen=True)
class FaultEvent:
    """One fault a rank applies at one measured decode step."""

    kind: str
    rank: int
    step: int
    ms: float | None
    at: str | None = None

    def to_json(self, details: dict | None = None) -> dict:
        """The faults.json entry: where it was injected, how much, what an analysis should name, and ``details``."""
        mechanism, phase = GROUND_TRUTH[(self.kind, self.at)]
        target = {"at": self.at} if self.at is not None else {}
        return {
            "kind": self.kind,
            "rank": self.rank,
            "step": self.step,
            "delay_ms": self.ms,
            "mechanism": mechanism,
            "phase": phase,
            **target,
            **(details or {}),
        }


# One rank's device program of one step: (start ns, end ns) on CLOCK_MONOTONIC, the executor's
# run-queue wait over it, and the most any thread of the rank but the host thread waited (ns)
ProgramWindow = tuple[int, int, int, int]


# One rank's own stretches of the host thread in one run: (start ns, end ns, run-queue ns) each
HostPhases = list[tuple[int, int, int]]


def contention_loss(
    entry: dict, found: dict[int, dict], programs: dict[tuple[int, int], ProgramWindow], host: dict[tuple[int, int], HostPhases]
) -> dict[int, dict]:
    """What each rank pinned to the contended CPU lost to a cpu_contention event (faults.json ``measured``).

    The struck rank says when the burn started (``burn_start_ns``); every rank on that
    CPU sent, for the steps near it, its device programs' windows (``programs``) and its
    host thread's stretches (``host``), keyed by (rank, step). What overlapped
    [start, start + delay_ms] lost its run-queue wait: ``device_ms`` the most any thread
    of the rank but the host thread waited (a rank blocked in an all-to-all loses its
    time in the collective's I/O thread; ``rq_ms`` the executor's own), ``host_ms`` the
    host thread's (a CPU mate's host thread is not spared), ``steps`` the loss per step
    (a CPU mate may lose it in the step before), ``loss_ms`` the larger of the two.
    """
    burn = found.get(entry["rank"], {})
    start = burn.get("burn_start_ns")
    if start is None:
        return found
    end = start + int(entry["delay_ms"] * 1e6)
    near = {entry["step"] - 1, entry["step"], entry["step"] + 1}
    device: dict[int, dict[int, tuple[int, int]]] = {}
    for (rank, step), (p_start, p_end, rq_ns, threads_rq_ns) in programs.items():
        if step in near and p_start < end and p_end > start:
            device.setdefault(rank, {})[step] = (rq_ns, max(rq_ns, threads_rq_ns))
    on_host: dict[int, dict[int, int]] = {}
    for (rank, step), phases in host.items():
        waited = sum(rq_ns for p_start, p_end, rq_ns in phases if p_start < end and p_end > start) if step in near else 0
        if waited > 0:
            on_host.setdefault(rank, {})[step] = waited
    losses: dict[int, dict] = {}
    for rank in sorted(device.keys() | on_host.keys()):
        programs_of, host_of = device.get(rank, {}), on_host.get(rank, {})
        device_ms, host_ms = sum(lost for _, lost in programs_of.values()) / 1e6, sum(host_of.values()) / 1e6
        by_step = {
            step: max(programs_of.get(step, (0, 0))[1], host_of.get(step, 0)) / 1e6 for step in sorted(programs_of.keys() | host_of.keys())
        }
        losses[rank] = {
            "loss_ms": round(max(device_ms, host_ms), 3),
            "device_ms": round(device_ms, 3),
            "rq_ms": round(sum(rq for rq, _ in programs_of.values()) / 1e6, 3),
            "host_ms": round(host_ms, 3),
            "steps": {str(step): round(ms, 3) for step, ms in by_step.items()},
        }
    losses.setdefault(entry["rank"], {"loss_ms": 0.0, "device_ms": 0.0, "rq_ms": 0.0, "host_ms": 0.0, "steps": {}})["struck"] = burn.get(
        "struck", False
    )
    return losses


def with_measured(entry: dict, measured: dict[int, dict]) -> dict:
    """The faults.json entry with what the ranks measured of it (rank -> {"loss_ms", ...}).

    ``lost_ms`` is the largest loss any rank measured; ``effective`` is false where
    it is below EFFECTIVE_SHARE of ``delay_ms`` (the fault struck, but cost next to
    nothing: e.g. a late fence the host reached later still). A crash has no loss.
    """
    if entry["delay_ms"] is None:
        return entry
    lost = max((m["loss_ms"] for m in measured.values()), default=0.0)
    return {
        **entry,
        "measured": {str(rank): measured[rank] for rank in sorted(measured)},
        "lost_ms": round(lost, 3),
        "effective": lost >= EFFECTIVE_SHARE * entry["delay_ms"],
    }


def parse_fault(text: str, ranks: int) -> FaultSpec:
    """Parse one ``kind:key=value,...`` spec; DsprofError names the spec and what is wrong."""

    def bad(what: str) -> DsprofError:
        return DsprofError(f"bad --inject spec {text!r}: {what}")

    kind, sep, body = text.strip().partition(":")
    if kind not in _GRAMMAR:
        raise bad(f"unknown fault kind {kind!r} (expected one of {', '.join(_GRAMMAR)})")
    required, optional = _GRAMMAR[kind]
    values: dict[str, float | int] = {}
    at = _TARGETS[kind][0] if kind in _TARGETS else None  # the default target
    seen: set[str] = set()
    for item in filter(None, (part.strip() for part in body.split(","))) if sep else ():
        key, eq, raw = item.partition("=")
        if not eq or key not in required + optional:
            raise bad(f"unexpected {item!r} (keys for {kind}: {', '.join(required + optional)})")
        if key in seen:
            raise bad(f"{key} given twice")
        seen.add(key)
        if key == "at":
            if raw not in _TARGETS[kind]:
                raise bad(f"at={raw!r} (expected {' or '.join(_TARGETS[kind])})")
            at = raw
            continue
        try:
            values[key] = int(raw) if key in _INT_KEYS else float(raw)
        except ValueError:
            raise bad(f"{key}={raw!r} is not a number") from None
    missing = [k for k in required if k not in values]
    if missing:
        raise bad(f"missing {', '.join(missing)}")
    if "rank" in values and not 0 <= values["rank"] < ranks:
        raise bad(f"rank {values['rank']} is outside 0..{ranks - 1}")
    if "step" in values and values["step"] < 0:
        raise bad("step must be >= 0")
    if "ms" in values and not values["ms"] > 0:
        raise bad("ms must be > 0")
    if "p" in values and not 0 < values["p"] <= 1:
        raise bad("p must be in (0, 1]")
    return FaultSpec(kind=kind, at=at, **values)  # type: ignore[arg-type]


def parse_faults(texts: list[str], ranks: int) -> list[FaultSpec]:
    return [parse_fault(text, ranks) for text in texts]


@dataclass(frozen=True)
class StepFaults:
    """The events one rank applies at one step."""

    events: tuple[FaultEvent, ...]

    def ms(self, kind: str, at: str | None = None) -> float:
        """Total ms of the events of ``kind`` (aimed ``at`` that target, if given; two specs of one kind add up)."""
        return sum(event.ms or 0.0 for event in self.events if event.kind == kind and at in (None, event.at))

    @property
    def crash(self) -> bool:
        return any(event.kind == CRASH for event in self.events)


class FaultPlan:
    """What each rank injects at each measured decode step; identical on every rank for one seed."""

    def __init__(self, specs: list[FaultSpec], ranks: int, seed: int):
        self.specs = specs
        self.ranks = ranks
        self.seed = seed

    def injects(self, spec_kind: str) -> bool:
        """Whether any spec is of ``spec_kind`` (a rank prepares the mechanism once, at start-up)."""
        return any(spec.kind == spec_kind for spec in self.specs)

    def most_ms(self, spec_kind: str, rank: int, at: str | None = None) -> float:
        """The most ``ms`` the specs of ``spec_kind`` (aimed ``at`` that target, if given) can inject into one step of ``rank``."""
        return sum(spec.ms or 0.0 for spec in self.specs if spec.kind == spec_kind and spec.rank in (None, rank) and at in (None, spec.at))

    def contention_at(self, step: int, ranks: set[int]) -> list[FaultEvent]:
        """The cpu_contention events at ``step`` of any of ``ranks`` (those pinned to one CPU: each of them loses time)."""
        return [event for rank in sorted(ranks) for event in self.at(rank, step).events if event.kind == CPU_CONTENTION]

    def _target(self, index: int, step: int) -> int | None:
        """The rank spec ``index`` hits at ``step``, or None."""
        spec = self.specs[index]
        if spec.p is not None:
            draw = random.Random(f"{spec.kind}:{self.seed}:{index}:{step}")
            hit = draw.random() < spec.p
            rank = draw.randrange(self.ranks) if spec.rank is None else spec.rank
            return rank if hit else None
        if spec.step is not None and spec.step != step:
            return None
        return spec.rank

    def at(self, rank: int, step: int) -> StepFaults:
        """The events ``rank`` applies at measured decode step ``step``, in spec order."""
        return StepFaults(
            tuple(
                FaultEvent(_EVENT_KIND.get(spec.kind, spec.kind), rank, step, spec.ms, spec.at)
                for index, spec in enumerate(self.specs)
                if self._target(index, step) == rank
            )
        )
