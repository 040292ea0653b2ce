"""Known-answer logs of a coupled decode loop, written by an independent producer.

An expert-parallel decode step meets every rank at the all-to-all inside the
device program, so a rank that reaches it late delays them all. This module
simulates that loop event by event and writes the STRACE log another producer
would write (:mod:`dsprof.testing.coupled_log`), with answers computed by the
simulation alone — never by dsprof:

* per rank, one host thread runs ``bind(0); launch(0); for s: [bind(s+1);
  launch(s+1)]; drain(s); validate(s)``; a bind also waits for the end of the
  run two before it (the ping-pong slot); launch = runner_run opens, then
  claim_release; drain = native_fence_wait until the device's completion fence
  fires; runner_run(s) closes right after that wait;
* per rank, a device stream runs program s at max(launch(s) + latency, end of
  program s-1): L layers of [work, all-to-all], then verify and mtp; an
  all-to-all releases every rank when the last one arrives, plus a comm time;
* every duration has seeded jitter; faults add extra time to one span of one
  (step, rank); a fault's saving is the decode wall of the run with every fault
  minus the decode wall with every fault but that one, jitter unchanged.

The step a fault is seen at is found the same way: the slow steps, tail steps
and late starts (SPEC §3 rules) that the fault's removal makes disappear.

This is test support: nothing in the product imports it, and it imports
nothing of dsprof's profiler or analysis, so the two cannot share a mistake.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from dsprof.fileio import atomic_write_text
from dsprof.testing.coupled_log import write_log

US = 1_000
MS = 1_000_000
T0_NS = 7_340_000_000_000  # the host monotonic clock at the first bind
THRESHOLD_MS = 5.0

# fault kind -> (mechanism, phase) an analysis should name for it
KINDS = {
    "device": ("device", "device_wall"),  # slower device work before an all-to-all
    "run_queue": ("run_queue", "device_wall"),  # the device executor waits for a CPU before an all-to-all
    "gc_device": ("gc", "device_wall"),  # a collection while the device program runs (a CPU device)
    "gc_bind": ("gc", "bind"),  # a collection on the host thread during bind
    "host_cpu": ("host_cpu", "bind"),  # more host CPU work in bind
    "fence": ("device", "native_fence_wait"),  # the completion fence is signalled late
}
DEVICE_KINDS = ("device", "run_queue", "gc_device")
BIND_KINDS = ("gc_bind", "host_cpu")


@dataclass(frozen=True)
class Fault:
    """``extra_ns`` more time in one span of run (step, rank); ``layer`` for faults inside the device program."""

    step: int
    rank: int
    kind: str
    extra_ns: int
    layer: int = 0


@dataclass(frozen=True)
class Shape:
    """What is simulated: ranks, decode steps, layers per program, whether wait spans name their peer."""

    ranks: int = 8
    steps: int = 150
    layers: int = 3
    seed: int = 0
    peer: bool = True


@dataclass
class Draws:
    """Every jittered duration of a run (ns), drawn once so that re-simulations differ only by the faults."""

    start: np.ndarray  # (R,) first bind start
    bind: np.ndarray  # (S, R)
    launch_gap: np.ndarray  # (S, R) bind end -> runner_run start
    claim_at: np.ndarray  # (S, R) runner_run start -> claim_release start
    claim: np.ndarray  # (S, R)
    drain_gap: np.ndarray  # (S, R) claim_release end -> fence wait start
    latency: np.ndarray  # (S, R) launch -> program may start
    work: np.ndarray  # (S, R, L) device work before each all-to-all
    comm: np.ndarray  # (S, L) all-to-all time after the last arrival
    verify: np.ndarray  # (S, R)
    mtp: np.ndarray  # (S, R)
    fence_lag: np.ndarray  # (S, R) program end -> fence seen on the host
    runner_tail: np.ndarray  # (S, R)
    validate_gap: np.ndarray  # (S, R)
    validate: np.ndarray  # (S, R)
    root_tail: np.ndarray  # (S, R)
    bind_rq: np.ndarray  # (S, R) run-queue noise of the host thread in bind
    device_rq: np.ndarray  # (S, R) run-queue noise of the device executor
    small_gc: np.ndarray  # (S, R) a small collection inside validate (ns, 0 = none)


def draw(shape: Shape) -> Draws:
    """Base durations with jitter of tens to a few hundred microseconds."""
    rng = np.random.default_rng([shape.seed, 17])
    s, r, layers = shape.steps, shape.ranks, shape.layers

    def around(base_us: float, spread_us: float, size: tuple[int, ...] = (s, r)) -> np.ndarray:
        return np.rint((base_us + rng.uniform(-spread_us, spread_us, size)) * US).astype(np.int64)

    gc_here = rng.random((s, r)) < 0.04
    return Draws(
        start=np.rint((np.arange(r) * 11.0 + rng.uniform(0, 150, r)) * US).astype(np.int64) + T0_NS,
        bind=around(1200, 150),
        launch_gap=around(45, 20),
        claim_at=around(25, 10),
        claim=around(35, 10),
        drain_gap=around(20, 8),
        latency=around(60, 20),
        work=around(2000, 180, (s, r, layers)),
        comm=around(260, 40, (s, layers)),
        verify=around(900, 90),
        mtp=around(600, 60),
        fence_lag=around(30, 15),
        runner_tail=around(20, 8),
        validate_gap=around(30, 10),
        validate=around(650, 90),
        root_tail=around(15, 5),
        bind_rq=around(40, 30),
        device_rq=around(60, 40),
        small_gc=np.where(gc_here, around(140, 60), 0),
    )


@dataclass
class Extras:
    """The faults as added time per span (ns), and the small nudges that are not faults."""

    bind: np.ndarray
    work: np.ndarray
    fence: np.ndarray
    validate: np.ndarray

    @classmethod
    def of(cls, shape: Shape, faults: list[Fault], nudges: Sequence[tuple[int, int, int]] = ()) -> Extras:
        s, r = shape.steps, shape.ranks
        extras = cls(
            np.zeros((s, r), np.int64), np.zeros((s, r, shape.layers), np.int64), np.zeros((s, r), np.int64), np.zeros((s, r), np.int64)
        )
        for f in faults:
            if f.kind in BIND_KINDS:
                extras.bind[f.step, f.rank] += f.extra_ns
            elif f.kind in DEVICE_KINDS:
                extras.work[f.step, f.rank, f.layer] += f.extra_ns
            else:
                extras.fence[f.step, f.rank] += f.extra_ns
        for step, rank, ns in nudges:
            extras.validate[step, rank] += ns
        return extras


@dataclass
class Timeline:
    """Every span's times on the host monotonic clock (ns): (S, R) arrays unless noted."""

    bind_ts: np.ndarray
    bind_end: np.ndarray
    runner_ts: np.ndarray
    claim_ts: np.ndarray
    claim_end: np.ndarray
    program_ts: np.ndarray
    layer_ts: np.ndarray  # (S, R, L)
    arrival: np.ndarray  # (S, R, L)
    release: np.ndarray  # (S, L)
    peer: np.ndarray  # (S, L) the last rank to arrive
    forward_end: np.ndarray
    verify_end: np.ndarray
    program_end: np.ndarray
    fence_ts: np.ndarray
    fence_end: np.ndarray
    runner_end: np.ndarray
    validate_ts: np.ndarray
    validate_end: np.ndarray
    root_end: np.ndarray

    @property
    def decode_wall_ns(self) -> int:
        return int(self.root_end.max() - self.bind_ts.min())


def simulate(shape: Shape, d: Draws, x: Extras) -> Timeline:
    """Run the decode loop of every rank (vectorised over ranks) and its device stream, step by step."""
    s_count, r_count, layers = shape.steps, shape.ranks, shape.layers
    t = {
        k: np.zeros((s_count, r_count), np.int64)
        for k in Timeline.__dataclass_fields__
        if k not in ("layer_ts", "arrival", "release", "peer")
    }
    layer_ts = np.zeros((s_count, r_count, layers), np.int64)
    arrival = np.zeros_like(layer_ts)
    release = np.zeros((s_count, layers), np.int64)
    peer = np.zeros((s_count, layers), np.int64)

    def bind_and_launch(s: int, free: np.ndarray) -> np.ndarray:
        """bind(s) then launch(s) on each host thread free at ``free``; returns when the thread is free again."""
        start = free if s < 2 else np.maximum(free, t["root_end"][s - 2])
        t["bind_ts"][s] = start
        t["bind_end"][s] = start + d.bind[s] + x.bind[s]
        runner = t["bind_end"][s] + d.launch_gap[s]
        if s > 0:
            runner = np.maximum(runner, t["claim_ts"][s - 1])
        t["runner_ts"][s] = runner
        t["claim_ts"][s] = runner + d.claim_at[s]
        t["claim_end"][s] = t["claim_ts"][s] + d.claim[s]
        return t["claim_end"][s]

    def program(s: int) -> None:
        """Device program s: layers of work then an all-to-all that waits for the last rank."""
        clock = t["runner_ts"][s] + d.latency[s]
        if s > 0:
            clock = np.maximum(clock, t["program_end"][s - 1])
        t["program_ts"][s] = clock
        for layer in range(layers):
            layer_ts[s, :, layer] = clock
            arrival[s, :, layer] = clock + d.work[s, :, layer] + x.work[s, :, layer]
            peer[s, layer] = int(np.argmax(arrival[s, :, layer]))
            release[s, layer] = arrival[s, :, layer].max() + d.comm[s, layer]
            clock = np.full(r_count, release[s, layer])
        t["forward_end"][s] = clock
        t["verify_end"][s] = clock + d.verify[s]
        t["program_end"][s] = t["verify_end"][s] + d.mtp[s]

    free = bind_and_launch(0, d.start)
    program(0)
    for s in range(s_count):
        if s + 1 < s_count:
            free = bind_and_launch(s + 1, free)
            program(s + 1)
        t["fence_ts"][s] = free + d.drain_gap[s]
        fired = t["program_end"][s] + d.fence_lag[s] + x.fence[s]
        t["fence_end"][s] = np.maximum(t["fence_ts"][s] + 5 * US, fired)
        t["runner_end"][s] = t["fence_end"][s] + d.runner_tail[s]
        t["validate_ts"][s] = t["runner_end"][s] + d.validate_gap[s]
        t["validate_end"][s] = t["validate_ts"][s] + d.validate[s] + x.validate[s]
        t["root_end"][s] = t["validate_end"][s] + d.root_tail[s]
        free = t["root_end"][s]
    return Timeline(layer_ts=layer_ts, arrival=arrival, release=release, peer=peer, **t)


# -- SPEC §3 rules, on a simulated timeline -------------------------------------------------


def step_intervals(tl: Timeline) -> np.ndarray:
    """Step interval(s) = max_r end(validate(s)) - max_r end(validate(s-1)), for s >= 1 (ns)."""
    return np.diff(tl.validate_end.max(axis=1))


def flags(tl: Timeline, threshold_ns: int = int(THRESHOLD_MS * MS)) -> set[tuple]:
    """Every flagged item: ("slow_steps", s, None), ("tail_steps", s, None), ("late_starts", s, rank)."""
    found: set[tuple] = set()
    intervals = step_intervals(tl)
    found.update(("slow_steps", int(s) + 1, None) for s in np.flatnonzero(intervals - np.median(intervals) > threshold_ns))
    skew = tl.runner_end.max(axis=1) - tl.runner_end.min(axis=1)
    found.update(("tail_steps", int(s), None) for s in np.flatnonzero(skew > threshold_ns))
    late = tl.runner_ts - tl.runner_ts.min(axis=1, keepdims=True) > threshold_ns
    found.update(("late_starts", int(s), int(r)) for s, r in zip(*np.nonzero(late), strict=True))
    return found


# -- scenarios and their known answers ------------------------------------------------------


@dataclass
class Scenario:
    """A shape, its faults (and nudges: small held-back starts that are not faults), and the simulation's draws."""

    shape: Shape
    faults: list[Fault]
    nudges: list[tuple[int, int, int]] = field(default_factory=list)
    draws: Draws | None = None

    def __post_init__(self) -> None:
        if self.draws is None:
            self.draws = draw(self.shape)

    def run(self, faults: list[Fault] | None = None) -> Timeline:
        assert self.draws is not None
        return simulate(self.shape, self.draws, Extras.of(self.shape, self.faults if faults is None else faults, self.nudges))


def plan_faults(shape: Shape, spacing: int = 7, attempt: int = 0) -> list[Fault]:
    """About one step in nine gets a fault (at most one per step, ``spacing`` apart); kinds rotate so each appears."""
    rng = np.random.default_rng([shape.seed, 29, attempt])
    count = max(len(KINDS), (shape.steps - 8) // (spacing + 2))
    slack = shape.steps - 8 - (count - 1) * spacing
    if slack < 0:
        raise ValueError(f"{shape.steps} steps are too few for {count} faults {spacing} steps apart")
    offsets = np.sort(rng.integers(0, slack + 1, count))
    kinds = [k for _ in range(count // len(KINDS) + 1) for k in rng.permutation(list(KINDS))][:count]
    return [
        Fault(
            step=int(3 + offset + i * spacing),
            rank=int(rng.integers(shape.ranks)),
            kind=str(kind),
            extra_ns=int(round(rng.uniform(10.0, 40.0), 1) * MS),
            layer=int(rng.integers(shape.layers)),
        )
        for i, (offset, kind) in enumerate(zip(offsets, kinds, strict=True))
    ]


def chain_scenario(seed: int = 3, ranks: int = 8) -> Scenario:
    """Three long faults, each on a run held back 150 us by its slot's previous run (a nudge, not a fault).

    Each fault starts a carry-over chain on its rank. The chain began at the
    faulty run — the one whose lateness has a cause of its own — not at the
    nudge before it, and (for the slow bind) not at the run before it that the
    bind held up on the same host thread.
    """
    shape = Shape(ranks=ranks, steps=60, layers=3, seed=seed, peer=True)
    faults = [
        Fault(20, 3 % ranks, "fence", 42 * MS),
        Fault(32, 5 % ranks, "gc_bind", 38 * MS),
        Fault(44, 6 % ranks, "fence", 36 * MS),
    ]
    nudges = [(f.step - 2, f.rank, 150 * US) for f in faults]
    return Scenario(shape, faults, nudges)


def _expected_mechanism(fault: Fault, section: str, step: int) -> str:
    """What an item a fault caused should say: its own mechanism where it acts, ``carried_over`` after."""
    mechanism = KINDS[fault.kind][0]
    if step == fault.step or (fault.kind in BIND_KINDS and step == fault.step - 1 and section != "late_starts"):
        return mechanism  # a long bind(s) also delays drain(s-1) on its host thread
    return "carried_over" if step > fault.step else mechanism


def known_answers(scenario: Scenario) -> dict:
    """The answers (ms) an analysis must reach, from the simulation with and without each fault."""
    full = scenario.run()
    clean = scenario.run([])
    wall = full.decode_wall_ns
    seen = flags(full)
    explained: set[tuple] = set()
    faults: list[dict[str, Any]] = []
    for fault in scenario.faults:
        others = [f for f in scenario.faults if f is not fault]
        without = scenario.run(others)
        mine = sorted(seen - flags(without), key=lambda item: (item[1], item[0]))
        explained.update(mine)
        mechanism, phase = KINDS[fault.kind]
        items = []
        for section, step, _ in mine:  # the culprit of everything a fault caused is the fault's rank
            item = {"section": section, "step": step, "rank": fault.rank, "mechanism": _expected_mechanism(fault, section, step)}
            if item["mechanism"] == "carried_over":
                item["from_step"] = fault.step
            items.append(item)
        faults.append(
            {
                "step": fault.step,
                "rank": fault.rank,
                "kind": fault.kind,
                "mechanism": mechanism,
                "phase": phase,
                "layer": fault.layer if fault.kind in DEVICE_KINDS else None,
                "extra_ms": round(fault.extra_ns / MS, 3),
                "saved_ms": round((wall - without.decode_wall_ns) / MS, 3),
                "flags": items,
            }
        )
    intervals = step_intervals(full)
    return {
        "ranks": scenario.shape.ranks,
        "steps": scenario.shape.steps,
        "layers": scenario.shape.layers,
        "seed": scenario.shape.seed,
        "peer": scenario.shape.peer,
        "threshold_ms": THRESHOLD_MS,
        "decode_wall_ms": round(wall / MS, 3),
        "clean_wall_ms": round(clean.decode_wall_ns / MS, 3),
        "total_saved_ms": round((wall - clean.decode_wall_ns) / MS, 3),
        "median_interval_ms": round(float(np.median(intervals)) / MS, 3),
        "threshold_margin_ms": round(threshold_margin_ms(full), 3),
        "faults": faults,
        "nudges": [{"step": s, "rank": r, "held_back_ms": ns / MS} for s, r, ns in scenario.nudges],
        "chains": [
            {"rank": f["rank"], "origin_step": f["step"], "carried": [(i["section"], i["step"]) for i in carried]}
            for f in faults
            if (carried := [i for i in f["flags"] if i["mechanism"] == "carried_over"])
        ],
        "unexplained": [{"section": sec, "step": s, "rank": r} for sec, s, r in sorted(seen - explained, key=lambda i: (i[1], i[0]))],
    }


def threshold_margin_ms(tl: Timeline, threshold_ns: int = int(THRESHOLD_MS * MS)) -> float:
    """How far the figures SPEC's rules compare with the threshold stay from it: the closest call, in ms."""
    intervals = step_intervals(tl)
    compared = (
        intervals - np.median(intervals),
        tl.runner_end.max(axis=1) - tl.runner_end.min(axis=1),
        (tl.runner_ts - tl.runner_ts.min(axis=1, keepdims=True)).ravel(),
    )
    return float(min(np.abs(x - threshold_ns).min() for x in compared)) / MS


def scenario_for(shape: Shape, margin_ms: float = 0.5) -> Scenario:
    """The first plan of faults whose every flag is clear of the threshold by ``margin_ms``: no answer hangs on a rounding."""
    draws = draw(shape)
    for attempt in range(50):
        scenario = Scenario(shape, plan_faults(shape, attempt=attempt), draws=draws)
        if threshold_margin_ms(scenario.run()) >= margin_ms:
            return scenario
    raise ValueError(f"no plan of faults for {shape} stays {margin_ms} ms clear of the threshold")


def write_scenario(scenario: Scenario, outdir: Path) -> dict:
    """server.log and known_answers.json in ``outdir``; returns the answers."""
    outdir.mkdir(parents=True, exist_ok=True)
    answers = known_answers(scenario)
    write_log(scenario, scenario.run(), outdir / "server.log")
    atomic_write_text(outdir / "known_answers.json", json.dumps(answers, indent=1) + "\n")
    return answers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsprof.testing.coupled", description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-peer", action="store_true", help="leave peer= off the all-to-all wait spans")
    parser.add_argument("--chain", action="store_true", help="the carry-over chain scenario (60 steps) instead")
    args = parser.parse_args(argv)
    if args.ranks < 2 or args.layers < 1 or args.steps < 8 * len(KINDS):
        parser.error(f"need --ranks >= 2, --layers >= 1, --steps >= {8 * len(KINDS)}")
    if args.chain:
        scenario = chain_scenario(args.seed, args.ranks)
        scenario.shape = replace(scenario.shape, peer=not args.no_peer)
    else:
        scenario = scenario_for(Shape(args.ranks, args.steps, args.layers, args.seed, not args.no_peer))
    try:
        answers = write_scenario(scenario, args.outdir)
    except OSError as error:
        print(f"error: cannot write to {args.outdir}: {error.strerror or error}", file=sys.stderr)
        return 2
    print(
        f"{args.outdir / 'server.log'}: {len(answers['faults'])} faults, decode wall {answers['decode_wall_ms']} ms, "
        f"saved {answers['total_saved_ms']} ms without them"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
