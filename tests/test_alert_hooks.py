"""``dsprof watch --on-alert``: hooks run beside the watch, a few at a time, and none outlives it (docs/WATCH.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from dsprof.commands.alert_hooks import ALERT_ENV, AlertHooks
from dsprof.testing.processes import ends_within, is_running


def _wait_for(path: Path) -> str:
    """The content of a file a hook writes, once it is there (a state, not a time: the test's timeout bounds it)."""
    while not path.is_file() or not path.read_text().endswith("\n"):
        time.sleep(0.02)
    return path.read_text()


def test_a_hook_runs_beside_the_watch_and_a_third_is_skipped_while_two_run(tmp_path):
    hooks = AlertHooks(f'echo "$$" > "{tmp_path}/$(printf %s "$DSPROF_ALERT" | tr -c a-z _)"; exec sleep 300')
    try:
        assert hooks.start("first") is None and hooks.start("second") is None
        note = hooks.start("third")
        assert note == "alert hook skipped (1 so far): 2 still running, at most 2 at once"
        assert hooks.skipped == ["third"] and [hook.poll() for hook in hooks.running] == [None, None]  # started, not awaited
        shells = [int(_wait_for(tmp_path / name)) for name in ("first", "second")]
        assert shells == [hook.pid for hook in hooks.running] and all(os.getpgid(pid) == pid for pid in shells)  # own groups
    finally:
        hooks.stop(stopped=True)
    assert hooks.running == [] and all(not is_running(pid) for pid in shells)


def test_stopping_kills_what_a_hook_started_and_a_hook_that_ignores_sigterm(tmp_path):
    hooks = AlertHooks(f"trap '' TERM; sleep 300 & echo $! > {tmp_path}/child; wait")
    hooks.start("alert")
    child = int(_wait_for(tmp_path / "child"))
    hooks.stop(stopped=True)  # SIGTERM is ignored by both: SIGKILL after the grace
    assert hooks.running == []
    assert ends_within(child, 5.0)  # the shell was waited for; its child, SIGKILLed with it, may take a moment to end


def test_a_hook_that_ends_on_its_own_is_waited_for_at_a_normal_end(tmp_path):
    hooks = AlertHooks(f"sleep 0.2; echo done > {tmp_path}/done")
    hooks.start("alert")
    hooks.stop(stopped=False)
    assert (tmp_path / "done").read_text() == "done\n"


def test_the_alert_line_reaches_the_hook_only_through_the_environment(tmp_path, capfd):
    line = "alert: steps 1-2: $(touch pwned) `touch pwned2`; touch pwned3 'x\" \\n"
    hooks = AlertHooks(f'cd {tmp_path} && printf "%s" "${ALERT_ENV}" > seen && echo printed')
    hooks.start(line)
    hooks.stop(stopped=False)
    assert (tmp_path / "seen").read_text() == line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seen"]  # nothing the line names was run
    printed = capfd.readouterr()
    assert printed.err == "printed\n" and printed.out == ""  # a hook's printout goes to stderr, not the watch's stdout
