"""The engine tables one analysis stage hands to another, declared once with typed, documented columns.

A stage (analysis/stages/runner.py) may write only tables declared here, with exactly
these columns; anything else it makes is scratch and is dropped when it
returns. docs/ARCHITECTURE.md's table reference is generated from this module
(``scripts/stages_table.py``). Times are nanoseconds on the host clock unless a
column says otherwise; null where the span or attribute is absent.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsprof.analysis.store.spans import SPAN_COLUMN_DOCS, SPAN_SCHEMA

BIGINT, UBIGINT, HUGEINT, DOUBLE, VARCHAR, BOOLEAN = "BIGINT", "UBIGINT", "HUGEINT", "DOUBLE", "VARCHAR", "BOOLEAN"
WAITS = 'STRUCT(ts_ns BIGINT, dur_ns BIGINT, "name" VARCHAR, peer BIGINT)[]'


@dataclass(frozen=True)
class Column:
    """One column: its name, its DuckDB type (as ``DESCRIBE`` prints it) and what it holds."""

    name: str
    type: str
    doc: str


@dataclass(frozen=True)
class Table:
    """A relation handed between stages: its name, what one row is, and its columns in order."""

    name: str
    doc: str
    columns: tuple[Column, ...]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


def _columns(*specs: tuple[str, str, str]) -> tuple[Column, ...]:
    return tuple(Column(*spec) for spec in specs)


def _phase_times(phase: str, evidence: bool, what: str) -> tuple[Column, ...]:
    """Start and end of a phase's earliest span, and its host evidence (thread CPU, run-queue wait) where it has one."""
    columns = _columns((f"{phase}_ts_ns", BIGINT, f"start of {what}"), (f"{phase}_end_ns", BIGINT, f"end of {what}"))
    if evidence:
        columns += _phase_evidence(phase, what)
    return columns


def _phase_evidence(phase: str, what: str, *, rq_first: bool = False) -> tuple[Column, ...]:
    cpu = Column(f"{phase}_cpu_ns", BIGINT, f"thread CPU time during {what} (``os.cpu_ns``)")
    rq = Column(f"{phase}_rq_ns", BIGINT, f"time runnable but not running during {what} (``os.rq_ns``)")
    return (rq, cpu) if rq_first else (cpu, rq)


INVOCATION_COLUMNS = (
    *_columns(
        ("pid", BIGINT, "process of the invocation"),
        ("inv", UBIGINT, "invocation number within the process (STRACE ``inv``)"),
        ("n_roots", BIGINT, "host depth-0 rows: 0 = the root never closed, > 1 = duplicates"),
        ("n_spans", BIGINT, "rows of the invocation"),
        ("root_ts_ns", BIGINT, "start of the root span"),
        ("root_end_ns", BIGINT, "end of the root span"),
        ("tid", BIGINT, "thread of the root span"),
        ("hid", VARCHAR, "handle id of the callable the root ran"),
        ("callable", VARCHAR, "the root's ``callable`` attribute"),
        ("rank_attr", BIGINT, "the root's ``rank`` attribute"),
        ("device_attr", VARCHAR, "the root's ``device`` attribute"),
        ("step_attr", BIGINT, "the root's ``step`` attribute"),
        ("run_id", BIGINT, "the root's ``run_id`` attribute"),
        ("dispatch_id", BIGINT, "the root's ``dispatch_id`` attribute"),
        ("run_epoch", BIGINT, "the root's ``run_epoch`` attribute"),
        ("slot_id", BIGINT, "the root's ``slot_id`` attribute: the pipeline slot"),
        ("generation", BIGINT, "the root's ``generation`` attribute"),
    ),
    *_phase_evidence("root", "the root span"),
    *_phase_times("bind", True, "``bind`` (the host prepares the step's inputs)"),
    *_phase_times("runner", True, "``runner.run`` (launch to return of the device program)"),
    *_phase_times("fence", True, "``fence.wait`` (the host waits for the device)"),
    *_phase_times("claim", False, "``claim.release`` (the slot handed back)"),
    *_phase_times("validate", True, "``validate`` (the host reads the step's tokens)"),
    *_columns(
        ("device_ts_ns", BIGINT, "device clock: start of ``device_wall``, as an offset from the launch"),
        ("device_wall_ns", BIGINT, "device clock: duration of ``device_wall``"),
        ("device_cpu_ns", BIGINT, "the executor thread's CPU time in ``device_wall`` (a host-thread device)"),
        ("device_rq_ns", BIGINT, "the executor thread's run-queue wait in ``device_wall``"),
        ("device_wait_ns", HUGEINT, "device spans below ``device_wall`` ending in ``_wait``: waiting on peers"),
        ("device_wait_rq_ns", HUGEINT, "run-queue wait of those spans (the device's threads could not run while it waited)"),
        ("device_waits", WAITS, "those spans in start order: offset, duration, name, ``peer`` attribute"),
        ("device_markers", BIGINT, "depth >= 2 runner spans: 0 when device-phase markers were off"),
    ),
)
RUN_COLUMNS = INVOCATION_COLUMNS + _columns(
    ("rank", BIGINT, "the process's rank"),
    ("device", VARCHAR, "the process's device"),
    ("callable_label", VARCHAR, "the callable's label (its most common ``callable`` attribute, else ``hid:<hid>``)"),
    ("is_decode", BOOLEAN, "the run is a decode step (the decode callable)"),
    ("position", BIGINT, "the run's position among its rank's decode steps"),
    ("step", BIGINT, "decode step number"),
    ("token_ns", BIGINT, "when the step's tokens were ready on the host (end of validate, else of the run)"),
)

_TYPICAL = (
    *("start_ns", "end_ns", "root_ts_ns", "admissible_ns", "drain_after_ns", "bind_ns", "launch_gap_ns", "runner_ns"),
    *("fence_ns", "drain_lag_ns", "signal_lag_ns", "next_bind_ns", "next_bind_cpu_ns", "next_bind_rq_ns"),
    *("device_wall_ns", "device_wait_ns", "device_wait_rq_ns", "device_work_ns", "bind_rq_ns", "bind_cpu_ns"),
    *("runner_rq_ns", "runner_cpu_ns", "fence_rq_ns", "fence_cpu_ns", "device_rq_ns", "device_cpu_ns"),
    *("validate_end_ns", "validate_ns", "validate_rq_ns", "validate_cpu_ns"),
)
_GC_WINDOWS = {
    "gc_bind": "bind",
    "gc_fence": "fence.wait",
    "gc_validate": "validate",
    "gc_next_bind": "the next step's bind",
    "gc_run": "the run (start to end)",
    "gc_gap": "the gap from bind's end to the launch",
    "gc_before": "the wait before the root started (typical to actual root start)",
}
_VERDICTS = {
    "start": "the start's cause",
    "end": "the end's cause",
    "start_own": "the start's own cause (not carried over)",
    "end_own": "the end's own cause (not carried over)",
    "token": "the token's cause (validate after the run)",
}


def _verdict_columns(name: str, what: str) -> tuple[Column, ...]:
    return _columns(
        (f"{name}_phase", VARCHAR, f"{what}: the phase"),
        (f"{name}_mechanism", VARCHAR, f"{what}: the mechanism (docs/CAUSES.md)"),
        (f"{name}_evidence_ns", DOUBLE, f"{what}: the nanoseconds of evidence for it"),
        (f"{name}_detail", VARCHAR, f"{what}: a sentence of detail"),
    )


DIAGNOSED_COLUMNS = (
    *_columns(
        ("rank", BIGINT, "the rank"),
        ("step", BIGINT, "the decode step"),
        ("position", BIGINT, "the step's position on the rank"),
        ("device", VARCHAR, "the rank's device"),
        ("pid", BIGINT, "the rank's process"),
        ("slot_id", BIGINT, "the pipeline slot"),
        ("start_ns", BIGINT, "launch of the device program (``runner.run`` start)"),
        ("end_ns", BIGINT, "return of the device program (``runner.run`` end)"),
        ("root_ts_ns", BIGINT, "start of the step's root span"),
        ("root_end_ns", BIGINT, "end of the step's root span"),
        ("bind_ts_ns", BIGINT, "start of bind"),
        ("bind_end_ns", BIGINT, "end of bind"),
        ("fence_ts_ns", BIGINT, "start of fence.wait"),
        ("fence_end_ns", BIGINT, "end of fence.wait"),
        ("validate_ts_ns", BIGINT, "start of validate"),
        ("validate_end_ns", BIGINT, "end of validate"),
        ("bind_ns", BIGINT, "bind's duration"),
        ("launch_gap_ns", BIGINT, "from bind's end to the launch"),
        ("runner_ns", BIGINT, "the run's duration (launch to return)"),
        ("fence_ns", BIGINT, "fence.wait's duration"),
        ("validate_ns", BIGINT, "validate's duration"),
        ("host_at_fence_ns", BIGINT, "when the host reached the fence, from the launch"),
        ("drain_lag_ns", BIGINT, "from the device's end to the fence's release"),
        ("signal_lag_ns", HUGEINT, "from the device's end to the return of the run"),
        ("device_wall_ns", BIGINT, "device clock: the device program's duration"),
        ("device_wait_ns", HUGEINT, "device clock: waits on peers inside it"),
        ("device_work_ns", HUGEINT, "device clock: the device program less its waits"),
        ("device_wait_rq_ns", HUGEINT, "run-queue wait of the device's waits"),
        ("device_markers", BIGINT, "device-phase marker spans of the run"),
    ),
    *_phase_evidence("bind", "bind", rq_first=True),
    *_phase_evidence("runner", "the run", rq_first=True),
    *_phase_evidence("fence", "fence.wait", rq_first=True),
    *_phase_evidence("device", "device_wall (the executor thread)", rq_first=True),
    *_phase_evidence("validate", "validate", rq_first=True),
    *_columns(
        ("next_step", BIGINT, "the rank's next decode step"),
        ("next_bind_ts_ns", BIGINT, "start of the next step's bind"),
        ("next_bind_end_ns", BIGINT, "end of the next step's bind"),
        ("next_bind_ns", BIGINT, "the next step's bind duration"),
        ("next_bind_cpu_ns", BIGINT, "thread CPU time in the next step's bind"),
        ("next_bind_rq_ns", BIGINT, "run-queue wait in the next step's bind"),
        ("previous_claim_ns", BIGINT, "when the previous step on the rank released its claim"),
        ("previous_step", BIGINT, "the rank's previous decode step"),
        ("drain_after_ns", BIGINT, "from the launch until the previous step's device work drained"),
        ("slot_free_ns", BIGINT, "when the step's pipeline slot was free again"),
        ("slot_step", BIGINT, "the step that held the slot before"),
        ("admissible_ns", BIGINT, "the earliest the step could start: the later of previous claim and free slot"),
    ),
    *(Column(f"{name}_typ", DOUBLE, f"the rank's typical ``{name}`` (median over the run)") for name in _TYPICAL),
    Column("root_typ_ns", BIGINT, "the typical root start, as an integer"),
    *(Column(name, HUGEINT, f"garbage collection on the process during {window}") for name, window in _GC_WINDOWS.items()),
    *(column for name, what in _VERDICTS.items() for column in _verdict_columns(name, what)),
    *_columns(
        ("start_excess_ns", BIGINT, "launch after the step's earliest launch"),
        ("end_excess_ns", DOUBLE, "return after the rank's typical return"),
        ("end_skew_ns", BIGINT, "the step's spread of returns across ranks"),
        ("latest_end_rank", BIGINT, "the rank that returned last in the step"),
        ("last_arrival_rank", BIGINT, "for a peer wait: the peer that reached the collective last"),
        ("start_carried_ns", DOUBLE, "evidence carried over from an earlier step into the start"),
        ("start_carried_phase", VARCHAR, "the phase that carried over into the start"),
        ("end_carried_ns", DOUBLE, "evidence carried over into the end"),
        ("end_carried_phase", VARCHAR, "the phase that carried over into the end"),
        ("end_evidence_step", BIGINT, "the step whose spans hold the end's evidence (the next step's bind)"),
        ("late_start", BOOLEAN, "the launch is later than the threshold"),
        ("late_end", BOOLEAN, "the end is a tail: the latest, or later than the threshold"),
        ("start_from_step", BIGINT, "the step a carried-over start came from"),
        ("end_from_step", BIGINT, "the step a carried-over end came from"),
    ),
)

_LANE = _columns(("pid", BIGINT, "process"), ("inv", UBIGINT, "invocation"), ("lane", BIGINT, "lane, 0-based"))


def _tables(*tables: Table) -> dict[str, Table]:
    return {t.name: t for t in tables}


TABLES = _tables(
    Table("invocations", "one invocation (STRACE rows sharing pid, inv) with the times of its phases", INVOCATION_COLUMNS),
    Table(
        "gc",
        "one garbage collection (``host.gc`` span)",
        _columns(("pid", BIGINT, "process"), ("tid", BIGINT, "thread"), ("gc_ts_ns", BIGINT, "start"), ("gc_end_ns", BIGINT, "end")),
    ),
    Table(
        "processes",
        "one rank process",
        _columns(
            ("pid", BIGINT, "process"),
            ("rank", BIGINT, "its rank"),
            ("device", VARCHAR, "its device"),
            ("device_source", VARCHAR, "where the device came from (attribute, chip map, ...)"),
        ),
    ),
    Table("runs", "one invocation inside the serving window, with its rank, callable and step", RUN_COLUMNS),
    Table("decode", "one decode step on one rank (a view of ``runs``, cut to the window's steps)", RUN_COLUMNS),
    Table(
        "steps",
        "one decode step across its ranks",
        _columns(
            ("step", BIGINT, "decode step"),
            ("ranks", BIGINT, "ranks that ran it"),
            ("min_start_ns", BIGINT, "the earliest launch"),
            ("runner_start_skew_ns", BIGINT, "latest minus earliest launch"),
            ("runner_end_skew_ns", BIGINT, "latest minus earliest return"),
            ("latest_start_rank", BIGINT, "the rank that launched last"),
            ("latest_end_rank", BIGINT, "the rank that returned last"),
        ),
    ),
    Table(
        "step_intervals",
        "one decode step's interval: from the previous step's tokens to its own",
        _columns(
            ("step", BIGINT, "decode step"),
            ("token_ns", BIGINT, "when its tokens were ready on every rank"),
            ("interval_ns", BIGINT, "since the previous step's tokens (null for the first)"),
            ("excess_ns", BIGINT, "over the run's median interval"),
            ("slow", BOOLEAN, "the excess is over the threshold"),
        ),
    ),
    Table(
        "collectives",
        "one rank's wait at one collective instance (step, name, occurrence), with who reached the instance last",
        _columns(
            ("step", BIGINT, "decode step"),
            ("name", VARCHAR, "the collective (its device ``*_wait`` span name)"),
            ("occurrence", BIGINT, "which occurrence of that collective in the step (1-based, in start order)"),
            ("rank", BIGINT, "the waiting rank"),
            ("wait_index", BIGINT, "the wait's place among its run's waits (0-based, in start order)"),
            ("arrival_ns", HUGEINT, "when the rank arrived: the launch plus the wait's device offset (host axis)"),
            ("wait_ns", BIGINT, "how long it waited"),
            ("exit_ns", HUGEINT, "when it left: arrival plus wait (host axis)"),
            ("peer", BIGINT, "the wait's ``peer`` attribute: the last rank as the producer saw it"),
            ("aligned", BOOLEAN, "the device clock is aligned with the host: every rank left after the last arrival"),
            ("last_arrival_ns", HUGEINT, "the instance's last arrival (host axis)"),
            ("first_exit_ns", HUGEINT, "the instance's first exit (host axis)"),
            ("ahead_ns", HUGEINT, "how long before the last arrival the rank arrived (aligned: host axis; else wait less the least wait)"),
            ("last_rank", BIGINT, "the rank that reached the instance last: the peer named, else the one least ahead"),
            ("source", VARCHAR, "how the last rank was known (peer, arrival order)"),
        ),
    ),
    Table(
        "critical_path",
        "one slow step: the rank and the collective (or the step's end) that held it",
        _columns(
            ("step", BIGINT, "decode step"),
            ("interval_ns", BIGINT, "its interval"),
            ("excess_ns", BIGINT, "over the median interval"),
            ("culprit_rank", BIGINT, "the rank that held the step"),
            ("via", VARCHAR, "the collective it held, or the step's end"),
            ("occurrence", BIGINT, "which occurrence of that collective in the step"),
            ("source", VARCHAR, "how the culprit was found (arrival, peer, stall, latest)"),
            ("held_ns", DOUBLE, "how long the others waited for it at the collective"),
            ("has_waits", BOOLEAN, "the step's runs recorded collective waits"),
        ),
    ),
    Table(
        "collective_waits",
        "one rank's wait at a slow step's critical collective",
        _columns(
            ("step", BIGINT, "decode step"),
            ("rank", BIGINT, "the waiting rank"),
            ("name", VARCHAR, "the collective"),
            ("wait_ns", BIGINT, "how long it waited"),
            ("culprit_rank", BIGINT, "the rank it waited for"),
        ),
    ),
    Table("diagnosed", "one rank's decode step that was diagnosed, with its typical values and its causes", DIAGNOSED_COLUMNS),
    Table("lanes", "the pipeline-slot lane of a run within its host thread (drawing)", _LANE),
    Table("device_lanes", "the lane of a run's device program within its rank process (drawing)", _LANE),
    Table(
        "anchor_offsets",
        "a process's wall-clock offset (drawing)",
        _columns(("pid", BIGINT, "process"), ("offset_ns", BIGINT, "wall clock minus monotonic clock")),
    ),
)


def tables_markdown() -> str:
    """docs/ARCHITECTURE.md's reference of the span table and the declared tables (checked by tests/test_stages.py)."""
    spans = "\n".join(f"| `{f.name}` | {f.type} | {SPAN_COLUMN_DOCS[f.name]} |" for f in SPAN_SCHEMA)
    blocks = [
        f"#### `spans`\n\nOne row: one span, as a reader made it (`analysis/store/spans.py`).\n\n"
        f"| column | type | meaning |\n|---|---|---|\n{spans}"
    ]
    for table in TABLES.values():
        rows = "\n".join(f"| `{c.name}` | {c.type.replace('|', '/')} | {c.doc.replace('``', '`')} |" for c in table.columns)
        blocks.append(
            f"#### `{table.name}`\n\nOne row: {table.doc.replace('``', '`')}.\n\n| column | type | meaning |\n|---|---|---|\n{rows}"
        )
    return "\n\n".join(blocks)
