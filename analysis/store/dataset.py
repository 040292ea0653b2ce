"""The span dataset: a span table on disk, as Parquet files partitioned by time window.

What ``dsprof ingest -o DIR/`` writes and what the analysis engine queries out
of core (DuckDB ``read_parquet``), so a log of any size is analysed in bounded
memory. Layout::

    DIR/time_window=<k>/part-<n>.parquet   span rows (SPAN_SCHEMA) of time window k
    DIR/side.parquet                  (not used; reserved)
    DIR/dataset.json                  the manifest (below)

Window ``k`` holds the rows of the invocations that started in
``[k * window_ns, (k + 1) * window_ns)``: a row's time is the earliest host
``ts_ns`` of its ``(pid, inv)`` among the rows of the same chunk (a piece of a
log as the reader hands it over; its own ``ts_ns`` for rows without ``inv``),
so the device-clock rows of an invocation land beside its host rows. An
invocation whose rows were cut between two chunks may straddle two adjacent
windows; a query for window k therefore reads windows k-1..k+1 and keeps the
invocations whose root starts in k. A window's rows may lie in several part
files (see :class:`SpanDatasetWriter`). ``window_ns`` starts at
DEFAULT_WINDOW_NS and doubles whenever the dataset would hold more than
MAX_WINDOWS windows (sparse timestamps), the manifest recording the last.

``dataset.json`` (schema ``dsprof.span_dataset/1``)::

    {"schema", "window_ns", "span_schema": [column names],
     "files": [{"path": "time_window=3/part-0.parquet", "window": 3, "rows": N,
                "min_ts_ns": .., "max_ts_ns": ..}],
     "trace": {"files", "records_read", "lines_read", "dropped": {reason: n}, "drop_sites": {reason: "file:line"},
               "anchors": [[pid, mono_ns, wall_ns]], "chip_devices": [[pid, device]],
               "process_names": [[pid, name]], "thread_names": [[pid, tid, name]],
               "performance_summary", "faults", "notes"}}

Integers in ``anchors`` are written as JSON integers (Python's json keeps them
exact). The manifest is written last and atomically: a dataset without one is
incomplete and is refused.

The writer opens the dataset directory once and makes, writes, moves and
removes everything in it through directory descriptors, a window folder opened
with ``O_NOFOLLOW`` (:func:`dsprof.fileio.open_dir`): a ``time_window=`` folder
that is a link is refused when written to, and never followed to remove a part.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import stat
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dsprof.analysis.store.dataset_check import Fields, check_part, check_part_entries, check_trace_fields, read_manifest
from dsprof.analysis.store.spans import (
    ANCHOR_SCHEMA,
    CHIP_SCHEMA,
    DICTIONARY_COLUMNS,
    DICTIONARY_TYPE,
    MAX_TIME_NS,
    PARQUET_SCHEMA,
    SPAN_SCHEMA,
    Trace,
)
from dsprof.compiled import use_compiled
from dsprof.errors import InputError
from dsprof.fileio import OutputError, atomic_output, atomic_write_text, file_kind, move_regular, open_dir, unlink_at
from dsprof.profiler import artifacts

try:
    from dsprof.analysis.store import _invocation_starts as compiled_starts  # type: ignore[attr-defined]
except ImportError:  # not built here (no C compiler at install time): an Arrow group-by does it
    compiled_starts = None

DATASET_SCHEMA = "dsprof.span_dataset/1"
MANIFEST = artifacts.SPAN_DATASET_MANIFEST
WINDOW_DIR = "time_window="
PART_FILE = "{prefix}-{n}.parquet"
# 2**34 ns ≈ 17 s: far longer than any root, short enough that a window of a
# 64-rank run holds a few hundred thousand rows.
DEFAULT_WINDOW_NS = 1 << 34
# A window's file stays open while the rows being written are at most this many windows later.
OPEN_WINDOWS_BEHIND = 1
# Part files open at once, at most: a log whose spans lie many windows apart (sparse timestamps)
# would otherwise open one file per window of a chunk and run out of file descriptors and memory.
MAX_OPEN_PARTS = 32
# Time windows in a dataset, at most: past it the windows are made twice as long (window_ns doubled, each
# part moved to the window that holds its own, a window's small parts merged), so timestamps however
# sparse make a bounded number of windows and parts, not one per span.
MAX_WINDOWS = 1024
# Parts of fewer rows than this are merged with the other small parts of their window when windows grow.
SMALL_PART_ROWS = 1 << 16

# How span Parquet files are written (the dataset's parts and ``dsprof ingest -o
# FILE.parquet``), chosen with benchmarks/bench_ingest.py and measured per column
# on its logs: text of few distinct values is dictionary-encoded; integers are
# delta-encoded (line numbers, ids, times and counters change little from row to
# row: a third of the bytes for a fifth more encoding time, and writing and
# syncing the bytes costs more than encoding them), except ``inv``, whose
# random per-process bases make deltas no smaller. No compression: on top of
# that (LZ4 halves the bytes again) it costs about as much encoding time as it
# saves in writing, and readers would pay to decompress. Statistics are kept for the integer
# columns, which queries filter on. No Arrow schema is stored, so columns handed
# over dictionary-encoded read back as the plain strings of SPAN_SCHEMA.
_INTEGER_COLUMNS = [f.name for f in SPAN_SCHEMA if pa.types.is_integer(f.type)]
PARQUET_OPTIONS: dict = {
    "compression": "none",
    "use_dictionary": list(DICTIONARY_COLUMNS),
    "column_encoding": {name: "DELTA_BINARY_PACKED" for name in _INTEGER_COLUMNS if name != "inv"},
    "write_statistics": _INTEGER_COLUMNS,
    "store_schema": False,
}


def parquet_table(table: pa.Table) -> pa.Table:
    """``table`` (SPAN_SCHEMA, string columns plain or dictionary-encoded) in the form the span Parquet writers take."""
    columns = []
    for field in PARQUET_SCHEMA:
        column = table.column(field.name)
        if column.type != field.type:
            column = pc.dictionary_encode(column) if field.type == DICTIONARY_TYPE else column.cast(field.type)
            column = column.cast(field.type) if column.type != field.type else column
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=PARQUET_SCHEMA)


class SpanParquetFile:
    """One span Parquet file, written through :func:`dsprof.fileio.atomic_output`: it appears whole on close, or not at all.

    With ``dataset_fd``, ``path``'s folder is opened relative to it, no link followed.
    """

    def __init__(self, path: str | os.PathLike, dataset_fd: int | None = None):
        self.path = Path(path)
        self.rows = 0
        self.min_ts_ns: int | None = None
        self.max_ts_ns: int | None = None
        self._stack = ExitStack()
        try:
            folder_fd = None if dataset_fd is None else self._stack.enter_context(open_dir(self.path.parent, dataset_fd))
            handle = self._stack.enter_context(atomic_output(self.path, folder_fd))
            self._writer = pq.ParquetWriter(handle, PARQUET_SCHEMA, **PARQUET_OPTIONS)
        except BaseException:  # an interrupt included: no temporary file is left behind
            self._stack.close()
            raise

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        self._writer.write_table(parquet_table(table))
        low, high = pc.min_max(table.column("ts_ns")).values()
        self.min_ts_ns = low.as_py() if self.min_ts_ns is None else min(self.min_ts_ns, low.as_py())
        self.max_ts_ns = high.as_py() if self.max_ts_ns is None else max(self.max_ts_ns, high.as_py())
        self.rows += table.num_rows

    def close(self) -> None:
        """Finish the file and put it in place."""
        self._writer.close()
        self._stack.close()

    def discard(self) -> None:
        """Give up the file: the temporary is removed, an older file of that name stays.

        A writer cut off inside a write (a stop landing in its file's write call) cannot finish its row group, and
        says so when closed; the file is thrown away, so that says nothing, and must not replace what cut it off.
        """
        try:
            with contextlib.suppress(Exception):
                self._writer.close()
        finally:
            self._stack.__exit__(RuntimeError, RuntimeError("discarded"), None)


# Parquet jobs (a table to encode, a file to close) queued at most: bounds the pieces held in memory.
MAX_PENDING_WRITES = 3
# Threads encoding Parquet: two files' jobs (a log piece's rows of two time windows) are encoded side by side.
WRITE_THREADS = 2


class BackgroundWrites:
    """Runs Parquet jobs on worker threads, each file's jobs in the order given, a few queued at most.

    A job is a bound method of the file it writes (``part.write``, ``part.close``); a job of a file waits for that
    file's job before it. Encoding releases the GIL, so it goes on while the caller reads and
    scans the next piece of a log. An error of a job is raised by the next
    :meth:`run` or by :meth:`wait`.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(WRITE_THREADS, thread_name_prefix="span-parquet")
        self._pending: deque[Future] = deque()
        self._latest: dict[object, Future] = {}  # each file's last job queued (the file itself the key: no id reused)

    def run(self, job: Callable[..., None], *args: object) -> None:
        while len(self._pending) >= MAX_PENDING_WRITES:
            self._pending[0].result()  # an interrupted wait leaves the job in the queue, for stop() to wait on
            self._pending.popleft()
        file = job.__self__  # type: ignore[attr-defined]  # a bound method of the file written
        self._latest = {key: future for key, future in self._latest.items() if not future.done()}
        future = self._pool.submit(_after, self._latest.get(file), job, *args)
        self._latest[file] = future
        self._pending.append(future)

    def settle(self) -> None:
        """Wait for every job queued so far (more may be queued after); raises the first error."""
        while self._pending:
            self._pending[0].result()
            self._pending.popleft()

    def wait(self) -> None:
        """Wait for every job and stop the worker; raises the first error."""
        try:
            self.settle()
        finally:
            self._pool.shutdown()

    def stop(self) -> None:
        """After an error elsewhere: let the queued jobs end, whatever they raise."""
        wait(self._pending)
        self._pending.clear()
        self._pool.shutdown()


def _after(before: Future | None, job: Callable[..., None], *args: object) -> None:
    """Run ``job`` once the job ``before`` it (of the same file) has ended; its error is this job's too."""
    if before is not None:
        before.result()
    job(*args)


def window_of_rows(table: pa.Table, window_ns: int) -> np.ndarray:
    """The window of each row: by its invocation's earliest host start in this table (see module docstring)."""
    n = table.num_rows
    if n == 0:
        return np.zeros(0, np.int64)
    ts = _int64s(table.column("ts_ns"))
    host = pc.not_equal(table.column("clk"), "dev").to_numpy(zero_copy_only=False)
    when = _invocation_starts(table, ts, host)
    never = when == np.iinfo(np.int64).max
    if never.any():  # an invocation with only device rows in this table goes with the table's own time
        when[never] = int(np.median(ts[host])) if host.any() else 0
    return np.floor_divide(when, window_ns)


def _int64s(column: pa.ChunkedArray) -> np.ndarray:
    return np.concatenate([chunk.to_numpy(zero_copy_only=False) for chunk in column.chunks] + [np.empty(0, np.int64)]).astype(
        np.int64, copy=False
    )


def _invocation_starts(table: pa.Table, ts: np.ndarray, host: np.ndarray) -> np.ndarray:
    """Each row's invocation's earliest host start (int64 max where it has no host row; own ts without inv).

    :func:`~dsprof.analysis.store.predicates.row_host_start` in SQL, done by the compiled helper where it
    is built, else with an Arrow group-by: DuckDB takes ten times as long and would bring pandas into
    ``dsprof ingest`` (docs/ARCHITECTURE.md "One home per concept"); tests/test_predicates.py holds both to the SQL.
    """
    n = table.num_rows
    has_inv = table.column("inv").is_valid()
    module = use_compiled(compiled_starts)
    if module is not None:
        starts = np.empty(n, np.int64)
        pid = _int64s(table.column("pid").fill_null(0))
        inv = _int64s(table.column("inv").fill_null(0).cast(pa.int64(), safe=False))
        module.invocation_starts(pid, inv, has_inv.to_numpy(zero_copy_only=False).view(np.uint8), ts, host.view(np.uint8), starts)
        return starts
    starts = ts.copy()
    if pc.any(has_inv).as_py():
        never = np.iinfo(np.int64).max
        keys = pa.table({"pid": table.column("pid"), "inv": table.column("inv"), "ts": np.where(host, ts, never), "row": np.arange(n)})
        groups = keys.filter(has_inv).group_by(["pid", "inv"], use_threads=False).aggregate([("ts", "min"), ("row", "list")])
        rows = groups.column("row_list")
        starts[pc.list_flatten(rows).to_numpy()] = np.repeat(groups.column("ts_min").to_numpy(), pc.list_value_length(rows).to_numpy())
    return starts


# Runs of at least this many consecutive rows are kept as zero-copy slices when a table is split by window.
_MIN_SLICE_ROWS = 4096


def rows_of(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table.take(rows)`` (rows ascending), with long runs of consecutive rows sliced instead of copied."""
    if len(rows) and rows[-1] - rows[0] + 1 == len(rows):
        return table.slice(int(rows[0]), len(rows))
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts, stops = np.concatenate([[0], breaks]), np.concatenate([breaks, [len(rows)]])
    long_runs = np.flatnonzero(stops - starts >= _MIN_SLICE_ROWS)
    if not len(long_runs):
        return table.take(rows)
    pieces, done = [], 0
    for run in long_runs:  # a loop over long runs, a few per window
        if starts[run] > done:
            pieces.append(table.take(rows[done : starts[run]]))
        pieces.append(table.slice(int(rows[starts[run]]), int(stops[run] - starts[run])))
        done = stops[run]
    if done < len(rows):
        pieces.append(table.take(rows[done:]))
    return pa.concat_tables(pieces)


def _existing_directory(directory: Path) -> bool:
    """Whether ``directory`` exists (as a directory); OutputError, saying what is expected, for a file or device there."""
    try:
        mode = os.stat(directory).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(mode):
        raise OutputError(f"{directory}: is {file_kind(mode)}, not a directory (expected a new directory or a span dataset's)")
    return True


class SpanDatasetWriter:
    """A SpanSink that writes the span dataset: rows to the files of their time windows, the manifest last.

    Each window touched gets a part file, kept open (so a window's rows fill
    few files) until the rows being written have moved more than
    OPEN_WINDOWS_BEHIND windows past it; rows of a window already closed go to
    a new part. Windows are made longer (:meth:`_lengthen`) whenever the
    dataset would hold more than MAX_WINDOWS of them. The caller's thread splits tables by window; the encoding and
    the closing run on a worker (:class:`BackgroundWrites`). At most
    MAX_OPEN_PARTS files are open at once. Files appear
    atomically when closed; until :meth:`finish` writes ``dataset.json`` the
    dataset is incomplete.
    """

    def __init__(self, directory: str | os.PathLike, window_ns: int = DEFAULT_WINDOW_NS, part_prefix: str = "part"):
        self.directory = Path(directory)
        self.window_ns = window_ns
        self.part_prefix = part_prefix  # writers sharing a directory (cluster ingest) use distinct prefixes
        self.files: list[dict] = []
        self._parts = 0
        self._windows: set[int] = set()  # every window written to
        self._open: dict[int, tuple[str, SpanParquetFile]] = {}
        self._closed: list[tuple[int, str, SpanParquetFile]] = []
        self._jobs = BackgroundWrites()
        self._made_directory = not _existing_directory(self.directory)
        self._made_folders: list[str] = []  # window folders this writer makes, removed again by abort() where empty
        self.directory.mkdir(parents=True, exist_ok=True)
        with open_dir(self.directory, follow=True) as fd:  # the directory the user named, resolved this once
            self._fd = os.dup(fd)
        self._release_fd = weakref.finalize(self, os.close, self._fd)
        unlink_at(self._fd, MANIFEST)  # the old dataset is incomplete from here on
        self._remove_own_parts()

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        windows = self._bounded(window_of_rows(table, self.window_ns))
        first, last = int(windows.min()), int(windows.max())
        if first == last:  # the common case: a piece of a log within one window
            self._jobs.run(self._file(first).write, table)
        else:
            order = np.argsort(windows, kind="stable")
            for rows in np.split(order, np.flatnonzero(np.diff(windows[order])) + 1):  # one piece per window touched
                self._jobs.run(self._file(int(windows[rows[0]])).write, rows_of(table, rows))  # a stable sort: rows ascend
        self._close_behind(first - OPEN_WINDOWS_BEHIND)

    def _file(self, window: int) -> SpanParquetFile:
        if window not in self._open:
            if len(self._open) >= MAX_OPEN_PARTS:  # the earliest window open goes; its later rows get a new part
                self._close_behind(min(self._open) + 1)
            relative = self._new_part(window)
            self._open[window] = (relative, SpanParquetFile(self.directory / relative, self._fd))
        return self._open[window][1]

    def _new_part(self, window: int) -> str:
        """The relative path of a new part of ``window`` (its folder made)."""
        relative = f"{WINDOW_DIR}{window}/{PART_FILE.format(prefix=self.part_prefix, n=self._parts)}"
        self._parts += 1
        self._make_folder(window)
        return relative

    def _make_folder(self, window: int) -> None:
        """``window``'s folder, made if missing (what is there already is checked when it is opened, no link followed)."""
        folder = f"{WINDOW_DIR}{window}"
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, dir_fd=self._fd)
            self._made_folders.append(folder)

    @contextlib.contextmanager
    def _folder(self, folder: str) -> Iterator[int]:
        """A window folder's descriptor, opened relative to the dataset's: a link is refused, never followed."""
        with open_dir(self.directory / folder, self._fd) as fd:
            yield fd

    def _remove_part(self, relative: str) -> None:
        """Remove one part of this writer; a folder that is gone, or a link now, is left alone."""
        folder, name = relative.split("/")
        with contextlib.suppress(OutputError, FileNotFoundError), self._folder(folder) as fd:
            unlink_at(fd, name)

    def _remove_own_parts(self) -> None:
        """Every part of this writer's prefix, in each real window folder (a link is never followed)."""
        pattern = PART_FILE.format(prefix=self.part_prefix, n="*")
        for folder in os.listdir(self._fd):
            if not folder.startswith(WINDOW_DIR):
                continue
            with contextlib.suppress(OutputError, FileNotFoundError), self._folder(folder) as fd:
                for name in fnmatch.filter(os.listdir(fd), pattern):
                    unlink_at(fd, name)

    def _bounded(self, windows: np.ndarray) -> np.ndarray:
        """The rows' ``windows``, after windows were made longer as often as it takes to stay within MAX_WINDOWS."""
        touched = _distinct(windows)
        while len(self._windows.union(touched)) > MAX_WINDOWS:
            self._lengthen()
            windows = np.floor_divide(windows, 2)  # exact: floor(floor(t / w) / 2) == floor(t / 2w)
            touched = _distinct(windows)
        self._windows.update(touched)
        return windows

    def _lengthen(self) -> None:
        """Double ``window_ns``: each part written so far goes to the window holding its own; a window's small parts become one."""
        self._close_behind(np.iinfo(np.int64).max)
        self._jobs.settle()
        self.window_ns *= 2
        by_window: dict[int, list[tuple[str, SpanParquetFile]]] = {}
        for window, relative, part in self._closed:
            by_window.setdefault(window // 2, []).append((relative, part))
        self._closed = []
        for window, parts in sorted(by_window.items()):
            small = [relative for relative, part in parts if part.rows < SMALL_PART_ROWS]
            if len(small) > 1:
                self._closed.append((window, *self._merged(window, small)))
            for relative, part in parts:
                if len(small) <= 1 or relative not in small:
                    self._closed.append((window, self._moved(relative, window), part))
        self._windows = set(by_window)

    def _moved(self, relative: str, window: int) -> str:
        """Move a closed part to ``window``'s folder; its new relative path."""
        source, name = relative.split("/")
        target = f"{WINDOW_DIR}{window}/{name}"
        if target != relative:
            self._make_folder(window)
            with self._folder(source) as source_fd, self._folder(f"{WINDOW_DIR}{window}") as target_fd:
                move_regular(name, source_fd, target_fd)
            with contextlib.suppress(OSError):  # the old window's folder, now empty
                os.rmdir(source, dir_fd=self._fd)
        return target

    def _merged(self, window: int, parts: list[str]) -> tuple[str, SpanParquetFile]:
        """One new part of ``window`` holding the rows of ``parts`` (small ones), which are removed."""
        relative = self._new_part(window)
        merged = SpanParquetFile(self.directory / relative, self._fd)
        try:
            for old in parts:
                merged.write(self._read_part(old))
            merged.close()
        except BaseException:
            merged.discard()
            raise
        for old in parts:
            self._remove_part(old)
            with contextlib.suppress(OSError):  # not empty (or a link, which rmdir refuses)
                os.rmdir(old.split("/")[0], dir_fd=self._fd)
        return relative, merged

    def _read_part(self, relative: str) -> pa.Table:
        """A part this writer closed, read through its folder's descriptor (no link followed)."""
        folder, name = relative.split("/")
        with self._folder(folder) as fd, os.fdopen(os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd), "rb") as handle:
            return pq.read_table(handle, columns=PARQUET_SCHEMA.names)

    def _close_behind(self, window: int) -> None:
        for old in [w for w in self._open if w < window]:
            relative, part = self._open.pop(old)
            self._jobs.run(part.close)
            self._closed.append((old, relative, part))

    def close(self) -> None:
        """Write out and close every part file; ``files`` lists them. The manifest is :meth:`finish`'s."""
        self._close_behind(np.iinfo(np.int64).max)
        self._jobs.wait()
        self.files = sorted(
            (
                {"path": relative, "window": window, "rows": part.rows, "min_ts_ns": part.min_ts_ns, "max_ts_ns": part.max_ts_ns}
                for window, relative, part in self._closed
                if part.rows
            ),
            key=lambda f: (f["window"], f["path"]),
        )

    def finish(self, trace: Trace) -> Path:
        """Close every part and write the manifest with ``trace``'s side information; the dataset is complete from here on."""
        self.close()
        manifest = {
            "schema": DATASET_SCHEMA,
            "window_ns": self.window_ns,
            "span_schema": SPAN_SCHEMA.names,
            "files": self.files,
            "trace": {
                "files": trace.files,
                "records_read": trace.records_read,
                "lines_read": trace.lines_read,
                "dropped": trace.dropped,
                "drop_sites": trace.drop_sites,
                "anchors": [[r["pid"], r["mono_ns"], r["wall_ns"]] for r in trace.anchors.to_pylist()],
                "chip_devices": [[r["pid"], r["device"]] for r in trace.chip_devices.to_pylist()],
                "process_names": [[pid, name] for pid, name in trace.process_names.items()],
                "thread_names": [[pid, tid, name] for (pid, tid), name in trace.thread_names.items()],
                "performance_summary": trace.performance_summary,
                "faults": trace.faults,
                "notes": trace.notes,
            },
        }
        path = self.directory / MANIFEST
        atomic_write_text(path, json.dumps(manifest) + "\n", self._fd)
        return path

    @property
    def span_files(self) -> list[Path]:
        return [self.directory / f["path"] for f in self.files]

    def abort(self) -> None:
        """Stop after an error or an interrupt: no part of this run and no manifest is left.

        Files still open are discarded, the parts already closed are removed
        (the dataset they belonged to is incomplete), and so are the folders
        this writer made, where they are empty now. The directory's descriptor is
        closed here (else when the writer is collected); a second call does nothing.
        """
        if not self._release_fd.alive:
            return
        self._jobs.stop()
        for _, part in self._open.values():
            part.discard()
        self._open.clear()
        for _, relative, _part in self._closed:
            self._remove_part(relative)
        self._closed.clear()
        self._remove_own_parts()  # wherever an interrupted _lengthen left them
        for folder in self._made_folders:
            with contextlib.suppress(OSError):  # not empty: another writer's or the user's files are kept there
                os.rmdir(folder, dir_fd=self._fd)
        self._release_fd()
        if self._made_directory:
            with contextlib.suppress(OSError):
                self.directory.rmdir()


# Windows this close together are told apart by counting, not sorting.
_DENSE_WINDOWS = 1024


def _distinct(windows: np.ndarray) -> list[int]:
    """The windows a table's rows touch (one, mostly: no sort then)."""
    first, last = int(windows.min()), int(windows.max())
    if last - first < _DENSE_WINDOWS:  # a piece of a log: a few neighbouring windows, counted without a sort
        return (np.flatnonzero(np.bincount(windows - first)) + first).tolist()
    return np.unique(windows).tolist()


def files_by_window(span_files: list[Path]) -> dict[int, list[Path]] | None:
    """The span files of one dataset by time window (ascending); None where they are not all parts of one dataset
    (files of several datasets may differ in ``window_ns``, and a lone Parquet file has no window)."""
    windows: dict[int, list[Path]] = {}
    for path in span_files:
        if not path.parent.name.startswith(WINDOW_DIR) or path.parent.parent != span_files[0].parent.parent:
            return None
        try:
            window = int(path.parent.name.removeprefix(WINDOW_DIR))
        except ValueError:
            return None
        windows.setdefault(window, []).append(path)
    return dict(sorted(windows.items())) if windows else None


def open_dataset(directory: str | os.PathLike) -> Trace:
    """The Trace of a complete span dataset: its files listed in ``span_files``, side tables loaded.

    Nothing in the directory is trusted: the manifest and every part are checked first (:mod:`.dataset_check`).
    """
    directory = Path(directory)
    path = directory / MANIFEST
    manifest = read_manifest(path)
    if not isinstance(manifest, dict) or manifest.get("schema") != DATASET_SCHEMA:
        raise InputError(path, "not a span dataset manifest", expected=DATASET_SCHEMA)
    fields = Fields(path)
    fields.integer(manifest.get("window_ns"), "window_ns", (1, MAX_TIME_NS))
    names = fields.items(manifest.get("span_schema"), "span_schema")
    if names != SPAN_SCHEMA.names:
        raise fields.fail("span_schema", "the span table's columns: " + ", ".join(SPAN_SCHEMA.names))
    parts = check_part_entries(fields, directory, manifest.get("files"))
    side = check_trace_fields(fields, manifest.get("trace"))
    for part, rows in parts:
        check_part(part, rows)
    anchors, chips = side["anchors"], side["chip_devices"]
    return Trace(
        span_files=[part for part, _ in parts],
        anchors=pa.table({k: pa.array([a[i] for a in anchors], pa.int64()) for i, k in enumerate(ANCHOR_SCHEMA.names)}),
        chip_devices=pa.table(
            {"pid": pa.array([c[0] for c in chips], pa.int64()), "device": pa.array([c[1] for c in chips], pa.string())}, schema=CHIP_SCHEMA
        ),
        dropped=side["dropped"],
        drop_sites=side["drop_sites"],
        records_read=side["records_read"],
        lines_read=side["lines_read"],
        files=side["files"],
        process_names={p: n for p, n in side["process_names"]},
        thread_names={(p, t): n for p, t, n in side["thread_names"]},
        performance_summary=side["performance_summary"],
        faults=side["faults"],
        notes=side["notes"],
    )
