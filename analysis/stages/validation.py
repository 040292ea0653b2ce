"""The verdict on a swimlane: named checks, each with its detail, and the problems found.

Checks never stop the analysis: a partial or inconsistent artifact still gets
every figure that can be computed, and the verdict says what is wrong.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from dsprof.analysis.stages.runner import stage
from dsprof.analysis.stages.swimlane import Swimlane
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.store.predicates import serving_row
from dsprof.analysis.summary_schema import Validation, ValidationCheck
from dsprof.profiler import sa_profile

# SA_PROFILE categories a serving trace must have (docs/FORMATS.md "SA_PROFILE", level e2e)
REQUIRED_SERVING_CATEGORIES = (sa_profile.CAT_REQUEST, sa_profile.CAT_SCHEDULER, sa_profile.CAT_WORKER)


class _Checks:
    def __init__(self) -> None:
        self.checks: list[ValidationCheck] = []
        self.problems: list[str] = []

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(ValidationCheck(name=name, ok=bool(ok), detail=detail))
        if not ok:
            self.problems.append(detail)


def _ranges(numbers: list[int], total: int | None = None) -> str:
    total = len(numbers) if total is None else total
    return ", ".join(map(str, numbers[:20])) + (f" and {total - 20} more" if total > 20 else "")


def _missing_ranks(expect_ranks: int, present: Iterable[int]) -> tuple[list[int], int]:
    """The first 20 ranks below ``expect_ranks`` without decode steps, and how many there are: no set of every expected rank is built."""
    have = {rank for rank in present if 0 <= rank < expect_ranks}
    count = expect_ranks - len(have)
    return list(itertools.islice((rank for rank in itertools.count() if rank not in have), min(count, 20))), count


@stage("validation", reads=("spans", "decode"), in_summary=True)
def validate(engine: Engine, swimlane: Swimlane, *, expect_ranks: int | None = None) -> Validation:
    """The ``validation`` block of summary.json."""
    checks = _Checks()
    steps_per_rank = dict(engine.rows("SELECT rank, count(*) FROM decode GROUP BY rank ORDER BY rank"))
    ranks = len({p["rank"] for p in swimlane.processes})
    decode_steps = max(steps_per_rank.values(), default=0)
    rank_roots = sum(steps_per_rank.values())
    devices = sorted({str(p["device"]) for p in swimlane.processes})
    _check_processes(checks, swimlane, devices, ranks, expect_ranks)
    checks.add(
        "decode_steps",
        decode_steps > 0,
        f"{decode_steps} decode steps (callable {swimlane.decode_label})" if decode_steps else "no decode steps found",
    )
    expected_roots = decode_steps * ranks
    roots_detail = (
        "no rank roots"
        if rank_roots == 0
        else f"{rank_roots} = {decode_steps} x {ranks}"
        if rank_roots == expected_roots
        else f"{rank_roots} rank roots, expected {decode_steps} x {ranks} = {expected_roots}"
    )
    checks.add("rank_roots", rank_roots == expected_roots and rank_roots > 0, roots_detail)
    _check_steps(engine, checks, steps_per_rank, decode_steps, ranks, expect_ranks)
    _check_phases(engine, checks)
    if swimlane.rootless_invocations:
        checks.add(
            "complete_invocations",
            False,
            f"{swimlane.rootless_invocations} invocations have spans but no chip.run root (torn or crashed run)",
        )
    if swimlane.duplicate_roots:
        checks.add("unique_roots", False, f"{swimlane.duplicate_roots} invocations have more than one root")
    if swimlane.serving_spans:
        present = {row[0] for row in engine.rows(f"SELECT DISTINCT cat FROM spans WHERE {serving_row()}")}
        missing = [c for c in REQUIRED_SERVING_CATEGORIES if c not in present]
        checks.add(
            "serving_categories",
            not missing,
            "serving categories present: " + ", ".join(REQUIRED_SERVING_CATEGORIES)
            if not missing
            else "serving trace lacks categories: " + ", ".join(missing),
        )
    device_clock = engine.scalar("SELECT count(*) FROM spans WHERE clk = 'dev'")
    checks.add("device_clock_off_host", True, f"{device_clock} device-clock spans kept off the host axis")
    unanchored = swimlane.unanchored_pids
    checks.add(
        "anchored", not unanchored, "every pid has a CLOCK_ANCHOR" if not unanchored else "no CLOCK_ANCHOR for pid " + _ranges(unanchored)
    )
    return Validation(
        valid=not checks.problems,
        decode_steps=decode_steps,
        rank_roots=rank_roots,
        ranks=ranks,
        devices=devices,
        expected_ranks=expect_ranks,
        steps_per_rank={str(r): int(n) for r, n in steps_per_rank.items()},
        step_numbering=swimlane.step_numbering,
        left_out_invocations=swimlane.left_out_invocations,
        problems=checks.problems,
        checks=checks.checks,
    )


def _check_processes(checks: _Checks, swimlane: Swimlane, devices: list[str], ranks: int, expect_ranks: int | None) -> None:
    found = f"{len(devices)} devices found ({', '.join(devices)})" if devices else "no devices found"
    if expect_ranks is not None:
        checks.add("devices", ranks == expect_ranks, f"{found}; {ranks} ranks, expected {expect_ranks}")
    else:
        checks.add("devices", len(devices) > 0, found)
    by_rank: dict[int, list[int]] = {}
    by_device: dict[str, list[int]] = {}
    for process in swimlane.processes:
        by_rank.setdefault(process["rank"], []).append(process["pid"])
        by_device.setdefault(str(process["device"]), []).append(process["rank"])
    for rank, pids in sorted(by_rank.items()):
        if len(pids) > 1:
            checks.add("distinct_ranks", False, f"rank {rank} is claimed by {len(pids)} processes (pid {_ranges(pids)})")
    for device, on_device in sorted(by_device.items()):
        if len(set(on_device)) > 1:
            checks.add("distinct_devices", False, f"ranks {_ranges(sorted(set(on_device)))} all run on device {device}")
    for conflict in swimlane.device_conflicts:
        checks.add(
            "consistent_devices",
            False,
            f"pid {conflict['pid']} announced {len(conflict['devices'])} devices: {', '.join(conflict['devices'])}",
        )


def _check_steps(engine: Engine, checks: _Checks, steps_per_rank: dict, decode_steps: int, ranks: int, expect_ranks: int | None) -> None:
    counts = sorted(set(steps_per_rank.values()))
    if len(counts) > 1:
        common = max(counts, key=lambda n: (list(steps_per_rank.values()).count(n), n))
        odd = "; ".join(f"rank {r} has {n} decode steps" for r, n in steps_per_rank.items() if n != common)
        checks.add("equal_steps", False, f"{odd}, others {common}")
    else:
        checks.add("equal_steps", True, f"every rank has {decode_steps} decode steps")
    partial = engine.rows(f"""SELECT min(step), max(step), count(*), min(n), max(n) FROM
                              (SELECT step, count(DISTINCT rank) AS n FROM decode GROUP BY step) WHERE n < {ranks}""")[0]
    if partial[2]:
        first, last, n, fewest, most = partial
        where = f"step {first}" if n == 1 else f"{n} steps between {first} and {last}"
        present = f"{fewest}" if fewest == most else f"{fewest} to {most}"
        checks.add(
            "complete_steps", False, f"{where} present on only {present} of {ranks} ranks; their figures use the ranks that have them"
        )
    if expect_ranks is not None:
        missing, count = _missing_ranks(expect_ranks, steps_per_rank)
        if count:
            checks.add("ranks_present", False, "no decode steps on rank " + _ranges(missing, count))
    gap_ranks = [
        r
        for (r,) in engine.rows("""SELECT DISTINCT rank FROM (
        SELECT rank, step_attr - lag(step_attr) OVER (PARTITION BY rank ORDER BY position) AS gap FROM decode
        WHERE step_attr IS NOT NULL) WHERE gap <> 1 ORDER BY rank""")
    ]
    checks.add(
        "contiguous_steps",
        not gap_ranks,
        "decode steps are contiguous on every rank" if not gap_ranks else "step numbers jump on rank " + _ranges(gap_ranks),
    )


def _check_phases(engine: Engine, checks: _Checks) -> None:
    """Decode runs without runner_run (invalid: no skew figures) or without bind (noted) are counted."""
    no_runner, no_bind = engine.rows("""SELECT count(*) FILTER (WHERE runner_ts_ns IS NULL), count(*) FILTER (WHERE bind_ts_ns IS NULL)
                                        FROM decode""")[0]
    if no_runner:
        checks.add("runner_spans", False, f"{no_runner} decode runs have no runner_run span; their skew figures are missing")
    if no_bind:  # the skew figures do not need bind: valid, but say what is missing
        checks.add("bind_spans", True, f"{no_bind} decode runs have no bind span; bind figures and pipeline pairs use the others")
