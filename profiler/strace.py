"""STRACE emitter (docs/FORMATS.md, "STRACE"): host-span records written to the process log.

A record is written once, when its span closes, with a single ``os.write`` of
at most PIPE_BUF bytes, so forked ranks sharing one stderr never interleave
inside a record. The hot path assembles the text of :mod:`.strace_format` from
per-thread precomputed pieces (tests check it against the format functions).
The state of the process's emitter is one :class:`Tracer`, :data:`TRACER`; the
module's functions are its methods. Switched on by :func:`enable` or
``DSPROF_STRACE=1`` at import. While off, a call still costs the call (Python
builds ``**attrs``), so hot loops test the flag first:
``strace.span(...) if strace.TRACER.enabled else strace.NOOP_SPAN``.
Host evidence and GC spans: docs/RUNTIME.md, "Artifacts and profiling".
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from dsprof.profiler.strace_format import (
    CLK_ATTR,
    CLK_HOST,
    GC,
    GC_COLLECTED_ATTR,
    GC_GEN_ATTR,
    GC_HID,
    MAX_VALUE_CHARS,
    OS_CPU_NS,
    OS_MAJFLT,
    OS_NIVCSW,
    OS_RQ_NS,
    PIPE_BUF,
    STRACE_VERSION,
    encode_value,
    fit_record,
    format_anchor_record,
    format_chip_ready_payload,
    format_prefix,
)

try:
    import resource
except ImportError:  # not a POSIX system: CPU time from the thread clock only
    resource = None  # type: ignore[assignment]

LOG_LEVEL = "INFO"
# The "<func>" part of the log prefix for spans and chip_process lines (anchors use strace_format's).
SPAN_FUNC = "strace_span"
READY_FUNC = "chip_process"
HOST_EVIDENCE_ENV = "DSPROF_HOST_EVIDENCE"
SCHEDSTAT_PATH = "/proc/thread-self/schedstat"
# What a host sample holds: (cpu ns, run-queue ns, involuntary switches, major faults); -1 = not available.
Sample = tuple[int, int, int, int]

_UINT64_MASK = (1 << 64) - 1
# Short strings seen as names/hids/values, mapped to their encoding, and
# attribute keys mapped to " <key>="; both bounded so arbitrary attributes
# cannot grow them without limit.
_ENCODED_CACHE_MAX = 4096
_ENCODED_CACHE_MAX_LEN = 64
SCHEDSTAT_BYTES = 128  # "<cpu ns> <run-queue ns> <timeslices>\n" fits with room to spare
_monotonic_ns = time.monotonic_ns
_os_write = os.write
_thread_time_ns = time.thread_time_ns
_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)
_getrusage = resource.getrusage if resource is not None else None


def schedstat_buffer() -> Any:
    """A buffer for :func:`read_schedstat` (one per reading thread)."""
    return ctypes.create_string_buffer(SCHEDSTAT_BYTES + 1)  # + the NUL that ends a read


class _ThreadState:
    """This thread's span nesting depth, the precomputed start of its records and its schedstat file."""

    __slots__ = ("depth", "gc_start", "head", "prefix_tail", "schedstat_buf", "schedstat_fd", "tid")

    def __init__(self) -> None:
        self.depth = 0
        # prefix tail after ``mono_ns`` and the STRACE payload up to ``inv=``; built on first record
        self.head: str | None = None
        self.prefix_tail = ""
        self.tid = 0
        # this thread's /proc/thread-self/schedstat: None = not opened yet, -1 = not available
        self.schedstat_fd: int | None = None
        self.schedstat_buf = schedstat_buffer()
        # (ns, sample) when this thread's running garbage collection started
        self.gc_start: tuple[int, Sample | None] | None = None

    def close_schedstat(self) -> None:
        """Close this thread's schedstat file (the thread ended, or a fork left the copy of another thread's)."""
        fd, self.schedstat_fd = self.schedstat_fd, None
        if fd is not None and fd >= 0:
            os.close(fd)

    def __del__(self) -> None:  # the thread ended: its threading.local state goes, and its file with it
        self.close_schedstat()


class _PerThread(threading.local):
    """Holds one _ThreadState per thread: a span reads threading.local once and keeps the state."""

    def __init__(self) -> None:
        self.state = _ThreadState()


# -- host evidence ------------------------------------------------------------------------


def _pread_holding_the_gil() -> Callable[[int, Any, int, int], int] | None:
    """libc's pread called without releasing the GIL, or None where ctypes cannot reach it.

    ``os.pread`` releases the GIL for the system call. A sample would then hand
    the GIL to another thread of the process (the CPU executor) and wait for it
    back, up to the interpreter's switch interval (5 ms): sampling would change
    the timing it measures and leave blocked time in the span that is neither
    CPU nor run-queue time. Reading a proc file of one's own thread does not
    block, so holding the GIL through it is safe.
    """
    try:
        pread = ctypes.PyDLL(None).pread
    except (OSError, AttributeError):
        return None
    pread.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long)
    pread.restype = ctypes.c_ssize_t
    return pread


_pread = _pread_holding_the_gil()
_string_at = ctypes.string_at


def read_schedstat(fd: int, buf: Any) -> bytes:
    """The text of an open schedstat file, read into ``buf`` without letting another thread run (b"" if the read failed)."""
    if _pread is None:
        return os.pread(fd, SCHEDSTAT_BYTES, 0)
    return _string_at(buf, max(0, _pread(fd, buf, SCHEDSTAT_BYTES, 0)))


def _open_schedstat(state: _ThreadState) -> int:
    """Open this thread's schedstat once; -1 where the kernel has none (then os.rq_ns is left out)."""
    try:
        fd = os.open(SCHEDSTAT_PATH, os.O_RDONLY | os.O_CLOEXEC)
        fields = read_schedstat(fd, state.schedstat_buf).split()
        if len(fields) < 2 or not (fields[0].isdigit() and fields[1].isdigit()):
            os.close(fd)
            fd = -1
    except OSError:
        fd = -1
    state.schedstat_fd = fd
    return fd


def _sample(state: _ThreadState) -> Sample:
    """What the OS has seen of the calling thread so far (``state`` is that thread's).

    CPU time is CLOCK_THREAD_CPUTIME_ID: the counter of schedstat's field 1,
    but brought up to date when read; field 1 itself lags a running thread by
    up to a scheduler tick (0–4 ms here), too coarse for millisecond spans.
    The run-queue wait (field 2) is exact for a thread that is running, as the
    reader is: every wait it had has ended.
    """
    fd = state.schedstat_fd
    if fd is None:
        fd = _open_schedstat(state)
    cpu = _thread_time_ns()
    rq = int(read_schedstat(fd, state.schedstat_buf).split(None, 2)[1]) if fd >= 0 else -1  # "<cpu ns> <run-queue ns> <slices>"
    if _RUSAGE_THREAD is None:
        return cpu, rq, -1, -1
    usage = _getrusage(_RUSAGE_THREAD)
    return cpu, rq, usage.ru_nivcsw, usage.ru_majflt


def evidence(start: Sample | None, end: Sample | None) -> dict[str, int]:
    """The host-evidence attributes (docs/FORMATS.md) of the span between two samples of one thread ({} when either is missing).

    ``os.rq_ns`` is left out where the thread had no schedstat, and the rusage
    counts where there is no RUSAGE_THREAD.
    """
    if start is None or end is None:
        return {}
    found = {OS_CPU_NS: end[0] - start[0]}
    if start[1] >= 0:
        found[OS_RQ_NS] = end[1] - start[1]
    if start[2] >= 0:
        found[OS_NIVCSW] = end[2] - start[2]
        found[OS_MAJFLT] = end[3] - start[3]
    return found


# -- the tracer -----------------------------------------------------------------------------


class Tracer:
    """One process's STRACE emitter: where its records go, its clock anchor, invocation ids, caches and switches.

    Records go to one fd with one ``os.write`` each, and garbage collections and
    forks are process-wide, so a process has one: :data:`TRACER`. ``enabled``
    (the fd is set) and ``sampling`` (enabled, with host evidence) are what hot
    loops test before calling.
    """

    def __init__(self) -> None:
        self.fd: int | None = None
        self.enabled = False
        self.evidence_wanted = os.environ.get(HOST_EVIDENCE_ENV) != "0"
        self.sampling = False
        self.pid = os.getpid()
        self.anchored_pid: int | None = None
        self.anchor_lock = threading.Lock()
        self.encoded: dict[str, str] = {}
        self.key_texts: dict[str, str] = {}
        self.per_thread = _PerThread()
        self._reseed_invocations()

    def _reseed_invocations(self) -> None:
        """Start a new invocation-id sequence (at creation and in every forked child)."""
        self.inv_base = int.from_bytes(os.urandom(8), "little")
        self.inv_counter = itertools.count()

    def after_fork_in_child(self) -> None:
        """The pid and the forking thread's native tid changed: drop its precomputed pieces and its schedstat file.

        The schedstat file describes the parent's thread; the nesting depth of
        the spans open across the fork is kept.
        """
        self.pid = os.getpid()
        self.anchor_lock = threading.Lock()
        state = self.per_thread.state
        state.head = None
        state.close_schedstat()
        state.gc_start = None
        self._reseed_invocations()

    def enable(self, fd: int = 2, *, gc_spans: bool = True) -> None:
        """Write records to ``fd``; a new fd gets its own CLOCK_ANCHOR before the first record.

        ``gc_spans`` records every garbage collection of this process as a ``host.gc`` span.
        """
        if fd != self.fd:
            self.anchored_pid = None
        self.fd = fd
        self.enabled = True
        self._update_sampling()
        if gc_spans and self.on_gc not in gc.callbacks:
            gc.callbacks.append(self.on_gc)
        elif not gc_spans and self.on_gc in gc.callbacks:
            gc.callbacks.remove(self.on_gc)

    def disable(self) -> None:
        self.fd = None
        self.enabled = False
        self._update_sampling()
        if self.on_gc in gc.callbacks:
            gc.callbacks.remove(self.on_gc)

    def is_enabled(self) -> bool:
        return self.fd is not None

    def set_host_evidence(self, on: bool) -> None:
        """Switch host evidence (docs/FORMATS.md, "Host evidence") on or off for every later span and sample of this process."""
        self.evidence_wanted = on
        self._update_sampling()

    def host_evidence_enabled(self) -> bool:
        return self.evidence_wanted

    def _update_sampling(self) -> None:
        self.sampling = self.enabled and self.evidence_wanted

    def host_sample(self) -> Sample | None:
        """A sample of the calling thread for :func:`evidence`; None while the emitter or host evidence is off.

        Cheap (the thread clock, one ``pread`` that keeps the GIL, one
        ``getrusage``: none of them lets another thread run meanwhile), safe from
        any thread (each thread reads its own file) and across ``fork`` (the child
        reopens).
        """
        if not self.sampling:
            return None
        return _sample(self.per_thread.state)

    def on_gc(self, phase: str, info: dict) -> None:
        """gc.callbacks hook: one ``host.gc`` record per collection, written by the collecting thread."""
        if self.fd is None:
            return
        state = self.per_thread.state
        if phase == "start":
            state.gc_start = (_monotonic_ns(), _sample(state) if self.sampling else None)
            return
        started, state.gc_start = state.gc_start, None
        if started is None:  # enabled while this collection ran
            return
        end_sample = _sample(state) if started[1] is not None else None
        end_ns = _monotonic_ns()
        attrs: dict = {GC_GEN_ATTR: info["generation"], GC_COLLECTED_ATTR: info["collected"]}
        if end_sample is not None:
            attrs.update(evidence(started[1], end_sample))
        self.emit(
            state.head or self.build_head(state), self.new_invocation(), GC_HID, 0, GC, started[0], end_ns - started[0], end_ns, attrs
        )

    def new_invocation(self) -> int:
        """A fresh unsigned 64-bit invocation id, never repeated within this process."""
        return (self.inv_base + next(self.inv_counter)) & _UINT64_MASK

    def _encode(self, value: object) -> str:
        """encode_value, with a cache for the short strings (names, labels) that repeat on every span."""
        if type(value) is not str:
            return encode_value(value)
        cached = self.encoded.get(value)
        if cached is not None:
            return cached
        text = encode_value(value)
        if len(value) <= _ENCODED_CACHE_MAX_LEN and len(self.encoded) < _ENCODED_CACHE_MAX:
            self.encoded[value] = text
        return text

    def _write(self, text: str) -> None:
        """One os.write of one whole record ending in a newline, trimmed by fit_record to fit PIPE_BUF."""
        fd = self.fd
        if fd is None:
            return
        data = text.encode()
        if len(data) > PIPE_BUF:
            data = (fit_record(text[:-1]) + "\n").encode()
        _os_write(fd, data)

    def _ensure_anchor(self) -> None:
        if self.anchored_pid != self.pid:
            with self.anchor_lock:
                if self.anchored_pid != self.pid:
                    self.emit_clock_anchor()

    def emit_clock_anchor(self) -> None:
        """Write this process's ``[CLOCK_ANCHOR]`` line (monotonic ↔ wall clock)."""
        if self.fd is None:
            return
        mono_ns = _monotonic_ns()
        wall_ns = time.time_ns()
        self._write(format_anchor_record(self.pid, mono_ns, wall_ns, threading.get_ident()) + "\n")
        self.anchored_pid = self.pid

    def chip_process_ready(self, device: str) -> None:
        """Write ``[chip_process pid=<pid> dev=<device>] ready``: maps this rank process to its device."""
        if self.fd is None:
            return
        self._ensure_anchor()
        prefix = format_prefix(_monotonic_ns(), threading.get_ident(), LOG_LEVEL, READY_FUNC)
        self._write(prefix + format_chip_ready_payload(self.pid, device) + "\n")

    def build_head(self, state: _ThreadState) -> str:
        """Precompute this thread's prefix tail and STRACE payload head (up to ``inv=``)."""
        prefix = format_prefix(0, threading.get_ident(), LOG_LEVEL, SPAN_FUNC)
        state.prefix_tail = prefix[len("[mono_ns=0") :]
        state.tid = threading.get_native_id()
        state.head = f"{state.prefix_tail}[STRACE] v={STRACE_VERSION} pid={self.pid} tid={state.tid} inv="
        return state.head

    def _key_text(self, key: str) -> str:
        """`` <encoded key>=`` for an attribute key the cache lacks; keys are few and repeat on every span."""
        text = f" {self._encode(key)}="
        if len(self.key_texts) < _ENCODED_CACHE_MAX:
            self.key_texts[key] = text
        return text

    def emit(self, head: str, inv: int, hid: str, depth: int, name: str, ts_ns: int, dur_ns: int, mono_ns: int, attrs: dict) -> None:
        """Format one STRACE record (``head`` = its thread's precomputed start) and write it atomically.

        The hot path of every enabled span and record: ints and cached strings skip
        the encoder call, and the attribute loop is inline to save a call per record.
        """
        if self.anchored_pid != self.pid:
            self._ensure_anchor()
        cached = self.encoded.get
        attr_text = ""
        if attrs:
            key_texts = self.key_texts
            for key, value in attrs.items():
                kind = type(value)
                if kind is int:
                    value = str(value)  # digits and "-" never need escaping, only the length cap
                    if len(value) > MAX_VALUE_CHARS:
                        value = encode_value(value)
                elif kind is str:
                    value = cached(value) or self._encode(value)
                else:
                    value = self._encode(value)
                attr_text += f"{key_texts.get(key) or self._key_text(key)}{value}"
        text = (
            f"[mono_ns={mono_ns}{head}{inv} hid={cached(hid) or self._encode(hid)} depth={depth} "
            f"name={cached(name) or self._encode(name)} ts={ts_ns} dur={dur_ns}{attr_text}\n"
        )
        # _write's lines, not a call to it: the call measured +0.05 µs per span
        data = text.encode()
        if len(data) > PIPE_BUF:
            data = (fit_record(text[:-1]) + "\n").encode()
        fd = self.fd
        if fd is not None:  # disabled by another thread meanwhile
            _os_write(fd, data)

    def span(self, name: str, *, inv: int, hid: str, **attrs):
        """Context manager timing a host span on CLOCK_MONOTONIC; the record is written on close.

        ``depth`` is the thread-local nesting depth at entry. The yielded object's
        ``set(**attrs)`` adds attributes; host evidence follows them (while on), and
        an exception leaving the span adds ``error=<ExceptionType>``.
        """
        if self.fd is None:
            return NOOP_SPAN
        opened = _new_span(_Span)
        opened.tracer = self
        opened.name = name
        opened.inv = inv
        opened.hid = hid
        opened.attrs = attrs
        return opened

    def record(
        self,
        name: str,
        *,
        inv: int,
        hid: str,
        depth: int,
        ts_ns: int,
        dur_ns: int,
        clk: str = CLK_HOST,
        tid: int | None = None,
        **attrs,
    ) -> None:
        """Write a span measured elsewhere, with an explicit depth (and tid, when not this thread).

        ``clk="dev"`` spans carry ``clk=dev`` as their first attribute, so trimming a
        long record to PIPE_BUF can never drop it.
        """
        if self.fd is None:
            return
        state = self.per_thread.state
        head = state.head or self.build_head(state)
        if tid is not None and tid != state.tid:
            head = f"{state.prefix_tail}[STRACE] v={STRACE_VERSION} pid={self.pid} tid={tid} inv="
        if clk != CLK_HOST:
            attrs = {CLK_ATTR: clk, **attrs}
        self.emit(head, inv, hid, depth, name, ts_ns, dur_ns, _monotonic_ns(), attrs)


class _Span:
    """An open span: records its start, thread-local depth and host sample; writes on close."""

    __slots__ = ("attrs", "depth", "hid", "inv", "name", "sample", "state", "tracer", "ts_ns")
    # set by Tracer.span() (the object is made with object.__new__, without __init__) and __enter__
    tracer: Tracer
    name: str
    inv: int
    hid: str
    attrs: dict
    state: _ThreadState
    depth: int
    ts_ns: int
    sample: Sample | None

    def set(self, **attrs) -> None:
        """Add attributes before the span closes."""
        self.attrs.update(attrs)

    def __enter__(self) -> _Span:
        tracer = self.tracer
        self.state = state = tracer.per_thread.state
        self.depth = depth = state.depth
        state.depth = depth + 1
        self.ts_ns = _monotonic_ns()
        # sampled inside [ts, end]: a thread busy all along shows os.cpu_ns <= dur
        self.sample = _sample(state) if tracer.sampling else None
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_rest: object) -> None:
        state = self.state
        end_sample = _sample(state) if self.sample is not None else None
        end_ns = _monotonic_ns()
        state.depth = depth = self.depth
        tracer = self.tracer
        if tracer.fd is None:
            return
        attrs = self.attrs
        if end_sample is not None:
            attrs.update(evidence(self.sample, end_sample))
        if exc_type is not None:
            attrs["error"] = exc_type.__name__
        ts_ns = self.ts_ns
        tracer.emit(state.head or tracer.build_head(state), self.inv, self.hid, depth, self.name, ts_ns, end_ns - ts_ns, end_ns, attrs)


_new_span = object.__new__


class _NoopSpan:
    """What span() returns while disabled (sa_profile returns it too while off).

    ``__enter__``/``__exit__`` are C callables (set below) rather than Python
    methods, which halves the cost of a disabled ``with`` block.
    """

    __slots__ = ()

    def set(self, **attrs) -> None:
        pass


NOOP_SPAN = _NoopSpan()
# Neither is a descriptor, so the with statement calls them without self:
# __enter__() returns the shared no-op span, __exit__(type, value, tb) returns
# "" (falsy, so exceptions propagate).
_NoopSpan.__enter__ = itertools.repeat(NOOP_SPAN).__next__  # type: ignore[attr-defined]
_NoopSpan.__exit__ = "".format  # type: ignore[attr-defined]

# The process's tracer, and its methods as the module's API.
TRACER = Tracer()
os.register_at_fork(after_in_child=TRACER.after_fork_in_child)
enable = TRACER.enable
disable = TRACER.disable
is_enabled = TRACER.is_enabled
set_host_evidence = TRACER.set_host_evidence
host_evidence_enabled = TRACER.host_evidence_enabled
host_sample = TRACER.host_sample
new_invocation = TRACER.new_invocation
emit_clock_anchor = TRACER.emit_clock_anchor
chip_process_ready = TRACER.chip_process_ready
span = TRACER.span
record = TRACER.record

if os.environ.get("DSPROF_STRACE") == "1":
    enable(2)
