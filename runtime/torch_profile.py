"""A rank's torch.profiler recording (``dsprof run --torch-profiler``): one Kineto trace per rank beside STRACE.

:class:`RankProfile` records the rank's decode loop and writes
``torch-profiler/rank<r>.json``. While it records, :func:`label` and
:func:`open_label` put the runtime's phases into the trace as
``record_function`` labels (:mod:`dsprof.profiler.torch_labels`); while it does
not, they cost a module flag test, so a run without the flag is the run it was.
All threads are recorded (``profile_all_threads``): the CPU device's executor
runs every program. Details: docs/RUNTIME.md, "torch.profiler traces".
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from dsprof.fileio import atomic_write_bytes
from dsprof.profiler import artifacts

_ON = False  # a RankProfile records in this process


def recording() -> bool:
    """Whether a RankProfile records in this process (labels cost nothing otherwise)."""
    return _ON


def label(name: str | None) -> contextlib.AbstractContextManager:
    """A ``record_function`` label around a block while the profile records; nothing otherwise (or for None)."""
    return record_function(name) if _ON and name is not None else contextlib.nullcontext()


def open_label(name: str) -> record_function | None:
    """Open a label that another place closes (:func:`close_label`); None while the profile does not record."""
    if not _ON:
        return None
    handle = record_function(name)
    handle.__enter__()
    return handle


def close_label(handle: record_function | None) -> None:
    if handle is not None:
        handle.__exit__(None, None, None)


class RankProfile:
    """torch.profiler over one rank's decode loop: CPU activities, and CUDA's where CUDA is available."""

    def __init__(self, out_dir: Path, rank: int):
        self.path = out_dir / artifacts.TORCH_PROFILER_DIR / artifacts.torch_profile_name(rank)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        self._profile: profile | None = profile(activities=activities, experimental_config=config)

    def start(self) -> None:
        global _ON
        assert self._profile is not None
        self._profile.start()
        _ON = True

    def stop(self) -> None:
        """Stop recording and write the trace (atomically: the temporary name is no ``*.json``). Once."""
        global _ON
        prof, self._profile = self._profile, None
        if prof is None:
            return
        _ON = False
        prof.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        try:
            prof.export_chrome_trace(str(temporary))
            atomic_write_bytes(self.path, temporary.read_bytes())
        finally:
            temporary.unlink(missing_ok=True)


def remove_stale(out_dir: Path) -> None:
    """Remove the traces an earlier run left in ``out_dir`` (a run without the flag must not be read with them)."""
    folder = out_dir / artifacts.TORCH_PROFILER_DIR
    if folder.is_dir():
        for stale in folder.iterdir():
            if artifacts.TORCH_PROFILE_PATTERN.match(stale.name):
                stale.unlink(missing_ok=True)
