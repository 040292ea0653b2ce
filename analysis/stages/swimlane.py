"""From invocations to the swimlane: the profile window, ranks and devices, callables, decode steps.

Builds, in the engine, the table ``runs`` (every invocation with a root inside
the profile window, with its rank, device and callable label) and the view
``decode`` (the decode runs, one row per rank and step). The rules:
docs/FIGURES.md, "Steps".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pyarrow as pa

from dsprof.analysis.ingest.kineto import HID_PREFIX as KINETO_HID
from dsprof.analysis.ingest.kineto import token_ready_sql
from dsprof.analysis.stages.invocations import create_invocations, gc_query
from dsprof.analysis.stages.runner import stage
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.store.predicates import serving_row
from dsprof.profiler import sa_profile
from dsprof.profiler import strace_format as fmt

STEP_NUMBERING_PRODUCER = "producer"
STEP_NUMBERING_POSITION = "position"


@dataclass
class Swimlane:
    """What the structure of the trace is; the tables themselves live in the engine (``runs``, ``decode``, ``gc``)."""

    serving_window_ns: tuple[int, int] | None
    left_out_invocations: int
    rootless_invocations: int
    duplicate_roots: int
    callables: dict[str, int]
    decode_label: str | None
    step_numbering: str
    processes: list[dict]  # pid, rank, device, device_source
    device_conflicts: list[dict] = field(default_factory=list)  # pid, devices: chip lines that disagree
    unanchored_pids: list[int] = field(default_factory=list)
    serving_spans: int = 0


@stage("swimlane", reads=("spans", "anchors", "chip_devices"), writes=("invocations", "gc", "processes", "runs", "decode"))
def build_swimlane(
    engine: Engine, invocations: pa.Table | None = None, steps: tuple[int, int] | None = None, known_invocations: pa.Table | None = None
) -> Swimlane:
    """Create ``invocations``, ``runs``, ``decode`` and ``gc`` in the engine; return the structure's facts.

    ``invocations`` may be given already computed (e.g. gathered from cluster
    workers); else it is aggregated from ``spans`` here, but for the
    ``known_invocations`` whose rows are unchanged (:func:`create_invocations`).
    ``steps`` (first, last): the decode steps analysed, a window of the run, by
    its step numbers.
    """
    if invocations is None:
        create_invocations(engine, known_invocations)
    else:
        engine.con.register("invocations_in", invocations)
        engine.run("CREATE OR REPLACE TABLE invocations AS SELECT * FROM invocations_in")
    engine.compact()  # before ``runs`` is made beside it
    engine.run(f"CREATE OR REPLACE TABLE gc AS {gc_query()}")
    window, serving_spans = _serving_spans(engine)
    lo, hi = window if window else (-(2**63), 2**63 - 1)
    engine.run(  # lo and hi are ints: a view cannot take parameters
        f"CREATE OR REPLACE TEMP VIEW windowed AS SELECT * FROM invocations WHERE n_roots > 0 AND root_ts_ns < {int(hi)} "
        f"AND root_end_ns > {int(lo)}"
    )
    rootless = engine.scalar("SELECT count(*) FROM invocations WHERE n_roots = 0")
    duplicates = engine.scalar("SELECT coalesce(sum(n_roots - 1), 0) FROM invocations WHERE n_roots > 1")
    left_out = engine.scalar("SELECT count(*) FROM invocations WHERE n_roots > 0") - engine.scalar("SELECT count(*) FROM windowed")
    labels, decode_label = _callable_labels(engine)
    processes, conflicts = _processes(engine)
    engine.con.register("callable_labels", pa.table({"hid": list(labels), "label": list(labels.values())}, schema=_LABELS))
    engine.con.register("processes_in", pa.Table.from_pylist(processes, schema=_PROCESSES))
    engine.run("CREATE OR REPLACE TABLE processes AS SELECT * FROM processes_in")  # a table: stages on other connections read it
    numbering = _number_steps(engine, decode_label)
    engine.run(
        f"""CREATE OR REPLACE TABLE runs AS
           SELECT w.*, p.rank, p.device, coalesce(c.label, 'hid:' || w.hid) AS callable_label,
                  coalesce(coalesce(c.label, 'hid:' || w.hid) = ?, FALSE) AS is_decode, s.position, s.step,
                  {token_ready_sql("w")} AS token_ns
           FROM windowed w JOIN processes p USING (pid) LEFT JOIN callable_labels c USING (hid)
           LEFT JOIN decode_steps s ON s.pid = w.pid AND s.inv = w.inv""",
        [decode_label],
    )
    in_steps = "TRUE" if steps is None else f"step BETWEEN {int(steps[0])} AND {int(steps[1])}"
    engine.run(f"CREATE OR REPLACE VIEW decode AS SELECT * FROM runs WHERE is_decode AND {in_steps}")
    callables = dict(engine.rows("SELECT callable_label, count(*) FROM runs GROUP BY 1 ORDER BY 2 DESC, 1"))
    anchored = {row[0] for row in engine.rows("SELECT DISTINCT pid FROM anchors")}
    # a Kineto trace's clock is the profiler's own (baseTimeNanoseconds), not a CLOCK_ANCHOR's
    anchored |= {row[0] for row in engine.rows(f"SELECT DISTINCT pid FROM windowed WHERE starts_with(hid, '{KINETO_HID}')")}
    return Swimlane(
        serving_window_ns=window,
        left_out_invocations=int(left_out),
        rootless_invocations=int(rootless),
        duplicate_roots=int(duplicates),
        callables={str(k): int(v) for k, v in callables.items()},
        decode_label=decode_label,
        step_numbering=numbering,
        processes=processes,
        device_conflicts=conflicts,
        unanchored_pids=sorted(p["pid"] for p in processes if p["pid"] not in anchored),
        serving_spans=serving_spans,
    )


_LABELS = pa.schema([("hid", pa.string()), ("label", pa.string())])
_PROCESSES = pa.schema([("pid", pa.int64()), ("rank", pa.int64()), ("device", pa.string()), ("device_source", pa.string())])


def _serving_spans(engine: Engine) -> tuple[tuple[int, int] | None, int]:
    """The profile window: [first start, last end) of the request spans, else the serving spans, else every
    serving span (None: none); and how many serving rows there are, in the same scan of ``spans``.

    Start-up spans (e.g. ``worker.init``) and warm-up rounds lie before the
    first request, so the request spans are the measured batch.
    """
    categories = (sa_profile.CAT_REQUEST, sa_profile.CAT_SERVING, None)
    complete = f"ph = 'X' AND clk <> '{fmt.CLK_DEVICE}'"
    bounds = ", ".join(
        f"min(ts_ns) FILTER (WHERE {within}), max(ts_ns + dur_ns) FILTER (WHERE {within})"
        for within in (complete if category is None else f"{complete} AND cat = '{category}'" for category in categories)
    )
    row = engine.rows(f"SELECT count(*), {bounds} FROM spans WHERE {serving_row()}")[0]
    count, ends = int(row[0]), row[1:]
    window = next(((int(first), int(last)) for first, last in zip(ends[::2], ends[1::2], strict=True) if first is not None), None)
    return window, count


def _callable_labels(engine: Engine) -> tuple[dict[str, str], str | None]:
    """hid -> label (the most common ``callable`` of its roots), and the decode label."""
    rows = engine.rows(
        """SELECT hid, callable, count(*) AS n FROM windowed GROUP BY hid, callable
           ORDER BY hid, callable IS NULL, n DESC, callable"""
    )
    sizes: dict[str, int] = {}
    labels: dict[str, str] = {}
    for hid, callable_name, n in rows:  # one row per (hid, callable): a handful
        sizes[hid] = sizes.get(hid, 0) + n
        if callable_name is not None and hid not in labels:
            labels[hid] = callable_name
    if not sizes:
        return labels, None
    named = set(labels.values())
    if fmt.DECODE_CALLABLE in named:
        return labels, fmt.DECODE_CALLABLE
    decode_like = sorted(label for label in named if label.startswith("decode"))
    if decode_like:
        return labels, decode_like[0]
    # no callable names: the most frequent bucket is decode (docs/FORMATS.md)
    biggest = max(sizes, key=lambda hid: (sizes[hid], hid))
    labels.setdefault(biggest, "decode")
    return labels, labels[biggest]


def _natural_key(text: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text))


def _processes(engine: Engine) -> tuple[list[dict], list[dict]]:
    """pid -> rank and device (see the module docstring); plus pids whose chip_process lines disagree."""
    attrs = engine.rows("SELECT pid, min(rank_attr), mode(device_attr) FROM windowed GROUP BY pid ORDER BY pid")
    chips = engine.rows("SELECT pid, list(DISTINCT device ORDER BY device), arg_min(device, seq) FROM chip_devices GROUP BY pid")
    chip_device = {pid: first for pid, _, first in chips}
    conflicts = [{"pid": int(pid), "devices": list(devices)} for pid, devices, _ in chips if len(devices) > 1]
    processes = []
    for pid, rank, device_attr in attrs:  # one row per rank process
        device, source = (chip_device[pid], "chip_process") if pid in chip_device else (device_attr, "root attribute")
        processes.append({"pid": int(pid), "rank": rank, "device": device, "device_source": source if device else None})
    unranked = [p for p in processes if p["rank"] is None]
    if unranked:
        order = sorted(processes, key=lambda p: ((0, _natural_key(p["device"])) if p["device"] else (1, ()), p["pid"]))
        for position, process in enumerate(order):
            if process["rank"] is None:
                process["rank"] = position
    for process in processes:
        if process["device"] is None:
            process["device"] = f"pid:{process['pid']}"
    return processes, conflicts


def _number_steps(engine: Engine, decode_label: str | None) -> str:
    """Create ``decode_steps`` (pid, inv, position, step of every decode run) and say which numbering it uses.

    Narrow on purpose: the window sorts four columns, not the whole run; ``runs``
    takes position and step from it, and ``decode`` is the view of its decode runs.
    """
    engine.run(
        """CREATE OR REPLACE TEMP TABLE decode_steps AS
           SELECT w.pid, w.inv, p.rank, w.step_attr,
                  CAST(row_number() OVER (PARTITION BY p.rank ORDER BY w.root_ts_ns, w.pid, w.inv) - 1 AS BIGINT) AS position
           FROM windowed w JOIN processes p USING (pid) LEFT JOIN callable_labels c USING (hid)
           WHERE coalesce(coalesce(c.label, 'hid:' || w.hid) = ?, FALSE)""",
        [decode_label],
    )
    producer = engine.scalar(
        """SELECT count(*) > 0
                  AND bool_and(step_attr IS NOT NULL)
                  AND (SELECT bool_and(lo = hi) FROM (SELECT min(step_attr) lo, max(step_attr) hi FROM decode_steps GROUP BY position))
                  AND (SELECT bool_and(increasing) FROM (
                         SELECT step_attr > lag(step_attr) OVER (PARTITION BY rank ORDER BY position)
                                OR lag(step_attr) OVER (PARTITION BY rank ORDER BY position) IS NULL AS increasing FROM decode_steps))
           FROM decode_steps"""
    )
    step = "step_attr" if producer else "position"
    engine.run(f"ALTER TABLE decode_steps ADD COLUMN step BIGINT; UPDATE decode_steps SET step = {step}")
    return STEP_NUMBERING_PRODUCER if producer else STEP_NUMBERING_POSITION
