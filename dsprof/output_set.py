"""Several outputs of one command appear together or not at all.

:func:`output_set` hands out paths in a private staging directory inside the
output directory; when every file is complete, the set is moved into place
under a ``flock``, with a journal that the next writer or reader completes
(:func:`settle`) if a crash cuts the renames short. The output directory may be
shared, so nothing in it is trusted: every lock, journal, rename and removal
goes through directory descriptors (:func:`~dsprof.fileio.open_dir`).
Details: docs/ARCHITECTURE.md, "Writing outputs".
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

from dsprof.fileio import OutputError, atomic_write_text, file_kind, move_regular, open_dir, refuse_non_regular, unlink_at
from dsprof.tempdirs import make_owned_dir, release_owned_dir, remove_dead
from dsprof.textsafe import terminal_safe

STAGING_PREFIX = ".dsprof-staging-"
LOCK_NAME = ".dsprof.lock"
JOURNAL_NAME = ".dsprof-journal.json"
# A journal lists a handful of names: anything larger is not one a writer wrote.
MAX_JOURNAL_BYTES = 1 << 20


class OutputSet:
    """A staging directory whose files replace their namesakes in ``out_dir`` together."""

    def __init__(self, out_dir: Path, staging: Path):
        self.out_dir, self.staging = out_dir, staging
        self.names: list[str] = []

    def path(self, name: str) -> Path:
        """Where to write output ``name`` (a plain file name); it appears at ``out_dir / name`` on commit."""
        if Path(name).name != name or name.startswith("."):
            raise ValueError(f"not a plain output name: {name!r}")
        refuse_non_regular(self.out_dir / name)  # before anything is written, not only at the rename
        self.names.append(name)
        return self.staging / name

    def target(self, name: str) -> Path:
        return self.out_dir / name


@contextlib.contextmanager
def output_set(out_dir: str | os.PathLike) -> Iterator[OutputSet]:
    """Stage the outputs written in the block; move them into ``out_dir`` as one set when it ends without error."""
    out_dir = Path(out_dir)
    made = not out_dir.exists()
    with contextlib.suppress(FileNotFoundError):
        mode = os.stat(out_dir).st_mode
        if not stat.S_ISDIR(mode):
            raise OutputError(f"{out_dir}: refusing to write into {file_kind(mode)} (the outputs go into a directory)")
    with contextlib.ExitStack() as fds:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            out_fd = fds.enter_context(open_dir(out_dir, follow=True))  # the directory the user named, resolved once
            with _locked(out_dir, out_fd):  # made under the directory's lock, so no cleaner sees it before its owner lock is held
                staging = make_owned_dir(STAGING_PREFIX, out_dir)
            staging_fd = fds.enter_context(open_dir(staging, out_fd))
        except OSError as exc:
            raise OutputError(f"{out_dir}: cannot write: {exc.strerror or exc}") from None
        try:
            outputs = OutputSet(out_dir, staging)
            yield outputs
            _commit(outputs, out_fd, staging_fd)
        except BaseException as exc:
            if _journalled(out_fd) != staging.name:  # a journalled set is the next writer's or reader's to complete
                shutil.rmtree(staging.name, ignore_errors=True, dir_fd=out_fd)
            if made:
                with contextlib.suppress(OSError):  # someone else put files there meanwhile: keep them
                    out_dir.rmdir()
            if isinstance(exc, OutputError):  # name the output the user asked for, not its staged copy
                raise OutputError(str(exc).replace(f"{staging}{os.sep}", f"{out_dir}{os.sep}")) from None
            raise
        finally:
            release_owned_dir(staging)


def settle(out_dir: str | os.PathLike) -> None:
    """Complete a set whose move a crash interrupted, and remove dead writers' staging; nothing to do is the common case."""
    out_dir = Path(out_dir)
    with contextlib.suppress(OSError, OutputError), open_dir(out_dir, follow=True) as out_fd:  # unwritable: read as it is
        if any(name == JOURNAL_NAME or name.startswith(STAGING_PREFIX) or _journal_temporary(name) for name in os.listdir(out_fd)):
            with _locked(out_dir, out_fd):
                pass


def _commit(outputs: OutputSet, out_fd: int, staging_fd: int) -> None:
    """Journal, then rename every staged file over its target, holding the lock.

    Ctrl-C or SIGTERM arriving during the renames (any thread may take the
    signal, so masking it is not enough) finishes them before it goes on.
    """
    staged = set(os.listdir(staging_fd))
    names = [n for n in dict.fromkeys(outputs.names) if n in staged]
    try:
        with _locked(outputs.out_dir, out_fd):
            for name in names:
                refuse_non_regular(outputs.target(name), dir_fd=out_fd)
            journal = {"staging": outputs.staging.name, "files": names}
            atomic_write_text(outputs.out_dir / JOURNAL_NAME, json.dumps(journal) + "\n", dir_fd=out_fd)
            try:
                _roll_forward(outputs.out_dir, out_fd)
            except BaseException:
                _roll_forward(outputs.out_dir, out_fd)  # the renames are idempotent: the set is whole before the interrupt goes on
                raise
    except OSError as exc:
        raise OutputError(f"{outputs.out_dir}: cannot write: {exc.strerror or exc}") from None


@contextlib.contextmanager
def _locked(out_dir: Path, out_fd: int) -> Iterator[None]:
    """Hold the directory's exclusive lock (waiting for a concurrent writer); recover what a crash left, first."""
    while True:
        fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600, dir_fd=out_fd)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:  # the holder before us may have removed the file: then ours is a lock on nothing, take the new one
            if os.fstat(fd).st_ino == os.stat(LOCK_NAME, dir_fd=out_fd, follow_symlinks=False).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        _roll_forward(out_dir, out_fd)
        remove_dead(out_dir, STAGING_PREFIX, young_s=0, dir_fd=out_fd)  # staging is made under this lock: no age is needed
        for torn in filter(_journal_temporary, os.listdir(out_fd)):  # a journal is written only under this lock: one half written is dead
            with contextlib.suppress(OSError):
                unlink_at(out_fd, torn)
        yield
    finally:
        with contextlib.suppress(OSError):
            unlink_at(out_fd, LOCK_NAME)
        os.close(fd)


def _roll_forward(out_dir: Path, out_fd: int) -> None:
    """Finish the renames the journal names (each is done once: a file already moved is gone from staging), then drop it.

    The staging directory is opened once, no link followed, and each file is
    renamed relative to the two descriptors: swapping the folder for a link
    meanwhile cannot bring anything in from elsewhere.
    """
    try:
        staging, names = _read_journal(out_fd)
        with open_dir(out_dir / staging, out_fd) as staging_fd:
            for name in names:
                move_regular(name, staging_fd, out_fd)
        with contextlib.suppress(OSError):  # the renames on disk, where the platform allows it
            os.fsync(out_fd)
    except FileNotFoundError as exc:
        if exc.filename != JOURNAL_NAME:
            _discard_journal(out_dir, out_fd, f"{exc.filename}: {exc.strerror}")
        return
    except (OSError, ValueError, RecursionError, OutputError) as exc:
        _discard_journal(out_dir, out_fd, str(exc))
        return
    unlink_at(out_fd, JOURNAL_NAME)
    shutil.rmtree(staging, ignore_errors=True, dir_fd=out_fd)


def _read_journal(out_fd: int) -> tuple[str, list[str]]:
    """The staging directory and file names the journal lists; ValueError unless each is a plain name a writer would write."""
    fd = os.open(JOURNAL_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=out_fd)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        entry = json.loads(handle.read(MAX_JOURNAL_BYTES + 1))
    if not isinstance(entry, dict) or not isinstance(entry.get("staging"), str) or not isinstance(entry.get("files"), list):
        raise ValueError("not an output set's journal")
    staging, names = entry["staging"], entry["files"]
    for name in [staging, *names]:
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
            raise ValueError(f"{terminal_safe(repr(name))[:80]} is not a plain file name")
    if not staging.startswith(STAGING_PREFIX):
        raise ValueError(f"{terminal_safe(repr(staging))[:80]} is not a staging directory")
    return staging, names


def _discard_journal(out_dir: Path, out_fd: int, why: str) -> None:
    """Drop a journal that cannot be completed (planted, or its renames fail), with one note: it must not block the directory."""
    unlink_at(out_fd, JOURNAL_NAME)
    print(terminal_safe(f"dsprof: {out_dir / JOURNAL_NAME}: discarded, as it cannot be completed ({why})"), file=sys.stderr)


def _journal_temporary(name: str) -> bool:
    """A journal a writer killed while writing it left (:func:`~dsprof.fileio.atomic_write_text`'s temporary name)."""
    return name.startswith(f".{JOURNAL_NAME}.") and name.endswith(".tmp")


def _journalled(out_fd: int) -> str | None:
    """The staging directory the journal names, if it is a valid one."""
    try:
        return _read_journal(out_fd)[0]
    except (OSError, ValueError, RecursionError):
        return None
