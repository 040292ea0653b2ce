"""Outputs replaced atomically: every file dsprof writes goes through here.

A file is written to a temporary file in the same directory, flushed to disk
and renamed over the target, so a reader (or a crash, a full disk, a SIGKILL)
only ever sees the previous complete file or the new one. Only a regular file
or a missing path is written or opened as input; a link, FIFO or device is
refused. Inside directories others can write to, files are named relative to a
directory descriptor (:func:`open_dir`), never by a path resolved again.
Details: docs/ARCHITECTURE.md, "Writing outputs".
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
def atomic_output(path: str | os.PathLike, dir_fd: int | None = None) -> Iterator[BinaryIO]:
    """A binary file handle whose content replaces ``path`` only when the block ends without error.

    With ``dir_fd``, the file is ``path``'s name in that directory (``path`` is what messages show).
    """
    path = Path(path)
    try:
        with contextlib.ExitStack() as stack:
            if dir_fd is None:
                path.parent.mkdir(parents=True, exist_ok=True)
                dir_fd = stack.enter_context(open_dir(path.parent, follow=True))
            refuse_non_regular(path, dir_fd=dir_fd)
            with _atomic_output_at(dir_fd, path) as handle:
                yield handle
    except OSError as exc:
        raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None


@contextlib.contextmanager
def _atomic_output_at(dir_fd: int, path: Path) -> Iterator[BinaryIO]:
    """The temporary file beside ``path.name`` in ``dir_fd``, renamed over it there when complete."""
    fd, temporary = _create_temporary(dir_fd, path.name)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        refuse_non_regular(path, dir_fd=dir_fd)  # again: something may have been put there while the file was written
        os.replace(temporary, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        with contextlib.suppress(OSError):  # the rename itself on disk, where the platform allows it
            os.fsync(dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            unlink_at(dir_fd, temporary)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes | memoryview, dir_fd: int | None = None) -> Path:
    with atomic_output(path, dir_fd) as handle:
        handle.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str, dir_fd: int | None = None) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), dir_fd)


def open_append(path: str | os.PathLike) -> int:
    """A descriptor appending to ``path`` (a regular file, created if absent): a link there is refused, never written through."""
    refuse_non_regular(path, "append to")
    try:  # no link followed, and a FIFO swapped in meanwhile fails at once instead of blocking
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise OutputError(f"{path}: cannot append: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OutputError(f"{path}: refusing to append to {file_kind(mode)} (only a regular file or a new path is written)")
    return fd


def atomic_append_text(path: str | os.PathLike, text: str) -> Path:
    """Append ``text`` to ``path`` (a regular file, created if absent) as one write, then flush it to disk."""
    path = Path(path)
    data = text.encode("utf-8")
    fd = open_append(path)
    try:
        written = os.write(fd, data)
        if written != len(data):  # a full disk or a file size limit: say so rather than leave a torn block unnoticed
            raise OutputError(f"{path}: cannot append: wrote {written} of {len(data)} bytes")
        os.fsync(fd)
    except OSError as exc:
        raise OutputError(f"{path}: cannot append: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return path


def _create_temporary(dir_fd: int, name: str) -> tuple[int, str]:
    """A new hidden file beside ``name``, created with mode 0666 so that the umask decides (``mkstemp`` would force 0600)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    for _ in range(_NAME_TRIES):
        temporary = f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(temporary, flags, 0o666, dir_fd=dir_fd), temporary
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", name)


@contextlib.contextmanager
def open_dir(path: str | os.PathLike, dir_fd: int | None = None, *, follow: bool = False) -> Iterator[int]:
    """A descriptor of the directory ``path`` (its name in ``dir_fd``, if given), closed after the block.

    A link there is refused with an OutputError naming ``path`` unless ``follow``
    (only for the directory the user named, so that it is resolved once).
    """
    name = Path(path).name if dir_fd is not None else path
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        mode = os.lstat(name, dir_fd=dir_fd).st_mode
        kind = "a file" if stat.S_ISREG(mode) else file_kind(mode)
        raise OutputError(f"{path}: refusing to write into {kind} (a real directory is expected)") from None
    try:
        yield fd
    finally:
        os.close(fd)


def move_regular(name: str, src_fd: int, dst_fd: int) -> None:
    """Rename the regular file ``name`` from one directory descriptor to another; absent is no error, a link is refused."""
    try:
        mode = os.lstat(name, dir_fd=src_fd).st_mode
        if not stat.S_ISREG(mode):
            raise OutputError(f"{name}: refusing to move {file_kind(mode)} (only a regular file is moved)")
        os.replace(name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
    except FileNotFoundError:
        pass


def unlink_at(dir_fd: int, name: str) -> None:
    """Remove ``name`` in ``dir_fd`` (a link itself, never what it points at); a missing file is no error."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def refuse_non_regular(path: str | os.PathLike, action: str = "replace", dir_fd: int | None = None) -> None:
    """OutputError unless ``path`` (its name in ``dir_fd``, if given) is missing or a regular file (``lstat``: a link counts as a link)."""
    try:
        mode = os.lstat(Path(path).name if dir_fd is not None else path, dir_fd=dir_fd).st_mode
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
