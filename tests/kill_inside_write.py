"""Run a dsprof command that SIGKILLs itself part-way through writing one output (for tests/test_crash_safety.py).

    python tests/kill_inside_write.py NAME BYTES EVIDENCE -- dsprof arguments...

``dsprof.fileio.atomic_output`` is wrapped before the command's modules import
it: the handle of the output called NAME writes its first BYTES bytes, flushes
them into the temporary file, records in EVIDENCE (JSON) which temporary file
that was and how much of it was written, then the process kills itself with
SIGKILL, so the kill lands inside that write, on a half-written temporary file.
Other outputs are written as usual. No product code knows about this.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dsprof import fileio

_real_atomic_output = fileio.atomic_output


class _KillingHandle:
    """A file handle that dies by SIGKILL once ``limit`` bytes went through it; every other use passes through."""

    def __init__(self, handle: Any, limit: int, evidence: Path):
        self.handle, self.limit, self.evidence, self.written = handle, limit, evidence, 0

    def write(self, data: bytes) -> int:
        if self.written + len(data) < self.limit:
            self.written += self.handle.write(data)
            return len(data)
        self.handle.write(bytes(memoryview(data)[: self.limit - self.written]))
        self.handle.flush()  # the part written is in the temporary file, as a crash would leave it
        temporary = os.readlink(f"/proc/self/fd/{self.handle.fileno()}")
        self.evidence.write_text(json.dumps({"temporary": temporary, "written": self.limit, "pid": os.getpid()}))
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable: SIGKILL cannot be caught")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


def _wrap(target: str, limit: int, evidence: Path):
    @contextlib.contextmanager
    def atomic_output(path: str | os.PathLike, dir_fd: int | None = None) -> Iterator[Any]:
        with _real_atomic_output(path, dir_fd) as handle:
            yield _KillingHandle(handle, limit, evidence) if Path(path).name == target else handle

    return atomic_output


def main() -> None:
    target, limit, evidence, separator, *arguments = sys.argv[1:]
    if separator != "--" or int(limit) < 1:
        raise SystemExit(f"usage: {sys.argv[0]} NAME BYTES EVIDENCE -- dsprof arguments...")
    fileio.atomic_output = _wrap(target, int(limit), Path(evidence))  # type: ignore[assignment]
    from dsprof.cli.main import cli  # imported after the wrap, so that every writer binds the wrapped function

    cli(arguments, prog_name="dsprof")


if __name__ == "__main__":
    main()
