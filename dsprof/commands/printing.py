"""How the commands hand their lines to whoever called them, and the one-line error format.

A command prints through :data:`Printer` callables (``print`` by default, the
CLI passes its own), so that what ``dsprof`` prints can also be had from Python.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from dsprof.textsafe import terminal_safe

Printer = Callable[[str], None]


def print_err(line: str) -> None:
    """The default printer of a command's notes: stderr."""
    print(line, file=sys.stderr)


def error_line(message: str) -> str:
    """``dsprof: error: <message>``; messages quote file names and contents, so nothing in them may drive the terminal."""
    return f"dsprof: error: {terminal_safe(message)}"


def note_line(message: str) -> str:
    """``dsprof: <message>``: something the user should know that is not an error of this command."""
    return f"dsprof: {terminal_safe(message)}"


def safe_lines(printer: Printer) -> Printer:
    """``printer`` with every line of what it is given made terminal-safe: file names and span names come from inputs."""

    def safe(text: str) -> None:
        printer("\n".join(terminal_safe(line) for line in text.split("\n")))

    return safe


def safe_progress(progress: Printer | None) -> Printer | None:
    """A progress callback whose lines are terminal-safe (None stays None)."""
    return None if progress is None else safe_lines(progress)


def os_error_message(exc: OSError) -> str:
    """A file that cannot be read or written, as ``<file>: <reason>``."""
    where = exc.filename if exc.filename is not None else ""
    reason = exc.strerror or str(exc)
    return f"{where}: {reason}" if where else reason
