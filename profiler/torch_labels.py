"""The ``record_function`` labels a torch.profiler (Kineto) trace carries, as the runtime writes them and the reader reads them.

A step is the span ``ProfilerStep#N`` (torch.profiler's own convention; N the
producer's step number). The bundled runtime also labels each phase of a run
with its STRACE span name (:mod:`.strace_format`: ``chip.run.bind``,
``chip.run.runner_run``, ``chip.run.runner_run.device_wall.forward.a2a_wait``,
...), and the device program of a measured step with
``chip.run.runner_run.device_wall#N``: the step's runs overlap on the host
thread (depth 2), so what the device thread ran for step N is named by its
number, not found by time (docs/FORMATS.md "Kineto traces").
"""

from __future__ import annotations

from dsprof.profiler import strace_format as fmt

PROFILER_STEP = "ProfilerStep"
STEP_MARK = "#"
STEP_PREFIX = PROFILER_STEP + STEP_MARK
# the label of a measured step's device program
PROGRAM = fmt.DEVICE_WALL


def step_label(name: str, step: int) -> str:
    """``name#step``: a label that names the step it belongs to (``ProfilerStep#3``)."""
    return f"{name}{STEP_MARK}{step}"


def step_label_regex(name: str) -> str:
    """A regular expression matching ``name#N`` whose group 1 is N (a literal name: dots escaped)."""
    return "^" + name.replace(".", r"\.") + STEP_MARK + "([0-9]+)$"
