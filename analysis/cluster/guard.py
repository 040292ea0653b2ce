"""A local Ray cluster dies with the dsprof process that started it, however that process ends.

Ray ties its own daemons to the driver (``PR_SET_PDEATHSIG``), but the workers
they start are grandchildren of the driver that notice its death only when a
heartbeat times out, up to a minute later; a SIGKILLed driver also leaves
Ray's session directory behind. So before the cluster starts, the driver
starts this guard: a small process in a session of its own (a Ctrl-C to the
terminal's process group does not reach it) that reads a pipe whose only
writer is the driver. The kernel closes that pipe however the driver ends
(exit, exception, SIGKILL); the guard then kills every process whose
environment carries the run's marker (set in the driver's environment before
the cluster starts, so every Ray process inherits it) or that it saw below
the driver while it lived, and removes the run's scratch directories.

    python -m dsprof.analysis.cluster.guard TOKEN DRIVER_PID [DIR...]
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

MARKER = "DSPROF_RAY_RUN"  # environment variable every process of one run's local cluster inherits
# Passes over /proc: a process being started while one pass reads may show up only in the next.
_PASSES = 3
_GUARD_WAIT_S = 30.0
_WATCH_INTERVAL_S = 0.5  # how often the guard notes the driver's descendants


@contextlib.contextmanager
def guarded_local_cluster(scratch: Sequence[Path] = ()) -> Iterator[None]:
    """Within the block, processes started inherit a marker; after it (or the driver's death) the guard kills them and removes ``scratch``."""
    token = secrets.token_hex(16)
    environment = {key: value for key, value in os.environ.items() if key != MARKER}
    guard = subprocess.Popen(
        [sys.executable, "-m", __name__, token, str(os.getpid()), *map(str, scratch)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=environment,
    )
    previous = os.environ.get(MARKER)
    os.environ[MARKER] = token
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(MARKER, None)
        else:
            os.environ[MARKER] = previous
        assert guard.stdin is not None
        guard.stdin.close()  # what the driver's death does too
        with contextlib.suppress(subprocess.TimeoutExpired):
            guard.wait(timeout=_GUARD_WAIT_S)


def _carries(pid: int, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone meanwhile, or not ours to read
        return False


def kill_marked(token: str, spare: set[int]) -> int:
    """SIGKILL every process (but ``spare``) whose environment holds ``MARKER=token``; how many were found in the last pass."""
    needle = f"{MARKER}={token}".encode()
    found = 0
    for _ in range(_PASSES):
        found = 0
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) not in spare and _carries(int(entry.name), needle):
                with contextlib.suppress(OSError):
                    os.kill(int(entry.name), signal.SIGKILL)
                    found += 1
        if not found:
            break
    return found


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every live process (``/proc/PID/stat``; the name may hold spaces)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(entry.name)] = (int(fields[1]), fields[19])
    return table


def descendants(root: int, table: dict[int, tuple[int, str]]) -> dict[int, str]:
    """pid -> start time of every process below ``root``."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, stack = {}, list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found[pid] = table[pid][1]
        stack += children.get(pid, [])
    return found


def cluster_processes(driver: int, token: str) -> dict[int, str]:
    """pid -> start time of the driver's descendants that carry the marker, and of everything below them.

    Ray renames some of its processes (the per-node agents) over their own
    environment, so the marker alone misses them; they are below a marked
    process (the raylet). A process the driver's program started for itself
    carries no marker and is left alone.
    """
    needle = f"{MARKER}={token}".encode()
    table = _processes()
    found: dict[int, str] = {}
    for pid in descendants(driver, table):
        if pid not in found and _carries(pid, needle):
            found[pid] = table[pid][1]
            found.update(descendants(pid, table))
    return found


def watch(driver: int, token: str) -> None:
    """Until the pipe from ``driver`` ends, note the cluster's processes; then kill them and whatever else carries the marker."""
    seen: dict[int, str] = {}
    while not select.select([sys.stdin.buffer], [], [], _WATCH_INTERVAL_S)[0]:
        seen.update(cluster_processes(driver, token))
    sys.stdin.buffer.read()  # EOF (or what the driver wrote): it is done or gone
    seen.update(cluster_processes(driver, token))
    table = _processes()
    for pid, started in seen.items():
        if pid != os.getpid() and table.get(pid, (0, ""))[1] == started:  # the same start time: not a reused pid
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    kill_marked(token, spare={os.getpid(), driver})


def main(arguments: Sequence[str]) -> None:
    token, driver, *scratch = arguments
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the guard outlives whatever stops the driver
    watch(int(driver), token)
    for directory in scratch:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
