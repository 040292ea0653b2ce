"""Process plumbing of the rank processes and their helpers: dying with the parent, CPU pinning, SIGTERM.

A rank (and a helper a rank forks) must never outlive the process that
started it: ``PR_SET_PDEATHSIG`` makes the kernel kill it when its parent
dies, however the parent died (SIGKILL included), and the launcher also puts
every rank in one process group it can signal as a whole.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Any

_PR_SET_PDEATHSIG = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that it is handled exactly like Ctrl-C (SIGINT)."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def _raise_terminated(signum: int, _frame) -> None:
    raise Terminated(signum)


def raise_on_sigterm() -> Any:
    """Make SIGTERM raise :class:`Terminated` in the main thread; returns the previous handler."""
    return signal.signal(signal.SIGTERM, _raise_terminated)


def signal_of(interrupt: KeyboardInterrupt) -> signal.Signals:
    """The signal behind an interrupt: SIGTERM for :class:`Terminated`, else SIGINT (Ctrl-C)."""
    return signal.Signals(interrupt.signum if isinstance(interrupt, Terminated) else signal.SIGINT)


def exit_status_of(interrupt: KeyboardInterrupt) -> int:
    """The shell's exit status for a run stopped by a signal: 128 + the signal number."""
    return 128 + signal_of(interrupt)


def die_with_parent(expected_parent: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies; exit now if it already has.

    Linux only (elsewhere the process group is the only safety net). The parent
    is the thread that forked this process, so forks come from the thread that
    outlives them (the launcher's main thread).
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != expected_parent:  # the parent died before the death signal was armed
        os._exit(1)


def cpu_for_rank(rank: int) -> int:
    """The CPU a pinned rank runs on: rank modulo the CPUs this process may use, in order."""
    allowed = sorted(os.sched_getaffinity(0))
    return allowed[rank % len(allowed)]


def pin_to_cpu(cpu: int) -> None:
    """Pin every thread of this process to ``cpu``; threads started later inherit it."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except ProcessLookupError:  # the thread ended meanwhile
            pass
