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


def burn_cpu(ms: float) -> float:
    """Busy work until this thread has used ``ms`` more milliseconds of CPU (not a sleep); the wall ms it took."""
    started = time.monotonic_ns()
    deadline = time.thread_time_ns() + int(ms * 1e6)
    while time.thread_time_ns() < deadline:
        pass
    return (time.monotonic_ns() - started) / 1e6


def _libc_holding_the_gil():
    """libc's open / read / close called without releasing the GIL (None where ctypes cannot reach them).

    A measurement must not change what it measures: Python's own file calls release
    the GIL, and the host thread would hand it to the CPU executor and wait for it
    back (up to the interpreter's 5 ms switch interval). Reading a proc file does not block.
    """
    try:
        libc = ctypes.PyDLL(None)
        calls = libc.open, libc.read, libc.close
    except (OSError, AttributeError):
        return None
    calls[0].argtypes, calls[0].restype = (ctypes.c_char_p, ctypes.c_int), ctypes.c_int
    calls[1].argtypes, calls[1].restype = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t), ctypes.c_ssize_t
    calls[2].argtypes, calls[2].restype = (ctypes.c_int,), ctypes.c_int
    return calls


_LIBC = _libc_holding_the_gil()


def _run_queue_ns(path: str) -> int:
    """Field 2 (run-queue wait, ns) of a schedstat file; -1 where it cannot be read."""
    try:
        if _LIBC is None:
            with open(path, "rb") as schedstat:
                return int(schedstat.read().split()[1])
        libc_open, libc_read, libc_close = _LIBC
        fd = libc_open(path.encode(), os.O_RDONLY | os.O_CLOEXEC)
        if fd < 0:
            return -1
        buf = ctypes.create_string_buffer(strace.SCHEDSTAT_BYTES)
        size = libc_read(fd, buf, strace.SCHEDSTAT_BYTES)
        libc_close(fd)
        return int(buf.raw[: max(size, 0)].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def thread_run_queue_ns() -> int:
    """How long the calling thread has waited in the run queue so far (schedstat field 2); -1 where there is none.

    The ground truth of cpu_contention is measured with it whether or not the
    profiler's host evidence is on.
    """
    return _run_queue_ns("/proc/thread-self/schedstat")


class ThreadRunQueues:
    """Run-queue wait so far of every thread of this process but one (tid -> ns), from schedstat files kept open.

    A CPU neighbour starves every thread on the rank's CPU: the executor, and the
    collective library's worker threads, which do the exchange while the executor
    blocks in an all-to-all. :meth:`refresh` lists the threads and opens the files
    of new ones (call it where the caller waits anyway: a listing releases the GIL);
    :meth:`read` only reads the open files, holding the GIL (:func:`~dsprof.profiler.strace.read_schedstat`).
    """

    def __init__(self, but: int):
        self.but = but
        self._fds: dict[int, int] = {}
        self._buffer = strace.schedstat_buffer()
        self.refresh()

    def refresh(self) -> None:
        try:
            alive = {int(name) for name in os.listdir("/proc/self/task")} - {self.but}
        except OSError:
            return
        for tid in self._fds.keys() - alive:
            os.close(self._fds.pop(tid))
        for tid in alive - self._fds.keys():
            try:
                self._fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue

    def read(self) -> dict[int, int]:
        found: dict[int, int] = {}
        for tid, fd in self._fds.items():
            try:
                # a failed call is not retried by libc (an interrupted read): Python's pread retries it
                raw = strace.read_schedstat(fd, self._buffer) or os.pread(fd, strace.SCHEDSTAT_BYTES, 0)
                found[tid] = int(raw.split()[1])
            except (OSError, IndexError, ValueError):  # the thread ended since the last refresh
                continue
        return found

    def most_since(self, before: dict[int, int]) -> int:
        """The most run-queue wait any thread read in ``before`` added since (ns); -1 where none can be read."""
        now = self.read()
        return max((now[tid] - rq for tid, rq in before.items() if tid in now), default=-1)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class CpuNeighbour:
    """A helper process pinned to ``cpu`` that burns it for the asked time (the cpu_contention fault).

    It is forked at once, before the rank starts any thread, waits on a pipe,
    and dies with the rank (PR_SET_PDEATHSIG) or when the pipe closes. Where
    the system allows it, it runs SCHED_FIFO, so it takes the CPU from the
    rank's threads the moment it wakes and keeps it for the whole burn — the
    rank loses exactly that time; otherwise it shares the CPU under the normal
    scheduler and the rank loses about the same CPU time over a longer window.
    """

    _COMMAND = struct.Struct("<dq")  # ms to burn, the thread to let fall asleep first (0: none); one atomic pipe write
    _STARTED = struct.Struct("<q")  # the answer: CLOCK_MONOTONIC ns at which the burn started
    # Woken, it waits (polling, at most this long) until the rank's host thread sleeps on
    # the device program's fence: the host thread must not be the one starved.
    SETTLE_MAX_S = 0.02

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
        self._status = status_read  # the start-up answer, then when each burn starts
        answer = os.read(status_read, 1)
        if answer not in (b"R", b"N"):
            self.close()
            raise RuntimeError(f"the CPU neighbour process {pid} failed to start")
        self.realtime = answer == b"R"

    def burn(self, ms: float, after_sleeps: int = 0) -> int:
        """Wake the neighbour to burn ``ms`` of CPU time on the rank's CPU; returns as the burn starts (monotonic ns).

        With ``after_sleeps`` (a thread id of the rank) it starts once that thread sleeps.
        The caller is then woken by the neighbour and waits for the CPU behind it.
        """
        os.write(self._commands, self._COMMAND.pack(ms, after_sleeps))
        started = os.read(self._status, self._STARTED.size)  # its clock: this thread may get the CPU back only after the burn
        if len(started) != self._STARTED.size:
            raise RuntimeError(f"the CPU neighbour process {self.pid} stopped")
        return self._STARTED.unpack(started)[0]

    def close(self) -> None:
        """Let the neighbour end (its pipe closes) and reap it."""
        if self._commands >= 0:
            os.close(self._commands)
            os.close(self._status)
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
        size = CpuNeighbour._COMMAND.size
        while len(data := os.read(commands, size)) == size:
            ms, tid = CpuNeighbour._COMMAND.unpack(data)
            if tid:
                _until_asleep(parent, tid, CpuNeighbour.SETTLE_MAX_S)
            os.write(status, CpuNeighbour._STARTED.pack(time.monotonic_ns()))
            burn_cpu(ms)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _until_asleep(pid: int, tid: int, longest_s: float) -> None:
    """Poll thread ``tid`` of ``pid`` until it sleeps (state S), for at most ``longest_s``."""
    deadline = time.monotonic() + longest_s
    path = f"/proc/{pid}/task/{tid}/stat"
    while time.monotonic() < deadline:
        try:
            with open(path, "rb") as stat:
                if stat.read().rpartition(b")")[2].split()[0] == b"S":
                    return
        except (OSError, IndexError):
            return
        time.sleep(0.0002)


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

    def pause(self, ms: float) -> dict[str, float]:
        """Build and collect about ``ms`` of CPU worth of garbage; what it cost this thread (ms).

        ``loss_ms``: building and collecting, wall time; ``gc_ms``: the collection's
        wall time; ``cpu_ms``: its CPU time.
        """
        started = time.monotonic_ns()
        refs = self._refs(ms)
        took_ns, wall_ns = self._collect_timed(refs)
        self.ns_per_ref = (self.ns_per_ref + took_ns / refs) / 2
        loss_ns = time.monotonic_ns() - started
        return {"loss_ms": round(loss_ns / 1e6, 3), "gc_ms": round(wall_ns / 1e6, 3), "cpu_ms": round(took_ns / 1e6, 3)}

    def _collect(self, refs: int) -> int:
        return self._collect_timed(refs)[0]

    def _collect_timed(self, refs: int) -> tuple[int, int]:
        """Make ``refs`` references of cyclic garbage and collect them; the (CPU ns, wall ns) the collection took."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            _make_cyclic_garbage(refs // self.CHUNK, self.CHUNK)
            # the wall interval encloses the CPU one: wall clock read first, and last
            wall_started = time.monotonic_ns()
            started = time.thread_time_ns()
            gc.collect(0)
            cpu_ns = time.thread_time_ns() - started
            return cpu_ns, time.monotonic_ns() - wall_started
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
