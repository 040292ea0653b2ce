"""summary.json: its one typed home — the model, how it is built, loaded and versioned.

Every command that reads or writes a run's figures goes through here:
``analyze`` builds it, ``summary.md``, ``report.html``, the Perfetto export,
``gate`` and ``diff`` load it, so they all agree with one file. The fields are
documented in docs/SUMMARY_SCHEMA.md; the TypedDicts below are the same
contract for the type checker.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, TypedDict

import dsprof
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
    slow_steps: dict[str, Any]
    what_if: dict[str, Any]
    tail_cost: dict[str, Any]
    pipeline: dict[str, Any]
    serving: dict[str, Any]


def run_info(performance_summary: dict | None) -> RunInfo:
    """Exit status and failure of the run, as the runtime wrote them."""
    summary = performance_summary if isinstance(performance_summary, dict) else {}
    failed = summary.get("failed_rank")
    failed = failed if isinstance(failed, int) and not isinstance(failed, bool) else None
    devices: dict = summary["devices"] if isinstance(summary.get("devices"), dict) else {}
    status = summary.get("exit_status")
    message = summary.get("message")
    return {
        "exit_status": status if isinstance(status, int) and not isinstance(status, bool) else None,
        "failed_rank": failed,
        "failed_device": None if failed is None else devices.get(str(failed)),
        "message": message if isinstance(message, str) and message else None,
    }


def build_summary(
    *,
    inputs: dict,
    performance_summary: dict | None,
    validation: dict,
    figures: dict,
    per_step: list,
    late_starts: dict,
    tail_steps: dict,
    slow_steps: dict,
    what_if: dict,
    tail_cost: dict,
    pipeline: dict,
    serving: dict,
) -> Summary:
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
        slow_steps=slow_steps,
        what_if=what_if,
        tail_cost=tail_cost,
        pipeline=pipeline,
        serving=serving,
    )


def summary_path(summary_or_dir: str | os.PathLike) -> Path:
    """``summary.json`` itself, or the one inside an artifact directory."""
    path = Path(summary_or_dir)
    return path / artifacts.SUMMARY_JSON if path.is_dir() else path


def load_summary(summary_or_dir: str | os.PathLike) -> Summary:
    """Read a summary.json (or an artifact directory's); InputError names the file on anything wrong.

    The one place summaries are read from disk. NaN/Infinity constants and
    numbers beyond the float range are refused with one clear error: dsprof
    never writes them, and they would break every comparison.
    """
    path = summary_path(summary_or_dir)
    expected = "summary.json or an artifact directory holding one (run dsprof analyze first)"
    try:
        size = path.stat().st_size
        if size > MAX_SUMMARY_BYTES:  # json.loads holds several times the text in memory
            raise InputError(path, f"{size} bytes is too large for a summary", expected=f"at most {MAX_SUMMARY_BYTES >> 20} MiB")
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(path, "not found", expected=expected) from None
    except IsADirectoryError:
        raise InputError(path, "is a directory", expected="summary.json") from None
    except UnicodeDecodeError:
        raise InputError(path, "binary data, not JSON text", expected="summary.json") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        content = json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise InputError(path, f"not valid JSON: {exc.msg}", line=exc.lineno) from None
    except ValueError as exc:
        raise InputError(path, str(exc), expected="a dsprof summary") from None
    except RecursionError:
        raise InputError(path, "nested too deeply for a summary", expected="a dsprof summary") from None
    if not isinstance(content, dict) or content.get("schema") not in READABLE_SCHEMAS:
        found = content.get("schema") if isinstance(content, dict) else None
        raise InputError(
            path,
            "not a dsprof summary" + (f" (schema {found!r})" if found else ""),
            expected=f'a JSON object with "schema": "{SUMMARY_SCHEMA}"',
        )
    _check_shape(content, path)
    return Summary(**content)


# Sections that are JSON objects, and the lists of objects inside them, as build_summary writes them.
_OBJECT_SECTIONS = ("inputs", "run", "validation", "figures", "late_starts", "tail_steps", "tail_cost", "pipeline", "serving")
_OBJECT_LISTS = (("per_step",), ("late_starts", "items"), ("tail_steps", "items"))


def _check_shape(content: dict, path: Path) -> None:
    """Refuse a summary whose sections are not the objects and lists of objects every reader walks."""
    for section in _OBJECT_SECTIONS:
        if not isinstance(content.get(section, {}), dict):
            raise InputError(path, f"{section} is {type(content[section]).__name__}", expected="a JSON object")
    for keys in _OBJECT_LISTS:
        value = content.get(keys[0], []) if len(keys) == 1 else content.get(keys[0], {}).get(keys[1], [])
        name = ".".join(keys)
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise InputError(path, f"{name} is not a list of objects", expected="a dsprof summary")
        if name == "tail_steps.items" and not all(isinstance(item.get("ranks", []), list) for item in value):
            raise InputError(path, "tail_steps.items[].ranks is not a list", expected="a dsprof summary")


# A summary of 10^6 steps is ~150 MiB; beyond this it is not a summary.
MAX_SUMMARY_BYTES = 256 << 20


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON (the schema writes null for a figure it could not measure)")


def _finite_float(text: str) -> float:
    """JSON floats that fit a float; ``1e400`` would silently become infinity."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is beyond the range of a figure")
    return value


def _bounded_int(text: str) -> int:
    """JSON integers within the float range; a longer one is corrupt (and int() refuses beyond 4300 digits)."""
    digits = len(text.lstrip("-"))
    if digits > 308:
        raise ValueError(f"an integer of {digits} digits is beyond the range of a figure")
    return int(text)
