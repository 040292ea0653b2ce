"""One way for the benchmarks to time a command: in its own process, with that process's own peak memory.

``wait4`` gives the child's resource usage alone, so the figures do not carry
the benchmark's own memory (``ru_maxrss`` of RUSAGE_CHILDREN would be the
largest child so far). Stderr goes to a temporary file, not a pipe, so a
chatty child never blocks on a full pipe.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass


@dataclass
class ChildRun:
    seconds: float
    cpu_s: float
    peak_rss_mib: float


def run_child(command: list[str], env: dict[str, str] | None = None) -> ChildRun:
    """Run ``command`` to completion (SystemExit with its stderr's tail if it fails) and measure it."""
    with tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            stderr.seek(0)
            tail = stderr.read().decode(errors="replace").strip()[-2000:]
            raise SystemExit(f"{' '.join(command)} failed ({child.returncode}): {tail}")
    return ChildRun(seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)
