"""The STRACE text of a simulated coupled decode run, as another producer writes it (SPEC §2, §2.1).

Written by hand from SPEC, not through dsprof's emitter: this producer's own
habits are a ``trace_emit`` log function, its own attribute order, device spans
written at drain time, unrelated scheduler lines and bare warnings between the
records, and every rank's records interleaved in one file in close-time order.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dsprof.fileio import atomic_write_text

if TYPE_CHECKING:
    from dsprof.testing.coupled import Scenario, Timeline

US = 1_000
WALL_AT_T0 = 1_796_000_000_123_456_789  # wall-clock ns: above 2**53, kept an integer
DECODE_HID = "c0ffee5eed71d00d"
_ESCAPE = re.compile(r"[\x00-\x20\x7f\[\]%=]")


def pct(value: object) -> str:
    """Percent-encode control bytes, spaces, brackets, ``%`` and ``=`` (SPEC §2)."""
    return _ESCAPE.sub(lambda m: f"%{ord(m.group()):02X}", str(value))


class Writer:
    """Collects log lines keyed by the host time they were written at."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, int, str]] = []

    def put(self, mono_ns: int, tid: int, text: str, level: str = "INFO", func: str = "trace_emit") -> None:
        self.lines.append((mono_ns, len(self.lines), f"[mono_ns={mono_ns}][T0x{tid:x}][{level}] {func}: {text}"))

    def raw(self, mono_ns: int, text: str) -> None:
        self.lines.append((mono_ns, len(self.lines), text))

    def span(self, pid: int, tid: int, inv: int, hid: str, depth: int, name: str, ts: int, dur: int, attrs: dict, at: int) -> None:
        tail = "".join(f" {pct(k)}={pct(v)}" for k, v in attrs.items())
        head = f"[STRACE] v=1 pid={pid} tid={tid} inv={inv} hid={hid} depth={depth} name={pct(name)} ts={ts} dur={dur}"
        self.put(at, tid, head + tail)

    def text(self) -> str:
        return "".join(line + "\n" for _, _, line in sorted(self.lines))


def evidence(cpu: int, rq: int) -> dict:
    """Host evidence, os.rq_ns first (this producer's order), with the involuntary switches it implies."""
    return {"os.rq_ns": int(rq), "os.cpu_ns": int(cpu), "os.nivcsw": int(rq) // (400 * US), "os.majflt": 0}


def write_log(scenario: Scenario, tl: Timeline, path: Path) -> None:
    """Every rank's runs, collections and device phases, one file, ``path`` replaced atomically."""
    rng = np.random.default_rng([scenario.shape.seed, 41])
    out = Writer()
    evidence_of = HostEvidence(scenario, tl)
    for r in range(scenario.shape.ranks):
        RankLog(out, scenario, tl, evidence_of, r, rng).write()
    _chatter(out, rng)
    atomic_write_text(path, out.text())


class HostEvidence:
    """What the OS saw of each thread per span (ns): the extra of a bind fault is CPU (work or GC), a run-queue fault waits."""

    def __init__(self, scenario: Scenario, tl: Timeline) -> None:
        d, shape = scenario.draws, scenario.shape
        assert d is not None
        self.draws = d
        self.device_rq = d.device_rq.copy()
        self.device_cpu = (d.work.sum(axis=2) + d.verify + d.mtp) * 24 // 25
        for f in scenario.faults:
            if f.kind == "run_queue":
                self.device_rq[f.step, f.rank] += f.extra_ns
            if f.kind == "gc_device":
                self.device_cpu[f.step, f.rank] += f.extra_ns
        self.bind_cpu = (d.bind * 93) // 100 + (tl.bind_end - tl.bind_ts - d.bind)
        self.fence_cpu = 9 * US + d.drain_gap
        self.steps = shape.steps

    def runner(self, s: int, r: int) -> dict:
        """runner_run spans bind(s+1) on its thread: that bind's CPU and waits are in it too."""
        cpu = int(self.fence_cpu[s, r]) + 30 * US + int(self.draws.claim[s, r])
        rq = 3 * US
        if s + 1 < self.steps:
            cpu, rq = cpu + int(self.bind_cpu[s + 1, r]), rq + int(self.draws.bind_rq[s + 1, r])
        return evidence(cpu, rq)


class RankLog:
    """One rank process: its anchor, its ready line, and per step one run's spans and any collection."""

    def __init__(self, out: Writer, scenario: Scenario, tl: Timeline, ev: HostEvidence, rank: int, rng: np.random.Generator) -> None:
        self.out, self.scenario, self.tl, self.ev, self.rank, self.rng = out, scenario, tl, ev, rank, rng
        self.pid = 23_011 + 37 * rank
        self.host, self.executor = self.pid, self.pid + 5
        self.faults = {f.step: f for f in scenario.faults if f.rank == rank and f.kind in ("gc_bind", "gc_device")}
        steps = scenario.shape.steps
        invs = rng.choice(2**62, size=steps + 64, replace=False) + 2**62
        self.invs, self.gc_invs = invs[:steps], iter(invs[steps:])

    def write(self) -> None:
        first = int(self.tl.bind_ts[:, self.rank].min())
        anchor = f"[CLOCK_ANCHOR] v=1 pid={self.pid} mono_ns={first - 3_000 * US} wall_ns={WALL_AT_T0 + first}"
        self.out.put(first - 3_000 * US, self.host, anchor, "TIMING", "clock_anchor")
        self.out.put(first - 2_900 * US, self.host, f"[chip_process pid={self.pid} dev=cpu:{self.rank}] ready", func="chip_boot")
        for s in range(self.scenario.shape.steps):
            self.run(s)
            self.collections(s)

    def span(self, s: int, depth: int, name: str, ts: int, end: int, attrs: dict | None = None, at: int | None = None) -> None:
        inv = int(self.invs[s])
        self.out.span(
            self.pid, self.host, inv, DECODE_HID, depth, name, int(ts), int(end - ts), attrs or {}, int(end if at is None else at)
        )

    def run(self, s: int) -> None:
        """One decode run's spans, each written when it closes; device phases when the drain reads them back."""
        r, d, ev = self.rank, self.ev.draws, self.ev
        t = {k: int(getattr(self.tl, k)[s, r]) for k in _HOST_TIMES}
        prebuilt = int(d.bind[s, r]) * 2 // 5
        self.span(s, 2, "chip.run.bind.args", t["bind_ts"], t["bind_end"] - prebuilt)
        self.span(s, 2, "chip.run.bind.prebuilt", t["bind_end"] - prebuilt, t["bind_end"])
        self.span(s, 1, "chip.run.bind", t["bind_ts"], t["bind_end"], evidence(ev.bind_cpu[s, r], d.bind_rq[s, r]))
        self.span(s, 1, "chip.run.claim_release", t["claim_ts"], t["claim_end"])
        self.span(s, 2, "chip.run.runner_run.native_fence_wait", t["fence_ts"], t["fence_end"], evidence(ev.fence_cpu[s, r], 3 * US))
        self.device_spans(s, t["runner_ts"], t["fence_end"] + 4 * US)
        self.span(s, 1, "chip.run.runner_run", t["runner_ts"], t["runner_end"], ev.runner(s, r))
        validate_cpu = (t["validate_end"] - t["validate_ts"]) * 9 // 10
        self.span(s, 1, "chip.run.validate", t["validate_ts"], t["validate_end"], evidence(validate_cpu, 6 * US))
        identity = {
            "callable": "decode.main+verify+mtp",
            "step": s,
            "rank": r,
            "device": f"cpu:{r}",
            "run_epoch": s + 1,
            "slot_id": s % 2,
            "generation": s // 2,
            "run_id": 9000 + s,
            "dispatch_id": s + 1,
            "worker": f"dp group {r // 4}",
        }
        self.span(s, 0, "chip.run", t["bind_ts"], t["root_end"], identity)

    def device_spans(self, s: int, origin: int, at: int) -> None:
        """The device program's phases: clk=dev, ts from the run's launch; the all-to-all waits name the last arrival."""
        tl, r = self.tl, self.rank

        def dev(depth: int, name: str, start: int, end: int, attrs: dict | None = None) -> None:
            attrs = {**(attrs or {}), "clk": "dev"}
            self.span(s, depth, "chip.run.runner_run.device_wall." + name, int(start) - origin, int(end) - origin, attrs, at=at)

        for layer in range(tl.layer_ts.shape[2]):
            waited = {"peer": int(tl.peer[s, layer])} if self.scenario.shape.peer else {}
            release = int(tl.release[s, layer])
            dev(5, f"forward.layer{layer}.a2a_wait", tl.arrival[s, r, layer], release, waited)
            dev(4, f"forward.layer{layer}", tl.layer_ts[s, r, layer], release)
        dev(3, "forward", tl.program_ts[s, r], tl.forward_end[s, r])
        dev(3, "verify", tl.forward_end[s, r], tl.verify_end[s, r])
        dev(3, "mtp", tl.verify_end[s, r], tl.program_end[s, r])
        device = {**evidence(self.ev.device_cpu[s, r], self.ev.device_rq[s, r]), "clk": "dev"}
        self.span(
            s,
            2,
            "chip.run.runner_run.device_wall",
            int(tl.program_ts[s, r]) - origin,
            int(tl.program_end[s, r]) - origin,
            device,
            at=at + 1,
        )

    def collections(self, s: int) -> None:
        """A small collection inside some validates; the collection of a GC fault where it struck."""
        small = int(self.ev.draws.small_gc[s, self.rank])
        if small:
            self.gc(self.host, int(self.tl.validate_ts[s, self.rank]) + 100 * US, small, 0)
        fault = self.faults.get(s)
        if fault is not None and fault.kind == "gc_bind":
            self.gc(self.host, int(self.tl.bind_ts[s, self.rank]) + 200 * US, fault.extra_ns, 2)
        elif fault is not None:
            self.gc(self.executor, int(self.tl.layer_ts[s, self.rank, fault.layer]) + 300 * US, fault.extra_ns, 2)

    def gc(self, tid: int, ts: int, dur: int, gen: int) -> None:
        """One collection as SPEC §2.1 records it: its own invocation, depth 0, hid 0."""
        collected = int(self.rng.integers(50, 900) if gen == 0 else self.rng.integers(10**5, 10**6))
        self.out.span(self.pid, tid, int(next(self.gc_invs)), "0", 0, "host.gc", ts, dur, {"gen": gen, "collected": collected}, ts + dur)


_HOST_TIMES = (
    "bind_ts",
    "bind_end",
    "runner_ts",
    "claim_ts",
    "claim_end",
    "fence_ts",
    "fence_end",
    "runner_end",
    "validate_ts",
    "validate_end",
    "root_end",
)


def _chatter(out: Writer, rng: np.random.Generator) -> None:
    """Unrelated log text between the records: scheduler lines and bare warnings."""
    times = sorted(t for t, _, _ in out.lines)
    for i in range(0, len(times), 23):
        at = times[i] + 1
        if rng.random() < 0.8:
            out.put(
                at, 0x7F00, f"admitted {int(rng.integers(1, 9))} requests, queue={int(rng.integers(0, 4))} [batch ok]", func="scheduler"
            )
        else:
            out.raw(at, f"W1201 tokenizer.cc:88] slow detokenize took {int(rng.integers(2, 9))} ms")
