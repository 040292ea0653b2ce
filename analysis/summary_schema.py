"""The sections of summary.json as typed records: what every analysis writes and every reader walks.

One TypedDict per object of the file (docs/SUMMARY_SCHEMA.md, tied to these
by tests/test_summary_schema.py). The analyses build them, the outputs, gate
and diff read them, and :func:`dsprof.analysis.summary.load_summary` checks a
file against them. ``NotRequired`` marks keys written only in some cases (a
cause's ``from_step``) or only by newer versions (``slow_steps``).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict


class Percentiles(TypedDict):
    """A percentile block: all null with ``count`` 0 when nothing was measured."""

    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None
    count: int


class WindowBlock(TypedDict):
    """The window of the run analysed (``--steps``, ``--since``, ``--until``; docs/FIGURES.md "Windows")."""

    steps: list[int] | None  # [first, last] decode step, both included
    since: str | None  # as given: an ISO 8601 instant or an offset from the run's start (+5m)
    until: str | None
    host_ns: list[int | None]  # [from, until) on the host monotonic clock; null: open
    run_start_ns: int | None  # the run's start offsets count from: its earliest CLOCK_ANCHOR, else its earliest host span
    steps_by: Literal["step attribute", "position"] | None  # how --steps picked the runs
    partial_steps_left_out: NotRequired[int]  # steps the window cut (some of their runs in it), left out whole


class Inputs(TypedDict):
    files: list[str]
    records_read: int
    spans: int
    dropped: dict[str, int]
    notes: list[str]
    dropped_at: NotRequired[dict[str, str]]  # reason -> "file:line" of the first record dropped for it, where the reader knows it
    span_dataset: NotRequired[str]  # the span dataset kept with --spans (or given as input): what report and export read
    steps: NotRequired[list[int]]  # [first, last]: the window of decode steps analysed (analyze --steps)
    window: NotRequired[WindowBlock]  # the window analysed, whenever --steps, --since or --until is given


class RunInfo(TypedDict):
    """What the runtime said of the run (performance_summary.json): exit status and, after a crash, who failed."""

    exit_status: int | None
    failed_rank: int | None
    failed_device: str | None
    message: str | None


class ValidationCheck(TypedDict):
    name: str
    ok: bool
    detail: str


class Validation(TypedDict):
    valid: bool
    decode_steps: int
    rank_roots: int
    ranks: int
    devices: list[str]
    expected_ranks: int | None
    steps_per_rank: dict[str, int]
    step_numbering: str
    left_out_invocations: int
    problems: list[str]
    checks: list[ValidationCheck]


class RankFigures(TypedDict):
    """One rank's percentile blocks (``figures.per_rank``)."""

    bind_ms: Percentiles
    root_ms: Percentiles
    validate_ms: Percentiles
    runner_to_validate_gap_ms: Percentiles
    device: str


class Figures(TypedDict):
    runner_start_skew_ms: Percentiles
    runner_end_skew_ms: Percentiles
    bind_ms: Percentiles
    runner_run_ms: Percentiles
    root_ms: Percentiles
    validate_ms: Percentiles
    runner_to_validate_gap_ms: Percentiles
    per_rank: dict[str, RankFigures]
    step_interval_ms: NotRequired[Percentiles]


class StepRow(TypedDict):
    """One row of ``per_step``."""

    step: int
    ranks: int
    runner_start_skew_ms: float
    runner_end_skew_ms: float
    latest_start_rank: int
    latest_end_rank: int
    interval_ms: NotRequired[float | None]


class CarriedOver(TypedDict):
    """Lateness carried over from an earlier step beside a cell's own cause."""

    from_step: int
    evidence_ms: float


class Cause(TypedDict):
    """Why one late cell was late; ``rank`` is the culprit (for a victim: the peer it waited for)."""

    rank: int | None
    device: str | None
    phase: str
    mechanism: str
    evidence_ms: float
    detail: str
    role: str  # culprit | victim
    evidence_step: NotRequired[int]  # the run whose phase holds the evidence, where not the item's step
    from_step: NotRequired[int]  # carried_over only
    carried_over: NotRequired[CarriedOver]  # an own cause with lateness carried over beside it
    peer: NotRequired[int | None]  # peer_wait only
    late_rank: NotRequired[int]  # the rank that was late (slow steps name it as the item's culprit)
    noise: NotRequired[bool]  # the item's excess lies within the run's noise floor: listed, not a finding
    explained_share: NotRequired[float]  # evidence / excess (at most 1); a mechanism is named from 0.5
    partial_mechanism: NotRequired[str]  # what the evidence of an item left unattributed (under half its excess) points to


class LateStart(Cause):
    step: int
    excess_ms: float  # against the step's earliest start
    typical_excess_ms: NotRequired[float]  # against the typical rank (the others' median start): what the noise floor judges


class LateRank(Cause):
    """One late rank of a tail step."""

    excess_ms: float


class TailStep(Cause):
    """A tail step, carrying its culprit's cause."""

    step: int
    runner_end_skew_ms: float
    excess_ms: float
    ranks: list[LateRank]


class CriticalPath(TypedDict):
    via: str  # the collective that held the other ranks, or "step end"
    source: str  # peer | arrival order | latest rank


class SlowStep(Cause):
    """A slow step, carrying the cause of the culprit on its critical path."""

    step: int
    interval_ms: float
    excess_ms: float
    critical_path: NotRequired[CriticalPath]
    ranks: list[Cause]


class Straggler(TypedDict):
    verdict: str
    rank: int | None
    device: str | None
    share: float
    mechanism: str | None
    ms_per_step: float | None
    saved_ms: NotRequired[float | None]
    steps: NotRequired[int]
    p_value: NotRequired[float | None]  # randomization p: a rank as costly as the costliest, were each cost's rank a fair draw
    pattern: NotRequired[str]  # none | rank | spread
    share_ci: NotRequired[list[float] | None]  # 95% bootstrap interval of ``share``
    parts: NotRequired[int]  # quarters of the run in which the costliest rank cost more than the others' mean
    by_rank_counts: NotRequired[dict[str, int]]  # findings per culprit rank (spread)
    chance: NotRequired[float | None]  # spread: the chance that one rank of as many is hit as often as the most-hit one
    cost_ms: NotRequired[float | None]  # the findings' what-if saving, all ranks


class NoiseBlock(TypedDict):
    """The run's own noise floor (analysis/stages/noise.py): late items within it are listed but are not findings."""

    floor_ms: float  # the slow-step floor: the step-interval excess within the run's noise
    slow_steps_ms: float
    late_starts_ms: float
    tail_steps_ms: float
    steps: int
    alpha: float
    method: str


class Verdict(TypedDict):
    """The run's one verdict, first in every output (analysis/stages/verdict.py), built from the sections."""

    status: Literal["healthy", "degraded", "failed", "invalid"]
    headline: str
    noise_floor_ms: float | None
    findings: int  # late items above the noise floor


class LateStarts(TypedDict):
    threshold_ms: float
    count: int
    items: list[LateStart]


class TailSteps(TypedDict):
    threshold_ms: float
    count: int
    items: list[TailStep]
    same_device: bool | None
    devices: dict[str, int]
    straggler: Straggler


class SlowSteps(TypedDict):
    threshold_ms: float
    median_interval_ms: float | None
    count: int
    items: list[SlowStep]


class WhatIfItem(TypedDict):
    """One cause removed alone in the replay, and what that saves."""

    step: int
    rank: int
    mechanism: str
    phase: str
    saved_ms: float


class WhatIf(TypedDict):
    decode_wall_ms: float | None
    replayed_wall_ms: float | None
    total_saved_ms: float | None
    share_of_decode_wall: float | None
    by_mechanism: dict[str, float]
    by_rank: dict[str, float]
    items: list[WhatIfItem]


class TrendWindow(TypedDict):
    """One window of consecutive steps and its figures (analysis/stages/trends.py)."""

    window: int
    first_step: int
    last_step: int
    steps: int
    start_s: float | None  # from the first decode root's start
    step_interval_p50_ms: float | None
    step_interval_p99_ms: float | None
    runner_start_skew_p99_ms: float | None
    runner_end_skew_p99_ms: float | None
    slow_steps: int
    what_if_saved_ms: float


class Trends(TypedDict):
    window_steps: int | None
    windows: list[TrendWindow]
    worst: list[int]  # window numbers, worst first


class TailCost(TypedDict):
    total_ms: float | None
    share_of_decode_wall: float | None
    decode_wall_ms: float | None


class NativeOverlap(TypedDict):
    verified: bool
    reason: str


class PipelineViolation(TypedDict):
    rank: int | None
    pid: int | None
    run_epoch: int | None
    step: int | None
    sequence: int | None
    reason: str


class PrefillPair(TypedDict):
    rank: int | None
    pid: int | None
    sequence: int | None
    prev_sequence: int | None
    overlapped: bool
    reason: str


class Pipeline(TypedDict):
    rule: str
    pairs_checked: int
    pairs_overlapped: int
    violations: int
    claim_order_violations: int
    overlap_share: float | None
    serialized: bool | None  # null: a failed run gets no verdict
    native_overlap_verified: NativeOverlap
    first_violations: list[PipelineViolation]
    prefill_pairs: list[PrefillPair]
    cadence_ms: dict[str, Percentiles]
    cadence_p50_ms: float | None
    achieved_depth: dict[str, float]
    runner_depth: dict[str, float]
    diagnosis: str
    partial: NotRequired[bool]  # the run failed: the figures cover the steps it completed


class Serving(TypedDict):
    tokens_returned: float | None
    tokens_expected: float | None
    batch_elapsed_s: float | None
    throughput_tok_s: float | None
    effective_tpot_ms: float | None
    acceptance_rate: float | None
    requests: float | None
    sources: dict[str, str]  # figure -> where it came from
    partial: NotRequired[bool]  # the run failed: throughput and TPOT count only completed requests
    partial_reason: NotRequired[str | None]


class DeviceTimeFigures(TypedDict):
    """The device-time breakdown of one rank, over the profiled window or one step (SPEC §1.1, docs/FIGURES.md)."""

    span_ms: float
    busy_ms: float
    idle_ms: float
    compute_ms: float
    non_compute_ms: float


class DeviceTimeStep(DeviceTimeFigures):
    """One rank's breakdown over one step (``device_time.per_step``)."""

    step: int
    rank: int


class DeviceTime(TypedDict):
    """Where a source records device activities (Kineto): the breakdown per rank and per step."""

    ranks: dict[str, DeviceTimeFigures]
    per_step: list[DeviceTimeStep]


class Summary(TypedDict):
    schema: str
    dsprof_version: str
    verdict: NotRequired[Verdict]
    inputs: Inputs
    workload: dict[str, Any] | None  # the runtime's own settings, as it wrote them
    exit_status: int | None
    run: RunInfo
    validation: Validation
    figures: Figures
    per_step: list[StepRow]
    noise: NotRequired[NoiseBlock]
    late_starts: LateStarts
    tail_steps: TailSteps
    slow_steps: NotRequired[SlowSteps]
    what_if: NotRequired[WhatIf]
    trends: NotRequired[Trends]
    tail_cost: TailCost
    pipeline: Pipeline
    serving: Serving
    device_time: NotRequired[DeviceTime]  # only where the source records device activities


# An item of the late lists (late_starts, tail_steps, slow_steps): a step, its excess and its culprit's cause.
LateItem = LateStart | TailStep | SlowStep

# The percentile blocks of ``figures``, by name.
PercentileFigure = Literal[
    "runner_start_skew_ms",
    "runner_end_skew_ms",
    "bind_ms",
    "runner_run_ms",
    "root_ms",
    "validate_ms",
    "runner_to_validate_gap_ms",
    "step_interval_ms",
]
