"""The measurable parts of replaying a recorded log to a follower (``benchmarks/bench_watch.py``).

A replay appends a log at its recorded pace while ``dsprof watch`` follows it.
To measure the follower, the harness needs, for every line of the log, where
it ends and when the original run wrote it (:func:`index_log`); when to write
it in the replay (:func:`write_schedule`); and, from the follower's events, how
long each step took to appear after its last record was written
(:func:`step_latencies`) and whether the follower fell behind
(:func:`backlog_steps`). Kept apart from the timing loop so that each can be
checked on known numbers.
"""

from __future__ import annotations

import mmap
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.profiler import strace_format as fmt

_CHUNK_BYTES = 64 << 20
# The appender writes blocks of whole lines of at most this size, and looks at the clock this often.
BLOCK_BYTES = 64 << 10
TICK_S = 0.01
# The write time of a line: its prefix clock (a STRACE record is written when its span closes).
_PREFIX_CLOCK = rf"^\[{fmt.PREFIX_CLOCK}=(?P<ns>\d+)\]"
# Which process and invocation a record belongs to; the root also names its step.
_RECORD = rf"{re.escape(fmt.STRACE_MARKER)} {fmt.VERSION_FIELD}=\d+ pid=(?P<pid>-?\d+) tid=-?\d+ inv=(?P<inv>\d+) "
_ROOT_STEP = rf" name={re.escape(fmt.ROOT)} .*? {fmt.STEP_ATTR}=(?P<step>-?\d+)"


@dataclass
class LogIndex:
    """Where each line of a log ends, when it was written, and which line completes each step."""

    line_end: np.ndarray  # byte offset just past each line (its newline included)
    written_ns: np.ndarray  # the original run's write time of each line (prefix clock), ns
    step: np.ndarray  # the decode step numbers present, ascending
    step_last_line: np.ndarray  # for each step, the index of the line holding its last record

    def save(self, path: Path) -> None:
        np.savez(path, line_end=self.line_end, written_ns=self.written_ns, step=self.step, step_last_line=self.step_last_line)

    @classmethod
    def load(cls, path: Path) -> LogIndex:
        with np.load(path) as arrays:
            return cls(**{name: arrays[name] for name in ("line_end", "written_ns", "step", "step_last_line")})


def index_log(path: Path) -> LogIndex:
    """Index a STRACE log chunk by chunk (each chunk's lines read as one Arrow array)."""
    ends, times, records = [], [], []
    base, lines_before = 0, 0
    with open(path, "rb") as f:
        carry = b""
        while True:
            chunk = f.read(_CHUNK_BYTES)
            data = carry + chunk
            cut = len(data) if not chunk else data.rfind(b"\n") + 1
            carry, data = data[cut:], data[:cut]
            if data:
                line_end, line_ns, line_records = _index_chunk(data)
                ends.append(line_end + base)
                times.append(line_ns)
                line_records["line"] += lines_before
                records.append(line_records)
                base += len(data)
                lines_before += len(line_end)
            if not chunk:
                break
    written = pc.fill_null_backward(pc.fill_null_forward(pa.chunked_array(times, pa.int64()))).fill_null(0).to_numpy()
    step, last_line = _step_last_lines(pd.concat(records) if records else pd.DataFrame(columns=["line", "pid", "inv", "step"]))
    return LogIndex(np.concatenate(ends) if ends else np.empty(0, np.int64), written, step, last_line)


def _index_chunk(data: bytes) -> tuple[np.ndarray, pa.Array, pd.DataFrame]:
    """Line ends, prefix times (null where a line has none) and the STRACE records of whole lines."""
    buffer = np.frombuffer(data, dtype=np.uint8)
    line_end = np.flatnonzero(buffer == ord("\n")) + 1
    if len(line_end) == 0 or line_end[-1] != len(data):  # a last line without its newline (a torn tail)
        line_end = np.append(line_end, len(data))
    offsets = np.concatenate([[0], line_end]).astype(np.int32)
    lines = pa.Array.from_buffers(pa.binary(), len(line_end), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    line_ns = pc.struct_field(pc.extract_regex(lines, _PREFIX_CLOCK), "ns").cast(pa.int64())
    record = pc.extract_regex(lines, _RECORD)
    is_record = pc.is_valid(record).to_numpy(zero_copy_only=False)
    root = pc.extract_regex(lines, _ROOT_STEP)
    records = pd.DataFrame(
        {
            "line": np.flatnonzero(is_record),
            "pid": pc.struct_field(record, "pid").drop_null().cast(pa.int64()).to_numpy(),
            "inv": pc.struct_field(record, "inv").drop_null().cast(pa.uint64()).to_numpy(),
            "step": pc.struct_field(root, "step").filter(pa.array(is_record)).cast(pa.float64()).to_numpy(zero_copy_only=False),
        }
    )
    return line_end.astype(np.int64), line_ns, records


def _step_last_lines(records: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each decode step and the last line holding a record of one of its invocations (the root names the step)."""
    roots = records.dropna(subset=["step"])[["pid", "inv", "step"]]
    with_step = records.drop(columns="step").merge(roots, on=["pid", "inv"], how="inner")
    last = with_step[with_step["step"] >= 0].groupby("step")["line"].max()
    return last.index.to_numpy(np.int64), last.to_numpy(np.int64)


def write_schedule(written_ns: np.ndarray, pace: float, origin_ns: int, floor_ns: int | None = None) -> np.ndarray:
    """Seconds after the replay's start at which each line is due: recorded time since ``origin_ns`` / pace.

    A line is never due before the one above it (a log is written in order), nor
    before ``floor_ns`` (the last line of the log replayed before this one).
    """
    due = np.maximum.accumulate(np.asarray(written_ns, dtype=np.int64))
    if floor_ns is not None:
        due = np.maximum(due, floor_ns)
    return (due - origin_ns) / 1e9 / pace


def shown_so_far(event_wall: np.ndarray, event_new_last_step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Events in time order, and the highest step shown by each one or an earlier one (-inf before any)."""
    order = np.argsort(event_wall, kind="stable")
    new_last = np.asarray(event_new_last_step, dtype=np.float64)[order]
    return np.asarray(event_wall, dtype=np.float64)[order], np.maximum.accumulate(np.where(np.isnan(new_last), -np.inf, new_last))


def step_latencies(step: np.ndarray, step_written_wall: np.ndarray, event_wall: np.ndarray, event_new_last_step: np.ndarray) -> np.ndarray:
    """Seconds from each step's last record written to the first event with new_last_step >= that step (NaN: never shown)."""
    wall, shown = shown_so_far(event_wall, event_new_last_step)
    first = np.searchsorted(shown, np.asarray(step, dtype=np.float64), side="left")
    seen = first < len(wall)
    latency = np.full(len(step), np.nan)
    latency[seen] = wall[first[seen]] - np.asarray(step_written_wall, dtype=np.float64)[seen]
    return latency


def backlog_steps(step: np.ndarray, step_written_wall: np.ndarray, event_wall: np.ndarray, event_new_last_step: np.ndarray) -> np.ndarray:
    """At each event (in time order): steps written by then that no event had shown yet."""
    wall, shown = shown_so_far(event_wall, event_new_last_step)
    written = np.searchsorted(np.sort(np.asarray(step_written_wall, dtype=np.float64)), wall, side="right")
    shown_count = np.searchsorted(np.sort(np.asarray(step, dtype=np.float64)), shown, side="right")
    return written - shown_count


def backlog_growth(event_wall: np.ndarray, backlog: np.ndarray, start: float, stop: float) -> float:
    """How much the backlog grew over [start, stop] (steps): the slope of a straight-line fit times the span.

    A follower that keeps up has a saw-tooth backlog (it grows between refreshes
    and drops at each one), so its fit stays flat; one that falls behind grows
    by the steps it fails to read. NaN with fewer than three events in the span.
    """
    inside = (event_wall >= start) & (event_wall <= stop)
    if inside.sum() < 3:
        return float("nan")
    slope = np.polyfit(event_wall[inside] - start, backlog[inside].astype(np.float64), 1)[0]
    return float(slope * (stop - start))


@dataclass
class Loop:
    """One piece of a replayed log: the file and its index."""

    path: Path
    index: LogIndex


@dataclass(eq=False)
class Appender:
    """Writes the loops to ``target`` on their schedule (in a thread) and notes when each step's last record was written."""

    loops: list[Loop]
    target: Path
    pace: float
    duration_s: float
    torn_every: int
    stop_event: threading.Event = field(default_factory=threading.Event)
    steps: list[np.ndarray] = field(default_factory=list)
    step_walls: list[np.ndarray] = field(default_factory=list)
    blocks: int = 0
    torn_writes: int = 0
    started_wall: float = 0.0
    stopped_wall: float = 0.0

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        origin_ns = int(self.loops[0].index.written_ns[0])
        floor_ns: int | None = None
        self.started_wall = time.time()
        with open(self.target, "ab", buffering=0) as out:
            for loop in self.loops:
                due = write_schedule(loop.index.written_ns, self.pace, origin_ns, floor_ns)
                floor_ns = int(loop.index.written_ns.max()) if floor_ns is None else max(floor_ns, int(loop.index.written_ns.max()))
                if not self._append(loop, due, out):
                    break
        self.stopped_wall = time.time()

    def _append(self, loop: Loop, due: np.ndarray, out: BinaryIO) -> bool:
        """One loop's lines, each no earlier than its due time; False when the replay's time is up."""
        line_end, index = loop.index.line_end, loop.index
        order = np.argsort(index.step_last_line, kind="stable")
        step, last_line = index.step[order], index.step_last_line[order]
        walls = np.full(len(step), np.nan)
        self.steps.append(step)
        self.step_walls.append(walls)
        written, completed = 0, 0
        with open(loop.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            while written < len(data):
                now = time.time() - self.started_wall
                if now >= self.duration_s or self.stop_event.is_set():
                    return False
                lines_due = int(np.searchsorted(due, now, side="right"))
                goal = int(line_end[lines_due - 1]) if lines_due else 0
                if goal <= written:
                    time.sleep(min(TICK_S, max(0.0, due[lines_due] - now)))
                    continue
                written = self._write_due(data, line_end, written, goal, out)
                complete = int(np.searchsorted(line_end, written, side="right"))
                done = int(np.searchsorted(last_line, complete, side="left"))
                walls[completed:done] = time.time()
                completed = done
                time.sleep(TICK_S)
        return True

    def _write_due(self, data: mmap.mmap, line_end: np.ndarray, written: int, goal: int, out: BinaryIO) -> int:
        """Write [written, goal) in blocks of whole lines; every ``torn_every``-th block stops halfway through
        its last line (the rest comes at the next tick). Returns how far it wrote."""
        while written < goal:
            block_end = min(_block_end(line_end, written), goal)
            self.blocks += 1
            if self.torn_every and self.blocks % self.torn_every == 0:
                line = int(np.searchsorted(line_end, block_end, side="left"))
                line_start = int(line_end[line - 1]) if line else 0
                cut = line_start + (block_end - line_start) // 2
                if cut > written:
                    out.write(data[written:cut])
                    self.torn_writes += 1
                    return cut
            out.write(data[written:block_end])
            written = block_end
        return written

    def written_steps(self) -> tuple[np.ndarray, np.ndarray]:
        """Step numbers whose last record was written, and when."""
        step, wall = np.concatenate(self.steps), np.concatenate(self.step_walls)
        keep = ~np.isnan(wall)
        return step[keep], wall[keep]


def _block_end(line_end: np.ndarray, written: int) -> int:
    """The end of the next block: whole lines up to BLOCK_BYTES past ``written``, at least the line it is in."""
    within = int(np.searchsorted(line_end, written + BLOCK_BYTES, side="right")) - 1
    at_least = int(line_end[np.searchsorted(line_end, written, side="right")])
    return max(int(line_end[within]) if within >= 0 else 0, at_least)
