"""Outputs replaced atomically: every file dsprof writes goes through here.

A file is written to a temporary file in the same directory, flushed to disk
and renamed over the target, so a reader (or a crash, a full disk, a SIGKILL)
only ever sees the previous complete file or the new complete one. On any
error the temporary file is removed, the previous output is left as it was,
and the error names the file. The temporary file is created as any file the
user writes is (mode 0666 less the umask: 0644 under umask 022), so the
renamed output is as readable as the user's other files.

A file that others append to as well (a CI job's step summary) cannot be
replaced: :func:`atomic_append_text` adds its block with one ``O_APPEND`` write,
so concurrent writers' blocks never interleave.

Only a regular file or a missing path is ever written: a symbolic link, a
device node, a FIFO or a socket at an output path is refused (checked with
``lstat``, so a link is never followed), rather than replaced by a new file or
written through. Inputs named by the user are checked the same way before
they are opened (:func:`check_input_file`), so a FIFO cannot block a reader.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from dsprof.errors import DsprofError, InputError

# Random temporary names tried before giving up (a clash of 48 random bits is already unlikely).
_NAME_TRIES = 8


class OutputError(DsprofError):
    """An output could not be written; names the file and why."""


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file handle whose content replaces ``path`` only when the block ends without error."""
    path = Path(path)
    refuse_non_regular(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = _create_temporary(path)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        refuse_non_regular(path)  # again: something may have been put there while the file was written
        os.replace(temporary, path)
        _sync_directory(path.parent)
    except OSError as exc:
        _remove(temporary)
        raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    except BaseException:
        _remove(temporary)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes | memoryview) -> Path:
    with atomic_output(path) as handle:
        handle.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_append_text(path: str | os.PathLike, text: str) -> Path:
    """Append ``text`` to ``path`` (a regular file, created if absent) as one write, then flush it to disk."""
    path = Path(path)
    data = text.encode("utf-8")
    refuse_non_regular(path, "append to")
    try:  # no link followed, and a FIFO swapped in meanwhile fails at once instead of blocking
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        raise OutputError(f"{path}: cannot append: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OutputError(
                f"{path}: refusing to append to {file_kind(os.fstat(fd).st_mode)} (only a regular file or a new path is written)"
            )
        written = os.write(fd, data)
        if written != len(data):  # a full disk or a file size limit: say so rather than leave a torn block unnoticed
            raise OutputError(f"{path}: cannot append: wrote {written} of {len(data)} bytes")
        os.fsync(fd)
    except OSError as exc:
        raise OutputError(f"{path}: cannot append: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return path


def _create_temporary(path: Path) -> tuple[int, str]:
    """A new hidden file next to ``path``, created with mode 0666 so that the umask decides (``mkstemp`` would force 0600)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    for _ in range(_NAME_TRIES):
        temporary = str(path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp"))
        try:
            return os.open(temporary, flags, 0o666), temporary
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path.parent))


def _sync_directory(directory: Path) -> None:
    """Flush the rename itself to disk, so that a power loss keeps the new file (where the platform allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def refuse_non_regular(path: str | os.PathLike, action: str = "replace") -> None:
    """OutputError unless ``path`` is missing or a regular file (``lstat``: a symbolic link counts as a link)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise OutputError(f"{path}: refusing to {action} {file_kind(mode)} (only a regular file or a new path is written)")


def check_input_file(path: str | os.PathLike, expected: str) -> None:
    """InputError when ``path`` exists but is not a regular file (links followed): a FIFO or a device would block or flood a reader."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # missing or unreadable: the reader says so
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise InputError(path, f"is {file_kind(mode)}, not a regular file", expected=expected)


def open_regular_file(path: str | os.PathLike, *, expected: str) -> BinaryIO:
    """``path`` opened for reading without blocking, checked on the open file: a FIFO, device or directory is an InputError.

    A FIFO opened the usual way would wait for a writer for good. Missing or unreadable files raise the OSError, for the
    caller to word.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(path, f"is {file_kind(mode)}, not a regular file", expected=expected)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_regular_file(path: str | os.PathLike, *, max_bytes: int, expected: str) -> bytes:
    """The bytes of ``path`` (:func:`open_regular_file`), at most ``max_bytes`` of them or an InputError."""
    with open_regular_file(path, expected=expected) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > max_bytes:  # the reader holds several times the text in memory
            raise InputError(path, f"{size} bytes is too large", expected=f"at most {max_bytes >> 20} MiB")
        return handle.read(max_bytes + 1)


def file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _remove(temporary: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(temporary)


def strict_json_loads(text: str | bytes) -> Any:
    """JSON as dsprof writes it: no NaN or Infinity, floats that stay finite, integers of at most 308 digits.

    ``json.loads`` would read ``1e400`` as infinity and spend quadratic time on
    a huge integer; each of these raises ValueError (JSONDecodeError for bad
    syntax, RecursionError for deep nesting), for the caller to name its file.
    """
    return json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int, parse_float=_finite_float)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON (dsprof writes null for what it could not measure)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is beyond the range of a figure")
    return value


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > 308:
        raise ValueError(f"an integer of {digits} digits is beyond the range of a figure")
    return int(text)
