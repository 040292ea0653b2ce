"""``dsprof watch --on-alert CMD``: each alert starts CMD without waiting for it (docs/WATCH.md "Alert hooks").

Each hook runs in a shell of its own process group (``start_new_session``), so
that the watch can stop it with whatever it started. The alert line reaches it
only through the environment (``$DSPROF_ALERT``), never through the command
line, so no log content is ever parsed by the shell. At most
:data:`MAX_RUNNING_HOOKS` run at once: an alert that comes while that many
still run is counted and its hook skipped, so slow hooks cannot pile up.
When the watch ends, the hooks still running get :data:`HOOK_GRACE_S` to
finish (on Ctrl-C or SIGTERM, none: the signal's handler sends SIGTERM to them at
once, even while a refresh is under way), then SIGTERM to their process group, then
SIGKILL after the same grace, and are waited for: nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

ALERT_ENV = "DSPROF_ALERT"
MAX_RUNNING_HOOKS = 2
HOOK_GRACE_S = 1.0  # for a hook to end on its own, then after SIGTERM before SIGKILL
STDERR_FD = 2


class AlertHooks:
    """The hooks started by alerts: at most ``limit`` running, the skipped ones counted, all stopped by :meth:`stop`."""

    def __init__(self, command: str, limit: int = MAX_RUNNING_HOOKS):
        self.command, self.limit = command, limit
        self.running: list[subprocess.Popen] = []
        self.skipped: list[str] = []  # the alert lines whose hook was not started

    def start(self, line: str) -> str | None:
        """Start the hook for the alert ``line``; a note to print when it was skipped instead."""
        self.running = [hook for hook in self.running if hook.poll() is None]
        if len(self.running) >= self.limit:
            self.skipped.append(line)
            return f"alert hook skipped ({len(self.skipped)} so far): {len(self.running)} still running, at most {self.limit} at once"
        self.running.append(
            subprocess.Popen(
                self.command,
                shell=True,
                env={**os.environ, ALERT_ENV: line},
                stdin=subprocess.DEVNULL,
                stdout=STDERR_FD,  # the hook's printout goes to stderr: never inside the watch's own lines (stdout)
                start_new_session=True,
            )
        )
        return None

    def stop(self, *, stopped: bool) -> None:
        """End every hook still running and wait for it; ``stopped`` (Ctrl-C, SIGTERM): without the first grace."""
        if not stopped:
            _wait_all(self.running, HOOK_GRACE_S)
        for signum in (signal.SIGTERM, signal.SIGKILL):
            running = [hook for hook in self.running if hook.poll() is None]
            _signal_groups(running, signum)
            _wait_all(running, HOOK_GRACE_S)
        self.running = []

    def terminate(self) -> None:
        """SIGTERM to every hook still running, without waiting (safe in a signal handler: nothing is reaped here)."""
        _signal_groups([hook for hook in self.running if hook.returncode is None], signal.SIGTERM)


def _signal_groups(hooks: list[subprocess.Popen], signum: int) -> None:
    """Send ``signum`` to each hook's process group (its shell is not reaped yet: the group id is still its own)."""
    for hook in hooks:
        with contextlib.suppress(ProcessLookupError):  # its group ended meanwhile
            os.killpg(hook.pid, signum)


def _wait_all(hooks: list[subprocess.Popen], grace_s: float) -> None:
    """Wait for ``hooks`` to end, ``grace_s`` seconds in all."""
    deadline = time.monotonic() + grace_s
    for hook in hooks:
        with contextlib.suppress(subprocess.TimeoutExpired):
            hook.wait(max(0.0, deadline - time.monotonic()))
