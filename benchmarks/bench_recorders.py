"""Cost per span of the two recorders, enabled and disabled (µs).

Targets on the development machine: STRACE emit ≤ 3 µs per span enabled and
≤ 0.2 µs disabled. Run: ``python benchmarks/bench_recorders.py [--spans N]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from dsprof.profiler import sa_profile, strace

STRACE_ENABLED_TARGET_US = 3.0
STRACE_DISABLED_TARGET_US = 0.2


def us_per_span(body, spans: int) -> float:
    start = time.perf_counter_ns()
    body(spans)
    return (time.perf_counter_ns() - start) / spans / 1000


def strace_spans(n: int) -> None:
    span = strace.span
    for i in range(n):
        with span("chip.run.bind", inv=1234567890123, hid="9f3ab2", step=i):
            pass


def strace_records(n: int) -> None:
    record = strace.record
    for i in range(n):
        record("chip.run.runner_run.device_wall", inv=1234567890123, hid="9f3ab2", depth=2, ts_ns=i, dur_ns=100, clk="dev")


def sa_spans(n: int) -> None:
    span = sa_profile.span
    for i in range(n):
        with span("worker.execute_model", "worker", step=i):
            pass


def _call_floor(name: str, *, inv: int, hid: str, **attrs):
    """A function with span()'s signature that does nothing but return the no-op span."""
    return strace.NOOP_SPAN


def call_floor(n: int) -> None:
    """The interpreter's floor for a disabled span: the same call and with-block, no checks."""
    span = _call_floor
    for i in range(n):
        with span("chip.run.bind", inv=1234567890123, hid="9f3ab2", step=i):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spans", type=int, default=20_000, help="spans per timed run")
    parser.add_argument("--rounds", type=int, default=9, help="round-robin rounds; the best run of each case is kept")
    args = parser.parse_args()
    devnull = os.open(os.devnull, os.O_WRONLY)
    with tempfile.TemporaryDirectory() as tmp:
        log_fd = os.open(os.path.join(tmp, "server.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        # (label, setup, body, target µs): cases run round-robin so that load from
        # other processes on a shared machine hits every case alike.
        cases = [
            ("floor: same call + with on a no-op", strace.disable, call_floor, None),
            ("strace span, disabled", strace.disable, strace_spans, STRACE_DISABLED_TARGET_US),
            ("strace record, disabled", strace.disable, strace_records, STRACE_DISABLED_TARGET_US),
            ("strace span, enabled -> /dev/null", lambda: strace.enable(devnull), strace_spans, STRACE_ENABLED_TARGET_US),
            ("strace record, enabled -> /dev/null", lambda: strace.enable(devnull), strace_records, STRACE_ENABLED_TARGET_US),
            ("strace span, enabled -> file", lambda: strace.enable(log_fd), strace_spans, STRACE_ENABLED_TARGET_US),
            ("sa_profile span, disabled", lambda: sa_profile.configure(None), sa_spans, None),
            ("sa_profile span, enabled -> fragment", lambda: sa_profile.configure(tmp, "e2e"), sa_spans, None),
        ]
        best = [float("inf")] * len(cases)
        for _ in range(args.rounds):
            for index, (_, setup, body, _) in enumerate(cases):
                setup()
                best[index] = min(best[index], us_per_span(body, args.spans))
        strace.disable()
        sa_profile.shutdown()
        os.close(log_fd)
    os.close(devnull)

    print(f"µs per span, best of {args.rounds} round-robin runs of {args.spans} spans (loop overhead included)")
    for (label, _, _, target), us in zip(cases, best):
        verdict = "" if target is None else f"  target ≤ {target:g} µs: {'ok' if us <= target else 'MISSED'}"
        print(f"{label:40s} {us:7.3f}{verdict}")


if __name__ == "__main__":
    main()
