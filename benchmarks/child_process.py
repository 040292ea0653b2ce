"""One way for the benchmarks to time a command: in its own process, with that process's own peak memory.

``wait4`` gives the child's resource usage alone, so the figures do not carry
the benchmark's own memory (``ru_maxrss`` of RUSAGE_CHILDREN would be the
largest child so far). Its ``ru_maxrss`` is still the largest single process
of the child's tree: a command that parses in a pool of worker processes (HTA
does) holds the sum of them at once. ``peak_tree_pss_mib`` is that sum, when
asked for (``tree=True``: the sampling takes CPU from the command timed, a
tenth of a second on a one-second ingest on 2 cores), sampled every 50 ms as the proportional set size (``Pss`` of
``/proc/PID/smaps_rollup``: pages a fork shares are counted once) of the child
and every process below it. Stderr goes to a temporary file, not a pipe, so a
chatty child never blocks on a full pipe.

Before the first command, the product's modules are byte-compiled
(:func:`byte_compile`), as an install from a wheel has them: where
``PYTHONDONTWRITEBYTECODE`` is set (this machine sets it), every child would
otherwise compile every module it imports from its source again, tens of
milliseconds that no installed copy spends.
"""

from __future__ import annotations

import compileall
import functools
import importlib.util
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

SAMPLE_S = 0.05
# the product's packages (pyproject.toml's package-dir maps each onto a folder of its own)
PRODUCT_PACKAGES = ("dsprof", "dsprof.analysis", "dsprof.cli", "dsprof.profiler", "dsprof.runtime")


@dataclass
class ChildRun:
    seconds: float
    cpu_s: float
    peak_rss_mib: float  # the largest single process of the child's tree
    peak_tree_pss_mib: float = 0.0  # the child and its descendants together, sampled


def _descendants(root: int) -> list[int]:
    """``root`` and every live process below it (from each process's parent in /proc/PID/stat)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class _TreeSampler(threading.Thread):
    """The peak of the summed PSS of a process tree, until :meth:`stop`."""

    def __init__(self, root: int):
        super().__init__(daemon=True)
        self.root, self.peak_kib, self._done = root, 0, threading.Event()

    def run(self) -> None:
        while not self._done.wait(SAMPLE_S):
            self.peak_kib = max(self.peak_kib, sum(_pss_kib(pid) for pid in _descendants(self.root)))

    def stop(self) -> float:
        self._done.set()
        self.join()
        return self.peak_kib / 1024


# Starts the command and reports its wall seconds, CPU seconds, peak RSS (KiB) and exit status on stdout. A process
# forked from a large one inherits its resident pages until it execs, and the kernel counts them in the child's
# ``ru_maxrss`` (``/bin/true`` started from a benchmark holding 1.6 GB of generated log measured 1.55 GB): so the
# command is started from this small launcher, never from the benchmark itself.
_LAUNCHER = """
import os, subprocess, sys, time
started = time.perf_counter()
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
print(time.perf_counter() - started, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def byte_compile(*files: Path) -> None:
    """Write the bytecode of ``files`` (e.g. a peer's module, to time it as fairly) and, once, of the product."""
    _byte_compile_product()
    for file in files:
        compileall.compile_file(str(file), quiet=1)


@functools.cache
def _byte_compile_product() -> None:
    for package in PRODUCT_PACKAGES:
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            compileall.compile_dir(folder, quiet=1)


def run_child(command: list[str], env: dict[str, str] | None = None, *, tree: bool = False) -> ChildRun:
    """Run ``command`` to completion (SystemExit with its stderr's tail if it fails) and measure it, started from a
    small launcher (see ``_LAUNCHER``); ``tree``: sample the PSS of its process tree too (the launcher's few MiB in it)."""
    _byte_compile_product()
    with tempfile.TemporaryFile() as stderr:
        launcher = subprocess.Popen(
            [sys.executable, "-S", "-c", _LAUNCHER, *command], env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        sampler = _TreeSampler(launcher.pid) if tree else None
        if sampler is not None:
            sampler.start()
        report, _ = launcher.communicate()
        tree_pss = sampler.stop() if sampler is not None else 0.0
        fields = report.split()
        returncode = int(fields[3]) if len(fields) == 4 else launcher.returncode
        if returncode != 0:
            stderr.seek(0)
            tail = stderr.read().decode(errors="replace").strip()[-2000:]
            raise SystemExit(f"{' '.join(command)} failed ({returncode}): {tail}")
    seconds, cpu_s, peak_kib = float(fields[0]), float(fields[1]), int(fields[2])
    return ChildRun(seconds, cpu_s, peak_kib / 1024, tree_pss)
