"""Reader for SA_PROFILE serving traces (SPEC §1): fragment JSONL files and the merged trace.json.

What a path may be, and what is read:

* an SA_PROFILE output directory: its ``trace.json`` when present (the merge
  already holds every fragment), else its ``fragments/trace.<pid>.jsonl``;
* a fragments directory (holding ``*.jsonl``), or one ``.jsonl`` fragment;
* a merged ``trace.json``, or an SA_PROFILE ``.json`` output path whose
  merge was never written (then ``<path>.fragments/`` is read).

Fragments hold one Chrome event per line; a line that is not a JSON object
(a torn last line after a crash, garbage) is skipped and counted as
``bad_json``. A fragment none of whose lines parse is unreadable:
:class:`InputError` names its first bad line. Events are converted by
:func:`dsprof.analysis.ingest.chrome.events_to_trace` with
``source="sa_profile"``; ``line`` is the fragment's 1-based line number, or the
event's index in a merged ``trace.json``.
"""

from __future__ import annotations

import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Callable

from dsprof.analysis.ingest.chrome import events_to_trace, read_chrome_trace
from dsprof.analysis.spans import Trace, merge_traces
from dsprof.errors import InputError
from dsprof.profiler import artifacts

SOURCE = "sa_profile"

Progress = Callable[[str], None] | None


def sa_profile_files(path: Path) -> list[Path]:
    """The files to read for an SA_PROFILE path (see the module docstring); [] if none."""
    if path.is_dir():
        if (path / artifacts.MERGED_TRACE).is_file():
            return [path / artifacts.MERGED_TRACE]
        if (path / artifacts.FRAGMENTS_DIR).is_dir():
            return artifacts.fragment_files(path / artifacts.FRAGMENTS_DIR)
        return artifacts.fragment_files(path)
    if path.is_file():
        return [path]
    fragments = artifacts.fragments_dir(path)
    if path.suffix == ".json" and fragments.is_dir():
        return artifacts.fragment_files(fragments)
    return []


def read_sa_profile(path: str | os.PathLike, progress: Progress = None) -> Trace:
    """Read an SA_PROFILE output dir, fragments dir, fragment or merged trace into one Trace."""
    path = Path(path)
    files = sa_profile_files(path)
    if not files:
        if not path.exists():
            raise InputError(path, "no such file or directory")
        raise InputError(path, "no SA_PROFILE trace here", expected="trace.json or fragments/trace.<pid>.jsonl")
    traces = []
    for file in files:
        if progress is not None:
            progress(f"reading {file}")
        if file.suffix == ".jsonl":
            traces.append(read_fragment(file))
        else:
            traces.append(read_chrome_trace(file, source=SOURCE))
    return merge_traces(traces)


def read_fragment(path: Path) -> Trace:
    """One ``trace.<pid>.jsonl`` fragment: one event per line, bad lines counted as ``bad_json``."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    events: list[tuple[int, dict]] = []
    bad_json = 0
    first_bad: int | None = None
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            event = json.loads(line, parse_float=Decimal)
        except (json.JSONDecodeError, UnicodeDecodeError):
            event = None
        if not isinstance(event, dict):
            bad_json += 1
            first_bad = first_bad or number
            continue
        events.append((number, event))
    if not events and first_bad is not None:
        raise InputError(path, "no line is a JSON event", line=first_bad, expected="one Chrome trace event per line")
    return events_to_trace(events, str(path), SOURCE, dropped={"bad_json": bad_json}, records_read=bad_json)
