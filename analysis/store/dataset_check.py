"""The span dataset's edge: its manifest and Parquet parts checked before the first query.

A dataset directory may come from anywhere (copied, unpacked, crafted), so
:func:`~dsprof.analysis.store.dataset.open_dataset` trusts nothing in it:
``dataset.json`` is a bounded regular file with every field in the writer's type
and range; each part is ``time_window=<k>/<name>.parquet`` under the directory,
a regular file in a real folder (``lstat``: no symlink out, no FIFO); its schema
is the span schema, its row count the manifest's, its times within ``MAX_TIME_NS``
(so SQL cannot overflow int64). A failure is one InputError naming file and field.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dsprof.analysis.store.spans import MAX_TIME_NS, PROMOTED_INT_ATTRS, SPAN_SCHEMA
from dsprof.errors import InputError
from dsprof.fileio import strict_json_loads

# A manifest lists one entry per part: a few hundred bytes each; a bigger one was not written by dsprof.
MAX_MANIFEST_BYTES = 256 << 20
_PART_PATH = re.compile(r"time_window=(-?[0-9]{1,19})/[A-Za-z0-9_.-]{1,200}\.parquet")
INT64 = (-(1 << 63), (1 << 63) - 1)
COUNT = (0, (1 << 63) - 1)
# Columns every span row has: a null there is a broken part.
_NEVER_NULL = ("pid", "tid", "ts_ns", "dur_ns")
_TEXT_TYPES = (pa.string(), pa.large_string())
# Integer attribute columns (rank, step, ...): the log readers promote at most 18 digits (spans._INT_TEXT);
# a part holding more (int64's ends) would overflow the analysis' arithmetic on them.
_ATTRIBUTE_INTS = tuple(PROMOTED_INT_ATTRS.values())
_ATTRIBUTE_BOUND = 10**18


def read_manifest(path: Path) -> dict:
    """The manifest's JSON object: a regular file (lstat), bounded, valid JSON."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise InputError(path.parent, "span dataset has no dataset.json (incomplete: ingest did not finish)") from None
    except OSError as exc:
        raise InputError(path, f"cannot read the manifest: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(path, "the manifest is not a regular file", expected="dataset.json as written by dsprof ingest")
    if info.st_size > MAX_MANIFEST_BYTES:
        raise InputError(path, f"the manifest is larger than {MAX_MANIFEST_BYTES >> 20} MiB")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
        return strict_json_loads(raw)
    except OSError as exc:
        raise InputError(path, f"cannot read the manifest: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError; so is a 5,000-digit number
        raise InputError(path, f"cannot read the manifest: {str(exc).splitlines()[0][:200]}") from None


class Fields:
    """Type and range checks of one manifest's values; each failure names the manifest and the field."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, expected: str) -> InputError:
        return InputError(self.path, f"bad field {where}", expected=expected)

    def integer(self, value: Any, where: str, bounds: tuple[int, int] = INT64) -> int:
        if type(value) is not int or not bounds[0] <= value <= bounds[1]:
            raise self.fail(where, f"an integer in [{bounds[0]}, {bounds[1]}]")
        return value

    def text(self, value: Any, where: str) -> str:
        if type(value) is not str:
            raise self.fail(where, "text")
        return value

    def obj(self, value: Any, where: str, *, optional: bool = False) -> dict | None:
        if value is None and optional:
            return None
        if type(value) is not dict:
            raise self.fail(where, "a JSON object" + (" or null" if optional else ""))
        return value

    def items(self, value: Any, where: str) -> list:
        """A list (absent: empty)."""
        if value is None:
            return []
        if type(value) is not list:
            raise self.fail(where, "a list")
        return value

    def row(self, value: Any, where: str, kinds: str) -> list:
        """A list of fixed length whose members are integers (``i``) or text (``s``), as ``kinds`` says."""
        if type(value) is not list or len(value) != len(kinds):
            raise self.fail(where, f"a list of {len(kinds)} values")
        return [
            self.integer(v, f"{where}[{i}]") if k == "i" else self.text(v, f"{where}[{i}]")
            for i, (v, k) in enumerate(zip(value, kinds, strict=True))
        ]


def check_trace_fields(fields: Fields, side: Any) -> dict:
    """The manifest's ``trace`` block, every member checked (absent members read as empty)."""
    side = fields.obj({} if side is None else side, "trace") or {}
    dropped = fields.obj(side.get("dropped") or {}, "trace.dropped") or {}
    return {
        "files": [fields.text(f, f"trace.files[{i}]") for i, f in enumerate(fields.items(side.get("files"), "trace.files"))],
        "records_read": fields.integer(side.get("records_read", 0), "trace.records_read", COUNT),
        "lines_read": fields.integer(side.get("lines_read", 0), "trace.lines_read", COUNT),
        "dropped": {str(k): fields.integer(v, f"trace.dropped.{k}", COUNT) for k, v in dropped.items()},
        "drop_sites": {
            str(k): fields.text(v, f"trace.drop_sites.{k}")
            for k, v in (fields.obj(side.get("drop_sites") or {}, "trace.drop_sites") or {}).items()
        },
        "anchors": [_anchor(fields, a, f"trace.anchors[{i}]") for i, a in enumerate(fields.items(side.get("anchors"), "trace.anchors"))],
        "chip_devices": [
            fields.row(c, f"trace.chip_devices[{i}]", "is")
            for i, c in enumerate(fields.items(side.get("chip_devices"), "trace.chip_devices"))
        ],
        "process_names": [
            fields.row(p, f"trace.process_names[{i}]", "is")
            for i, p in enumerate(fields.items(side.get("process_names"), "trace.process_names"))
        ],
        "thread_names": [
            fields.row(t, f"trace.thread_names[{i}]", "iis")
            for i, t in enumerate(fields.items(side.get("thread_names"), "trace.thread_names"))
        ],
        "performance_summary": fields.obj(side.get("performance_summary"), "trace.performance_summary", optional=True),
        "faults": fields.obj(side.get("faults"), "trace.faults", optional=True),
        "notes": [fields.text(n, f"trace.notes[{i}]") for i, n in enumerate(fields.items(side.get("notes"), "trace.notes"))],
    }


def _anchor(fields: Fields, value: Any, where: str) -> list:
    """[pid, mono_ns, wall_ns], the times in [0, MAX_TIME_NS) as the log reader keeps them."""
    pid, mono, wall = fields.row(value, where, "iii")
    for i, ns in ((1, mono), (2, wall)):
        fields.integer(ns, f"{where}[{i}]", (0, MAX_TIME_NS - 1))
    return [pid, mono, wall]


def check_part_entries(fields: Fields, directory: Path, files: Any) -> list[tuple[Path, int]]:
    """(path, rows) of each part the manifest lists: confined to ``directory``, regular files (see module docstring)."""
    parts = []
    for i, entry in enumerate(fields.items(files, "files")):
        where = f"files[{i}]"
        entry = fields.obj(entry, where) or {}
        relative = fields.text(entry.get("path"), f"{where}.path")
        match = _PART_PATH.fullmatch(relative)
        if match is None:
            raise fields.fail(f"{where}.path {relative[:200]!r}", "time_window=<k>/<name>.parquet inside the dataset")
        window = fields.integer(entry.get("window"), f"{where}.window")
        if str(window) != match.group(1):
            raise fields.fail(f"{where}.window", f"the window of its path, {match.group(1)}")
        rows = fields.integer(entry.get("rows"), f"{where}.rows", COUNT)
        for bound in ("min_ts_ns", "max_ts_ns"):
            if entry.get(bound) is not None:
                fields.integer(entry[bound], f"{where}.{bound}")
        parts.append((_confined_part(directory, relative), rows))
    return parts


def _confined_part(directory: Path, relative: str) -> Path:
    """``directory / relative``, its folder a real folder and the part a regular file (neither followed if a link)."""
    path = directory / relative
    for node, kind, test in ((path.parent, "a folder", stat.S_ISDIR), (path, "a regular file", stat.S_ISREG)):
        try:
            mode = os.lstat(node).st_mode
        except OSError as exc:
            raise InputError(node, f"span dataset part missing or unreadable: {exc.strerror or exc}") from None
        if not test(mode):
            raise InputError(node, "span dataset part is not " + kind + " (links and special files are refused)")
    return path


def check_part(path: Path, rows: int) -> None:
    """One Parquet part: readable, of the span schema, ``rows`` rows, times never null and within MAX_TIME_NS."""
    try:
        part = pq.ParquetFile(path)
        schema = part.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(path, f"not a readable Parquet file: {_first_line(exc)}") from None
    with part:
        if schema.names != SPAN_SCHEMA.names:
            raise InputError(path, "Parquet columns are not the span table's", expected=", ".join(SPAN_SCHEMA.names))
        for field, want in zip(schema, SPAN_SCHEMA, strict=True):
            if not _same_type(field.type, want.type):
                raise InputError(path, f"column {field.name} is {field.type}", expected=str(want.type))
        if part.metadata.num_rows != rows:
            raise InputError(path, f"{part.metadata.num_rows} rows, the manifest says {rows}")
        for group in range(part.metadata.num_row_groups):
            _check_row_group(path, part, group)


def _same_type(have: pa.DataType, want: pa.DataType) -> bool:
    if pa.types.is_map(want):
        return pa.types.is_map(have) and have.key_type in _TEXT_TYPES and have.item_type in _TEXT_TYPES
    if want == pa.string():
        return have in _TEXT_TYPES
    return have == want


def _check_row_group(path: Path, part: pq.ParquetFile, group: int) -> None:
    """Nulls and time range of one row group, from its statistics (or its columns where they have none)."""
    meta = part.metadata.row_group(group)
    index = {meta.column(c).path_in_schema: c for c in range(meta.num_columns)}
    low: dict[str, int] = {}
    high: dict[str, int] = {}
    for name in (*_NEVER_NULL, *_ATTRIBUTE_INTS):
        stats = meta.column(index[name]).statistics
        if stats is not None and stats.has_null_count and (stats.has_min_max or stats.null_count == meta.num_rows):
            nulls, lo, hi = stats.null_count, stats.min if stats.has_min_max else None, stats.max if stats.has_min_max else None
        else:
            column = part.read_row_group(group, columns=[name]).column(0)
            nulls, (lo, hi) = column.null_count, (v.as_py() for v in pc.min_max(column).values())
        if nulls and name in _NEVER_NULL:
            raise InputError(path, f"{nulls} null value(s) in column {name} (row group {group})", expected="a value on every span row")
        if lo is not None and hi is not None:
            low[name], high[name] = int(lo), int(hi)
            if name in _ATTRIBUTE_INTS and not -_ATTRIBUTE_BOUND < low[name] <= high[name] < _ATTRIBUTE_BOUND:
                raise InputError(
                    path, f"column {name} out of range (row group {group})", expected="at most 18 digits, as the log readers take"
                )
    if "ts_ns" not in low or "dur_ns" not in low:  # no rows
        return
    if low["ts_ns"] <= -MAX_TIME_NS or high["ts_ns"] >= MAX_TIME_NS or low["dur_ns"] < 0 or high["ts_ns"] + high["dur_ns"] >= MAX_TIME_NS:
        raise InputError(
            path,
            f"ts_ns/dur_ns out of range (row group {group})",
            expected=f"times within ±2^{MAX_TIME_NS.bit_length() - 1} ns and durations >= 0",
        )


def corrupt_part(paths: list[Path]) -> InputError | None:
    """After a query failed: the first part whose data (not just its footer) cannot be decoded, as an InputError naming it.

    Reads every part a row group at a time, so it costs a pass over the
    dataset only on this error path, in bounded memory.
    """
    for path in paths:
        try:
            with pq.ParquetFile(path) as part:
                for group in range(part.metadata.num_row_groups):
                    part.read_row_group(group)
        except (pa.ArrowException, OSError, ValueError) as exc:
            return InputError(path, f"corrupt Parquet data: {_first_line(exc)}")
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
