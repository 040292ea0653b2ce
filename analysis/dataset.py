"""The span dataset: a span table on disk, as Parquet files partitioned by time window.

What ``dsprof ingest -o DIR/`` writes and what the analysis engine queries out
of core (DuckDB ``read_parquet``), so a log of any size is analysed in bounded
memory. Layout::

    DIR/time_window=<k>/part-<n>.parquet   span rows (SPAN_SCHEMA) of time window k
    DIR/side.parquet                  (not used; reserved)
    DIR/dataset.json                  the manifest (below)

Window ``k`` holds the rows of the invocations that started in
``[k * window_ns, (k + 1) * window_ns)``: a row's time is the earliest host
``ts_ns`` of its ``(pid, inv)`` among the rows of the same chunk (its own
``ts_ns`` for rows without ``inv``), so the device-clock rows of an invocation
land beside its host rows. An invocation whose rows were cut between two chunks
may straddle two adjacent windows; a query for window k therefore reads windows
k-1..k+1 and keeps the invocations whose root starts in k.

``dataset.json`` (schema ``dsprof.span_dataset/1``)::

    {"schema", "window_ns", "span_schema": [column names],
     "files": [{"path": "time_window=3/part-0.parquet", "window": 3, "rows": N,
                "min_ts_ns": .., "max_ts_ns": ..}],
     "trace": {"files", "records_read", "lines_read", "dropped": {reason: n},
               "anchors": [[pid, mono_ns, wall_ns]], "chip_devices": [[pid, device]],
               "process_names": [[pid, name]], "thread_names": [[pid, tid, name]],
               "performance_summary", "faults", "notes"}}

Integers in ``anchors`` are written as JSON integers (Python's json keeps them
exact). The manifest is written last and atomically: a dataset without one is
incomplete and is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dsprof.analysis.spans import ANCHOR_SCHEMA, CHIP_SCHEMA, DICTIONARY_COLUMNS, SPAN_SCHEMA, Trace
from dsprof.errors import InputError
from dsprof.fileio import atomic_write_text

DATASET_SCHEMA = "dsprof.span_dataset/1"
MANIFEST = "dataset.json"
# 2**34 ns ≈ 17 s: far longer than any root, short enough that a window of a
# 64-rank run holds a few hundred thousand rows.
DEFAULT_WINDOW_NS = 1 << 34


def window_of_rows(table: pa.Table, window_ns: int) -> np.ndarray:
    """The window of each row: by its invocation's earliest host start in this table (see module docstring)."""
    ts = table.column("ts_ns").to_numpy(zero_copy_only=False)
    inv = table.column("inv")
    n = table.num_rows
    if n == 0:
        return np.zeros(0, np.int64)
    host = pc.not_equal(table.column("clk"), "dev").to_numpy(zero_copy_only=False)
    has_inv = inv.is_valid().to_numpy(zero_copy_only=False)
    when = ts.astype(np.int64).copy()
    if has_inv.any():
        keys = pa.table({"pid": table.column("pid"), "inv": inv, "ts": pa.array(np.where(host, ts, np.iinfo(np.int64).max))})
        grouped = keys.filter(pa.array(has_inv)).group_by(["pid", "inv"]).aggregate([("ts", "min")])
        joined = keys.append_column("row", pa.array(np.arange(n))).filter(pa.array(has_inv)).join(grouped, ["pid", "inv"])
        rows = joined.column("row").to_numpy()
        first_host = joined.column("ts_min").to_numpy()
        # an invocation with only device rows in this table goes with the table's own time
        fallback = int(np.median(ts[host])) if host.any() else 0
        when[rows] = np.where(first_host == np.iinfo(np.int64).max, fallback, first_host)
    return np.floor_divide(when, window_ns)


class SpanDatasetWriter:
    """A SpanSink that writes each table it is given as Parquet files, one per time window touched."""

    def __init__(self, directory: str | os.PathLike, window_ns: int = DEFAULT_WINDOW_NS, part_prefix: str = "part"):
        self.directory = Path(directory)
        self.window_ns = window_ns
        self.part_prefix = part_prefix  # writers sharing a directory (cluster ingest) use distinct prefixes
        self.files: list[dict] = []
        self._parts = 0
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / MANIFEST).unlink(missing_ok=True)  # the old dataset is incomplete from here on

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        windows = window_of_rows(table, self.window_ns)
        order = np.argsort(windows, kind="stable")
        sorted_windows = windows[order]
        cuts = np.flatnonzero(np.diff(sorted_windows)) + 1
        for rows in np.split(order, cuts):  # one piece per window this table touches
            self._write(int(windows[rows[0]]), table.take(pa.array(rows)))

    def _write(self, window: int, table: pa.Table) -> None:
        relative = Path(f"time_window={window}") / f"{self.part_prefix}-{self._parts}.parquet"
        self._parts += 1
        (self.directory / relative.parent).mkdir(exist_ok=True)
        pq.write_table(table, self.directory / relative, compression="none", use_dictionary=list(DICTIONARY_COLUMNS))
        ts = table.column("ts_ns")
        self.files.append({"path": relative.as_posix(), "window": window, "rows": table.num_rows,
                           "min_ts_ns": pc.min(ts).as_py(), "max_ts_ns": pc.max(ts).as_py()})

    def finish(self, trace: Trace) -> Path:
        """Write the manifest with ``trace``'s side information; the dataset is complete from here on."""
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
        atomic_write_text(path, json.dumps(manifest) + "\n")
        return path


def open_dataset(directory: str | os.PathLike) -> Trace:
    """The Trace of a complete span dataset: its files listed in ``span_files``, side tables loaded."""
    directory = Path(directory)
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(directory, "span dataset has no dataset.json (incomplete: ingest did not finish)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(path, f"cannot read the manifest: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != DATASET_SCHEMA:
        raise InputError(path, "not a span dataset manifest", expected=DATASET_SCHEMA)
    side = manifest.get("trace") or {}
    anchors = side.get("anchors") or []
    chips = side.get("chip_devices") or []
    return Trace(
        span_files=[directory / f["path"] for f in manifest.get("files") or []],
        anchors=pa.table({k: pa.array([a[i] for a in anchors], pa.int64()) for i, k in enumerate(ANCHOR_SCHEMA.names)}),
        chip_devices=pa.table({"pid": pa.array([c[0] for c in chips], pa.int64()), "device": pa.array([c[1] for c in chips], pa.string())},
                              schema=CHIP_SCHEMA),
        dropped={str(k): int(v) for k, v in (side.get("dropped") or {}).items()},
        records_read=int(side.get("records_read") or 0),
        lines_read=int(side.get("lines_read") or 0),
        files=[str(f) for f in side.get("files") or []],
        process_names={int(p): str(n) for p, n in side.get("process_names") or []},
        thread_names={(int(p), int(t)): str(n) for p, t, n in side.get("thread_names") or []},
        performance_summary=side.get("performance_summary"),
        faults=side.get("faults"),
        notes=[str(n) for n in side.get("notes") or []],
    )
