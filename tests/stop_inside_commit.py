"""Run a dsprof command that stops in the middle of moving its output set into place (for tests/test_output_set.py).

    python tests/stop_inside_commit.py ACTION NAME -- dsprof arguments...

``os.replace`` is wrapped: right after the staged output called NAME has been
renamed into the output directory (the first of the set; the others still
wait in the staging directory), the process either kills itself with SIGKILL
(ACTION ``kill``: a crash between two renames), sends itself SIGTERM (``term``:
a stop asked for while the set moves), or prints ``paused after NAME`` and
waits for a line on stdin before it goes on (``pause``: a writer caught holding
the directory's lock). ``term-staged`` (``int-staged``) sends SIGTERM (SIGINT)
once NAME is complete in the staging directory, before any move. No product code knows about this.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from dsprof.output_set import STAGING_PREFIX

_real_replace = os.replace


ACTIONS = ("kill", "pause", "term", "term-staged", "int-staged")


def _wrap(action: str, name: str):
    def replace(source, target, *, src_dir_fd=None, dst_dir_fd=None):
        _real_replace(source, target, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        source, target = _resolved(source, src_dir_fd), _resolved(target, dst_dir_fd)
        if Path(target).name != name or not Path(source).parent.name.startswith(STAGING_PREFIX):
            return
        staged = Path(target).parent.name.startswith(STAGING_PREFIX)  # complete in staging, not yet moved
        if action == "term-staged" and staged:
            os.kill(os.getpid(), signal.SIGTERM)
        elif action == "int-staged" and staged:
            os.kill(os.getpid(), signal.SIGINT)
        elif action == "kill" and not staged:
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "term" and not staged:
            os.kill(os.getpid(), signal.SIGTERM)
        elif action == "pause" and not staged:
            print(f"paused after {name}", flush=True)
            sys.stdin.readline()

    return replace


def _resolved(path: str | os.PathLike, dir_fd: int | None) -> Path:
    """The path a rename relative to a directory descriptor (as dsprof's are) names."""
    return Path(path) if dir_fd is None else Path(os.readlink(f"/proc/self/fd/{dir_fd}")) / path


def main() -> None:
    action, name, separator, *arguments = sys.argv[1:]
    if separator != "--" or action not in ACTIONS:
        raise SystemExit(f"usage: {sys.argv[0]} {'|'.join(ACTIONS)} NAME -- dsprof arguments...")
    os.replace = _wrap(action, name)  # type: ignore[assignment]
    from dsprof.cli.main import main as dsprof_main

    sys.argv = ["dsprof", *arguments]
    dsprof_main()


if __name__ == "__main__":
    main()
