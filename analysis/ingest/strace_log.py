"""Reader for STRACE host-span records in any text log (SPEC §2).

The log is read as bytes and cut into lines without copying (an Arrow string
array whose offsets are the newline positions); every line that holds a
``[STRACE]`` marker is split at the marker, and one regular expression over the
whole column extracts the fields of every well-formed record. Only records
that fail that expression (torn, split across lines, garbled, other
versions) take a Python path, to rejoin continuation lines or to name the
reason the record is dropped.

Reading rules (also what ``Trace.dropped`` counts):

* a record may sit anywhere in a line, after the ``[mono_ns=..][T0x..][LEVEL]
  func: `` prefix or not, and a line may hold several records;
* a record cut by a newline is rejoined with up to
  :data:`MAX_CONTINUATION_LINES` following lines when that completes it
  (the newline removed, or replaced by a space where that is what parses);
* a record with ``v`` other than 1 is skipped: ``unknown_version``;
* a record that stops before its required fields are complete:
  ``torn_record``; one whose required fields are out of order or absent:
  ``missing_field``; one whose fields are all there but a value does not
  parse (or overflows 64 bits): ``bad_value``;
* the same for ``[CLOCK_ANCHOR]`` lines (``bad_anchor``) and
  ``[chip_process ...] ready`` lines (``bad_chip_process``);
* unrelated log text is ignored and not counted as dropped; the number of
  lines read is kept in ``Trace.extras["lines_read"]``.

Column conventions for STRACE rows: ``source="strace"``, ``cat=""``,
``ph="X"``, ``line`` is the line the record starts on. The ``clk`` attribute
becomes the ``clk`` column (``"dev"`` when ``clk=dev``, else ``"host"``) and is
not repeated in ``attrs``; every other trailing ``k=v`` attribute, known or not,
is kept in ``attrs`` with keys and values percent-decoded.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.spans import ATTRS_TYPE, SPAN_SCHEMA, Trace, spans_from_arrow
from dsprof.errors import InputError
from dsprof.profiler.strace_format import STRACE_VERSION, decode_value

STRACE_MARKER = "[STRACE]"
MAX_CONTINUATION_LINES = 3
# Lines handled per vectorised pass; bounds the temporary copies of a big log.
LINES_PER_BATCH = 1 << 18

REQUIRED_FIELDS = ("v", "pid", "tid", "inv", "hid", "depth", "name", "ts", "dur")
# A token of the k=v grammar: no spaces, brackets or '=' (they are escaped).
_TOKEN = r"[^\s\[\]=]"
# One record after its "[STRACE]" marker. Digit counts are capped so that
# casting cannot overflow by more than the range check below catches.
STRACE_PATTERN = (
    r"^ v=(?P<v>\d{1,9}) pid=(?P<pid>-?\d{1,19}) tid=(?P<tid>-?\d{1,19}) inv=(?P<inv>\d{1,20})"
    r" hid=(?P<hid>" + _TOKEN + r"+) depth=(?P<depth>\d{1,19}) name=(?P<name>" + _TOKEN + r"*)"
    r" ts=(?P<ts>-?\d{1,19}) dur=(?P<dur>-?\d{1,19})"
    r"(?P<tail>(?: +" + _TOKEN + r"+=" + _TOKEN + r"*)*)(?:\s|\[|$)"
)
_STRACE_RE = re.compile(STRACE_PATTERN, re.ASCII)
_FIELDS = ("v", "pid", "tid", "inv", "hid", "depth", "name", "ts", "dur", "tail")

ANCHOR_PATTERN = r"\[CLOCK_ANCHOR\] v=(?P<v>\d{1,9}) pid=(?P<pid>\d{1,19}) mono_ns=(?P<mono_ns>-?\d{1,19}) wall_ns=(?P<wall_ns>-?\d{1,19})(?:\s|\[|$)"
CHIP_PATTERN = r"\[chip_process pid=(?P<pid>\d{1,19}) dev=(?P<device>" + _TOKEN + r"+)\] ready"

_INT64_MAX = str(2**63 - 1)
_INT64_MIN_ABS = str(2**63)
_UINT64_MAX = str(2**64 - 1)

Progress = Callable[[str], None] | None


def read_strace_log(path: str | os.PathLike, progress: Progress = None) -> Trace:
    """Read every STRACE record, clock anchor and chip_process line of a text log."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    return parse_strace_bytes(data, str(path), progress=progress)


def parse_strace_bytes(data: bytes, file: str, progress: Progress = None) -> Trace:
    """Parse a whole log held in memory; ``file`` names it in rows and errors."""
    data, binary_at = _as_utf8(data)
    log = _Log(data)
    n_lines = len(log.lines)
    dropped: dict[str, int] = {}

    batches: list[pa.Table] = []
    slow: list[_SlowRecord] = []
    for start in range(0, n_lines, LINES_PER_BATCH):
        table, batch_slow = _extract_batch(log, start, min(start + LINES_PER_BATCH, n_lines))
        if table.num_rows:
            batches.append(table)
        slow.extend(batch_slow)
        if progress is not None and n_lines > LINES_PER_BATCH:
            progress(f"{file}: {min(start + LINES_PER_BATCH, n_lines):,}/{n_lines:,} lines")
    slow.extend(_marker_split_records(log))

    recovered = _finish_slow_records(slow, log, dropped)
    if recovered:
        batches.append(
            pa.table(
                {"line": pa.array([line for line, _ in recovered], pa.int64())}
                | {f: pa.array([groups[f] for _, groups in recovered], pa.large_string()) for f in _FIELDS}
            )
        )
    records_found = sum(t.num_rows for t in batches) + len(slow) - len(recovered)
    fields = pa.concat_tables(batches) if batches else None
    if recovered:  # records from the slow path go back to the place of their first line
        fields = fields.take(pc.sort_indices(fields, [("line", "ascending")]))

    anchors = _anchors(log.lines, dropped)
    chips = _chip_devices(log.lines, dropped)
    spans = _spans_from_fields(fields, file, dropped)

    if len(spans) == 0 and len(anchors) == 0 and len(chips) == 0 and records_found == 0 and binary_at is not None:
        raise InputError(file, "binary data, not a text log", line=binary_at, expected="a text log with [STRACE] records")

    return Trace(
        spans=spans,
        anchors=anchors,
        chip_devices=chips,
        dropped={k: v for k, v in dropped.items() if v},
        records_read=records_found + len(anchors) + len(chips) + dropped.get("bad_anchor", 0) + dropped.get("bad_chip_process", 0),
        files=[file],
        extras={"lines_read": n_lines},
    )


def _as_utf8(data: bytes) -> tuple[bytes, int | None]:
    """Valid UTF-8 for Arrow's string kernels, and the 1-based line of the first binary byte (or None).

    Invalid bytes become U+FFFD so that the rest of a partly damaged log is still read.
    """
    whole = pa.Array.from_buffers(pa.large_binary(), 1, [None, pa.py_buffer(np.array([0, len(data)], np.int64)), pa.py_buffer(data)])
    first_bad = []
    try:
        whole.cast(pa.large_string())
    except pa.ArrowInvalid:
        text = data.decode("utf-8", errors="replace")
        first_bad.append(text[: text.find("\ufffd")].count("\n") + 1)
        data = text.encode("utf-8")
    nul = data.find(b"\x00")
    if nul >= 0:
        first_bad.append(data[:nul].count(b"\n") + 1)
    return data, (min(first_bad) if first_bad else None)


class _Log:
    """The log's bytes and its lines as a zero-copy Arrow array (each line keeps its newline)."""

    def __init__(self, data: bytes):
        self.buf = np.frombuffer(data, dtype=np.uint8)
        step = 1 << 24  # bounded temporaries while finding newlines
        newlines = [np.flatnonzero(self.buf[i : i + step] == 10) + i for i in range(0, len(self.buf), step)]
        ends = np.concatenate(newlines + [np.empty(0, np.int64)]).astype(np.int64) + 1
        if len(self.buf) and (len(ends) == 0 or ends[-1] != len(self.buf)):
            ends = np.append(ends, len(self.buf))
        self.offsets = np.concatenate([np.zeros(1, np.int64), ends])
        self.lines = pa.Array.from_buffers(pa.large_string(), len(ends), [None, pa.py_buffer(self.offsets), pa.py_buffer(data)])

    def text(self, index: int) -> str:
        """One line without its line break."""
        return self.lines[index].as_py().rstrip("\r\n")

    def may_continue(self, index: np.ndarray) -> np.ndarray:
        """Whether line ``index + 1`` exists and could continue a record (does not open with '[' or end at once)."""
        nxt = index + 1
        exists = nxt < len(self.lines)
        first = np.full(len(index), ord("["), np.uint8)
        first[exists] = self.buf[self.offsets[nxt[exists]]]
        return exists & (first != ord("[")) & (first != ord("\n")) & (first != ord("\r"))


# A record for the Python path: the line it starts on (0-based), its text after
# the marker up to the end of that line or the next marker, and the line that
# may continue it (None when something else follows it on its line).
_SlowRecord = tuple[int, str, int | None]
# Characters the record pattern matches besides its groups: " v=", " pid=", ...
_LITERAL_BYTES = sum(len(f" {name}=") for name in REQUIRED_FIELDS)


def _extract_batch(log: _Log, first: int, stop: int) -> tuple[pa.Table, list[_SlowRecord]]:
    """Fields of every well-formed record in lines [first, stop); the rest go to the Python path.

    Also sent there: well-formed records that end their line when the next line
    could be the rest of them (a newline injected inside the attributes); in a
    log whose lines carry the usual prefix the next line opens with '[' and
    rules that out at once.
    """
    batch = log.lines.slice(first, stop - first)
    has_marker = pc.match_substring(batch, STRACE_MARKER)
    line_index = np.flatnonzero(has_marker.to_numpy(zero_copy_only=False)) + first
    pieces = pc.split_pattern(batch.filter(has_marker), STRACE_MARKER)
    list_offsets = pieces.offsets.to_numpy()
    flat = pieces.flatten()
    parent = pc.list_parent_indices(pieces).to_numpy()
    is_record = np.ones(len(flat), dtype=bool)
    is_record[list_offsets[:-1]] = False  # the text before the first marker
    is_last = np.zeros(len(flat), dtype=bool)
    is_last[list_offsets[1:] - 1] = True
    segments = flat.filter(pa.array(is_record))
    seg_line = line_index[parent[is_record]]
    seg_last = is_last[is_record]

    fields = pc.extract_regex(segments, STRACE_PATTERN)
    matched = fields.is_valid().to_numpy(zero_copy_only=False)
    continues = seg_last & log.may_continue(seg_line)
    to_python = ~matched | continues
    slow = [
        (int(seg_line[i]), segments[int(i)].as_py().rstrip("\r\n"), int(seg_line[i]) + 1 if continues[i] else None)
        for i in np.flatnonzero(to_python)
    ]
    keep = pa.array(~to_python)
    table = pa.table({"line": pa.array(seg_line + 1, pa.int64()).filter(keep)} | {f: fields.field(f).filter(keep) for f in _FIELDS})
    return table, slow


def _marker_split_records(log: _Log) -> list[_SlowRecord]:
    """Records whose ``[STRACE]`` marker itself was cut by a newline (``[STR`` / ``ACE] v=1 ...``).

    Found by looking at the bytes just before each newline, so only the few
    candidate line pairs are examined in Python.
    """
    buf = log.buf
    marker = STRACE_MARKER.encode()
    found: list[_SlowRecord] = []
    newline_at = log.offsets[1:] - 1
    if len(newline_at) < 2:
        return found
    ends_with_newline = buf[newline_at] == 10
    for k in range(1, len(marker)):
        mask = ends_with_newline & (newline_at >= k)
        for j in range(k):
            mask &= buf[np.clip(newline_at - k + j, 0, None)] == marker[j]
        for i in np.flatnonzero(mask[:-1]):
            nxt = log.text(int(i) + 1)
            if nxt.startswith(STRACE_MARKER[k:]):
                rest = nxt[len(marker) - k :]
                cut = rest.find(STRACE_MARKER)
                found.append((int(i), rest if cut < 0 else rest[:cut], int(i) + 2 if cut < 0 else None))
    return found


def _finish_slow_records(slow: list[_SlowRecord], log: _Log, dropped: dict[str, int]) -> list[tuple[int, dict]]:
    """Rejoin records cut by newlines; count why the others are dropped."""
    recovered: list[tuple[int, dict]] = []
    for line_idx, segment, next_line in slow:
        match = _join_continuations(segment, next_line, log)
        if match and match.group("v") == str(STRACE_VERSION):
            recovered.append((line_idx + 1, match.groupdict()))
            continue
        reason = "unknown_version" if match else _drop_reason(segment)
        dropped[reason] = dropped.get(reason, 0) + 1
    return recovered


def _join_continuations(text: str, next_line: int | None, log: _Log) -> re.Match | None:
    """The record that ``text`` starts, extended over following lines while that completes it.

    An incomplete record takes the next line if the join parses (the newline
    removed, or read as a space); a complete one that ends its line takes the
    next line only if the join parses and uses that whole line, so unrelated
    text after a record is never glued to it.
    """
    match = _STRACE_RE.match(text)
    n_lines = len(log.lines)
    index = next_line
    for _ in range(MAX_CONTINUATION_LINES):
        if index is None or index >= n_lines or (match and not _open_end(match, text)):
            break
        if match is None and _version_of(text) not in (None, str(STRACE_VERSION)):
            break
        nxt = log.text(index)
        if not nxt or nxt.startswith("["):
            break
        cut = nxt.find(STRACE_MARKER)
        head = nxt if cut < 0 else nxt[:cut]
        extended = None
        for candidate in (text + head, text + " " + head):
            found = _STRACE_RE.match(candidate)
            if found and (match is None or _uses_all(found, candidate)):
                extended = (found, candidate)
                break
        if extended:
            match, text = extended
        elif match is None:
            text += head
        else:
            break
        if cut >= 0:
            break
        index += 1
    return match


def _uses_all(match: re.Match, text: str) -> bool:
    return not text[match.end("tail") :].strip()


def _open_end(match: re.Match, text: str) -> bool:
    """A parsed record the next line may still extend: nothing after it, or one cut token (``run`` of ``run_id=7``)."""
    leftover = text[match.end("tail") :]
    if not leftover.strip():
        return True
    token = leftover[1:]
    return leftover[0] == " " and not any(c.isspace() or c in "[]" for c in token)


def _version_of(segment: str) -> str | None:
    m = re.match(r" v=(\d+)(?:\s|$)", segment)
    return m.group(1) if m else None


def _drop_reason(segment: str) -> str:
    """Why a record that the record pattern rejects cannot be used."""
    version = _version_of(segment)
    if version is not None and version != str(STRACE_VERSION):
        return "unknown_version"
    body = segment.split("[", 1)[0]
    tokens = body.split()
    keys = [t.split("=", 1)[0] for t in tokens]
    if all(f in keys for f in REQUIRED_FIELDS):
        return "bad_value"
    # torn: the keys seen are the required ones in order, the last possibly cut short
    for i, key in enumerate(keys):
        if i >= len(REQUIRED_FIELDS):
            break
        complete = i < len(keys) - 1 or "=" in tokens[i] or body.endswith(" ")
        if key != REQUIRED_FIELDS[i] and (complete or not REQUIRED_FIELDS[i].startswith(key)):
            return "missing_field"
    return "torn_record"


def _count(dropped: dict[str, int], reason: str, n: int) -> None:
    if n:
        dropped[reason] = dropped.get(reason, 0) + int(n)


def _out_of_range(digits: pa.Array, signed: bool) -> np.ndarray:
    """Decimal strings (at most 20 digits by the pattern) that overflow int64 / uint64."""
    negative = pc.starts_with(digits, "-")
    magnitude = pc.utf8_ltrim(digits, "-")
    length = pc.utf8_length(magnitude)
    if signed:
        limit = pc.if_else(negative, pa.scalar(_INT64_MIN_ABS), pa.scalar(_INT64_MAX))
        over = pc.or_(pc.greater(length, 19), pc.and_(pc.equal(length, 19), pc.greater(magnitude, limit)))
    else:
        over = pc.and_(pc.equal(length, 20), pc.greater(magnitude, pa.scalar(_UINT64_MAX)))
    return over.to_numpy(zero_copy_only=False)


def _decode_where_escaped(values: pa.Array) -> pa.Array:
    """Percent-decode only the values that contain '%' (most contain none)."""
    escaped = pc.match_substring(values, "%").to_numpy(zero_copy_only=False)
    if not escaped.any():
        return values
    idx = np.flatnonzero(escaped)
    decoded = [decode_value(v) for v in values.take(pa.array(idx)).to_pylist()]
    out = values.to_pylist() if len(values) < 4 * len(idx) else None
    if out is not None:
        for i, v in zip(idx, decoded):
            out[i] = v
        return pa.array(out, values.type)
    positions = np.full(len(values), -1, np.int64)
    positions[idx] = np.arange(len(idx))
    candidates = pa.chunked_array([values, pa.array(decoded, values.type)]).combine_chunks()
    take = np.where(escaped, len(values) + positions, np.arange(len(values)))
    return candidates.take(pa.array(take))


def _attrs_and_clk(tail: pa.Array) -> tuple[pa.Array, pa.Array]:
    """The trailing ``k=v`` tokens as a map column, and the clk column taken out of them."""
    n = len(tail)
    tokens_list = pc.split_pattern(tail, " ")
    tokens = tokens_list.flatten()
    row = pc.list_parent_indices(tokens_list)
    nonempty = pc.not_equal(pc.utf8_length(tokens), 0)
    tokens, row = tokens.filter(nonempty), row.filter(nonempty)
    kv = pc.split_pattern(tokens, "=", max_splits=1)
    keys = pc.list_element(kv, 0)
    values = pc.list_element(kv, 1)
    is_clk = pc.equal(keys, "clk")
    clk = np.full(n, "host", dtype=object)
    clk_rows = row.filter(is_clk).to_numpy()
    clk_dev = pc.equal(values.filter(is_clk), "dev").to_numpy(zero_copy_only=False)
    clk[clk_rows[clk_dev]] = "dev"
    keep = pc.invert(is_clk)
    keys, values, row = keys.filter(keep), values.filter(keep), row.filter(keep).to_numpy()
    counts = np.bincount(row, minlength=n) if len(row) else np.zeros(n, np.int64)
    offsets = np.concatenate([np.zeros(1, np.int32), np.cumsum(counts, dtype=np.int32)])
    keys = _decode_where_escaped(keys.cast(pa.string()))
    values = _decode_where_escaped(values.cast(pa.string()))
    attrs = pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), keys, values, type=ATTRS_TYPE)
    return attrs, pa.array(clk, pa.string())


def _spans_from_fields(fields: pa.Table | None, file: str, dropped: dict[str, int]) -> pd.DataFrame:
    if fields is None or fields.num_rows == 0:
        return spans_from_arrow(SPAN_SCHEMA.empty_table())
    fields = fields.combine_chunks()
    col = {name: fields.column(name).chunk(0) if fields.column(name).num_chunks else fields.column(name) for name in fields.column_names}
    other_version = pc.not_equal(col["v"], str(STRACE_VERSION)).to_numpy(zero_copy_only=False)
    overflow = np.zeros(fields.num_rows, dtype=bool)
    for name in ("pid", "tid", "depth", "ts", "dur"):
        overflow |= _out_of_range(col[name], signed=True)
    overflow |= _out_of_range(col["inv"], signed=False)
    _count(dropped, "unknown_version", other_version.sum())
    bad = overflow & ~other_version
    _count(dropped, "bad_value", bad.sum())
    keep_mask = ~(other_version | bad)
    if not keep_mask.all():
        keep = pa.array(keep_mask)
        col = {k: v.filter(keep) for k, v in col.items()}
    n = len(col["line"])
    attrs, clk = _attrs_and_clk(col["tail"])
    table = pa.table(
        {
            "source": pa.repeat(pa.scalar("strace"), n),
            "file": pa.repeat(pa.scalar(file), n),
            "line": col["line"],
            "pid": col["pid"].cast(pa.int64()),
            "tid": col["tid"].cast(pa.int64()),
            "name": _decode_where_escaped(col["name"].cast(pa.string())),
            "cat": pa.repeat(pa.scalar(""), n),
            "ph": pa.repeat(pa.scalar("X"), n),
            "ts_ns": col["ts"].cast(pa.int64()),
            "dur_ns": col["dur"].cast(pa.int64()),
            "inv": col["inv"].cast(pa.uint64()),
            "hid": _decode_where_escaped(col["hid"].cast(pa.string())),
            "depth": col["depth"].cast(pa.int64()),
            "clk": clk,
            "attrs": attrs,
        },
        schema=SPAN_SCHEMA,
    )
    return spans_from_arrow(table)


def _anchors(lines: pa.Array, dropped: dict[str, int]) -> pd.DataFrame:
    """One row per CLOCK_ANCHOR; wall nanoseconds stay int64 (they exceed 2**53)."""
    candidates = lines.filter(pc.match_substring(lines, "[CLOCK_ANCHOR]"))
    fields = pc.extract_regex(candidates, ANCHOR_PATTERN) if len(candidates) else None
    frame = {"pid": np.empty(0, np.int64), "mono_ns": np.empty(0, np.int64), "wall_ns": np.empty(0, np.int64)}
    if fields is not None:
        valid = fields.is_valid()
        _count(dropped, "bad_anchor", len(candidates) - pc.sum(valid).as_py())
        fields = fields.filter(valid)
        ok = np.ones(len(fields), bool)
        for name in ("pid", "mono_ns", "wall_ns"):
            ok &= ~_out_of_range(fields.field(name), signed=True)
        version_ok = pc.equal(fields.field("v"), str(1)).to_numpy(zero_copy_only=False)
        _count(dropped, "bad_anchor", (~(ok & version_ok)).sum())
        fields = fields.filter(pa.array(ok & version_ok))
        frame = {name: fields.field(name).cast(pa.int64()).to_numpy() for name in frame}
    return pd.DataFrame(frame).astype("int64")


def _chip_devices(lines: pa.Array, dropped: dict[str, int]) -> pd.DataFrame:
    """One row per ``[chip_process pid=P dev=D] ready`` line."""
    candidates = lines.filter(pc.match_substring(lines, "[chip_process "))
    pids = np.empty(0, np.int64)
    devices: list[str] = []
    if len(candidates):
        fields = pc.extract_regex(candidates, CHIP_PATTERN)
        valid = fields.is_valid()
        fields = fields.filter(valid)
        ok = ~_out_of_range(fields.field("pid"), signed=True)
        _count(dropped, "bad_chip_process", len(candidates) - len(fields) + int((~ok).sum()))
        fields = fields.filter(pa.array(ok))
        pids = fields.field("pid").cast(pa.int64()).to_numpy()
        devices = [decode_value(d) for d in fields.field("device").to_pylist()]
    return pd.DataFrame({"pid": pd.Series(pids, dtype="int64"), "device": pd.Series(devices, dtype="string[pyarrow]")})
