"""A rank whose own threads could not run holds a step without arriving late (SPEC §2.1, §3; docs/FIGURES.md "Slow steps").

Two ways the runtime's CPU-contention fault showed up on the 2-core CI
machine, each rebuilt here on a coupled-loop log (an independent producer) by
editing the last step of one rank, so that nothing after it moves:

* the rank stays in its last all-to-all after every other rank has left it
  (the collective library's threads were starved), its wait carrying the
  device threads' run-queue wait as ``os.rq_ns``;
* the rank's host thread is held up in validate, which delays the step's
  token but not the run's end.

The answer is what was written in: the rank, the mechanism, and how much.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.ingest import read_paths
from dsprof.testing.coupled import Scenario, Shape, write_scenario

SHAPE = Shape(ranks=4, steps=40, layers=2, seed=21, peer=True)
RANK = 1
HELD_NS = 30_000_000  # what the edit adds: well above the step's interval of ~10 ms
WAIT = "chip.run.runner_run.device_wall.forward.layer1.a2a_wait"


def _field(line: str, key: str) -> int:
    return int(re.search(rf" {re.escape(key)}=(-?\d+)", line).group(1))


def _set(line: str, key: str, value: int) -> str:
    if f" {key}=" in line:
        return re.sub(rf" {re.escape(key)}=-?\d+", f" {key}={value}", line)
    return line.replace(" clk=", f" {key}={value} clk=") if " clk=" in line else f"{line} {key}={value}"


class LastStep:
    """The STRACE lines of one rank's last decode run, to be edited in place."""

    def __init__(self, log: Path, rank: int) -> None:
        self.log, self.lines = log, log.read_text().splitlines()
        root = max(
            (i for i, line in enumerate(self.lines) if " name=chip.run " in line and f" rank={rank} " in line),
            key=lambda i: _field(self.lines[i], "step"),
        )
        self.step = _field(self.lines[root], "step")
        pid, inv = (re.search(rf" {key}=(\S+)", self.lines[root]).group(1) for key in ("pid", "inv"))
        self.rows = [i for i, line in enumerate(self.lines) if f" pid={pid} " in line and f" inv={inv} " in line and "[STRACE]" in line]

    def name(self, i: int) -> str:
        return re.search(r" name=(\S+)", self.lines[i]).group(1)

    def longer(self, name: str, by_ns: int, **attrs: int) -> None:
        """The span named ``name`` lasts ``by_ns`` longer and carries ``attrs`` (its evidence)."""
        for i in self.rows:
            if self.name(i) == name:
                self.lines[i] = _set(self.lines[i], "dur", _field(self.lines[i], "dur") + by_ns)
                for key, value in attrs.items():
                    self.lines[i] = _set(self.lines[i], key, value)

    def later(self, name: str, by_ns: int) -> None:
        for i in self.rows:
            if self.name(i) == name:
                self.lines[i] = _set(self.lines[i], "ts", _field(self.lines[i], "ts") + by_ns)

    def write(self) -> None:
        self.log.write_text("\n".join(self.lines) + "\n")


@pytest.fixture
def last_step(tmp_path) -> LastStep:
    write_scenario(Scenario(SHAPE, faults=[]), tmp_path)  # no fault of its own: the edit is the only one
    return LastStep(tmp_path / "server.log", RANK)


def _summary(log: Path) -> dict:
    return analyze_trace(read_paths([log]), threshold_ms=5.0).summary


def _slow_step(log: Path, step: int) -> dict:
    (item,) = [i for i in _summary(log)["slow_steps"]["items"] if i["step"] == step]
    return item


def _stall_in_last_collective(steps: LastStep, **evidence: int) -> None:
    """The rank leaves its last all-to-all HELD_NS after the others: everything after it on the rank moves with it."""
    device_after = ("chip.run.runner_run.device_wall.verify", "chip.run.runner_run.device_wall.mtp")
    for name in (WAIT, "chip.run.runner_run.device_wall.forward.layer1", "chip.run.runner_run.device_wall.forward"):
        steps.longer(name, HELD_NS, **(evidence if name == WAIT else {}))
    for name in device_after:
        steps.later(name, HELD_NS)
    for name in ("chip.run.runner_run.device_wall", "chip.run.runner_run.native_fence_wait", "chip.run.runner_run", "chip.run"):
        steps.longer(name, HELD_NS)
    steps.later("chip.run.validate", HELD_NS)  # claim_release came before the fence wait: it stays
    steps.write()


def test_a_collective_whose_own_threads_waited_for_a_cpu_names_its_rank_and_run_queue(last_step):
    _stall_in_last_collective(last_step, **{"os.rq_ns": HELD_NS})
    item = _slow_step(last_step.log, last_step.step)
    assert (item["rank"], item["role"], item["mechanism"]) == (RANK, "culprit", "run_queue"), item
    assert item["evidence_ms"] == pytest.approx(HELD_NS / 1e6, rel=0.05)
    assert "collectives" in item["detail"]


def test_the_what_if_saving_of_such_a_stall_is_what_the_log_without_it_takes(last_step):
    """The replay takes the stall out of the rank's exit from the collective; the unedited log is the A/B answer."""
    clean = _summary(last_step.log)["what_if"]["decode_wall_ms"]
    _stall_in_last_collective(last_step, **{"os.rq_ns": HELD_NS})
    what_if = _summary(last_step.log)["what_if"]
    (saved,) = [i["saved_ms"] for i in what_if["items"] if (i["step"], i["rank"]) == (last_step.step, RANK)]
    measured = what_if["decode_wall_ms"] - clean
    assert measured == pytest.approx(HELD_NS / 1e6, rel=0.01)
    assert saved == pytest.approx(measured, rel=0.02)


def test_the_same_stall_without_run_queue_evidence_is_not_called_contention(last_step):
    _stall_in_last_collective(last_step)
    item = _slow_step(last_step.log, last_step.step)
    assert item["rank"] == RANK and item["mechanism"] != "run_queue", item


@pytest.mark.parametrize(("evidence", "mechanism"), [("os.rq_ns", "run_queue"), ("os.cpu_ns", "host_cpu")])
def test_a_token_held_up_in_validate_names_the_validate_and_why(last_step, evidence, mechanism):
    validate = next(i for i in last_step.rows if last_step.name(i) == "chip.run.validate")
    before = _field(last_step.lines[validate], evidence)
    last_step.longer("chip.run.validate", HELD_NS, **{evidence: before + HELD_NS})
    last_step.longer("chip.run", HELD_NS)
    last_step.write()
    item = _slow_step(last_step.log, last_step.step)
    assert (item["rank"], item["phase"], item["mechanism"]) == (RANK, "validate", mechanism), item
    assert item["evidence_ms"] == pytest.approx(HELD_NS / 1e6, rel=0.1)
