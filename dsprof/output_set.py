"""Several outputs of one command appear together or not at all.

:func:`output_set` hands out paths in a private staging directory inside the
output directory (``.dsprof-staging-*``); each file there is written as usual
(:mod:`dsprof.fileio`). When every file is complete, the set is moved into
place while holding an exclusive ``flock`` on ``.dsprof.lock`` in the output
directory, so two concurrent writers leave one whole set, the last one's.

A crash between two renames must not leave a mix of old and new files: before
the first rename, a journal (``.dsprof-journal.json``, naming the staging
directory and its files) is written atomically; the renames are idempotent,
and whoever next takes the lock (a writer, or a reader through
:func:`settle`) finds the journal and completes them. Staging directories of
writers that died (their owner lock is free) are removed then too.

Any error, Ctrl-C or SIGTERM before the renames removes the staging directory
and leaves the previous outputs as they were; a SIGKILL leaves it, or a
journal's temporary file, for the next writer or reader. The lock file and the journal exist only while a set is
being moved.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from dsprof.fileio import OutputError, atomic_write_text, file_kind, refuse_non_regular
from dsprof.tempdirs import make_owned_dir, release_owned_dir, remove_dead

STAGING_PREFIX = ".dsprof-staging-"
LOCK_NAME = ".dsprof.lock"
JOURNAL_NAME = ".dsprof-journal.json"


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
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with _locked(out_dir):  # made under the directory's lock, so no cleaner sees it before its owner lock is held
            staging = make_owned_dir(STAGING_PREFIX, out_dir)
    except OSError as exc:
        raise OutputError(f"{out_dir}: cannot write: {exc.strerror or exc}") from None
    try:
        outputs = OutputSet(out_dir, staging)
        yield outputs
        _commit(outputs)
    except BaseException as exc:
        if not _journalled(out_dir, staging):  # a journalled set is the next writer's or reader's to complete
            shutil.rmtree(staging, ignore_errors=True)
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
    if not (out_dir / JOURNAL_NAME).exists() and not any(out_dir.glob(STAGING_PREFIX + "*")) and not _journal_temporaries(out_dir):
        return
    with contextlib.suppress(OSError), _locked(out_dir):  # a directory the reader cannot write is read as it is
        pass


def _commit(outputs: OutputSet) -> None:
    """Journal, then rename every staged file over its target, holding the lock.

    Ctrl-C or SIGTERM arriving during the renames (any thread may take the
    signal, so masking it is not enough) finishes them before it goes on.
    """
    names = [n for n in dict.fromkeys(outputs.names) if (outputs.staging / n).is_file()]
    try:
        with _locked(outputs.out_dir):
            for name in names:
                refuse_non_regular(outputs.target(name))
            journal = {"staging": outputs.staging.name, "files": names}
            atomic_write_text(outputs.out_dir / JOURNAL_NAME, json.dumps(journal) + "\n")
            try:
                _roll_forward(outputs.out_dir)
            except BaseException:
                _roll_forward(outputs.out_dir)  # the renames are idempotent: the set is whole before the interrupt goes on
                raise
    except OSError as exc:
        raise OutputError(f"{outputs.out_dir}: cannot write: {exc.strerror or exc}") from None


@contextlib.contextmanager
def _locked(out_dir: Path) -> Iterator[None]:
    """Hold the directory's exclusive lock (waiting for a concurrent writer); recover what a crash left, first."""
    lock = out_dir / LOCK_NAME
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:  # the holder before us may have removed the file: then ours is a lock on nothing, take the new one
            if os.fstat(fd).st_ino == os.stat(lock, follow_symlinks=False).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        _roll_forward(out_dir)
        remove_dead(out_dir, STAGING_PREFIX, young_s=0)  # staging is made under this lock: no age is needed
        for torn in _journal_temporaries(out_dir):  # a journal is written only under this lock: one half written is dead
            torn.unlink(missing_ok=True)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def _roll_forward(out_dir: Path) -> None:
    """Finish the renames the journal names (each is done once: a file already moved is gone from staging), then drop it."""
    journal = out_dir / JOURNAL_NAME
    try:
        entry = json.loads(journal.read_text())
        staging = out_dir / Path(str(entry["staging"])).name
        names = [Path(str(n)).name for n in entry["files"]]
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError):  # torn or foreign: nothing can be completed from it
        journal.unlink(missing_ok=True)
        return
    if not _is_staging(staging):  # a journal naming anything else is not ours: nothing is moved from it
        journal.unlink(missing_ok=True)
        return
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.replace(staging / name, out_dir / name)
    _sync(out_dir)
    journal.unlink(missing_ok=True)
    shutil.rmtree(staging, ignore_errors=True)


def _journal_temporaries(out_dir: Path) -> list[Path]:
    """Journals a writer killed while writing them left (:func:`~dsprof.fileio.atomic_write_text`'s temporary names)."""
    return [path for path in out_dir.glob(f".{JOURNAL_NAME}.*.tmp") if path.is_file() and not path.is_symlink()]


def _is_staging(path: Path) -> bool:
    """A staging directory of ours: the name, and a real directory (``lstat``: a planted link is never followed)."""
    try:
        return path.name.startswith(STAGING_PREFIX) and stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _journalled(out_dir: Path, staging: Path) -> bool:
    try:
        return json.loads((out_dir / JOURNAL_NAME).read_text()).get("staging") == staging.name
    except (OSError, ValueError, AttributeError):
        return False


def _sync(directory: Path) -> None:
    """Flush the renames to disk where the platform allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
