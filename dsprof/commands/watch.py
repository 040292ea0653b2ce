"""``dsprof watch``: follow a running job's logs, analyse a window of its last steps every second, and at the end
write what ``dsprof analyze`` writes for the same bytes (docs/WATCH.md).

The loop polls the logs (new bytes only, :mod:`dsprof.analysis.live.live_analysis`) and,
every ``interval`` seconds, analyses the window with the stages of
``analyze``. On a terminal the window is drawn as a live view; in a pipe each
finding is printed once. ``--alert`` evaluates gate rules on every window;
``--events`` appends one JSON line per refresh (what benchmarks/bench_watch.py
reads). The watch ends on Ctrl-C/SIGTERM, when ``performance_summary.json``
appears in a watched artifact directory (the runtime writes it at the end), after
``idle_exit`` seconds without a new byte, when ``stop`` is set, or on an alert
without a hook; then the final outputs are written from the span dataset of
everything read.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NoReturn

from dsprof.analysis.analyze import DEFAULT_THRESHOLD_MS, check_threshold
from dsprof.analysis.live.live_analysis import DEFAULT_WINDOW_STEPS, LiveAnalysis, WindowResult, window_summary
from dsprof.analysis.outputs.console import format_console_summary
from dsprof.analysis.outputs.live_view import CLEAR_SCREEN, FindingLines, format_live_view, window_steps
from dsprof.analysis.policy.gate import evaluate_gate
from dsprof.analysis.policy.gate_rules import load_rules
from dsprof.analysis.summary import Summary
from dsprof.commands.alert_hooks import MAX_RUNNING_HOOKS, AlertHooks
from dsprof.commands.analysis_job import (
    SPILL_PREFIX,
    AnalyzeOutcome,
    analyze_paths,
    default_out_dir,
    require_something_to_analyse,
    write_outputs,
)
from dsprof.commands.printing import Printer, safe_lines
from dsprof.errors import DsprofError
from dsprof.fileio import OutputError, open_append
from dsprof.tempdirs import make_owned_dir, remove_owned_dir
from dsprof.textsafe import terminal_safe

DEFAULT_INTERVAL_S = 0.25  # the least time between two windows taken
DEFAULT_WORKERS = 1  # window analyses under way at once
POLL_S = 0.1  # how often the logs are polled
# The runtime writes faults.json just after performance_summary.json: the watch ends this long after the latter appears.
JOB_END_GRACE_S = 1.0
# watch has no --memory-limit: the final analysis is analyze's, of the span dataset --spans keeps.
MEMORY_REMEDY = "keep the spans (--spans DIR) and analyse them with 'dsprof analyze DIR --memory-limit'"
Screen = Callable[[str], None]


@dataclass
class WatchOptions:
    """What ``dsprof watch`` is told besides its paths (defaults: the CLI's)."""

    out_dir: str | os.PathLike | None = None
    window: int = DEFAULT_WINDOW_STEPS
    interval_s: float = DEFAULT_INTERVAL_S
    threshold_ms: float = DEFAULT_THRESHOLD_MS
    idle_exit_s: float | None = None
    alert_rules: str | os.PathLike | None = None
    on_alert: str | None = None
    events: str | os.PathLike | None = None
    spans_dir: str | os.PathLike | None = None
    expect_ranks: int | None = None
    workers: int = DEFAULT_WORKERS

    def check(self) -> None:
        """Refuse bad options before anything is read (one line, exit 2)."""
        check_threshold(self.threshold_ms)
        if not self.interval_s > 0:
            raise DsprofError(f"--interval must be a number of seconds > 0, got {self.interval_s!r}")
        if not (isinstance(self.workers, int) and self.workers >= 1):
            raise DsprofError(f"--workers must be a whole number >= 1, got {self.workers!r}")
        if self.idle_exit_s is not None and not self.idle_exit_s > 0:
            raise DsprofError(f"--idle-exit must be a number of seconds > 0, got {self.idle_exit_s!r}")
        if self.on_alert is not None and self.alert_rules is None:
            raise DsprofError("--on-alert needs --alert RULES.toml")
        if self.alert_rules is not None:
            load_rules(Path(self.alert_rules))


@dataclass
class WatchOutcome:
    """The final analysis, the outputs written, why the watch ended and its exit status."""

    analysis: AnalyzeOutcome
    ended_by: str
    exit_code: int
    alerts: list[str] = field(default_factory=list)
    hooks_skipped: int = 0


class Alerts:
    """Gate rules evaluated on each window; a failure fires once, then not again until the window has moved past where it fired.

    With a hook (``--on-alert``), each alert starts it (:class:`~dsprof.commands.alert_hooks.AlertHooks`); :meth:`stop` ends them.
    """

    def __init__(self, rules: str | os.PathLike | None, hook: str | None):
        self.rules = rules
        self.hooks = None if hook is None else AlertHooks(hook)
        self.loaded = None if rules is None else load_rules(Path(rules))  # read once, checked on every window
        self.quiet_until: dict[str, int] = {}  # rule title -> last step of the window it fired in
        self.fired: list[str] = []
        self.notes: list[str] = []  # hooks skipped since the caller last took them

    def check(self, summary: Summary, steps: tuple[int, int]) -> list[str]:
        """The lines of the rules that fail on this window and have not fired on it yet (each starts the hook)."""
        if self.rules is None:
            return []
        lines = []
        for result in evaluate_gate(dict(summary), Path(self.rules), rules=self.loaded).results:
            if not result.failed or self.quiet_until.get(result.title, -1) >= steps[0]:
                continue
            self.quiet_until[result.title] = steps[1]
            line = terminal_safe(f"alert: steps {steps[0]}-{steps[1]}: {result.title}: {result.detail or result.status}")
            lines.append(line)
            note = None if self.hooks is None else self.hooks.start(line)
            if note is not None:
                self.notes.append(note)
        self.fired.extend(lines)
        return lines

    def stop(self, *, stopped: bool) -> None:
        """End the hooks still running (``stopped``: by Ctrl-C or SIGTERM, without waiting for them to end on their own)."""
        if self.hooks is not None:
            self.hooks.stop(stopped=stopped)

    def terminate_hooks(self) -> None:
        """SIGTERM to the hooks still running, at once (from a signal handler; :meth:`stop` waits for them after)."""
        if self.hooks is not None:
            self.hooks.terminate()


class Events:
    """``--events FILE``: one JSON line per refresh, appended and flushed (benchmarks/bench_watch.py reads them).

    A file that cannot be written (a directory, ``/dev/full``) is an error naming it, at the open or the first write.
    It is opened without following a link (:func:`~dsprof.fileio.open_append`): a planted one is refused.
    """

    def __init__(self, path: str | os.PathLike | None):
        self.path = path
        self.handle: IO[str] | None = None
        if path is not None:
            try:
                self.handle = os.fdopen(open_append(path), "a", encoding="utf-8")
            except OSError as exc:
                self._refuse(exc)
        self.last_shown: int | None = None

    def write(self, steps: tuple[int, int] | None, alerts: list[str], refresh_s: float) -> None:
        last = None if steps is None else steps[1]
        new_last = last if last is not None and (self.last_shown is None or last > self.last_shown) else None
        if new_last is not None:
            self.last_shown = new_last
        if self.handle is None:
            return
        event = {
            "wall_s": time.time(),
            "first_step": None if steps is None else steps[0],
            "last_step": last,
            "new_last_step": new_last,
            "alerts": alerts,
            "refresh_s": round(refresh_s, 4),
        }
        try:
            self.handle.write(json.dumps(event) + "\n")
            self.handle.flush()
        except OSError as exc:
            self._refuse(exc)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()

    def _refuse(self, exc: OSError) -> NoReturn:
        """The file is let go (its unwritten line would fail again on close) and named in the error."""
        handle, self.handle = self.handle, None
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()
        raise OutputError(f"{self.path}: cannot write the --events file: {exc.strerror or exc}") from None


def watch_command(
    paths: Sequence[str | os.PathLike],
    options: WatchOptions,
    *,
    out: Printer = print,
    screen: Screen | None = None,
    stop: threading.Event | None = None,
) -> int:
    """``dsprof watch``: follow ``paths`` until the job ends (see the module docstring), print the findings and the files.

    ``screen`` (a terminal's writer) gets the live view; without it each finding is a line on ``out``. Returns the exit
    status: 0, or 1 when an alert fired without ``--on-alert``.
    """
    out = safe_lines(out)
    outcome = watch_paths(paths, options, out=out, screen=screen, stop=stop)
    try:
        if screen is None:
            out(f"watch ended: {outcome.ended_by}")
        if outcome.hooks_skipped:
            out(f"alert hooks skipped: {outcome.hooks_skipped} (at most {MAX_RUNNING_HOOKS} run at once)")
        out(format_console_summary(outcome.analysis.summary))
        for name, path in outcome.analysis.outputs.items():
            out(f"{name}: {path}")
    finally:
        outcome.analysis.result.engine.close()
    return outcome.exit_code


def watch_paths(
    paths: Sequence[str | os.PathLike],
    options: WatchOptions,
    *,
    out: Printer = print,
    screen: Screen | None = None,
    stop: threading.Event | None = None,
) -> WatchOutcome:
    """Follow ``paths`` until the job ends, then write the final outputs; the caller closes ``analysis.result.engine``."""
    options.check()
    out_dir = Path(default_out_dir(paths) if options.out_dir is None else options.out_dir)
    events = Events(options.events)  # before the temporary folder: a bad --events leaves nothing behind
    temporary = None
    try:
        temporary = None if options.spans_dir is not None else make_owned_dir(SPILL_PREFIX)
        dataset = Path(options.spans_dir) if options.spans_dir is not None else temporary
        assert dataset is not None
        live = LiveAnalysis(paths, dataset, window=options.window, threshold_ms=options.threshold_ms, expect_ranks=options.expect_ranks)
        follower = _Follower(live, options, out, screen, events)
        try:
            with _signals_end(follower):  # a signal while the hooks stop waits for them, as one while following does
                ended_by = None
                try:
                    ended_by = follower.run(stop)
                finally:
                    follower.alerts.stop(stopped=ended_by is None or follower.signalled is not None)
        except BaseException:
            live.abort()
            raise
        analysis = finish_watch(live, out_dir, options, keep_dataset=temporary is None)
    finally:
        try:
            events.close()
        finally:
            remove_owned_dir(temporary)
    code = 1 if follower.alerts.fired and options.on_alert is None else 0
    skipped = 0 if follower.alerts.hooks is None else len(follower.alerts.hooks.skipped)
    return WatchOutcome(analysis, ended_by, code, follower.alerts.fired, skipped)


def finish_watch(live: LiveAnalysis, out_dir: Path, options: WatchOptions, *, keep_dataset: bool) -> AnalyzeOutcome:
    """Complete the dataset and write ``analyze``'s outputs from it; the caller closes ``result.engine`` (and removes the dataset after).

    ``keep_dataset``: the dataset stays (``--spans``) and the summary names it, as ``analyze --spans`` does.
    """
    try:
        trace = live.finish()
        if not any(part["rows"] for part in live.writer.files):  # named here: the inputs followed, not the dataset made of them
            require_something_to_analyse(trace, live.paths)
    except BaseException:
        live.abort()
        raise
    analysis = analyze_paths(
        [live.writer.directory],
        None,
        threshold_ms=options.threshold_ms,
        expect_ranks=options.expect_ranks,
        memory_remedy=MEMORY_REMEDY,
    )
    try:
        if not keep_dataset:  # analyze of the same bytes keeps no dataset, and names none
            analysis.summary["inputs"].pop("span_dataset", None)
        analysis.outputs = write_outputs(analysis.result, out_dir)
    except BaseException:
        analysis.result.engine.close()
        raise
    return analysis


@contextlib.contextmanager
def _signals_end(follower: _Follower) -> Iterator[None]:
    """While following, Ctrl-C and SIGTERM end the watch at the next poll instead of interrupting a read half done.

    Only in the main thread (where signal handlers live); the handlers before are back for the final outputs, so a
    second Ctrl-C there stops at once.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}

    def end(signum: int, _frame: object) -> None:
        follower.signalled = follower.signalled or f"stopped by {signal.Signals(signum).name}"
        follower.alerts.terminate_hooks()  # now, not after the refresh under way

    try:
        for signum in previous:
            signal.signal(signum, end)
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class WindowAnalyses:
    """Window analyses under way on worker threads (each opens an engine of its own), taken back in the order they began.

    The logs are polled while a window is analysed, and the next window is taken as soon as an analysis is free:
    a step waits for the analysis under way and its own, not for a clock. An analysis costs the fixed cost of its
    queries whatever the window holds (benchmarks/README.md), so more than one ``workers`` helps only on free cores.
    """

    def __init__(self, workers: int, threshold_ms: float):
        self.workers, self.threshold_ms = workers, threshold_ms
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dsprof-window")
        self.running: deque[tuple[float, LiveAnalysis, Future[WindowResult | None]]] = deque()
        self.ended = threading.Event()  # set when an analysis ends: the poller wakes at once to show it

    def free(self) -> bool:
        return len(self.running) < self.workers

    def start(self, live: LiveAnalysis) -> None:
        """Take the window of ``live`` on this thread (the ring is the poller's), analyse it on a worker (None: no
        complete step yet)."""
        taken = time.monotonic()
        window = live.take()
        if window is None:
            future: Future[WindowResult | None] = Future()
            future.set_result(None)
        else:
            future = self.pool.submit(window_summary, window, self.threshold_ms)
            future.add_done_callback(lambda _: self.ended.set())
        self.running.append((taken, live, future))

    def done(self, *, wait: bool) -> Iterator[tuple[Summary | None, float]]:
        """Each ended analysis, oldest first, up to the first still running (``wait``: every one); its summary and age.

        Its invocations go back to the live analysis, for the next window taken (:meth:`LiveAnalysis.learn`).
        """
        while self.running and (wait or self.running[0][2].done()):
            started, live, future = self.running.popleft()
            result = future.result()
            if result is not None:
                live.learn(result)
            yield None if result is None else result.summary, time.monotonic() - started

    def close(self) -> None:
        """Wait for the analyses under way (their engines close) and let the threads go."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.running.clear()


class _Follower:
    """The watch loop: poll, take the window when new bytes came and an analysis is free, show each analysed window
    (print, alert), and say why it ended."""

    def __init__(self, live: LiveAnalysis, options: WatchOptions, out: Printer, screen: Screen | None, events: Events):
        self.live, self.options, self.out, self.screen, self.events = live, options, out, screen, events
        self.findings = FindingLines()
        self.alerts = Alerts(options.alert_rules, options.on_alert)
        self.windows = WindowAnalyses(options.workers, options.threshold_ms)
        self.end_seen: float | None = None
        self.signalled: str | None = None  # set by a signal handler (_signals_end)

    def run(self, stop: threading.Event | None) -> str:
        """Follow until the job ends; why it ended."""
        last_new = next_start = time.monotonic()
        fresh = True  # bytes came since the window was last taken (and before the first)
        try:
            while True:
                self.windows.ended.clear()  # before looking: an analysis that ends after this wakes the wait below
                if self.live.poll():
                    last_new, fresh = time.monotonic(), True
                if self._show_done(wait=False):
                    return "an alert fired"
                now = time.monotonic()
                if fresh and now >= next_start and self.windows.free():
                    next_start, fresh = now + self.options.interval_s, False
                    self.windows.start(self.live)
                ended = self._ended(stop, now - last_new)
                if ended is not None:
                    if self._show_done(wait=True):
                        return "an alert fired"
                    self.live.drain()
                    self.windows.start(self.live)  # the last window, to its last record
                    fired = self._show_done(wait=True, final=True)
                    return "an alert fired" if fired and self.options.on_alert is None else ended
                self.windows.ended.wait(POLL_S)
        except KeyboardInterrupt as interrupt:
            return f"stopped by {interrupt or 'Ctrl-C'}"
        finally:
            self.windows.close()

    def _show_done(self, *, wait: bool, final: bool = False) -> bool:
        """Show the window analyses that have ended, oldest first (``wait``: all, once they end); whether an alert
        fired that ends the watch (without ``--on-alert``; with ``final``, whether any fired)."""
        for summary, seconds in self.windows.done(wait=wait):
            if self.show(summary, seconds, final=final) and (final or self.options.on_alert is None):
                return True
        return False

    def show(self, summary: Summary | None, seconds: float, final: bool = False) -> bool:
        """Print what is new in one window's summary (None: no complete step yet), evaluate the alerts; whether one
        fired (``final``: the job ended). ``seconds``: since the window was taken."""
        started = time.monotonic()
        steps, fired = None if summary is None else window_steps(summary), []
        if summary is not None and steps is not None and (final or steps[1] - steps[0] + 1 >= self.options.window):
            fired = self.alerts.check(summary, steps)  # a window still filling judges too few steps
        if self.screen is not None:
            view = format_live_view(
                summary,
                bytes_read=self.live.bytes_read,
                alerts=self.alerts.fired[-5:],
                clock=time.strftime("%H:%M:%S"),
                width=shutil.get_terminal_size().columns,
            )
            self.screen(CLEAR_SCREEN + view + "\n")
        else:
            for line in ([] if summary is None else self.findings.new_lines(summary, final)) + fired + self.alerts.notes:
                self.out(line)
        self.alerts.notes.clear()
        self.events.write(steps, fired, seconds + time.monotonic() - started)
        return bool(fired)

    def _ended(self, stop: threading.Event | None, idle_s: float) -> str | None:
        if self.signalled is not None:
            return self.signalled
        if stop is not None and stop.is_set():
            return "the job ended"
        if self.live.job_ended():
            self.end_seen = self.end_seen or time.monotonic()
            if time.monotonic() - self.end_seen >= JOB_END_GRACE_S:
                return "the job ended (performance_summary.json written)"
        if self.options.idle_exit_s is not None and idle_s >= self.options.idle_exit_s:
            return f"no new bytes for {self.options.idle_exit_s:g} s"
        return None
