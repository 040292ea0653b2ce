"""The rules that choose the cause of a late start or end (docs/FIGURES.md "Causes"), as SQL over a cell.

Each :class:`Rule` holds SQL expressions over one row of ``cells`` (its
values and ``<column>_typ``, the median of the other ranks of the step); the
rules of a list are tried in order. :func:`rule_index_sql` picks the first
rule that holds (its conditions evaluated once per row) and
:func:`rule_field_sql` reads a field of the rule picked.
:mod:`dsprof.analysis.stages.causes` applies them.
"""

from __future__ import annotations

from typing import NamedTuple

from dsprof.profiler import strace_format as fmt


class Rule(NamedTuple):
    """One way a late start or end is explained: when it holds, and what it names."""

    when: str  # SQL condition
    phase: str  # text
    mechanism: str  # text (docs/CAUSES.md)
    evidence: str  # SQL: the nanoseconds of evidence
    detail: str  # SQL: a sentence


# a quantity explains a lateness when it accounts for at least this share of it
EXPLAINS_SHARE = 0.5
PHASE_BEFORE_BIND = "before bind"
PHASE_LAUNCH = "launch"
# the end of run N held by the bind of run N+1 on the same thread; items name it as that run's bind
PHASE_NEXT_BIND = "next bind"


def excess_of(column: str) -> str:
    return f"({column} - {column}_typ)"


def explains(value: str, of: str) -> str:
    """``value`` (possibly null) explains at least half of ``of``."""
    return f"coalesce({value} >= {EXPLAINS_SHARE} * {of}, FALSE)"


def contention_of(rq: str, cpu: str) -> str:
    """Run-queue wait beyond what the CPU time spent would have waited at the step's typical contention.

    On a busy host a thread that does more work also waits more for a CPU; only
    the wait beyond that proportion is contention (``run_queue``), the rest goes
    with the work.
    """
    return f"({rq} - coalesce({cpu}, 0) * coalesce({rq}_typ / nullif({cpu}_typ, 0), 0))"


def collective_contention() -> str:
    """Run-queue wait of the device's threads in its collective waits, beyond the step's typical rank's (CPU device only).

    The executor blocks in a collective while the library's worker threads do
    the exchange: a CPU taken from them lengthens the wait as a late peer does.
    Ranks whose waits carry no such evidence count as having waited for no CPU.
    """
    return "(device_wait_rq_ns - coalesce(device_wait_rq_ns_typ, 0))"


COLLECTIVE_RUN_QUEUE = "'the device threads were runnable but waiting for a CPU in the collectives'"


def extra_work(cpu: str, rq: str) -> str:
    """The extra CPU time, with the run-queue wait it brings at the step's typical contention."""
    return f"(({cpu} - {cpu}_typ) * (1 + coalesce({rq}_typ / nullif({cpu}_typ, 0), 0)))"


def host_rules(phase: str, gc: str, rq: str, cpu: str, excess: str) -> list[Rule]:
    """The rules for host work of ``phase`` that ran ``excess`` longer."""
    return [
        Rule(explains(gc, excess), phase, fmt.MECH_GC, gc, f"'collection in {phase}'"),
        Rule(
            explains(contention_of(rq, cpu), excess),
            phase,
            fmt.MECH_RUN_QUEUE,
            contention_of(rq, cpu),
            f"'runnable but waiting for a CPU in {phase}'",
        ),
        Rule(explains(extra_work(cpu, rq), excess), phase, fmt.MECH_HOST_CPU, excess_of(cpu), f"'more host CPU in {phase}'"),
        Rule(f"{rq} IS NULL AND {cpu} IS NULL", phase, fmt.MECH_UNATTRIBUTED, excess, f"'{phase} took longer; no host evidence'"),
        Rule("TRUE", phase, fmt.MECH_UNATTRIBUTED, excess, f"'{phase} took longer; no CPU, run-queue or GC excess explains it'"),
    ]


def start_rules(delay: str) -> list[Rule]:
    """Rules for a start that was ``delay`` late; conditions are tried in order."""
    carried = excess_of("admissible_ns")
    bind = excess_of("bind_ns")
    arrival = excess_of("root_ts_ns")
    gap = excess_of("launch_gap_ns")
    through = "CASE WHEN previous_claim_ns >= coalesce(slot_free_ns, previous_claim_ns) THEN 'claim_release' ELSE 'slot reuse' END"
    return [
        Rule(
            f"NOT ({delay} > 0)",
            PHASE_BEFORE_BIND,
            fmt.MECH_UNATTRIBUTED,
            delay,
            "'no later than the typical rank (an earlier rank started early)'",
        ),
        Rule(
            explains(carried, delay),
            PHASE_BEFORE_BIND,
            fmt.MECH_CARRIED_OVER,
            carried,
            f"'held back by the late earlier run through ' || {through}",
        ),
        *[
            Rule(f"{explains(bind, delay)} AND {cond}", phase, mech, ev, detail)
            for cond, phase, mech, ev, detail in host_rules(fmt.PHASE_BIND, "gc_bind", "bind_rq_ns", "bind_cpu_ns", bind)
        ],
        Rule(
            f"{explains(arrival, delay)} AND {explains('gc_before', arrival)}",
            PHASE_BEFORE_BIND,
            fmt.MECH_GC,
            "gc_before",
            "'collection before the run began'",
        ),
        Rule(
            explains(arrival, delay),
            PHASE_BEFORE_BIND,
            fmt.MECH_UNATTRIBUTED,
            arrival,
            "'the run began late; nothing recorded before its bind explains it'",
        ),
        Rule(
            f"{explains(gap, delay)} AND {explains('gc_gap', gap)}",
            PHASE_LAUNCH,
            fmt.MECH_GC,
            "gc_gap",
            "'collection between bind and launch'",
        ),
        Rule("TRUE", PHASE_LAUNCH, fmt.MECH_UNATTRIBUTED, delay, "'between bind and launch; nothing recorded explains it'"),
    ]


def end_rules(threshold_ns: int) -> list[Rule]:
    """Rules for an end that was late; ``runner_x`` is how much longer runner_run took."""
    runner_x = excess_of("runner_ns")
    drain = excess_of("drain_after_ns")
    markers = "device_markers > 0"
    work = excess_of("device_work_ns")
    next_bind = excess_of("next_bind_ns")
    late_signal, carried = _rivals_in_runner()
    # the device's own work is named first only where it grew by no less than the other explanations measured
    slow_device = (
        f"{markers} AND coalesce({work} > {threshold_ns} AND {work} >= coalesce(greatest({late_signal}, {carried}), {work}), FALSE)"
    )
    # the start's cause where the late start is the larger part, unless the device's idle before the signal (without
    # a fence span: a late start the collectives absorbed) or the carry-over through the drain is larger still
    idle = _idle_before_signal()
    larger_start = (
        f"{excess_of('start_ns')} > {runner_x} AND NOT coalesce({markers} AND greatest({idle}, {carried}) > {excess_of('start_ns')}, FALSE)"
    )
    return [
        # the device's own work (its wall time less the time it waited on peers) took longer than the threshold:
        # the run itself was slow, whatever else happened to it. A persistent straggler's runs all start late
        # too (depth-2 back-pressure), and its peers wait for it: its own work is the cause, not the carry-over.
        Rule(
            f"{slow_device} AND {explains('gc_run', work)}",
            fmt.PHASE_DEVICE_WALL,
            fmt.MECH_GC,
            "gc_run",
            f"'collection while the device ran ({fmt.PHASE_DEVICE_WALL})'",
        ),
        Rule(
            f"{slow_device} AND {explains(contention_of('device_rq_ns', 'device_cpu_ns'), work)}",
            fmt.PHASE_DEVICE_WALL,
            fmt.MECH_RUN_QUEUE,
            contention_of("device_rq_ns", "device_cpu_ns"),
            "'the device thread was runnable but waiting for a CPU'",
        ),
        Rule(slow_device, fmt.PHASE_DEVICE_WALL, fmt.MECH_DEVICE, work, "'slower device work'"),
        # otherwise the start's cause when the late start is the larger part
        *[
            Rule(f"{larger_start} AND {cond}", phase, mech, ev, detail)
            for cond, phase, mech, ev, detail in start_rules(excess_of("start_ns"))
        ],
        *device_grew_rules(runner_x),
        Rule(
            f"{markers} AND {explains(excess_of('drain_lag_ns'), runner_x)} AND {explains(drain, runner_x)} AND host_at_fence_ns >= drain_after_ns",
            fmt.PHASE_RUNNER,
            fmt.MECH_CARRIED_OVER,
            drain,
            "'its drain waited for the late previous run'",
        ),
        *fence_rules(runner_x),
        # the thread binds the next run before it drains this one (depth 2): a slow next bind holds this run's end
        *[
            Rule(
                f"coalesce(next_bind_ts_ns < end_ns, FALSE) AND {explains(next_bind, runner_x)} AND {cond}",
                PHASE_NEXT_BIND,
                mech,
                ev,
                detail.replace(PHASE_NEXT_BIND, "the bind of the next run"),
            )
            for cond, _, mech, ev, detail in host_rules(PHASE_NEXT_BIND, "gc_next_bind", "next_bind_rq_ns", "next_bind_cpu_ns", next_bind)[
                :3
            ]
        ],
        *[
            Rule(f"{markers} AND {cond}", phase, mech, ev, detail)
            for cond, phase, mech, ev, detail in host_rules(fmt.PHASE_RUNNER, "gc_run", "runner_rq_ns", "runner_cpu_ns", runner_x)
        ],
        # no device-phase markers: the host evidence of runner_run may still tell
        *host_rules(fmt.PHASE_RUNNER, "gc_run", "runner_rq_ns", "runner_cpu_ns", runner_x)[:3],
        Rule("TRUE", fmt.PHASE_RUNNER, fmt.MECH_UNATTRIBUTED, runner_x, "'inside runner_run; device-phase markers off'"),
    ]


def _rivals_in_runner() -> tuple[str, str]:
    """SQL: two explanations of a late end besides the run's start and its device's own work, where device-phase
    markers or a device timeline measure them: the late fence signal (the host's wait on the fence beyond the
    device's growth; without a fence span, the device's idle before the signal, rule 4) and, without a fence span
    (a Kineto device timeline), the carry-over through the drain (rule 2: how much later the host reached the
    drain, held there by the late previous run)."""
    late_signal = f"coalesce({excess_of('fence_ns')} - {excess_of('device_wall_ns')}, {excess_of('signal_lag_ns')})"
    carried = f"CASE WHEN fence_ns IS NULL AND host_at_fence_ns >= drain_after_ns THEN least({excess_of('drain_lag_ns')}, {excess_of('drain_after_ns')}) END"
    return late_signal, carried


def _idle_before_signal() -> str:
    """SQL: how much longer than typical the device was idle before its fence signal, where no fence span says what
    the host did then (a Kineto device timeline: rule 4); NULL where a fence span does."""
    return f"CASE WHEN fence_ns IS NULL THEN {excess_of('signal_lag_ns')} END"


def device_grew_rules(runner_x: str) -> list[Rule]:
    """Rules for a runner_run that took ``runner_x`` longer mostly because its device wall grew (docs/FIGURES.md rule 1)."""
    device = excess_of("device_wall_ns")
    # the wall grew, and its end was later for it: not where the device then idled longer still before a late
    # signal (the growth was a wait the other ranks' devices shared, absorbed before the late fence; rule 4)
    grown = f"device_markers > 0 AND {explains(device, runner_x)} AND NOT coalesce({_idle_before_signal()} > {device}, FALSE)"
    return [
        Rule(
            f"{grown} AND {explains('gc_run', device)}",
            fmt.PHASE_DEVICE_WALL,
            fmt.MECH_GC,
            "gc_run",
            f"'collection while the device ran ({fmt.PHASE_DEVICE_WALL})'",
        ),
        # a long wait whose own threads could not run: contention on this rank, not a late peer
        Rule(
            f"{grown} AND {explains(excess_of('device_wait_ns'), device)}"
            f" AND {explains(collective_contention(), excess_of('device_wait_ns'))}",
            fmt.PHASE_DEVICE_WALL,
            fmt.MECH_RUN_QUEUE,
            collective_contention(),
            COLLECTIVE_RUN_QUEUE,
        ),
        Rule(
            f"{grown} AND {explains(excess_of('device_wait_ns'), device)}",
            fmt.PHASE_DEVICE_WALL,
            fmt.MECH_PEER_WAIT,
            excess_of("device_wait_ns"),
            "'waited for a peer rank'",
        ),
        Rule(
            f"{grown} AND {explains(contention_of('device_rq_ns', 'device_cpu_ns'), device)}",
            fmt.PHASE_DEVICE_WALL,
            fmt.MECH_RUN_QUEUE,
            contention_of("device_rq_ns", "device_cpu_ns"),
            "'the device thread was runnable but waiting for a CPU'",
        ),
        Rule(f"{grown}", fmt.PHASE_DEVICE_WALL, fmt.MECH_DEVICE, device, "'slower device work'"),
    ]


def fence_rules(runner_x: str) -> list[Rule]:
    """Rules for a runner_run that took ``runner_x`` longer after its device was done: its fence wait grew
    (docs/FIGURES.md rule 3), or without a fence span, its device timeline shows the device idle (rule 4)."""
    markers = "device_markers > 0"
    fence = excess_of("fence_ns")
    return [
        Rule(
            f"{markers} AND {explains(fence, runner_x)} AND {explains('gc_fence', fence)}",
            fmt.PHASE_FENCE_WAIT,
            fmt.MECH_GC,
            "gc_fence",
            f"'collection in {fmt.PHASE_FENCE_WAIT}'",
        ),
        Rule(
            f"{markers} AND {explains(fence, runner_x)} AND {explains(contention_of('fence_rq_ns', 'fence_cpu_ns'), fence)}",
            fmt.PHASE_FENCE_WAIT,
            fmt.MECH_RUN_QUEUE,
            contention_of("fence_rq_ns", "fence_cpu_ns"),
            "'woke from the fence but waited for a CPU'",
        ),
        Rule(
            f"{markers} AND {explains(fence, runner_x)}",
            fmt.PHASE_FENCE_WAIT,
            fmt.MECH_DEVICE,
            fence,
            "'the completion fence was signalled late'",
        ),
        # no fence span, but a device timeline (a Kineto trace's, e.g. beside a log without device-phase markers):
        # runner_run went on after the device had finished
        *device_idle_rules(runner_x),
    ]


def device_idle_rules(runner_x: str) -> list[Rule]:
    """Rules for a runner_run that went on, after its device program had ended, longer than typical (``signal_lag_ns``):
    where no fence span says what the host did then, the device timeline says that the device was idle before the
    fence signal. Only where a device timeline exists (``device_markers``) and no fence span does."""
    idle = excess_of("signal_lag_ns")
    where = f"device_markers > 0 AND fence_ns IS NULL AND {explains(idle, runner_x)}"
    return [
        Rule(
            f"{where} AND {explains('gc_run', idle)}",
            fmt.PHASE_FENCE_WAIT,
            fmt.MECH_GC,
            "gc_run",
            f"'collection in {fmt.PHASE_FENCE_WAIT}'",
        ),
        Rule(where, fmt.PHASE_FENCE_WAIT, fmt.MECH_DEVICE, idle, "'the device was idle before the completion fence was signalled'"),
    ]


def token_rules() -> list[Rule]:
    """Rules for a token this rank gave late because its validate took longer (not because its run ended late).

    A step's interval ends at its last validate (docs/FIGURES.md "Slow steps"): a
    host thread held up in validate delays the step's token without delaying the
    run's end, so the end's rules never see it. No rule holds where the run's end
    is the larger part: the end's cause stands.
    """
    token = excess_of("validate_end_ns")
    validate = excess_of("validate_ns")
    return [
        Rule(f"coalesce({token} > 0, FALSE) AND {explains(validate, token)} AND {cond}", phase, mech, ev, detail)
        for cond, phase, mech, ev, detail in host_rules(fmt.PHASE_VALIDATE, "gc_validate", "validate_rq_ns", "validate_cpu_ns", validate)
    ]


def own_rules(threshold_ns: int, which: str) -> list[Rule]:
    """A run's own cause, beside what was carried over to it: evidence in its own phases above the threshold.

    Used where the run was also held back by an earlier one, so that a fault
    of its own is named rather than hidden behind the carry-over.
    """
    material = lambda value: f"coalesce({value} > {threshold_ns}, FALSE)"  # noqa: E731
    bind = [
        Rule(material("gc_bind"), fmt.PHASE_BIND, fmt.MECH_GC, "gc_bind", f"'collection in {fmt.PHASE_BIND}'"),
        Rule(
            material(extra_work("bind_cpu_ns", "bind_rq_ns")),
            fmt.PHASE_BIND,
            fmt.MECH_HOST_CPU,
            excess_of("bind_cpu_ns"),
            "'more host CPU in bind'",
        ),
    ]
    if which == "start":
        return bind
    work = excess_of("device_work_ns")
    signal = excess_of("signal_lag_ns")
    return [
        *bind,
        Rule(material("gc_fence"), fmt.PHASE_FENCE_WAIT, fmt.MECH_GC, "gc_fence", f"'collection in {fmt.PHASE_FENCE_WAIT}'"),
        Rule(
            f"{material(work)} AND {explains('gc_run', work)}",
            fmt.PHASE_DEVICE_WALL,
            fmt.MECH_GC,
            "gc_run",
            f"'collection while the device ran ({fmt.PHASE_DEVICE_WALL})'",
        ),
        Rule(
            f"{material(work)} AND {explains(contention_of('device_rq_ns', 'device_cpu_ns'), work)}",
            fmt.PHASE_DEVICE_WALL,
            fmt.MECH_RUN_QUEUE,
            contention_of("device_rq_ns", "device_cpu_ns"),
            "'the device thread was runnable but waiting for a CPU'",
        ),
        Rule(material(work), fmt.PHASE_DEVICE_WALL, fmt.MECH_DEVICE, work, "'slower device work'"),
        Rule(material(collective_contention()), fmt.PHASE_DEVICE_WALL, fmt.MECH_RUN_QUEUE, collective_contention(), COLLECTIVE_RUN_QUEUE),
        Rule(
            f"{material(signal)} AND {explains(contention_of('fence_rq_ns', 'fence_cpu_ns'), signal)}",
            fmt.PHASE_FENCE_WAIT,
            fmt.MECH_RUN_QUEUE,
            contention_of("fence_rq_ns", "fence_cpu_ns"),
            "'woke from the fence but waited for a CPU'",
        ),
        Rule(material(signal), fmt.PHASE_FENCE_WAIT, fmt.MECH_DEVICE, signal, "'the completion fence was signalled late'"),
    ]


def rule_index_sql(rules: list[Rule]) -> str:
    """SQL: the position of the first rule whose condition holds, NULL when none does."""
    whens = " ".join(f"WHEN {rule.when} THEN {position}" for position, rule in enumerate(rules))
    return f"CASE {whens} END"


def rule_field_sql(rules: list[Rule], index: str, field: str) -> str:
    """SQL: ``field`` (``phase``, ``mechanism``: texts; ``evidence``, ``detail``: SQL) of the rule at position ``index``."""
    texts = field in ("phase", "mechanism")
    whens = " ".join(
        f"WHEN {position} THEN {sql_text(getattr(rule, field)) if texts else getattr(rule, field)}" for position, rule in enumerate(rules)
    )
    return f"CASE {index} {whens} END"


def sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
