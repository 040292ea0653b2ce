"""Reader for Chrome Trace Event Format JSON (generic Chrome / PyTorch Kineto traces).

Accepts a top-level list of events or an object with ``traceEvents``, plain
or gzip-compressed (by ``.gz`` suffix or gzip magic bytes). Also the event
converter that the SA_PROFILE reader shares (:func:`events_to_trace`).

Conversion rules:

* ``ts``/``dur`` are microseconds, integer or fractional; they are converted
  to integer nanoseconds exactly (numbers are parsed as decimals, never via
  binary floats) with round-half-even, and a top-level
  ``baseTimeNanoseconds`` (Kineto) is added to ``ts``.
* ``X`` → ``ph="X"``; ``B``/``E`` are paired per (pid, tid) as a stack into
  one ``X`` row (its attrs merge the B and E args); ``i``/``I`` → ``ph="i"``,
  ``dur_ns=0``.
* ``M`` events named ``process_name``/``thread_name`` go to
  ``Trace.extras["process_names"]`` (``{pid: name}``) and
  ``Trace.extras["thread_names"]`` (``{(pid, tid): name}``); the span table
  holds no metadata rows.
* ``pid``/``tid`` that are numeric strings become ints; other strings become a
  stable 63-bit hash and the original text is kept in ``attrs`` as
  ``pid_label``/``tid_label``.
* ``args`` become ``attrs``: strings as they are, everything else (numbers,
  booleans, nested objects) as JSON text.
* Dropped and counted: events that are not objects or lack a usable ``ts``
  (``bad_event``), an ``E`` without a ``B`` (``unmatched_end``), a ``B``
  never closed (``unmatched_begin``), other phases such as counters or flows
  (``unsupported_phase``) and other metadata (``unsupported_metadata``).
* ``line`` is the event's 0-based index in ``traceEvents`` (for JSONL
  fragments, the 1-based line number).
"""

from __future__ import annotations

import decimal
import gzip
import hashlib
import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import pyarrow as pa

from dsprof.analysis.spans import SPAN_SCHEMA, Trace, split_attributes
from dsprof.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"
_NS_PER_US = Decimal(1000)

Progress = Callable[[str], None] | None


def read_chrome_trace(path: str | os.PathLike, progress: Progress = None, source: str = "chrome") -> Trace:
    """Read a Chrome/Kineto JSON trace (``.json`` or gzip) into a Trace."""
    path = Path(path)
    if progress is not None:
        progress(f"reading {path}")
    document = load_json_document(path)
    if isinstance(document, list):
        events, base_ns = document, 0
    elif isinstance(document, dict) and isinstance(document.get("traceEvents"), list):
        events = document["traceEvents"]
        base_ns = _base_time_ns(document, path)
    else:
        raise InputError(path, "JSON is not a Chrome trace", expected='a list of events or {"traceEvents": [...]}')
    return events_to_trace(enumerate(events), str(path), source, base_ns=base_ns)


def load_json_document(path: Path) -> object:
    """Parse a (possibly gzipped) JSON file, numbers as exact decimals; bad JSON names file and line."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise InputError(path, f"corrupt gzip data: {exc}") from None
    try:
        return json.loads(raw, parse_float=Decimal)
    except UnicodeDecodeError as exc:
        raise InputError(path, "not UTF-8 text", line=raw[: exc.start].count(b"\n") + 1, expected="JSON") from None
    except json.JSONDecodeError as exc:
        raise InputError(path, f"invalid JSON: {exc.msg}", line=exc.lineno, expected="a Chrome trace") from None


def _base_time_ns(document: dict, path: Path) -> int:
    base = document.get("baseTimeNanoseconds", 0)
    try:
        return int(base)  # an int, an integral Decimal, or a numeric string
    except (TypeError, ValueError, decimal.InvalidOperation):
        raise InputError(path, f"baseTimeNanoseconds is not an integer: {base!r}") from None


def us_to_ns(value: object) -> int | None:
    """Microseconds (int, decimal or numeric string) to integer ns, half-even; None if not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value * 1000
    try:
        micros = value if isinstance(value, Decimal) else Decimal(str(value))
        return int((micros * _NS_PER_US).to_integral_value(rounding=decimal.ROUND_HALF_EVEN))
    except (decimal.InvalidOperation, ValueError, OverflowError):
        return None


def _stable_id(value: object, label_key: str, attrs: dict[str, str]) -> int:
    """An int pid/tid: numeric values as they are, other text hashed (original kept in attrs)."""
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int):
        return value
    text = str(value)
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = Decimal(text)
        if number == number.to_integral_value():
            return int(number)
    except decimal.InvalidOperation:
        pass
    attrs[label_key] = text
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


def _attr_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Decimal):
        return str(value)
    return json.dumps(value, default=_json_default, ensure_ascii=False, separators=(",", ":"))


def _json_default(value: object) -> object:
    if isinstance(value, Decimal):
        return float(value) if value != value.to_integral_value() else int(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def events_to_trace(indexed_events: Iterable[tuple[int, object]], file: str, source: str, base_ns: int = 0, dropped: dict[str, int] | None = None, records_read: int = 0) -> Trace:
    """Convert ``(line or index, event)`` pairs into a Trace; counts what cannot be used."""
    dropped = dict(dropped or {})
    rows: dict[str, list] = {k: [] for k in ("line", "pid", "tid", "name", "cat", "ph", "ts_ns", "dur_ns", "attrs")}
    process_names: dict[int, str] = {}
    thread_names: dict[tuple[int, int], str] = {}
    open_begins: list[tuple] = []
    ends: list[tuple] = []

    def count(reason: str) -> None:
        dropped[reason] = dropped.get(reason, 0) + 1

    for line, event in indexed_events:
        records_read += 1
        if not isinstance(event, dict):
            count("bad_event")
            continue
        ph = event.get("ph")
        attrs: dict[str, str] = {}
        pid = _stable_id(event.get("pid"), "pid_label", attrs)
        tid = _stable_id(event.get("tid"), "tid_label", attrs)
        if ph == "M":
            name = event.get("name")
            args = event.get("args")
            label = args.get("name") if isinstance(args, dict) else None
            if name == "process_name" and label is not None:
                process_names[pid] = str(label)
            elif name == "thread_name" and label is not None:
                thread_names[(pid, tid)] = str(label)
            else:
                count("unsupported_metadata")
            continue
        if ph not in ("X", "B", "E", "i", "I"):
            count("unsupported_phase")
            continue
        ts_ns = us_to_ns(event.get("ts"))
        if ts_ns is None:
            count("bad_event")
            continue
        ts_ns += base_ns
        args = event.get("args")
        if isinstance(args, dict):
            for key, value in args.items():
                attrs[str(key)] = _attr_text(value)
        elif args is not None:
            attrs["args"] = _attr_text(args)
        name = event.get("name")
        name = "" if name is None else str(name)
        cat = event.get("cat")
        cat = "" if cat is None else str(cat)
        if ph == "X":
            dur_ns = us_to_ns(event.get("dur", 0))
            if dur_ns is None:
                count("bad_event")
                continue
            _append(rows, line, pid, tid, name, cat, "X", ts_ns, dur_ns, attrs)
        elif ph in ("i", "I"):
            _append(rows, line, pid, tid, name, cat, "i", ts_ns, 0, attrs)
        elif ph == "B":
            open_begins.append((pid, tid, ts_ns, records_read, line, name, cat, attrs))
        else:
            ends.append((pid, tid, ts_ns, records_read, attrs))

    _pair_begin_end(open_begins, ends, rows, dropped)
    keep = [d >= 0 for d in rows["dur_ns"]]
    if not all(keep):  # a span that ends before it starts would inflate every figure built on it
        dropped["negative_duration"] = dropped.get("negative_duration", 0) + keep.count(False)
        for key in rows:
            rows[key] = [v for v, ok in zip(rows[key], keep) if ok]
    n = len(rows["line"])
    pairs = [item for attrs in rows["attrs"] for item in attrs.items()]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum([len(a) for a in rows["attrs"]], out=offsets[1:])
    promoted, attrs = split_attributes(offsets, pa.array([k for k, _ in pairs], pa.string()), pa.array([v for _, v in pairs], pa.string()))
    columns = {
        "source": pa.repeat(pa.scalar(source), n),
        "file": pa.repeat(pa.scalar(file), n),
        "line": pa.array(rows["line"], pa.int64()),
        "pid": pa.array(rows["pid"], pa.int64()),
        "tid": pa.array(rows["tid"], pa.int64()),
        "name": pa.array(rows["name"], pa.string()),
        "cat": pa.array(rows["cat"], pa.string()),
        "ph": pa.array(rows["ph"], pa.string()),
        "ts_ns": pa.array(rows["ts_ns"], pa.int64()),
        "dur_ns": pa.array(rows["dur_ns"], pa.int64()),
        "inv": pa.nulls(n, pa.uint64()),
        "hid": pa.repeat(pa.scalar(""), n),
        "depth": pa.nulls(n, pa.int64()),
        "clk": pa.repeat(pa.scalar("host"), n),
        **promoted,
        "attrs": attrs,
    }
    table = pa.table([columns[name] for name in SPAN_SCHEMA.names], schema=SPAN_SCHEMA)
    if n:
        order = np.argsort(np.asarray(rows["line"]), kind="stable")  # B/E pairs were appended last
        table = table.take(pa.array(order))
    return Trace(
        spans=table,
        dropped={k: v for k, v in dropped.items() if v},
        records_read=records_read,
        files=[file],
        process_names=process_names,
        thread_names=thread_names,
    )


def _append(rows: dict[str, list], line, pid, tid, name, cat, ph, ts_ns, dur_ns, attrs) -> None:
    for key, value in zip(("line", "pid", "tid", "name", "cat", "ph", "ts_ns", "dur_ns", "attrs"), (line, pid, tid, name, cat, ph, ts_ns, dur_ns, attrs)):
        rows[key].append(value)


def _pair_begin_end(begins: list[tuple], ends: list[tuple], rows: dict[str, list], dropped: dict[str, int]) -> None:
    """Match E to the innermost open B of its (pid, tid), in time order (file order breaks ties).

    Each B/E tuple carries its position in the file (index 3) as the tie-breaker.
    """
    if not begins and not ends:
        return
    timeline = sorted([(b[0], b[1], b[2], b[3], b) for b in begins] + [(e[0], e[1], e[2], e[3], e) for e in ends], key=lambda t: t[:4])
    stacks: dict[tuple[int, int], list[tuple]] = {}
    unmatched_end = 0
    for pid, tid, _ts, _seq, event in timeline:
        stack = stacks.setdefault((pid, tid), [])
        if len(event) == 8:  # a B
            stack.append(event)
        elif stack:
            b_pid, b_tid, b_ts, _, b_line, name, cat, attrs = stack.pop()
            _append(rows, b_line, b_pid, b_tid, name, cat, "X", b_ts, event[2] - b_ts, {**attrs, **event[4]})
        else:
            unmatched_end += 1
    if unmatched_end:
        dropped["unmatched_end"] = dropped.get("unmatched_end", 0) + unmatched_end
    unmatched_begin = sum(len(s) for s in stacks.values())
    if unmatched_begin:
        dropped["unmatched_begin"] = dropped.get("unmatched_begin", 0) + unmatched_begin
