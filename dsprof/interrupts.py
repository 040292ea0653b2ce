"""A signal that stops a command interrupts its DuckDB queries at once.

Python runs a signal's handler in the main thread between two bytecodes, so a
long query in DuckDB's C code holds the handler back until the query ends.
:func:`watch_signals` has the interpreter also write each signal's number to
a pipe (``signal.set_wakeup_fd``); a daemon thread reads it and, for a signal
that stops the command, interrupts every open connection registered with
:func:`interruptible`. The query then fails at once and the main thread runs
the handler (the CLI's one line and exit status, cli/group.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

Connection = TypeVar("Connection")

_connections: weakref.WeakSet = weakref.WeakSet()  # open DuckDB connections; a closed or collected one drops out
_connections_lock = threading.Lock()  # connections are opened on worker threads too (dsprof watch's window analyses)


def interruptible(con: Connection) -> Connection:
    """Register a DuckDB connection to be interrupted when a signal stops the command; returns it."""
    with _connections_lock:
        _connections.add(con)
    return con


def watch_signals(stops: Callable[[int], bool]) -> None:
    """Interrupt the registered connections on every signal for which ``stops`` is true; call once, from the main thread."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # the interpreter's write must never block its signal handler
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    threading.Thread(target=_interrupt_on_signals, args=(read_end, stops), name="dsprof-signals", daemon=True).start()


def _interrupt_on_signals(read_end: int, stops: Callable[[int], bool]) -> None:
    while received := os.read(read_end, 64):
        if any(stops(signum) for signum in received):
            with _connections_lock:
                open_now = list(_connections)
            for con in open_now:
                with contextlib.suppress(Exception):  # a connection closed meanwhile: nothing to interrupt
                    con.interrupt()
