"""The real mechanisms behind injected faults (runtime/faults.py says when and where).

* :func:`burn_cpu` — busy work on the calling thread until it has used the
  given CPU time (slow_bind on the host thread, straggler on the executor).
* :class:`CpuNeighbour` — a process forked at start-up, pinned to the rank's
  CPU, that burns that CPU when asked (cpu_contention): the rank's threads
  really wait in the run queue.
* :class:`GcPause` — real cyclic garbage, sized by a calibration on this
  machine, collected by a real ``gc.collect`` (gc_pause).
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import statistics
import struct
import time

from dsprof.profiler import strace
from dsprof.runtime.processes import die_with_parent


def burn_cpu(ms: float) -> None:
    """Busy work until this thread has used ``ms`` more milliseconds of CPU (not a sleep)."""
    deadline = time.thread_time_ns() + int(ms * 1e6)
    while time.thread_time_ns() < deadline:
        pass


class CpuNeighbour:
    """A helper process pinned to ``cpu`` that burns it for the asked time (the cpu_contention fault).

    It is forked at once, before the rank starts any thread, waits on a pipe,
    and dies with the rank (PR_SET_PDEATHSIG) or when the pipe closes. Where
    the system allows it, it runs SCHED_FIFO, so it takes the CPU from the
    rank's threads the moment it wakes and keeps it for the whole burn — the
    rank loses exactly that time; otherwise it shares the CPU under the normal
    scheduler and the rank loses about the same CPU time over a longer window.
    """

    _COMMAND = struct.Struct("<d")  # ms to burn; one atomic pipe write

    def __init__(self, cpu: int):
        commands_read, commands_write = os.pipe()
        status_read, status_write = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(commands_write)
            os.close(status_read)
            _neighbour_main(commands_read, status_write, parent, cpu)
        os.close(commands_read)
        os.close(status_write)
        self.pid = pid
        self._commands = commands_write
        with os.fdopen(status_read, "rb") as status:
            answer = status.read(1)
        if answer not in (b"R", b"N"):
            self.close()
            raise RuntimeError(f"the CPU neighbour process {pid} failed to start")
        self.realtime = answer == b"R"

    def burn(self, ms: float) -> None:
        """Wake the neighbour to burn ``ms`` of CPU time on the rank's CPU (returns at once)."""
        os.write(self._commands, self._COMMAND.pack(ms))

    def close(self) -> None:
        """Let the neighbour end (its pipe closes) and reap it."""
        if self._commands >= 0:
            os.close(self._commands)
            self._commands = -1
            os.waitpid(self.pid, 0)


def _neighbour_main(commands: int, status: int, parent: int, cpu: int) -> None:
    """Body of the neighbour process; never returns."""
    code = 0
    try:
        die_with_parent(parent)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the rank's handler
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        strace.disable()  # nothing of it goes to the rank's log, host.gc records included
        gc.disable()
        os.sched_setaffinity(0, {cpu})
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
            realtime = True
        except (OSError, AttributeError):
            realtime = False
        os.write(status, b"R" if realtime else b"N")
        os.close(status)
        size = CpuNeighbour._COMMAND.size
        while len(data := os.read(commands, size)) == size:
            burn_cpu(CpuNeighbour._COMMAND.unpack(data)[0])
    except BaseException:
        code = 1
    finally:
        os._exit(code)


class GcPause:
    """Garbage collections of a chosen length, made of real cyclic garbage.

    The garbage is lists of ``CHUNK`` references to one shared list, in one
    reference cycle: a C-level repeat builds each list, while the collector
    visits every reference several times. It is built with automatic
    collection off and collected with ``gc.collect(0)``: it is then the young
    generation, and the pause is set by its size, not by the rest of the heap
    (a full collection of a torch process costs ~100 ms by itself).

    Building it is dominated by the first touch of fresh memory, so glibc is
    asked to keep freed heap memory (``M_TRIM_THRESHOLD``) and the calibration
    ends with a pause as long as the longest one planned: later pauses reuse
    those pages, and building then costs ~1/20 of collecting. The calibration
    measures the collector's CPU time per reference on this machine (CPU time,
    not wall time: it does not move with the load of a shared machine); each
    pause refines it. On an idle CPU a pause lasts its CPU time; where the
    thread has to wait for a CPU it lasts longer, and its host evidence shows
    the wait as ``os.rq_ns``.
    """

    CHUNK = 10_000  # 80 KB per list: heap memory, below glibc's mmap threshold
    _CALIBRATION_REFS = 300_000
    _CALIBRATION_RUNS = 3
    _KEEP_FREED_HEAP_BYTES = 1 << 30

    def __init__(self, longest_ms: float):
        _keep_freed_heap(self._KEEP_FREED_HEAP_BYTES)
        self.ns_per_ref = statistics.median(
            self._collect(self._CALIBRATION_REFS) / self._CALIBRATION_REFS for _ in range(self._CALIBRATION_RUNS)
        )
        refs = self._refs(longest_ms)  # the rate at the planned size counts (caches), and its pages stay mapped
        self.ns_per_ref = self._collect(refs) / refs

    def _refs(self, ms: float) -> int:
        return max(1, round(ms * 1e6 / self.ns_per_ref / self.CHUNK)) * self.CHUNK

    def pause(self, ms: float) -> float:
        """Build and collect about ``ms`` of CPU worth of garbage; returns the collection's CPU time (ms)."""
        refs = self._refs(ms)
        took_ns = self._collect(refs)
        self.ns_per_ref = (self.ns_per_ref + took_ns / refs) / 2
        return took_ns / 1e6

    def _collect(self, refs: int) -> int:
        """Make ``refs`` references of cyclic garbage and collect them; the CPU ns the collection took."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            _make_cyclic_garbage(refs // self.CHUNK, self.CHUNK)
            started = time.thread_time_ns()
            gc.collect(0)
            return time.thread_time_ns() - started
        finally:
            if enabled:
                gc.enable()


def _make_cyclic_garbage(lists: int, chunk: int) -> None:
    """Lists that only the collector can free: once this returns, nothing outside the cycle holds them."""
    shared: list = []
    garbage = [[shared] * chunk for _ in range(lists)]
    garbage.append(garbage)


def _keep_freed_heap(max_bytes: int) -> None:
    """Ask glibc not to return freed heap memory to the OS below ``max_bytes`` (a no-op elsewhere)."""
    m_trim_threshold = -1
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(m_trim_threshold, max_bytes)
