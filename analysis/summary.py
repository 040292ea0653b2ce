"""summary.json: its one typed home — the model, how it is built, loaded and versioned.

Every command that reads or writes a run's figures goes through here:
``analyze`` builds it, ``summary.md``, ``report.html``, the Perfetto export,
``gate`` and ``diff`` load it, so they all agree with one file. The fields are
documented in docs/SUMMARY_SCHEMA.md; the TypedDicts below are the same
contract for the type checker.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypedDict

import dsprof
from dsprof.analysis.ingest.side_files import load_json_object
from dsprof.errors import InputError
from dsprof.profiler import artifacts

SUMMARY_SCHEMA = "dsprof.summary/2"
# Older summaries the readers still accept (their fields are a subset for gate and diff).
READABLE_SCHEMAS = (SUMMARY_SCHEMA, "dsprof.summary/1")


class Percentiles(TypedDict):
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None
    count: int


class Cause(TypedDict, total=False):
    """Why one late cell was late; ``rank`` is the culprit (for a victim: the peer it waited for)."""

    rank: int
    device: str
    phase: str
    mechanism: str
    evidence_ms: float
    detail: str
    role: str  # culprit | victim
    late_rank: int
    excess_ms: float
    from_step: int  # carried_over only
    peer: int  # peer_wait only


class LateStart(Cause, total=False):
    step: int


class TailStep(Cause, total=False):
    step: int
    runner_end_skew_ms: float
    ranks: list[Cause]


class Straggler(TypedDict):
    verdict: str
    rank: int | None
    device: str | None
    share: float
    p_value: float | None
    mechanism: str | None
    ms_per_step: float | None


class RunInfo(TypedDict):
    """What the runtime said of the run (performance_summary.json): exit status and, after a crash, who failed."""

    exit_status: int | None
    failed_rank: int | None
    failed_device: str | None
    message: str | None


class Summary(TypedDict, total=False):
    schema: str
    dsprof_version: str
    inputs: dict[str, Any]
    workload: dict[str, Any] | None
    exit_status: int | None
    run: RunInfo
    validation: dict[str, Any]
    figures: dict[str, Any]
    per_step: list[dict[str, Any]]
    late_starts: dict[str, Any]
    tail_steps: dict[str, Any]
    tail_cost: dict[str, Any]
    pipeline: dict[str, Any]
    serving: dict[str, Any]


def run_info(performance_summary: dict | None) -> RunInfo:
    """Exit status and failure of the run, as the runtime wrote them."""
    summary = performance_summary if isinstance(performance_summary, dict) else {}
    failed = summary.get("failed_rank")
    failed = failed if isinstance(failed, int) and not isinstance(failed, bool) else None
    devices = summary.get("devices") if isinstance(summary.get("devices"), dict) else {}
    status = summary.get("exit_status")
    message = summary.get("message")
    return {
        "exit_status": status if isinstance(status, int) and not isinstance(status, bool) else None,
        "failed_rank": failed,
        "failed_device": None if failed is None else devices.get(str(failed)),
        "message": message if isinstance(message, str) and message else None,
    }


def build_summary(*, inputs: dict, performance_summary: dict | None, validation: dict, figures: dict, per_step: list,
                  late_starts: dict, tail_steps: dict, tail_cost: dict, pipeline: dict, serving: dict) -> Summary:
    """The summary, its fields in their documented order."""
    run = run_info(performance_summary)
    workload = (performance_summary or {}).get("workload") if isinstance(performance_summary, dict) else None
    return Summary(
        schema=SUMMARY_SCHEMA,
        dsprof_version=dsprof.__version__,
        inputs=inputs,
        workload=workload if isinstance(workload, dict) else None,
        exit_status=run["exit_status"],
        run=run,
        validation=validation,
        figures=figures,
        per_step=per_step,
        late_starts=late_starts,
        tail_steps=tail_steps,
        tail_cost=tail_cost,
        pipeline=pipeline,
        serving=serving,
    )


def summary_path(summary_or_dir: str | os.PathLike) -> Path:
    """``summary.json`` itself, or the one inside an artifact directory."""
    path = Path(summary_or_dir)
    return path / artifacts.SUMMARY_JSON if path.is_dir() else path


def load_summary(summary_or_dir: str | os.PathLike) -> Summary:
    """Read a summary.json (or an artifact directory's); InputError names the file on anything wrong."""
    path = summary_path(summary_or_dir)
    if not path.exists():
        raise InputError(path, "not found", expected="summary.json or an artifact directory holding one (run dsprof analyze first)")
    content = load_json_object(path, expected="summary.json written by dsprof analyze")
    schema = content.get("schema")
    if schema not in READABLE_SCHEMAS:
        raise InputError(path, f"unknown summary schema {schema!r}", expected=" or ".join(READABLE_SCHEMAS))
    return Summary(**content)  # type: ignore[typeddict-item]
