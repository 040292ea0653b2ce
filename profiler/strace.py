"""STRACE emitter (SPEC §2): host-span records written to the process log.

A record is written once, when its span closes, with a single ``os.write`` of
at most PIPE_BUF bytes, so forked rank processes that share one captured stderr
never interleave inside a record. Every line is
``format_prefix(...) + payload + "\\n"`` in the shapes fixed by
:mod:`dsprof.profiler.strace_format`; the hot path assembles the same text from
per-thread precomputed pieces (tests check it against the format functions).

Switched on with :func:`enable` or ``DSPROF_STRACE=1`` at import. While off,
:func:`span` returns one shared no-op object and :func:`record` returns at once;
that still costs the call itself (Python builds the ``**attrs`` dict before
``span`` runs). Hot loops that must cost nothing while off test the module flag
first, read through the module so that enable/disable are seen::

    with strace.span("chip.run.bind", inv=inv, hid=hid, step=i) if strace.ENABLED else strace.NOOP_SPAN:
        ...
    if strace.ENABLED:
        strace.record(...)
"""

from __future__ import annotations

import itertools
import os
import threading
import time

from dsprof.profiler.strace_format import (
    MAX_VALUE_CHARS,
    PIPE_BUF,
    STRACE_VERSION,
    encode_value,
    fit_record,
    format_anchor_payload,
    format_chip_ready_payload,
    format_prefix,
)

LOG_LEVEL = "INFO"
# The "<func>" part of the log prefix for each kind of line this module writes.
SPAN_FUNC = "strace_span"
ANCHOR_FUNC = "clock_anchor"
READY_FUNC = "chip_process"

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


class _ThreadState:
    """This thread's span nesting depth and the precomputed start of its records."""

    __slots__ = ("depth", "head", "prefix_tail", "tid")

    def __init__(self) -> None:
        self.depth = 0
        # prefix tail after ``mono_ns`` and the STRACE payload up to ``inv=``; built on first record
        self.head: str | None = None
        self.prefix_tail = ""
        self.tid = 0


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
    # pieces but keep the nesting depth of the spans open across the fork.
    global _pid, _anchor_lock
    _pid = os.getpid()
    _anchor_lock = threading.Lock()
    _per_thread.state.head = None
    _reseed_invocations()


os.register_at_fork(after_in_child=_after_fork_in_child)


def enable(fd: int = 2) -> None:
    """Write records to ``fd``; a new fd gets its own CLOCK_ANCHOR before the first record."""
    global _fd, _anchored_pid, ENABLED
    if fd != _fd:
        _anchored_pid = None
    _fd = fd
    ENABLED = True


def disable() -> None:
    global _fd, ENABLED
    _fd = None
    ENABLED = False


def is_enabled() -> bool:
    return _fd is not None


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
    data = text.encode()
    if len(data) > PIPE_BUF:
        data = (fit_record(text[:-1]) + "\n").encode()
    _os_write(_fd, data)


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
    prefix = format_prefix(mono_ns, threading.get_ident(), LOG_LEVEL, ANCHOR_FUNC)
    _write(prefix + format_anchor_payload(_pid, mono_ns, wall_ns) + "\n")
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
    # _write's three lines, not a call to it: the call measured +0.05 µs per span
    data = text.encode()
    if len(data) > PIPE_BUF:
        data = (fit_record(text[:-1]) + "\n").encode()
    _os_write(_fd, data)


class _Span:
    """An open span: records its start and thread-local depth, writes on close."""

    __slots__ = ("name", "inv", "hid", "attrs", "state", "depth", "ts_ns")

    def set(self, **attrs) -> None:
        """Add attributes before the span closes."""
        self.attrs.update(attrs)

    def __enter__(self) -> _Span:
        self.state = state = _per_thread.state
        self.depth = depth = state.depth
        state.depth = depth + 1
        self.ts_ns = _monotonic_ns()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        end_ns = _monotonic_ns()
        state = self.state
        state.depth = depth = self.depth
        if _fd is None:
            return
        if exc_type is not None:
            self.attrs["error"] = exc_type.__name__
        ts_ns = self.ts_ns
        _emit(state.head or _build_head(state), self.inv, self.hid, depth, self.name, ts_ns, end_ns - ts_ns, end_ns, self.attrs)


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
_NoopSpan.__enter__ = itertools.repeat(NOOP_SPAN).__next__
_NoopSpan.__exit__ = "".format


def span(name: str, *, inv: int, hid: str, **attrs):
    """Context manager timing a host span on CLOCK_MONOTONIC; the record is written on close.

    ``depth`` is the thread-local nesting depth at entry. The yielded object's
    ``set(**attrs)`` adds attributes; an exception leaving the span adds
    ``error=<ExceptionType>``.
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
    clk: str = "host",
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
    if clk != "host":
        attrs = {"clk": clk, **attrs}
    _emit(head, inv, hid, depth, name, ts_ns, dur_ns, _monotonic_ns(), attrs)


if os.environ.get("DSPROF_STRACE") == "1":
    enable(2)
