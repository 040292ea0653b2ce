"""The invocation table: one row per ``(pid, inv)`` with the times and host evidence of its phases.

docs/FORMATS.md (STRACE): an invocation is the set of STRACE rows sharing ``(pid, inv)``; its
root is the host-clock ``depth == 0`` row, every other row is a child by
``inv`` (never by timestamp containment), known by its span name. This is the
one span-sized pass of the analysis: a grouped aggregation, so it runs
out of core over a span dataset, on a large trace in passes over shares of the
invocations (:func:`create_invocations`), and on a cluster per time window.

Columns (ns; null where the phase or attribute is absent): ``pid, inv,
n_roots`` (host depth-0 rows; 0 = the root never closed, > 1 = duplicates), ``n_spans``,
the root's ``tid, hid, root_ts_ns, root_end_ns``, its attributes ``callable,
rank_attr, device_attr, step_attr, run_epoch, slot_id, run_id, dispatch_id,
generation``, and per phase the earliest span of that name:
``bind_ts_ns/bind_end_ns, runner_ts_ns/runner_end_ns, fence_ts_ns/fence_end_ns,
claim_ts_ns, validate_ts_ns/validate_end_ns``; host evidence ``<phase>_cpu_ns,
<phase>_rq_ns`` for root, bind, runner, fence and validate; on the device
clock ``device_ts_ns`` (offset from the launch) and ``device_wall_ns``
(duration), the executor's ``device_cpu_ns, device_rq_ns`` where the device is
a host thread, ``device_wait_ns`` (device spans below device_wall whose name
ends in ``_wait``: waiting on peers), ``device_wait_rq_ns`` (their ``os.rq_ns``: on a
CPU device, how long the device's threads could not run while it waited),
``device_waits`` (those spans in start
order: ``ts_ns`` offset, ``dur_ns``, ``name``, ``peer`` attribute) and
``device_markers`` (depth-2-or-deeper runner spans: 0 when the run switched
device-phase markers off).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from dsprof.analysis.store.dataset import files_by_window
from dsprof.analysis.store.engine import parquet_source
from dsprof.analysis.store.predicates import gc_row, host_root, in_share, runtime_row
from dsprof.profiler import strace_format as fmt

if TYPE_CHECKING:
    from dsprof.analysis.store.engine import Engine

# Spans aggregated in one pass at most: the aggregation's hash table and its plain result are sized by the
# invocations of a pass (64 x 30k steps, 17M spans: 2.3 GB at peak in one pass, 1.4 GB in four, as fast).
SPANS_PER_PASS = 5_000_000
# ... and at most one per this many bytes of the engine's memory limit, whose operators a pass must fit in: at
# 64 x 100k a pass of 5M spans ran out of a 1.5 GB limit one run in three and of 1 GB every time, and passes of
# 2.5M spans completed under 1 GB (benchmarks/README.md)
PASS_BYTES_PER_SPAN = 400

_HOST_ROOT = host_root()


# Phases aggregated per invocation: (span name, column prefix, carries host evidence)
_PHASES = (
    (fmt.BIND, "bind", True),
    (fmt.RUNNER_RUN, "runner", True),
    (fmt.FENCE_WAIT, "fence", True),
    (fmt.CLAIM_RELEASE, "claim", False),
    (fmt.VALIDATE, "validate", True),
)
# root field -> invocation column
_ROOT_COLUMNS = (
    ("tid", "tid"),
    ("hid", "hid"),
    ("callable", "callable"),
    ("rank", "rank_attr"),
    ("device", "device_attr"),
    ("step", "step_attr"),
    *((name, name) for name in fmt.IDENTITY_ATTRS),
    ("os_cpu_ns", "root_cpu_ns"),
    ("os_rq_ns", "root_rq_ns"),
)
_DEVICE = f"clk = '{fmt.CLK_DEVICE}'"
# a device-clock wait on peers inside the device program (a collective such as the MoE all-to-all)
_COLLECTIVE_WAIT = f"{_DEVICE} AND starts_with(name, '{fmt.DEVICE_WALL}.') AND ends_with(name, '{fmt.WAIT_SUFFIX}')"


def _earliest(alias: str, where: str, fields: dict[str, str]) -> str:
    """Per invocation, the earliest row meeting ``where`` (a ``min`` over a struct led by its start), unpacked as ``fields``.

    One small grouped query per phase, joined on (pid, inv): far cheaper than
    one wide aggregation with a filter per column.
    """
    packed = ", ".join(f"{name} := {expression}" for name, expression in {"ts": "ts_ns", **fields}.items())
    return f"(SELECT pid, inv, min(struct_pack({packed})) AS {alias} FROM runtime WHERE {where} GROUP BY pid, inv)"


def _parts() -> list[tuple[str, str, list[str]]]:
    """(alias, subquery, output columns) of each part joined into the invocation table."""
    parts = [
        (
            "root",
            _earliest("root", _HOST_ROOT, {"end_ns": "ts_ns + dur_ns", **{f: f for f, _ in _ROOT_COLUMNS}}),
            ["root.ts AS root_ts_ns", "root.end_ns AS root_end_ns", *(f"root.{f} AS {alias}" for f, alias in _ROOT_COLUMNS)],
        )
    ]
    for _, (name, prefix, evidence) in enumerate(_PHASES):
        fields = {"end_ns": "ts_ns + dur_ns", **({"cpu": "os_cpu_ns", "rq": "os_rq_ns"} if evidence else {})}
        columns = [f"{prefix}.ts AS {prefix}_ts_ns", f"{prefix}.end_ns AS {prefix}_end_ns"]
        if evidence:
            columns += [f"{prefix}.cpu AS {prefix}_cpu_ns", f"{prefix}.rq AS {prefix}_rq_ns"]
        parts.append((prefix, _earliest(prefix, f"name = '{name}' AND NOT ({_DEVICE})", fields), columns))
    parts.append(
        (
            "device",
            _earliest("device", f"{_DEVICE} AND name = '{fmt.DEVICE_WALL}'", {"dur": "dur_ns", "cpu": "os_cpu_ns", "rq": "os_rq_ns"}),
            ["device.ts AS device_ts_ns", "device.dur AS device_wall_ns", "device.cpu AS device_cpu_ns", "device.rq AS device_rq_ns"],
        )
    )
    return parts


def _base(having: str) -> str:
    """Every invocation, with what is counted or summed over all its rows."""
    return f"""(SELECT pid, inv, count(*) FILTER (WHERE {_HOST_ROOT}) AS n_roots, count(*) AS n_spans,
                       sum(dur_ns) FILTER (WHERE {_COLLECTIVE_WAIT}) AS device_wait_ns,
                       sum(os_rq_ns) FILTER (WHERE {_COLLECTIVE_WAIT}) AS device_wait_rq_ns,
                       list(struct_pack(ts_ns := ts_ns, dur_ns := dur_ns, name := name,
                                        peer := TRY_CAST(attrs['{fmt.PEER_ATTR}'] AS BIGINT)) ORDER BY ts_ns, name)
                           FILTER (WHERE {_COLLECTIVE_WAIT}) AS device_waits,
                       count(*) FILTER (WHERE depth >= 2 AND starts_with(name, '{fmt.RUNNER_RUN}.')) AS device_markers
                FROM runtime GROUP BY pid, inv HAVING {having})"""


def invocation_query(where: str = "TRUE", having: str = "TRUE", source: str = "spans") -> str:
    """SQL for the invocation table of the runtime rows of ``source`` that satisfy ``where`` (groups: ``having``)."""
    parts = _parts()
    joins = " ".join(f"LEFT JOIN {subquery} USING (pid, inv)" for _, subquery, _ in parts)
    columns = [
        "pid",
        "inv",
        "n_roots",
        "n_spans",
        *(c for _, _, cs in parts for c in cs),
        "device_wait_ns",
        "device_wait_rq_ns",
        "device_waits",
        "device_markers",
    ]
    return (
        f"WITH runtime AS NOT MATERIALIZED (SELECT * FROM {source} WHERE {runtime_row()} AND ({where})) "
        f"SELECT {', '.join(columns)} FROM {_base(having)} {joins}"
    )


def create_invocations(engine: Engine, known: pa.Table | None = None) -> None:
    """Make the table ``invocations`` from ``spans``: in one pass, or for a large trace in passes, each compressed
    before the next: over runs of time windows where the spans are one span dataset (each pass reads its own
    files), else over shares of the invocations (:func:`~dsprof.analysis.store.predicates.in_share`; each pass
    reads every span).

    ``known``: rows of this table aggregated before from exactly the rows ``spans`` holds of them (a live view's
    earlier window, :mod:`~dsprof.analysis.live.live_analysis`); those whose invocation is in ``spans`` are kept
    as they are and only the others are aggregated (one pass).
    """
    trace = engine.trace
    passes = -(-trace.span_count // spans_per_pass(engine))
    if known is not None and passes <= 1:
        _create_beside_known(engine, known)
        return
    if passes <= 1:
        engine.run(f"CREATE OR REPLACE TABLE invocations AS {invocation_query()}")
        return
    engine.run(f"CREATE OR REPLACE TABLE invocations AS {invocation_query(where='FALSE')}")
    windows = None if trace.spans.num_rows else files_by_window(trace.span_files)
    if windows is not None:
        _insert_by_windows(engine, windows, spans_per_pass(engine))
        return
    for share in range(passes):
        engine.run(f"INSERT INTO invocations {invocation_query(where=in_share(share, passes))}")
        engine.compact()


def _create_beside_known(engine: Engine, known: pa.Table) -> None:
    """``invocations``: the ``known`` rows of the invocations in ``spans``, and the others aggregated from their rows."""
    engine.con.register("_known_invocations", known)
    kept = f"SELECT * FROM _known_invocations SEMI JOIN (SELECT DISTINCT pid, inv FROM spans WHERE {runtime_row()}) USING (pid, inv)"
    # a row of an invocation known is one of a kept invocation: the others are aggregated from the rest
    others = invocation_query(source="spans ANTI JOIN _known_invocations USING (pid, inv)")
    engine.run(f"CREATE OR REPLACE TABLE invocations AS {kept} UNION ALL BY NAME SELECT * FROM ({others})")


def spans_per_pass(engine: Engine) -> int:
    """How many spans one invocation pass aggregates at most: :data:`SPANS_PER_PASS`, fewer under a small memory limit."""
    return max(1, min(SPANS_PER_PASS, engine.memory_limit // PASS_BYTES_PER_SPAN))


def _insert_by_windows(engine: Engine, windows: dict[int, list[Path]], per_pass: int) -> None:
    """The invocations of a span dataset, a run of windows holding ``per_pass`` spans or more at a time.

    Each pass reads only its windows' files. Nearly every invocation lies in one
    window (:mod:`~dsprof.analysis.store.dataset`: a row goes to the window of
    its invocation's earliest host start in its piece of the log); the few
    whose rows a cut between pieces spread over several windows are found
    first, in one pass over the keys, left out of the passes, and aggregated
    last from the files of the windows they lie in.
    """
    every = parquet_source([path for paths in windows.values() for path in paths])
    engine.run(
        "CREATE OR REPLACE TEMP TABLE _spread AS SELECT pid, inv, min(time_window) AS first_window, max(time_window) AS last_window "
        f"FROM {every} WHERE {runtime_row()} GROUP BY pid, inv HAVING first_window < last_window"
    )
    spread = [row[0] for row in engine.rows("SELECT DISTINCT w FROM _spread, range(first_window, last_window + 1) AS t(w) ORDER BY w")]
    left_out = " ANTI JOIN _spread USING (pid, inv)" if spread else ""
    for first, last in _window_runs(windows, per_pass):
        files = [path for window, paths in windows.items() if first <= window <= last for path in paths]
        engine.run(f"INSERT INTO invocations {invocation_query(source=parquet_source(files) + left_out)}")
        engine.compact()
    if spread:
        files = [path for window in spread for path in windows.get(window, [])]
        engine.run(f"INSERT INTO invocations {invocation_query(source=parquet_source(files) + ' SEMI JOIN _spread USING (pid, inv)')}")
    engine.run("DROP TABLE _spread")


def _window_runs(windows: dict[int, list[Path]], per_pass: int) -> list[tuple[int, int]]:
    """Consecutive runs ``(first, last)`` of the windows, each holding ``per_pass`` spans or more (the last: what is left)."""
    runs: list[tuple[int, int]] = []
    first, rows = None, 0
    for window, paths in windows.items():
        first = window if first is None else first
        rows += sum(pq.ParquetFile(path).metadata.num_rows for path in paths)
        if rows >= per_pass:
            runs.append((first, window))
            first, rows = None, 0
    if first is not None:
        runs.append((first, max(windows)))
    return runs


def gc_query() -> str:
    """SQL for the garbage collections (``host.gc`` spans, docs/FORMATS.md "Host evidence"): pid, tid, start, end."""
    return f"SELECT pid, tid, ts_ns AS gc_ts_ns, ts_ns + dur_ns AS gc_end_ns FROM spans WHERE {gc_row()}"
