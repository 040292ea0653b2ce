"""STRACE emitter (docs/FORMATS.md, "STRACE"): host-span records written to the process log.

A record is written once, when its span closes, with a single ``os.write`` of
at most PIPE_BUF bytes, so forked ranks sharing one stderr never interleave
inside a record. The hot path assembles the text of :mod:`.strace_format` from
per-thread precomputed pieces (tests check it against the format functions).
Switched on by :func:`enable` or ``DSPROF_STRACE=1`` at import. While off, a call
still costs the call (Python builds ``**attrs``), so hot loops test the flag
through the module first: ``strace.span(...) if strace.ENABLED else strace.NOOP_SPAN``.
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

_fd: int | None = None
# Public mirror of ``_fd is not None`` for callers that skip the call while off (see above).
ENABLED = False
_pid: int = os.getpid()
_anchored_pid: int | None = None
_anchor_lock = threading.Lock()
_encoded: dict[str, str] = {}
_key_texts: dict[str, str] = {}
_inv_base: int = 0
_inv_counter = itertools.count()
_monotonic_ns = time.monotonic_ns
_os_write = os.write
SCHEDSTAT_BYTES = 128  # "<cpu ns> <run-queue ns> <timeslices>\n" fits with room to spare
_evidence_wanted = os.environ.get(HOST_EVIDENCE_ENV) != "0"
# Public mirror of "enabled and host evidence on": code that samples for later records tests it.
SAMPLING = False
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


_per_thread = _PerThread()


def _reseed_invocations() -> None:
    """Start a new invocation-id sequence (at import and in every forked child)."""
    global _inv_base, _inv_counter
    _inv_base = int.from_bytes(os.urandom(8), "little")
    _inv_counter = itertools.count()


_reseed_invocations()


def _after_fork_in_child() -> None:
    # pid and the forking thread's native tid changed: drop its precomputed
    # pieces and its schedstat file (it describes the parent's thread) but
    # keep the nesting depth of the spans open across the fork.
    global _pid, _anchor_lock
    _pid = os.getpid()
    _anchor_lock = threading.Lock()
    state = _per_thread.state
    state.head = None
    state.close_schedstat()
    state.gc_start = None
    _reseed_invocations()


os.register_at_fork(after_in_child=_after_fork_in_child)


def enable(fd: int = 2, *, gc_spans: bool = True) -> None:
    """Write records to ``fd``; a new fd gets its own CLOCK_ANCHOR before the first record.

    ``gc_spans`` records every garbage collection of this process as a ``host.gc`` span.
    """
    global _fd, _anchored_pid, ENABLED
    if fd != _fd:
        _anchored_pid = None
    _fd = fd
    ENABLED = True
    _update_sampling()
    if gc_spans and _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)
    elif not gc_spans and _on_gc in gc.callbacks:
        gc.callbacks.remove(_on_gc)


def disable() -> None:
    global _fd, ENABLED
    _fd = None
    ENABLED = False
    _update_sampling()
    if _on_gc in gc.callbacks:
        gc.callbacks.remove(_on_gc)


def is_enabled() -> bool:
    return _fd is not None


def set_host_evidence(on: bool) -> None:
    """Switch host evidence (docs/FORMATS.md, "Host evidence") on or off for every later span and sample of this process."""
    global _evidence_wanted
    _evidence_wanted = on
    _update_sampling()


def host_evidence_enabled() -> bool:
    return _evidence_wanted


def _update_sampling() -> None:
    global SAMPLING
    SAMPLING = ENABLED and _evidence_wanted


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


def _read_schedstat(state: _ThreadState, fd: int) -> bytes:
    return read_schedstat(fd, state.schedstat_buf)


def _open_schedstat(state: _ThreadState) -> int:
    """Open this thread's schedstat once; -1 where the kernel has none (then os.rq_ns is left out)."""
    try:
        fd = os.open(SCHEDSTAT_PATH, os.O_RDONLY | os.O_CLOEXEC)
        fields = _read_schedstat(state, fd).split()
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
    rq = int(_read_schedstat(state, fd).split(None, 2)[1]) if fd >= 0 else -1  # "<cpu ns> <run-queue ns> <slices>"
    if _RUSAGE_THREAD is None:
        return cpu, rq, -1, -1
    usage = _getrusage(_RUSAGE_THREAD)
    return cpu, rq, usage.ru_nivcsw, usage.ru_majflt


def host_sample() -> Sample | None:
    """A sample of the calling thread for :func:`evidence`; None while the emitter or host evidence is off.

    Cheap (the thread clock, one ``pread`` that keeps the GIL, one
    ``getrusage``: none of them lets another thread run meanwhile), safe from
    any thread (each thread reads its own file) and across ``fork`` (the child
    reopens).
    """
    if not SAMPLING:
        return None
    return _sample(_per_thread.state)


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


def _on_gc(phase: str, info: dict) -> None:
    """gc.callbacks hook: one ``host.gc`` record per collection, written by the collecting thread."""
    if _fd is None:
        return
    state = _per_thread.state
    if phase == "start":
        state.gc_start = (_monotonic_ns(), _sample(state) if SAMPLING else None)
        return
    started, state.gc_start = state.gc_start, None
    if started is None:  # enabled while this collection ran
        return
    end_sample = _sample(state) if started[1] is not None else None
    end_ns = _monotonic_ns()
    attrs: dict = {GC_GEN_ATTR: info["generation"], GC_COLLECTED_ATTR: info["collected"]}
    if end_sample is not None:
        attrs.update(evidence(started[1], end_sample))
    _emit(state.head or _build_head(state), new_invocation(), GC_HID, 0, GC, started[0], end_ns - started[0], end_ns, attrs)


def new_invocation() -> int:
    """A fresh unsigned 64-bit invocation id, never repeated within this process."""
    return (_inv_base + next(_inv_counter)) & _UINT64_MASK


def _encode(value: object) -> str:
    """encode_value, with a cache for the short strings (names, labels) that repeat on every span."""
    if type(value) is not str:
        return encode_value(value)
    cached = _encoded.get(value)
    if cached is not None:
        return cached
    text = encode_value(value)
    if len(value) <= _ENCODED_CACHE_MAX_LEN and len(_encoded) < _ENCODED_CACHE_MAX:
        _encoded[value] = text
    return text


def _write(text: str) -> None:
    """One os.write of one whole record ending in a newline, trimmed by fit_record to fit PIPE_BUF."""
    fd = _fd
    if fd is None:
        return
    data = text.encode()
    if len(data) > PIPE_BUF:
        data = (fit_record(text[:-1]) + "\n").encode()
    _os_write(fd, data)


def _ensure_anchor() -> None:
    if _anchored_pid != _pid:
        with _anchor_lock:
            if _anchored_pid != _pid:
                emit_clock_anchor()


def emit_clock_anchor() -> None:
    """Write this process's ``[CLOCK_ANCHOR]`` line (monotonic ↔ wall clock)."""
    global _anchored_pid
    if _fd is None:
        return
    mono_ns = _monotonic_ns()
    wall_ns = time.time_ns()
    _write(format_anchor_record(_pid, mono_ns, wall_ns, threading.get_ident()) + "\n")
    _anchored_pid = _pid


def chip_process_ready(device: str) -> None:
    """Write ``[chip_process pid=<pid> dev=<device>] ready``: maps this rank process to its device."""
    if _fd is None:
        return
    _ensure_anchor()
    prefix = format_prefix(_monotonic_ns(), threading.get_ident(), LOG_LEVEL, READY_FUNC)
    _write(prefix + format_chip_ready_payload(_pid, device) + "\n")


def _build_head(state: _ThreadState) -> str:
    """Precompute this thread's prefix tail and STRACE payload head (up to ``inv=``)."""
    prefix = format_prefix(0, threading.get_ident(), LOG_LEVEL, SPAN_FUNC)
    state.prefix_tail = prefix[len("[mono_ns=0") :]
    state.tid = threading.get_native_id()
    state.head = f"{state.prefix_tail}[STRACE] v={STRACE_VERSION} pid={_pid} tid={state.tid} inv="
    return state.head


def _key_text(key: str) -> str:
    """`` <encoded key>=`` for an attribute key the cache lacks; keys are few and repeat on every span."""
    text = f" {_encode(key)}="
    if len(_key_texts) < _ENCODED_CACHE_MAX:
        _key_texts[key] = text
    return text


def _emit(head: str, inv: int, hid: str, depth: int, name: str, ts_ns: int, dur_ns: int, mono_ns: int, attrs: dict) -> None:
    """Format one STRACE record (``head`` = its thread's precomputed start) and write it atomically.

    The hot path of every enabled span and record: ints and cached strings skip
    the encoder call, and the attribute loop is inline to save a call per record.
    """
    if _anchored_pid != _pid:
        _ensure_anchor()
    attr_text = ""
    if attrs:
        for key, value in attrs.items():
            kind = type(value)
            if kind is int:
                value = str(value)  # digits and "-" never need escaping, only the length cap
                if len(value) > MAX_VALUE_CHARS:
                    value = encode_value(value)
            elif kind is str:
                value = _encoded.get(value) or _encode(value)
            else:
                value = _encode(value)
            attr_text += f"{_key_texts.get(key) or _key_text(key)}{value}"
    cached = _encoded.get
    text = (
        f"[mono_ns={mono_ns}{head}{inv} hid={cached(hid) or _encode(hid)} depth={depth} "
        f"name={cached(name) or _encode(name)} ts={ts_ns} dur={dur_ns}{attr_text}\n"
    )
    # _write's lines, not a call to it: the call measured +0.05 µs per span
    data = text.encode()
    if len(data) > PIPE_BUF:
        data = (fit_record(text[:-1]) + "\n").encode()
    fd = _fd
    if fd is not None:  # disabled by another thread meanwhile
        _os_write(fd, data)


class _Span:
    """An open span: records its start, thread-local depth and host sample; writes on close."""

    __slots__ = ("attrs", "depth", "hid", "inv", "name", "sample", "state", "ts_ns")
    # set by span() (the object is made with object.__new__, without __init__) and __enter__
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
        self.state = state = _per_thread.state
        self.depth = depth = state.depth
        state.depth = depth + 1
        self.ts_ns = _monotonic_ns()
        # sampled inside [ts, end]: a thread busy all along shows os.cpu_ns <= dur
        self.sample = _sample(state) if SAMPLING else None
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_rest: object) -> None:
        state = self.state
        end_sample = _sample(state) if self.sample is not None else None
        end_ns = _monotonic_ns()
        state.depth = depth = self.depth
        if _fd is None:
            return
        attrs = self.attrs
        if end_sample is not None:
            attrs.update(evidence(self.sample, end_sample))
        if exc_type is not None:
            attrs["error"] = exc_type.__name__
        ts_ns = self.ts_ns
        _emit(state.head or _build_head(state), self.inv, self.hid, depth, self.name, ts_ns, end_ns - ts_ns, end_ns, attrs)


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


def span(name: str, *, inv: int, hid: str, **attrs):
    """Context manager timing a host span on CLOCK_MONOTONIC; the record is written on close.

    ``depth`` is the thread-local nesting depth at entry. The yielded object's
    ``set(**attrs)`` adds attributes; host evidence follows them (while on), and
    an exception leaving the span adds ``error=<ExceptionType>``.
    """
    if _fd is None:
        return NOOP_SPAN
    opened = _new_span(_Span)
    opened.name = name
    opened.inv = inv
    opened.hid = hid
    opened.attrs = attrs
    return opened


def record(
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
    if _fd is None:
        return
    state = _per_thread.state
    head = state.head or _build_head(state)
    if tid is not None and tid != state.tid:
        head = f"{state.prefix_tail}[STRACE] v={STRACE_VERSION} pid={_pid} tid={tid} inv="
    if clk != CLK_HOST:
        attrs = {CLK_ATTR: clk, **attrs}
    _emit(head, inv, hid, depth, name, ts_ns, dur_ns, _monotonic_ns(), attrs)


if os.environ.get("DSPROF_STRACE") == "1":
    enable(2)
