"""A file a follower reads on as it grows (:mod:`.follow`, :mod:`.fragment_follow`), and what it is known by.

A :class:`FollowedFile` is known by its device, inode and first bytes, so
that a file replaced (another inode at the path), truncated (shorter than
what was read) or rewritten in place (its first bytes changed: copytruncate,
then an ``O_APPEND`` writer's new records past the old size, all within one
poll) is noticed, never read on from an offset that now lies in other bytes.
It is opened without blocking and checked on the open file
(:func:`~dsprof.fileio.open_regular_file`): a FIFO, device or directory put
at a followed path is refused in one line naming it instead of blocking
``open()`` for good. Its descriptor can be let go and taken again
(:meth:`FollowedFile.open`): the file found then is read on only if it is
still the one read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from dsprof.errors import InputError
from dsprof.fileio import open_regular_file

# A file's first bytes, kept and compared every poll: changed, the file was written again from its start.
HEAD_BYTES = 4096


class FollowedFile:
    """One followed file: its identity (device, inode, first bytes), the bytes read, and its descriptor while open."""

    def __init__(self, path: Path, expected: str):
        self.path, self.expected = path, expected
        self.handle: BinaryIO | None = None
        self.identity: tuple[int, int] | None = None  # (device, inode)
        self.read = 0  # bytes read from the file
        self.head = b""  # its first bytes, up to HEAD_BYTES
        self.open()

    def open(self) -> bool:
        """Take a descriptor on the path (again, after :meth:`close`); whether it is still the file read before.

        If it is, reading goes on where it stood; if not (or on the first open), from its start.
        """
        try:
            self.handle = open_regular_file(self.path, expected=self.expected)
        except OSError as exc:
            raise InputError(self.path, f"cannot read: {exc.strerror or exc}") from None
        status = os.fstat(self.handle.fileno())
        same = (status.st_dev, status.st_ino) == self.identity and not self.rewritten()
        if not same:
            self.identity = (status.st_dev, status.st_ino)
            self.restart()
        self.handle.seek(self.read)
        return same

    def named_by(self, status: os.stat_result | None) -> bool:
        """Whether ``status`` (the path's ``os.stat``, None if it is gone) is this file's."""
        return status is not None and (status.st_dev, status.st_ino) == self.identity

    def rewritten(self) -> bool:
        """Whether the open file is shorter than what was read, or its first bytes are no longer those read."""
        assert self.handle is not None
        fd = self.handle.fileno()
        if os.fstat(fd).st_size < self.read:
            return True
        return bool(self.head) and os.pread(fd, len(self.head), 0) != self.head

    def restart(self) -> None:
        """Read the open file again from its start: nothing read, no first bytes known."""
        assert self.handle is not None
        self.handle.seek(0)
        self.read, self.head = 0, b""

    def read_more(self, size: int) -> bytes:
        """Up to ``size`` more bytes, the first ones kept to know the file by."""
        assert self.handle is not None
        data = self.handle.read(size)
        if len(self.head) < HEAD_BYTES:
            self.head += data[: HEAD_BYTES - len(self.head)]
        self.read += len(data)
        return data

    def close(self) -> None:
        """Let the descriptor go; what the file is known by stays, for :meth:`open` to check."""
        if self.handle is not None:
            self.handle.close()
        self.handle = None


__all__ = ["HEAD_BYTES", "FollowedFile"]
