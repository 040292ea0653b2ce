"""Temporary directories that not even a SIGKILL leaves behind for good.

Every folder dsprof makes under TMPDIR (span datasets, DuckDB's spill, a
window's cut) has a fresh private name (``mkdtemp``, mode 0700) and holds an
``.owner`` file that this process keeps ``flock``-ed while the folder lives.
Errors, Ctrl-C and SIGTERM remove the folder on the way out, and a folder
still owned when the process exits goes then (a signal's exception can land
inside the cleanup that would have removed it); a process killed outright cannot, so whoever next makes a folder with the same prefix removes
those whose owner lock is free (their process is gone). The staging folders
of :mod:`dsprof.output_set` are cleaned the same way, through the parent's
directory descriptor (:func:`dsprof.fileio.open_dir`): no link is followed.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

from dsprof.fileio import OutputError, open_dir

OWNER_NAME = ".owner"
# A folder this young may be one another process is making right now (its owner file not locked yet): it is left alone.
YOUNG_S = 10.0

_owners: dict[Path, int] = {}  # the folders this process owns, and the descriptor holding each one's lock
_made_by: dict[Path, int] = {}  # ... and the process that made each one


def make_owned_dir(prefix: str, parent: str | os.PathLike | None = None) -> Path:
    """A new private folder ``parent/prefix*`` (default parent: TMPDIR) owned by this process until :func:`remove_owned_dir`.

    Folders of the same prefix whose owner died are removed first.
    """
    base = Path(tempfile.gettempdir() if parent is None else parent)
    remove_dead(base, prefix)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    try:
        with open_dir(folder) as folder_fd:  # the folder just made, not a link put in its place
            owner = os.open(OWNER_NAME, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600, dir_fd=folder_fd)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    fcntl.flock(owner, fcntl.LOCK_EX)
    _owners[folder] = owner
    _made_by[folder] = os.getpid()
    return folder


def remove_owned_dir(folder: str | os.PathLike | None) -> None:
    """Remove a folder made by :func:`make_owned_dir` and let its lock go; removing it twice, or None, is harmless."""
    if folder is None:
        return
    shutil.rmtree(folder, ignore_errors=True)
    release_owned_dir(folder)


def release_owned_dir(folder: str | os.PathLike) -> None:
    """Let a folder's lock go without removing it (it was moved away, or is left for the next process to finish)."""
    owner = _owners.pop(Path(folder), None)
    _made_by.pop(Path(folder), None)
    if owner is not None:
        os.close(owner)


@atexit.register
def _remove_owned_at_exit() -> None:
    """The folders this process still owns as it exits: a signal cut their cleanup short (a forked child's exit leaves them)."""
    for folder, pid in list(_made_by.items()):
        if pid == os.getpid():
            remove_owned_dir(folder)


def remove_dead(parent: Path, prefix: str, young_s: float = YOUNG_S, dir_fd: int | None = None) -> None:
    """Remove this user's folders ``parent/prefix*`` older than ``young_s`` whose owner lock is free.

    Everything is done relative to ``parent``'s descriptor (``dir_fd``, if the
    caller holds one), so a planted link is never followed; another user's folder is left alone.
    """
    with contextlib.ExitStack() as stack:
        try:
            parent_fd = dir_fd if dir_fd is not None else stack.enter_context(open_dir(parent, follow=True))
            names = [name for name in os.listdir(parent_fd) if name.startswith(prefix) and parent / name not in _owners]
        except (OSError, OutputError):  # no such folder yet: nothing to remove
            return
        now = time.time()
        for name in names:
            try:
                info = os.lstat(name, dir_fd=parent_fd)
            except OSError:
                continue
            if (
                stat.S_ISDIR(info.st_mode)
                and info.st_uid == os.getuid()
                and now - info.st_mtime >= young_s
                and _owner_gone(parent_fd, name)
            ):
                shutil.rmtree(name, ignore_errors=True, dir_fd=parent_fd)


def _owner_gone(parent_fd: int, name: str) -> bool:
    """Whether the folder has an owner file and no process holds its lock."""
    try:
        with open_dir(name, parent_fd) as folder_fd:
            fd = os.open(OWNER_NAME, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=folder_fd)
    except (OSError, OutputError):  # none: not one of ours (or an older dsprof's, which may be alive), left alone
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True
