"""summary.json: its one typed home — the model, how it is built, loaded and versioned.

Every command that reads or writes a run's figures goes through here:
``analyze`` builds it, ``summary.md``, ``report.html``, the Perfetto export,
``gate`` and ``diff`` load it, so they all agree with one file. The fields are
documented in docs/SUMMARY_SCHEMA.md; the TypedDicts of
:mod:`~dsprof.analysis.summary_schema` are the same contract for the type
checker, and for :func:`load_summary`, which checks every file against them.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import os
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict, Union, cast, get_args, get_origin, get_type_hints, is_typeddict

import msgspec

import dsprof
from dsprof.analysis.summary_schema import (
    RunInfo,
    Summary,
)
from dsprof.errors import InputError
from dsprof.fileio import read_regular_file, strict_json_loads
from dsprof.output_set import settle
from dsprof.profiler import artifacts

SUMMARY_SCHEMA = "dsprof.summary/2"
# Older summaries the readers still accept (their fields are a subset for gate and diff).
READABLE_SCHEMAS = (SUMMARY_SCHEMA, "dsprof.summary/1")


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


# Summary keys declared ``X | None``: written as null; any other block that is None is left out (e.g. ``device_time``)
_NULLABLE = frozenset({"workload", "exit_status"})


def build_summary(performance_summary: dict | None, blocks: Mapping[str, Any]) -> Summary:
    """The summary from the analysis' blocks, its keys in the order :class:`Summary` declares them; a None block is left out."""
    run = run_info(performance_summary)
    workload = (performance_summary or {}).get("workload") if isinstance(performance_summary, dict) else None
    fields = {
        **blocks,
        "schema": SUMMARY_SCHEMA,
        "dsprof_version": dsprof.__version__,
        "workload": workload if isinstance(workload, dict) else None,
        "exit_status": run["exit_status"],
        "run": run,
    }
    unknown = fields.keys() - Summary.__annotations__.keys()
    if unknown:
        raise KeyError(f"summary blocks {sorted(unknown)} are not declared in summary_schema.Summary")
    ordered = {key: fields[key] for key in Summary.__annotations__ if key in fields}
    return cast(Summary, {key: value for key, value in ordered.items() if value is not None or key in _NULLABLE})


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
    settle(path.parent)  # a set of outputs whose move a crash cut short is completed before it is read
    try:
        text = read_regular_file(path, max_bytes=MAX_SUMMARY_BYTES, expected="summary.json").decode("utf-8")
    except FileNotFoundError:
        raise InputError(path, "not found", expected=expected) from None
    except UnicodeDecodeError:
        raise InputError(path, "binary data, not JSON text", expected="summary.json") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        content = strict_json_loads(text)
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
    _check_types(content, path)
    return cast(Summary, content)


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


def _partial(model: Any) -> Any:
    """``model`` with every key of every TypedDict in it optional: what a ``dsprof.summary/1`` file may hold."""
    if is_typeddict(model):
        fields = {name: _partial(hint) for name, hint in get_type_hints(model).items()}
        typed_dict: Any = TypedDict  # the functional form, with fields known only here
        return typed_dict(f"Partial{model.__name__}", fields, total=False)
    origin, args = get_origin(model), get_args(model)
    if origin is list:
        return types.GenericAlias(list, (_partial(args[0]),))
    if origin is dict:
        return types.GenericAlias(dict, (args[0], _partial(args[1])))
    if args and origin in (Union, types.UnionType):
        return functools.reduce(operator.or_, (_partial(arg) for arg in args))
    return model


# The model a file of each readable schema is checked against: the older one's fields are a subset, each optional.
_MODELS = {SUMMARY_SCHEMA: Summary, "dsprof.summary/1": _partial(Summary)}


def _check_types(content: dict, path: Path) -> None:
    """Refuse a summary whose values are not of the model's types, naming the first one by its JSON path."""
    try:
        msgspec.convert(content, type=_MODELS[content["schema"]])
    except msgspec.ValidationError as exc:
        raise InputError(
            path, str(exc).replace(" - at ", " at "), expected=f"a summary of docs/SUMMARY_SCHEMA.md ({content['schema']})"
        ) from None


# A summary of 10^6 steps is ~150 MiB; beyond this it is not a summary.
MAX_SUMMARY_BYTES = 256 << 20


# =========================================================================== figure lookup
# Finding figures in a summary by dotted path, for the gate and diff: one path
# (``runner_end_skew_ms.p99``, ``figures.per_rank.*.bind_ms.p95``) gives the
# concrete figures it names, a figure the run did not produce, or a mistake in
# the path (with the closest paths the summary does have). Kept as one block, its
# imports with it, so that it merges apart from the model above (move them up then).

import difflib  # noqa: E402
import itertools  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402

from dsprof.textsafe import terminal_safe  # noqa: E402

# Blocks of the summary whose keys are the run's own (ranks, devices, drop reasons,
# workload settings): a key one of them lacks is a figure this run did not
# produce. Every other block has the same keys in every summary (null when not
# measured), so a path missing there is a mistake in the rules. Lists (items,
# per_step) are run-dependent as well: an index past the end was not produced.
RUN_KEYED_BLOCKS = frozenset(
    {
        "workload",
        "inputs.dropped",
        "validation.dropped",
        "validation.steps_per_rank",
        "figures.per_rank",
        "tail_steps.devices",
        "pipeline.cadence_ms",
        "pipeline.achieved_depth",
    }
)

# Units by figure-name suffix, longest first (``_tok_s`` before ``_s``).
_UNITS = (("_tok_s", "tok/s"), ("_ms", "ms"), ("_us", "us"), ("_ns", "ns"), ("_s", "s"))


def summary_with_path(summary_or_dir: str | os.PathLike | dict) -> tuple[dict, str | None]:
    """A summary dict as given, or the summary of a ``summary.json`` path or artifact dir, with its path."""
    if isinstance(summary_or_dir, dict):
        return summary_or_dir, None
    return dict(load_summary(summary_or_dir)), str(summary_path(summary_or_dir))


def is_number(value: Any) -> bool:
    """A finite int or float, not a bool: what the gate can compare and the diff can average."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond the float range
        return False


@dataclass(frozen=True)
class Unavailable:
    """A figure of the summary's schema that this run did not produce; ``reason`` says why."""

    reason: str


class UnknownFigure(Exception):
    """A path the summary does not have: a mistake in the rules, not a property of the run."""

    def __init__(self, path: str, missing_at: str, suggestions: list[str]):
        self.path = path
        self.missing_at = missing_at
        self.suggestions = suggestions
        super().__init__(path)

    def describe(self) -> str:
        """``"x.y" is not a figure of this summary (no "x.y"); did you mean ...?"``"""
        text = f"{terminal_safe(self.path)} is not a figure of this summary"
        if self.missing_at != self.path:
            text += f" (it has no {terminal_safe(self.missing_at)})"
        if self.suggestions:
            text += "; did you mean " + " or ".join(terminal_safe(s) for s in self.suggestions) + "?"
        return text


def _figure_paths(summary: dict, limit: int = 20_000) -> Iterator[str]:
    """Leaf paths of a summary for suggestions: every fixed key, and ``*`` for run keys and list items (the first one's keys)."""
    stack: list[tuple[list[str], Any]] = [([], summary)]
    produced = 0
    while stack and produced < limit:
        prefix, node = stack.pop()
        if isinstance(node, dict):
            keyed = ".".join(prefix) in RUN_KEYED_BLOCKS
            children = itertools.islice(node.items(), 1) if keyed else node.items()
            stack.extend(([*prefix, "*" if keyed else str(k)], v) for k, v in children)
        elif isinstance(node, list):
            if node:
                stack.append(([*prefix, "*"], node[0]))
        elif prefix:
            produced += 1
            path = ".".join(prefix)
            yield path
            if prefix[0] == "figures" and len(prefix) > 1:
                yield path.removeprefix("figures.")


def _closest(path: str, candidates: Iterator[str], cutoff: float = 0.6, band: float = 0.05) -> list[str]:
    """Up to three paths most like ``path`` (difflib ratio), only those about as close as the best one."""
    scored = []
    for candidate in dict.fromkeys(candidates):
        matcher = difflib.SequenceMatcher(None, path, candidate)
        if matcher.real_quick_ratio() >= cutoff and matcher.quick_ratio() >= cutoff and matcher.ratio() >= cutoff:
            scored.append((-matcher.ratio(), candidate))
    scored.sort()
    return [candidate for score, candidate in scored[:3] if -score >= -scored[0][0] - band]


def _unknown(summary: dict, path: str, missing_at: str) -> UnknownFigure:
    return UnknownFigure(path, missing_at, _closest(path, _figure_paths(summary)))


def resolve(summary: dict, path: str) -> list[tuple[str, Any]]:
    """Concrete ``(path, value)`` pairs for a dotted path.

    A path not found from the top is tried under ``figures.``; a ``*`` segment
    matches every key of the dict (or index of the list) at that level. A value
    the run did not produce (under a null block, a rank or item it does not
    have, every rank of an empty per-rank block) comes back as
    :class:`Unavailable`; a wildcard over an empty list matches nothing (no
    items: nothing to check). A path the summary's schema does not have raises
    :class:`UnknownFigure`.
    """
    parts = path.split(".")
    if parts[0] not in summary and isinstance(summary.get("figures"), dict) and parts[0] in summary["figures"]:
        parts = ["figures", *parts]
    matches: list[tuple[list[str], Any]] = [([], summary)]
    for part in parts:
        expanded: list[tuple[list[str], Any]] = []
        for prefix, node in matches:
            where = ".".join(prefix)
            if isinstance(node, Unavailable):
                expanded.append(([*prefix, part], node))
            elif node is None:
                expanded.append(([*prefix, part], Unavailable(f"{where} is null in this run")))
            elif part == "*" and isinstance(node, dict):
                if not node:
                    expanded.append(([*prefix, part], Unavailable(f"{where} is empty in this run")))
                expanded.extend(([*prefix, str(k)], v) for k, v in node.items())
            elif part == "*" and isinstance(node, list):
                expanded.extend(([*prefix, str(i)], v) for i, v in enumerate(node))
            elif isinstance(node, dict) and part in node:
                expanded.append(([*prefix, part], node[part]))
            elif isinstance(node, dict) and where in RUN_KEYED_BLOCKS:
                expanded.append(([*prefix, part], Unavailable(f"{where} has no {part} in this run")))
            elif isinstance(node, list) and part.isascii() and part.isdecimal():  # '٥' is not an index
                if int(part) < len(node):
                    expanded.append(([*prefix, part], node[int(part)]))
                else:
                    expanded.append(([*prefix, part], Unavailable(f"{where} has {len(node)} item(s) in this run")))
            else:
                raise _unknown(summary, path, ".".join([*prefix, part]))
        matches = expanded
    return [(".".join(p), v) for p, v in matches]


def figure_unit(path: str) -> str:
    """The unit a figure's name declares: ``_ms`` ms, ``_s`` seconds, ``_tok_s`` tok/s; '' when none.

    The last segment with a unit suffix decides, so ``runner_end_skew_ms.p99``
    and ``pipeline.cadence_ms.3.p50`` are ms.
    """
    for segment in reversed(path.split(".")):
        for suffix, unit in _UNITS:
            if segment.endswith(suffix):
                return unit
    return ""


# =========================================================================== end of figure lookup
