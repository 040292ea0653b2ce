"""The ``dsprof`` click group and what every command shares: one-line errors, progress on stderr, common options.

Split from :mod:`dsprof.cli.main` (the commands) so each stays short; see its
docstring for the error and exit-status conventions.
"""

from __future__ import annotations

import _thread
import shutil
import signal
import sys
import threading

import click

from dsprof.commands import __version__, watch_signals
from dsprof.commands.printing import error_line, os_error_message
from dsprof.errors import DsprofError

_DEBUG_KEY = "dsprof.debug"
_PROGRESS_KEY = "dsprof.progress"


class UserError(click.ClickException):
    """A one-line error with the exit status of the error that caused it."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it on the class; this error's own status

    def show(self, file=None) -> None:
        click.echo(error_line(self.format_message()), err=True)


def _usage_error_message(exc: click.UsageError) -> str:
    """Click's message on one line, pointing at the command's help instead of printing the usage block."""
    message = " ".join(exc.format_message().split())
    return f"{message} (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else message


class Stopped(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C, so that every ``finally`` and cleanup runs on the way out."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


# the signals that stopped this command, in order: a query library that catches the exception a handler raised
# (DuckDB turns it into "Query interrupted") still stops the command with the signal's line and status
_stopping_signals: list[int] = []


def raise_stopped(signum: int, _frame) -> None:
    _stopping_signals.append(signum)
    raise Stopped(signum)


def install_stop_handlers() -> None:
    """SIGTERM, and Ctrl-C unless this process was started with it ignored (a background job), raise :class:`Stopped`,
    and interrupt the DuckDB queries under way (:mod:`dsprof.interrupts`); a command that handles them itself keeps them."""
    signal.signal(signal.SIGTERM, raise_stopped)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, raise_stopped)
    watch_signals(lambda signum: signal.getsignal(signum) is raise_stopped)
    sys.unraisablehook = _redeliver_swallowed_stops


def _redeliver_swallowed_stops(unraisable) -> None:
    """A stop raised while a finalizer ran (a generator closed on the way, a ``__del__``) is swallowed by Python:
    deliver its signal to the main thread again, from another thread a moment later, so that it lands in the
    command's own code (delivered from here, it would be raised, and swallowed, in this hook)."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        signum = getattr(unraisable.exc_value, "signum", signal.SIGINT)
        again = threading.Timer(REDELIVER_S, _thread.interrupt_main, (signum,))
        again.daemon = True
        again.start()
        return
    sys.__unraisablehook__(unraisable)


# how long after a finalizer swallowed a stop its signal is delivered again
REDELIVER_S = 0.05


def _stop_message(interrupt: KeyboardInterrupt) -> tuple[str, int]:
    """One line and the shell's status (128 + signal) for Ctrl-C or SIGTERM (ours, or the runtime's, which has ``signum``)."""
    signum = getattr(interrupt, "signum", signal.SIGINT)
    name = signal.Signals(signum).name
    return f"stopped by {name}; no partial output is left", 128 + signum


class DsprofGroup(click.Group):
    """Turns library errors, bad options and Ctrl-C/SIGTERM into one-line messages unless ``--debug`` was given."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise UserError(_usage_error_message(exc), exc.exit_code) from exc
        except KeyboardInterrupt as exc:
            printer = ctx.meta.get(_PROGRESS_KEY)
            if printer is not None:
                printer.done()
            if ctx.meta.get(_DEBUG_KEY):
                raise
            message, status = _stop_message(exc)
            raise UserError(message, status) from None
        except (DsprofError, OSError) as exc:
            printer = ctx.meta.get(_PROGRESS_KEY)
            if printer is not None:
                printer.done()  # the error starts on its own line
            if ctx.meta.get(_DEBUG_KEY):
                raise
            if _stopping_signals:  # raised on the way out of a stop, by something the stop cut off half-done
                raise _stopped_error() from None
            if isinstance(exc, DsprofError):
                raise UserError(str(exc), exc.exit_code) from exc
            raise UserError(os_error_message(exc)) from exc
        except Exception:
            if not _stopping_signals or ctx.meta.get(_DEBUG_KEY):
                raise
            raise _stopped_error() from None  # what the signal's exception became


def _stopped_error() -> UserError:
    """The stop's line and status, whatever the exception that reached the command's top after the stop."""
    message, status = _stop_message(Stopped(_stopping_signals[-1]))
    return UserError(message, status)


class ProgressPrinter:
    """Progress lines on stderr: rewritten in place on a terminal, one per line otherwise."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.in_place = self.stream.isatty()
        self.pending = False

    def __call__(self, message: str) -> None:
        if self.in_place:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r\x1b[K" + message[:width])
            self.stream.flush()
            self.pending = True
        else:
            click.echo(message, file=self.stream)

    def done(self) -> None:
        """End an in-place line so that what follows starts on a fresh one."""
        if self.pending:
            self.stream.write("\n")
            self.stream.flush()
            self.pending = False


@click.group(cls=DsprofGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="dsprof")
@click.option("--debug", is_flag=True, help="Show the full traceback of errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Profile a multi-rank LLM decode runtime and explain why decode steps were late.

    Exit status: 0 success, 1 a failed check (gate failed, run failed or invalid),
    2 an error (bad input, bad rules, bad options).
    """
    ctx.meta[_DEBUG_KEY] = debug


def progress_printer() -> ProgressPrinter:
    """The command's progress printer, registered so that an error can end its line."""
    printer = ProgressPrinter()
    click.get_current_context().meta[_PROGRESS_KEY] = printer
    return printer


def _endprogress_printer() -> None:
    printer = click.get_current_context().meta.get(_PROGRESS_KEY)
    if printer is not None:
        printer.done()


def out_line(line: str) -> None:
    """A line of the command's printout (stdout), after any progress line."""
    _endprogress_printer()
    click.echo(line)


def err_line(line: str) -> None:
    """A note of the command (stderr), after any progress line."""
    _endprogress_printer()
    click.echo(line, err=True)


PRESET = "the preset's"
# --expect-ranks: far beyond any job, small enough that per-rank bookkeeping stays cheap
EXPECTED_RANKS = click.IntRange(min=1, max=1 << 20)
THRESHOLD = click.option(
    "--threshold-ms", type=click.FloatRange(min=0), default=5.0, show_default=True, help="Late-start / tail-step threshold."
)


# --------------------------------------------------------------------------- run


def window_options(command):
    """``--steps``, ``--since``, ``--until``: the window of the run a reading command takes (docs/CLI.md "Windows")."""
    options = (
        click.option("--steps", metavar="A:B", show_default="every step", help="Only decode steps A to B (by the step numbers reported)."),
        click.option(
            "--since",
            metavar="TIME",
            show_default="the run's start",
            help="Only steps whose runs all start at or after TIME (a step it cuts is left out): wall clock (2026-12-01T10:00:00Z) or offset from the run's start (+90s, +5m, 1h30m).",
        ),
        click.option(
            "--until", metavar="TIME", show_default="the run's end", help="Only steps whose runs all start before TIME (as --since)."
        ),
    )
    for option in reversed(options):
        command = option(command)
    return command
