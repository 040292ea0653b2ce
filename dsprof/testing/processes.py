"""Processes as ``/proc`` shows them, for the tests that check that nothing outlives a command."""

from __future__ import annotations

import time
from pathlib import Path


def is_running(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (dead, waiting to be reaped) does not."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def ends_within(pid: int, bound_s: float) -> bool:
    """Whether ``pid`` stops running within ``bound_s`` seconds (a process SIGKILLed takes a moment to end)."""
    deadline = time.monotonic() + bound_s
    while is_running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not is_running(pid)
