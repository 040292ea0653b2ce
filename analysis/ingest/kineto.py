"""Reader for PyTorch-profiler (Kineto) traces of a multi-rank job (SPEC §1.1): one file per rank, read as one job.

It makes from each rank's steps the rows the STRACE reader makes for a run, so
that every analysis runs on them unchanged. Each file is streamed
(:mod:`.json_stream`) and only the events the diagnosis needs are kept, in a
DuckDB database of the reader's own that spills past :data:`READER_MEMORY_LIMIT`;
rows are handed on a chunk at a time, so a job holds about one file's worth of
memory, not the job's. :data:`FILLS` and :data:`LACKS` are the one statement of
which phases the source gives. Format: docs/FORMATS.md, "Kineto traces".
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.ingest.chrome import read_document
from dsprof.analysis.ingest.json_stream import ChromeDocument
from dsprof.analysis.ingest.sink import SpanSink
from dsprof.analysis.store.intervals import islands_sql, union_sql
from dsprof.analysis.store.spans import ATTRS_TYPE, PARQUET_SCHEMA, SPAN_SCHEMA, Trace, merge_traces
from dsprof.errors import InputError
from dsprof.interrupts import interruptible
from dsprof.profiler import strace_format as fmt
from dsprof.profiler import torch_labels
from dsprof.profiler.chrome_json import DEFAULT_LIMITS, JsonLimits
from dsprof.progress import Progress
from dsprof.tempdirs import make_owned_dir, remove_owned_dir

if TYPE_CHECKING:  # duckdb is imported where a Kineto trace is read: a command reading none never loads it
    import duckdb

SOURCE = "kineto"
HID_PREFIX = "kineto:"
STEP_PREFIX, PROFILER_STEP = torch_labels.STEP_PREFIX, torch_labels.PROFILER_STEP
COMPUTE = f"{fmt.DEVICE_WALL}.compute"
HOST_GAP = f"{fmt.DEVICE_WALL}.host_gap"
# in a labelled device program the time with neither op nor collective is the device's own (the CPU device's
# Python between ops, a collection, a wait for a CPU), not a host that launched nothing
BETWEEN_OPS = f"{fmt.DEVICE_WALL}.between_ops"
ACTIVITY = f"{fmt.DEVICE_WALL}.activity"  # + "." + kind: one row per device activity
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "c10d::")
PARAM_COMMS = "record_param_comms"
COLLECTIVE_NAME_ARG, GROUP_ARG, CORRELATION_ARG = "Collective name", "Process Group Name", "correlation"

# The phases of a run the Kineto source fills (invocation-table columns), and those it lacks
FILLS = (
    "root",
    "runner_run",
    "device_wall",
    "device_waits (collectives, with peer)",
    "device_wall.compute",
    "device_wall.host_gap (device_wall.between_ops in a labelled device program)",
    "device_wall.activity.* (device activities)",
)
LACKS = ("bind", "validate", "claim_release", "native_fence_wait", "host evidence (os.*)")

# where two files share a pid (ranks on several hosts), each rank's runs take this + rank instead
SHARED_PID_BASE = 1 << 30
# rows made and handed on at a time: a sink holds a chunk of a rank, not the job
ROWS_PER_CHUNK = 1 << 16
# the reader's database holds at most this much memory, then spills to a private folder (prefix SPILL_PREFIX)
READER_MEMORY_LIMIT = 64 << 20
SPILL_PREFIX = "dsprof-kineto-"
_PARTS = ("steps", "collectives", "activities", "launches", "ops", "programs")
# collective record kinds, in the order of preference within one file
_KERNEL, _ANNOTATION, _PARAM_COMMS, _C10D = range(4)
ACTIVITY_KINDS = {"compute": 0, "communication": 1, "memory": 2}


def token_ready_sql(alias: str) -> str:
    """SQL: when a run's token is ready: the end of its validate; a Kineto run, which has none, at its end (SPEC §1.1)."""
    return f"CASE WHEN starts_with({alias}.hid, '{HID_PREFIX}') THEN {alias}.root_end_ns ELSE {alias}.validate_end_ns END"


def is_kineto(path: Path, limits: JsonLimits = DEFAULT_LIMITS) -> bool:
    """Whether a Chrome JSON file is a PyTorch-profiler trace: it describes its process (``distributedInfo``, ``deviceProperties``)."""
    try:
        document = ChromeDocument(path, limits)
        document.head()
    except InputError:
        return False
    return "distributedInfo" in document.kept or "deviceProperties" in document.kept


@dataclass
class _StagedFile:
    """A rank's file once its tables are in the reader's database: what is left to decide its rank and pids."""

    path: Path
    rank: int | None
    host: str
    trace: Trace
    pids: set[int]


@dataclass
class _RankFile:
    """What one rank's file holds of use, as narrow tables (ns, after baseTimeNanoseconds)."""

    path: Path
    rank: int | None
    host: str
    trace: Trace
    steps: pa.Table
    collectives: pa.Table
    activities: pa.Table
    launches: pa.Table
    ops: pa.Table
    programs: pa.Table


class _Selector:
    """The span sink that keeps, of each converted batch, the few columns of the events the diagnosis reads."""

    def __init__(self, step_marker: str | None):
        self.step_marker = step_marker
        self.parts: dict[str, list[pa.Table]] = {
            "steps": [],
            "collectives": [],
            "activities": [],
            "launches": [],
            "ops": [],
            "programs": [],
        }

    def add(self, table: pa.Table) -> None:
        names = table.column("name")
        cats = table.column("cat").cast(pa.string())
        spans = pc.equal(table.column("ph").cast(pa.string()), "X")
        attrs = table.column("attrs")
        if self.step_marker is not None:
            steps = pc.equal(names, self.step_marker)
        else:
            steps = pc.match_substring_regex(names, f"^{STEP_PREFIX}[0-9]+$")
        device = pc.is_in(cats, pa.array(DEVICE_CATS))
        comm_kernel = pc.and_(pc.equal(cats, "kernel"), pc.match_substring(names, "nccl", ignore_case=True))
        annotation = pc.or_(*(pc.starts_with(names, p) for p in COLLECTIVE_PREFIXES[:2]))
        kind = pc.if_else(
            comm_kernel,
            _KERNEL,
            pc.if_else(
                annotation,
                _ANNOTATION,
                pc.if_else(pc.equal(names, PARAM_COMMS), _PARAM_COMMS, pc.if_else(pc.starts_with(names, "c10d::"), _C10D, -1)),
            ),
        )
        collective = pc.and_(spans, pc.greater_equal(kind, 0))
        base = ["pid", "tid", "line", "ts_ns", "dur_ns"]
        self._keep("steps", table, pc.and_(spans, steps), base + ["name"])
        coll = table.filter(collective)
        if coll.num_rows:
            named = pc.map_lookup(coll.column("attrs"), COLLECTIVE_NAME_ARG, "first")
            is_param = pc.equal(kind.filter(collective), _PARAM_COMMS)
            self.parts["collectives"].append(
                pa.table(
                    {
                        **{c: coll.column(c) for c in base},
                        "kind": kind.filter(collective).cast(pa.int8()),
                        "name": pc.if_else(is_param, pc.coalesce(named, PARAM_COMMS), _short_name(coll.column("name"))),
                        "grp": pc.coalesce(pc.map_lookup(coll.column("attrs"), GROUP_ARG, "first"), ""),
                        "correlation": _correlation(coll.column("attrs")),
                    }
                )
            )
        acts = table.filter(pc.and_(spans, device))
        if acts.num_rows:
            activity = pc.if_else(
                pc.equal(acts.column("cat").cast(pa.string()), "kernel"),
                pc.if_else(comm_kernel.filter(pc.and_(spans, device)), ACTIVITY_KINDS["communication"], ACTIVITY_KINDS["compute"]),
                ACTIVITY_KINDS["memory"],
            )
            self.parts["activities"].append(
                pa.table(
                    {
                        "ts_ns": acts.column("ts_ns"),
                        "dur_ns": acts.column("dur_ns"),
                        "activity": activity.cast(pa.int8()),
                        "correlation": _correlation(acts.column("attrs")),
                    }
                )
            )
        launch = pc.and_(spans, pc.and_(pc.starts_with(cats, "cuda_"), pc.is_valid(_correlation(attrs))))
        launches = table.filter(launch)
        if launches.num_rows:
            self.parts["launches"].append(
                pa.table({"ts_ns": launches.column("ts_ns"), "correlation": _correlation(launches.column("attrs"))})
            )
        ops = pc.and_(spans, pc.and_(pc.equal(cats, "cpu_op"), pc.less(kind, 0)))
        self._keep("ops", table, ops, ["tid", "ts_ns", "dur_ns"])
        programs = pc.or_(
            pc.equal(names, torch_labels.PROGRAM), pc.match_substring_regex(names, torch_labels.step_label_regex(torch_labels.PROGRAM))
        )
        self._keep("programs", table, pc.and_(spans, programs), ["tid", "ts_ns", "dur_ns", "name"])

    def _keep(self, part: str, table: pa.Table, mask: pa.Array, columns: list[str]) -> None:
        kept = table.filter(mask).select(columns)
        if kept.num_rows:
            self.parts[part].append(kept)

    def table(self, part: str, schema: pa.Schema) -> pa.Table:
        tables = [t.cast(schema) for t in self.parts[part]]
        return pa.concat_tables(tables) if tables else schema.empty_table()


def _short_name(names: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A kernel's name up to its argument list; annotation names as they are."""
    return pc.utf8_slice_codeunits(pc.replace_substring_regex(names, r"\(.*$", ""), 0, 80)


def _correlation(attrs: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pc.cast(pc.map_lookup(attrs, CORRELATION_ARG, "first"), pa.int64(), safe=False)


_STEP_COLUMNS = pa.schema(
    [("pid", pa.int64()), ("tid", pa.int64()), ("line", pa.int64()), ("ts_ns", pa.int64()), ("dur_ns", pa.int64()), ("name", pa.string())]
)
_COLLECTIVE_COLUMNS = pa.schema(
    [
        *(_STEP_COLUMNS.field(c) for c in ("pid", "tid", "line", "ts_ns", "dur_ns")),
        ("kind", pa.int8()),
        ("name", pa.string()),
        ("grp", pa.string()),
        ("correlation", pa.int64()),
    ]
)
_ACTIVITY_COLUMNS = pa.schema([("ts_ns", pa.int64()), ("dur_ns", pa.int64()), ("activity", pa.int8()), ("correlation", pa.int64())])
_LAUNCH_COLUMNS = pa.schema([("ts_ns", pa.int64()), ("correlation", pa.int64())])
_OP_COLUMNS = pa.schema([("tid", pa.int64()), ("ts_ns", pa.int64()), ("dur_ns", pa.int64())])
_PROGRAM_COLUMNS = pa.schema([*_OP_COLUMNS, ("name", pa.string())])


def _read_rank_file(path: Path, step_marker: str | None, limits: JsonLimits) -> _RankFile:
    selector = _Selector(step_marker)
    trace, document = read_document(path, SOURCE, limits, sink=selector)
    # flow and counter events, sort-order metadata: the profiler's own, not damage (launches are linked by correlation)
    unused = trace.dropped.pop("unsupported_phase", 0) + trace.dropped.pop("unsupported_metadata", 0)
    if unused:
        trace.notes.append(f"{path}: {unused} flow, counter and sort-order events not used")
    info = document.kept.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    host = document.kept.get("host_name")
    return _RankFile(
        path=path,
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None,
        host=host if isinstance(host, str) else "",
        trace=trace,
        steps=selector.table("steps", _STEP_COLUMNS),
        collectives=selector.table("collectives", _COLLECTIVE_COLUMNS),
        activities=selector.table("activities", _ACTIVITY_COLUMNS),
        launches=selector.table("launches", _LAUNCH_COLUMNS),
        ops=selector.table("ops", _OP_COLUMNS),
        programs=selector.table("programs", _PROGRAM_COLUMNS),
    )


def read_kineto_traces(
    paths: Sequence[str | os.PathLike],
    *,
    step_marker: str | None = None,
    limits: JsonLimits = DEFAULT_LIMITS,
    progress: Progress = None,
    sink: SpanSink | None = None,
) -> Trace:
    """The runs of a multi-rank job's per-rank Kineto traces (see the module docstring), as one Trace.

    With a ``sink``, each file's rows go to it as they are made (the trace keeps
    their count), so memory holds one rank's rows, not the job's.
    """
    with ExitStack() as cleanup:  # each step undone even if another's undoing is cut short by a signal
        spill = make_owned_dir(SPILL_PREFIX)
        cleanup.callback(remove_owned_dir, spill)
        import duckdb

        con = interruptible(duckdb.connect(config={"memory_limit": f"{READER_MEMORY_LIMIT}B", "temp_directory": str(spill)}))
        cleanup.callback(con.close)
        con.execute("SET enable_progress_bar = false")  # progress is the caller's, not bars on stderr
        files = []
        for index, path in enumerate(sorted(map(Path, paths))):
            if progress is not None:
                progress(f"reading {path}")
            files.append(_staged(con, _read_rank_file(path, step_marker, limits), index))
        trace = merge_traces([f.trace for f in files])
        trace.files = [str(f.path) for f in files]
        if not files:
            return trace
        _register(con, files, _assign_ranks(files, trace))
        _align_hosts(con, trace)
        label = step_marker or PROFILER_STEP
        names = [str(f.path) for f in files]
        chunks = (_span_rows(rows, names, label) for rows in _runs(con, len(files)))
        trace.spans = _handed(chunks, sink, trace) if sink is not None else pa.concat_tables(list(chunks))
    trace.notes.append(
        f"Kineto traces: {len(files)} ranks; phases filled: {', '.join(FILLS)}; lacking (their figures absent): {', '.join(LACKS)}"
    )
    return trace


def _assign_ranks(files: list[_StagedFile], trace: Trace) -> list[int]:
    """Each file's rank: ``distributedInfo.rank`` when every file has a distinct one, else the order of the files (noted)."""
    given = [f.rank for f in files]
    if all(r is not None for r in given) and len(set(given)) == len(given):
        return [int(r) for r in given if r is not None]
    trace.notes.append("Kineto traces: ranks from the order of the files (distributedInfo.rank missing or repeated)")
    return list(range(len(files)))


def _staged(con: duckdb.DuckDBPyConnection, file: _RankFile, index: int) -> _StagedFile:
    """Append the file's tables to ``<part>_staged`` in ``con`` with its index, so memory holds one file's tables, not the job's."""
    for part in _PARTS:
        table = getattr(file, part)
        con.register("file_part", table.append_column("file_index", pa.array(np.full(table.num_rows, index, np.int64))))
        con.execute(f"CREATE TABLE IF NOT EXISTS {part}_staged AS SELECT * FROM file_part LIMIT 0")
        con.execute(f"INSERT INTO {part}_staged SELECT * FROM file_part")
        con.unregister("file_part")
    pids = set(file.steps.column("pid").to_pylist())
    return _StagedFile(path=file.path, rank=file.rank, host=file.host, trace=file.trace, pids=pids)


def _register(con: duckdb.DuckDBPyConnection, files: list[_StagedFile], ranks: list[int]) -> None:
    """The files' tables, stacked with their rank, host and file, in ``con``; pids made distinct where files share one."""
    shared = any(files[i].pids & files[j].pids for i in range(len(files)) for j in range(i))
    con.register("file_ranks", pa.table({"file_index": range(len(files)), "rank": ranks, "host": [f.host for f in files]}))
    for part in _PARTS:
        con.execute(f"""CREATE TEMP VIEW {part}_in AS SELECT s.* EXCLUDE (file_index), r.rank, r.host, s.file_index
                        FROM {part}_staged s JOIN file_ranks r USING (file_index)""")
    pid = f"{SHARED_PID_BASE} + rank" if shared else "pid"  # int32, as trace viewers take pids
    con.execute(f"""CREATE TEMP TABLE steps AS SELECT rank, host, file_index, {pid} AS pid, tid, line, ts_ns, dur_ns,
                           TRY_CAST(regexp_extract(name, '^{STEP_PREFIX}([0-9]+)$', 1) AS BIGINT) AS number FROM steps_in""")
    con.execute("""CREATE TEMP TABLE colls AS SELECT * FROM collectives_in c
                   WHERE kind = (SELECT min(kind) FROM collectives_in k WHERE k.rank = c.rank)""")
    for part in ("activities", "launches", "ops"):
        con.execute(f"CREATE TEMP TABLE {part} AS SELECT * FROM {part}_in")
    con.execute(f"""CREATE TEMP TABLE programs AS SELECT rank, host, tid, ts_ns, dur_ns,
                           TRY_CAST(regexp_extract(name, '{torch_labels.step_label_regex(torch_labels.PROGRAM)}', 1) AS BIGINT) AS number
                    FROM programs_in""")


def _align_hosts(con: duckdb.DuckDBPyConnection, trace: Trace) -> None:
    """Shift every host but the first rank's onto its clock, from the collectives' arrivals and exits (noted)."""
    hosts = [row[0] for row in con.execute("SELECT DISTINCT host FROM steps ORDER BY host").fetchall()]
    if len(hosts) < 2:
        return
    # Each instance bounds the offset o added to host h: its ranks cannot leave before the reference host's last
    # arrival, nor the reference host's before h's last arrival. The midpoint of the tightest bounds is taken
    # (the median difference of the exits where the bounds cross).
    offsets = con.execute("""
        WITH calls AS (SELECT host, grp, name, ts_ns, ts_ns + dur_ns AS end_ns,
                              row_number() OVER (PARTITION BY rank, grp, name ORDER BY ts_ns, dur_ns) AS n FROM colls),
             per_host AS (SELECT host, grp, name, n, max(ts_ns) AS arrival_ns, min(end_ns) AS exit_ns FROM calls GROUP BY host, grp, name, n),
             ref AS (SELECT arg_min(host, rank) AS host FROM steps),
             bounds AS (SELECT h.host, max(r.arrival_ns - h.exit_ns) AS lo, min(r.exit_ns - h.arrival_ns) AS hi,
                               quantile_disc(r.exit_ns - h.exit_ns, 0.5) AS median_ns, count(*) AS instances
                        FROM per_host h JOIN per_host r USING (grp, name, n)
                        WHERE r.host = (SELECT host FROM ref) AND h.host <> r.host GROUP BY h.host)
        SELECT host, CASE WHEN lo <= hi THEN lo + (hi - lo) // 2 ELSE median_ns END, instances FROM bounds ORDER BY host""").fetchall()
    aligned = {host for host, _, _ in offsets}
    con.register("host_offsets", pa.table({"host": [h for h, _, _ in offsets], "offset_ns": [int(o) for _, o, _ in offsets]}))
    for part in ("steps", "colls", "activities", "launches", "ops", "programs"):
        con.execute(f"UPDATE {part} SET ts_ns = ts_ns + o.offset_ns FROM host_offsets o WHERE {part}.host = o.host")
    reference = con.execute("SELECT arg_min(host, rank) FROM steps").fetchone()
    for host, offset, instances in offsets:
        trace.notes.append(
            f"Kineto clock of host {host!r} aligned to host {reference[0] if reference else ''!r}: "
            f"{int(offset)} ns, from {int(instances)} collective instances"
        )
    for host in sorted(set(hosts) - aligned - {reference[0] if reference else None}):
        trace.notes.append(f"Kineto clock of host {host!r} not aligned: no collective instance in common with the first rank's host")


def _assigned(events: str, same_thread: bool) -> str:
    """SQL: the rows of ``events`` (with ``rank``, ``tid``, ``anchor_ns``) and ``inv``, the run each belongs to.

    On a rank whose trace labels its device programs (``device_wall#N``), the
    numbered program holding the anchor (on the same thread, for ``same_thread``);
    a row in no numbered program belongs to no run. On any other rank, the step
    that began last at or before the anchor.
    """
    thread = "AND p.tid = e.tid" if same_thread else ""
    return f"""(SELECT e.*, CASE WHEN e.rank IN (SELECT rank FROM progs) THEN p.inv ELSE w.inv END AS inv
        FROM {events} e
        LEFT JOIN progs p ON p.rank = e.rank AND e.anchor_ns >= p.ts_ns AND e.anchor_ns < p.end_ns {thread}
        LEFT JOIN windows w ON w.rank = e.rank AND e.rank NOT IN (SELECT rank FROM progs)
                               AND e.anchor_ns >= w.ts_ns AND e.anchor_ns < w.next_ns
        WHERE (CASE WHEN e.rank IN (SELECT rank FROM progs) THEN p.inv ELSE w.inv END) IS NOT NULL)"""


def _handed(chunks: Iterator[pa.Table], sink: SpanSink, trace: Trace) -> pa.Table:
    """Hand each chunk of rows to ``sink`` as it is made, counted in ``trace.spans_written``; the trace keeps none."""
    for chunk in chunks:
        sink.add(chunk.cast(PARQUET_SCHEMA))
        trace.spans_written[SOURCE] = trace.spans_written.get(SOURCE, 0) + chunk.num_rows
        pa.default_memory_pool().release_unused()  # the chunks handed on: their memory back, not kept by the allocator
    return SPAN_SCHEMA.empty_table()


def _runs(con: duckdb.DuckDBPyConnection, files: int) -> Iterator[pa.Table]:
    """The STRACE-shaped rows of every step of every rank (see the module docstring), one file's at a time."""
    con.execute("""CREATE TEMP TABLE windows AS
        SELECT *, row_number() OVER by_rank AS inv, ts_ns + dur_ns AS end_ns,
               coalesce(lead(ts_ns) OVER by_rank, ts_ns + dur_ns) AS next_ns
        FROM steps WINDOW by_rank AS (PARTITION BY rank ORDER BY ts_ns, line)""")
    # the device programs (inv: the measured step each ran for; NULL for another program, e.g. the prefill), and per
    # run the stretch its device timeline covers: on a CPU device (a rank with programs and no device activity) its
    # program, else its step (a CUDA program's label is the host's enqueue: its kernels run after it)
    con.execute("""CREATE TEMP TABLE progs AS SELECT p.rank, p.tid, p.ts_ns, p.ts_ns + p.dur_ns AS end_ns, w.inv
                   FROM programs p LEFT JOIN windows w ON w.rank = p.rank AND w.number = p.number""")
    con.execute("""CREATE TEMP TABLE cpu_device AS SELECT DISTINCT rank FROM progs WHERE rank NOT IN (SELECT rank FROM activities)""")
    con.execute("""CREATE TEMP TABLE stretch AS
        SELECT w.rank, w.inv, w.ts_ns AS step_ns, coalesce(p.lo, w.ts_ns) AS lo, coalesce(p.hi, w.end_ns) AS hi
        FROM windows w LEFT JOIN (SELECT rank, inv, min(ts_ns) AS lo, max(end_ns) AS hi FROM progs
                                  WHERE rank IN (SELECT rank FROM cpu_device) GROUP BY ALL) p USING (rank, inv)""")
    first_launch = "(SELECT rank, correlation, min(ts_ns) AS ts_ns FROM launches GROUP BY ALL)"
    con.execute(f"""CREATE TEMP TABLE calls AS
        SELECT c.*, row_number() OVER (PARTITION BY c.rank, c.grp, c.name ORDER BY c.ts_ns, c.dur_ns, c.line) AS n,
               coalesce(l.ts_ns, c.ts_ns) AS anchor_ns
        FROM colls c LEFT JOIN {first_launch} l ON l.rank = c.rank AND l.correlation = c.correlation""")
    con.execute(f"""CREATE TEMP TABLE step_calls AS
        SELECT a.rank, a.inv, a.name, a.n, a.ts_ns, a.dur_ns, s.step_ns, p.peer
        FROM {_assigned("calls", same_thread=False)} a JOIN stretch s USING (rank, inv)
        JOIN (SELECT grp, name, n, arg_max(rank, (ts_ns, rank)) AS peer FROM calls GROUP BY grp, name, n) p USING (grp, name, n)""")
    launched = f"""(SELECT a.*, NULL AS tid, coalesce(l.ts_ns, a.ts_ns) AS anchor_ns
                    FROM activities a LEFT JOIN {first_launch} l ON l.rank = a.rank AND l.correlation = a.correlation)"""
    con.execute(f"""CREATE TEMP TABLE step_activities AS
        SELECT a.rank, a.inv, a.activity, a.ts_ns, a.dur_ns, s.step_ns
        FROM {_assigned(launched, same_thread=False)} a JOIN stretch s USING (rank, inv)""")
    ops = _assigned("(SELECT *, ts_ns AS anchor_ns FROM ops WHERE rank NOT IN (SELECT rank FROM activities WHERE activity = 0))", True)
    busy = f"""(SELECT rank, inv, ts_ns AS lo, ts_ns + dur_ns AS hi FROM step_activities WHERE activity = 0
               UNION ALL SELECT rank, inv, ts_ns, ts_ns + dur_ns FROM {ops})"""
    clip = "SELECT b.rank, b.inv, greatest(b.lo, s.lo) AS lo, least(b.hi, s.hi) AS hi FROM {} b JOIN stretch s USING (rank, inv)"
    con.execute(f"CREATE TEMP TABLE compute AS {union_sql('(' + clip.format(busy) + ')', 'rank, inv')}")
    both = f"({clip.format(busy)} UNION ALL {clip.format('(SELECT rank, inv, ts_ns AS lo, ts_ns + dur_ns AS hi FROM step_calls)')})"
    con.execute(f"CREATE TEMP TABLE covered AS {union_sql(both, 'rank, inv')}")
    # a program's outermost ops are the CPU device's activities (a GPU's are its kernels)
    program_ops = f"(SELECT * FROM ({clip.format(busy)}) WHERE rank IN (SELECT rank FROM cpu_device))"
    con.execute(f"""INSERT INTO step_activities SELECT o.rank, o.inv, {ACTIVITY_KINDS["compute"]}, o.lo, o.hi - o.lo, s.step_ns
                    FROM ({islands_sql(program_ops, "rank, inv")}) o JOIN stretch s USING (rank, inv)""")
    con.register("activity_kinds", pa.table({"activity": pa.array(list(ACTIVITY_KINDS.values()), pa.int8()), "kind": list(ACTIVITY_KINDS)}))
    con.execute(f"""CREATE TEMP TABLE kineto_rows AS
        WITH run AS (SELECT w.*, coalesce(w.number, w.inv - 1) AS step, s.lo - w.ts_ns AS device_ts_ns, s.hi - s.lo AS device_ns,
                            CASE WHEN w.host = '' THEN 'rank' || w.rank ELSE w.host || ':rank' || w.rank END AS device
                     FROM windows w JOIN stretch s USING (rank, inv))
        SELECT file_index, line, pid, tid, '{fmt.ROOT}' AS name, ts_ns, dur_ns, inv, 0 AS depth, 'host' AS clk,
               rank, step, device, NULL::BIGINT AS peer, NULL::BIGINT AS n FROM run
        UNION ALL SELECT file_index, line, pid, tid, '{fmt.RUNNER_RUN}', ts_ns, dur_ns, inv, 1, 'host', NULL, NULL, NULL, NULL, NULL FROM run
        UNION ALL SELECT file_index, line, pid, tid, '{fmt.DEVICE_WALL}', device_ts_ns, device_ns, inv, 2, '{fmt.CLK_DEVICE}',
                         NULL, NULL, NULL, NULL, NULL
                  FROM run
        UNION ALL SELECT r.file_index, r.line, r.pid, r.tid, '{COMPUTE}', coalesce(c.first_ns - r.ts_ns, r.device_ts_ns),
                         coalesce(c.union_ns, 0), r.inv, 3, '{fmt.CLK_DEVICE}', NULL, NULL, NULL, NULL, NULL
                  FROM run r LEFT JOIN compute c USING (rank, inv)
        UNION ALL SELECT r.file_index, r.line, r.pid, r.tid,
                         CASE WHEN r.rank IN (SELECT rank FROM cpu_device) THEN '{BETWEEN_OPS}' ELSE '{HOST_GAP}' END, r.device_ts_ns, greatest(r.device_ns - coalesce(v.union_ns, 0), 0),
                         r.inv, 3, '{fmt.CLK_DEVICE}', NULL, NULL, NULL, NULL, NULL
                  FROM run r LEFT JOIN covered v USING (rank, inv)
        UNION ALL SELECT r.file_index, r.line, r.pid, r.tid, '{fmt.DEVICE_WALL}.' || s.name || '{fmt.WAIT_SUFFIX}', s.ts_ns - s.step_ns,
                         s.dur_ns, r.inv, 3, '{fmt.CLK_DEVICE}', NULL, NULL, NULL, s.peer, s.n
                  FROM run r JOIN step_calls s USING (rank, inv)
        UNION ALL SELECT r.file_index, r.line, r.pid, r.tid, '{ACTIVITY}.' || k.kind, a.ts_ns - a.step_ns, a.dur_ns, r.inv, 4,
                         '{fmt.CLK_DEVICE}', NULL, NULL, NULL, NULL, NULL
                  FROM run r JOIN step_activities a USING (rank, inv) JOIN activity_kinds k USING (activity)""")
    for index in range(files):
        ordered = con.sql(f"SELECT * FROM kineto_rows WHERE file_index = {index} ORDER BY inv, depth, ts_ns, name, dur_ns")
        for batch in ordered.to_arrow_reader(ROWS_PER_CHUNK):
            yield pa.Table.from_batches([batch])


def _span_rows(rows: pa.Table, names: list[str], label: str) -> pa.Table:
    """SPAN_SCHEMA rows from the query's columns: the root carries rank, step, device, callable; waits their peer and instance."""
    n = rows.num_rows
    is_root = pc.equal(rows.column("depth"), 0)
    columns = {
        "source": pa.repeat(pa.scalar(SOURCE), n),
        "file": pa.array(names).take(rows.column("file_index")),
        "line": rows.column("line"),
        "pid": rows.column("pid"),
        "tid": rows.column("tid"),
        "name": rows.column("name"),
        "cat": pa.repeat(pa.scalar(""), n),
        "ph": pa.repeat(pa.scalar("X"), n),
        "ts_ns": rows.column("ts_ns"),
        "dur_ns": rows.column("dur_ns"),
        "inv": rows.column("inv"),
        "hid": pa.repeat(pa.scalar(HID_PREFIX + label), n),
        "depth": rows.column("depth"),
        "clk": rows.column("clk"),
        "rank": rows.column("rank"),
        "step": rows.column("step"),
        "device": rows.column("device"),
        "callable": pc.if_else(is_root, label, pa.scalar(None, pa.string())),
        "attrs": _wait_attrs(rows.column("peer"), rows.column("n")),
    }
    return pa.table([columns.get(f.name, pa.nulls(n, f.type)).cast(f.type) for f in SPAN_SCHEMA], schema=SPAN_SCHEMA)


def _wait_attrs(peer: pa.ChunkedArray, instance: pa.ChunkedArray) -> pa.Array:
    """``{peer, instance}`` on the collective waits, no attributes elsewhere."""
    has = pc.is_valid(peer).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(has) + 1, np.int32)
    np.cumsum(has * 2, out=offsets[1:])
    keys = pa.array(np.tile(np.array([fmt.PEER_ATTR, "instance"], object), int(has.sum())), pa.string())
    values = pc.cast(pa.concat_arrays([c.filter(pa.array(has)) for c in (peer.combine_chunks(), instance.combine_chunks())]), pa.string())
    order = np.arange(len(values)).reshape(2, -1).T.ravel() if len(values) else np.zeros(0, np.int64)
    return pa.MapArray.from_arrays(pa.array(offsets), keys, values.take(pa.array(order)), type=ATTRS_TYPE)
