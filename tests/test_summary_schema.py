"""The summary model (analysis/summary_schema.py): what the analyses write, what load_summary accepts, what the doc names.

* A real analysis writes exactly the model: every value has the model's type,
  and no key is written that the model lacks.
* load_summary refuses a crafted summary with one line naming the JSON path,
  and report, export, gate and diff say so without a traceback; it still reads
  older summaries (schema 1, or without the newer sections) and keeps keys it
  does not know.
* docs/SUMMARY_SCHEMA.md names every field of the model under its section.
"""

from __future__ import annotations

import copy
import json
import re
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints, is_typeddict

import msgspec
import numpy as np
import pytest
from click.testing import CliRunner

from dsprof.analysis.summary import load_summary
from dsprof.analysis.summary_schema import Cause, Figures, PercentileFigure, Percentiles, SlowSteps, Straggler, Summary
from dsprof.cli.main import cli
from dsprof.errors import InputError
from dsprof.testing.synthetic import SyntheticRun

REPO = Path(__file__).resolve().parents[1]
SCHEMA_DOC = REPO / "docs" / "SUMMARY_SCHEMA.md"
RULES = REPO / "examples" / "ci-rules.toml"


def _faulty_run() -> SyntheticRun:
    """Four ranks with a slow bind (a late start) and a slow device run (a tail and a slow step)."""
    shape = (4, 20)
    bind = np.full(shape, 1_000_000, dtype=np.int64)
    fence = np.full(shape, 9_000_000, dtype=np.int64)
    device = np.full(shape, 9_100_000, dtype=np.int64)
    bind[1, 5] += 7_000_000
    fence[2, 12] += 12_000_000
    device[2, 12] += 12_000_000
    return SyntheticRun(ranks=4, steps=20, bind_ns=bind, fence_wait_ns=fence, device_wall_ns=device)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory) -> Path:
    run = _faulty_run().write(tmp_path_factory.mktemp("model") / "run")
    result = CliRunner().invoke(cli, ["analyze", str(run)])
    assert result.exit_code == 0, result.output
    return run


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


# --------------------------------------------------------------------------- the model against a real analysis


def _unmodelled_keys(value: Any, model: Any, where: str = "$") -> list[str]:
    """JSON paths of keys in ``value`` that ``model`` (a TypedDict, list, dict or union of them) does not have."""
    if is_typeddict(model) and isinstance(value, dict):
        hints = get_type_hints(model)
        found = [f"{where}.{key}" for key in value if key not in hints]
        return found + [
            path for key, hint in hints.items() if key in value for path in _unmodelled_keys(value[key], hint, f"{where}.{key}")
        ]
    origin, args = get_origin(model), get_args(model)
    if origin is list and isinstance(value, list):
        return [path for i, item in enumerate(value) for path in _unmodelled_keys(item, args[0], f"{where}[{i}]")]
    if origin is dict and isinstance(value, dict):
        return [path for key, item in value.items() for path in _unmodelled_keys(item, args[1], f"{where}[{key}]")]
    if origin in (Union, types.UnionType):
        return [path for arg in args if arg is not type(None) for path in _unmodelled_keys(value, arg, where)]
    return []


def test_an_analysis_writes_exactly_the_model(analysed):
    summary = _summary(analysed)
    for section in ("late_starts", "tail_steps", "slow_steps", "what_if"):
        assert summary[section]["items"], f"the faulty run should give {section} items"
    msgspec.convert(summary, type=Summary)  # every value has its type (raises otherwise)
    assert _unmodelled_keys(summary, Summary) == []
    assert load_summary(analysed) == summary


def test_the_percentile_figure_names_are_the_figures_blocks():
    blocks = {name for name, hint in get_type_hints(Figures).items() if hint is Percentiles}
    assert set(get_args(PercentileFigure)) == blocks


# --------------------------------------------------------------------------- load_summary: crafted and older files


def _set(summary: dict, path: tuple, value: Any) -> dict:
    changed = copy.deepcopy(summary)
    node = changed
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return changed


CRAFTED = [
    (("per_step", 0, "step"), "0", "$.per_step[0].step"),  # a step given as text
    (("per_step", 1, "runner_end_skew_ms"), None, "$.per_step[1].runner_end_skew_ms"),  # a null per-step figure
    (("late_starts", "items", 0, "step"), "five", "$.late_starts.items[0].step"),
    (("tail_steps", "straggler"), [], "$.tail_steps.straggler"),  # a list where an object belongs
    (("tail_steps", "items", 0, "ranks", 0, "evidence_ms"), "1 ms", "$.tail_steps.items[0].ranks[0].evidence_ms"),
    (("figures", "per_rank", "0", "bind_ms"), None, "$.figures.per_rank[...].bind_ms"),
    (("slow_steps", "items", 0, "critical_path"), "device_wall", "$.slow_steps.items[0].critical_path"),
    (("what_if", "by_rank"), [1.0], "$.what_if.by_rank"),
    (("pipeline", "native_overlap_verified", "verified"), "yes", "$.pipeline.native_overlap_verified.verified"),
    (("validation", "valid"), 1, "$.validation.valid"),
]


@pytest.mark.parametrize("path, value, json_path", CRAFTED)
def test_a_crafted_summary_is_one_error_naming_the_json_path(analysed, tmp_path, path, value, json_path):
    target = tmp_path / "summary.json"
    target.write_text(json.dumps(_set(_summary(analysed), path, value)))
    with pytest.raises(InputError) as caught:
        load_summary(target)
    message = str(caught.value)
    assert message.startswith(f"{target}: ") and f"at `{json_path}`" in message and "\n" not in message


@pytest.mark.parametrize("path, value, json_path", [CRAFTED[0], CRAFTED[1], CRAFTED[3], CRAFTED[5]])
def test_commands_refuse_a_crafted_summary_in_one_line(analysed, tmp_path, path, value, json_path):
    run = tmp_path / "run"
    run.mkdir()
    for item in analysed.iterdir():
        if item.is_file():
            (run / item.name).write_bytes(item.read_bytes())
        else:
            (run / item.name).symlink_to(item, target_is_directory=True)
    (run / "summary.json").write_text(json.dumps(_set(_summary(analysed), path, value)))
    for args in (
        ["report", str(run)],
        ["export", str(run), "-o", str(tmp_path / "trace.json")],
        ["gate", str(run), "--rules", str(RULES)],
        ["diff", str(analysed), str(run)],
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)
        assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
        lines = result.output.strip().splitlines()
        assert lines[-1].startswith("dsprof: error: ") and f"at `{json_path}`" in lines[-1], (args, result.output)


def test_older_summaries_are_read_as_they_are(analysed, tmp_path):
    current = _summary(analysed)
    without_new = {k: v for k, v in current.items() if k not in ("slow_steps", "what_if")}
    without_new["per_step"] = [{k: v for k, v in row.items() if k != "interval_ms"} for row in current["per_step"]]
    without_new["figures"] = {k: v for k, v in current["figures"].items() if k != "step_interval_ms"}
    without_new["future_section"] = {"kept": True}  # unknown keys are kept, not dropped
    schema_1 = {"schema": "dsprof.summary/1", "validation": {"valid": True}, "tail_steps": {"count": 1}, "extra": [1]}
    for content in (without_new, schema_1):
        target = tmp_path / "summary.json"
        target.write_text(json.dumps(content))
        assert load_summary(target) == content


def test_an_older_schema_still_has_its_types_checked(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text(json.dumps({"schema": "dsprof.summary/1", "late_starts": {"items": [{"step": "3"}]}}))
    with pytest.raises(InputError, match=r"at `\$\.late_starts\.items\[0\]\.step`"):
        load_summary(target)


# --------------------------------------------------------------------------- the schema doc names every field


def _doc_sections() -> tuple[str, dict[str, str], str]:
    """The doc's text before the example, each top-level section of the JSON example, and the causes table."""
    text = SCHEMA_DOC.read_text()
    preamble, rest = text.split("```jsonc", 1)
    example = rest.split("```", 1)[0]
    sections: dict[str, str] = {}
    current = None
    for line in example.splitlines():
        top = re.match(r'^  "(\w+)":', line)
        if top:
            current = top.group(1)
            sections[current] = ""
        if current:
            sections[current] += line + "\n"
    causes = text.split("## Causes", 1)[1].split("\n## ", 1)[0]
    return preamble, sections, causes


def _records(model: Any) -> list[Any]:
    """Every TypedDict reachable from ``model`` through lists, dicts and unions."""
    if is_typeddict(model):
        return [model, *(r for hint in get_type_hints(model).values() for r in _records(hint))]
    return [r for arg in get_args(model) for r in _records(arg)]


CAUSE_FIELDS = set(get_type_hints(Cause))
CAUSE_PARTS = _records(Cause)[1:]  # records inside a cause (carried_over), documented with it


def _missing_fields(record: Any, section_text: str, causes_table: str) -> list[str]:
    """Fields of ``record`` its section does not name; a cause's own fields may be named in the causes table instead."""
    fields = set(get_type_hints(record))
    in_table = CAUSE_FIELDS if CAUSE_FIELDS <= fields else fields if record in CAUSE_PARTS else set()
    return sorted(
        name
        for name in fields
        if f'"{name}"' not in section_text and not (name in in_table and (f"`{name}`" in causes_table or f'"{name}"' in causes_table))
    )


def test_the_schema_doc_names_every_field_under_its_section():
    preamble, sections, causes = _doc_sections()
    assert list(sections) == list(get_type_hints(Summary)), "the example lists the sections in the model's order"
    missing = {}
    for name, hint in get_type_hints(Summary).items():
        for record in _records(hint):
            text = preamble if record is Percentiles else sections[name]
            absent = _missing_fields(record, text, causes)
            if absent:
                missing[f"{name}: {record.__name__}"] = absent
    assert missing == {}, "fields of analysis/summary_schema.py not in docs/SUMMARY_SCHEMA.md"


def test_the_doc_check_finds_a_field_left_out():
    _, sections, causes = _doc_sections()
    assert _missing_fields(Straggler, sections["tail_steps"].replace('"saved_ms"', '"saved"'), causes) == ["saved_ms"]
    assert _missing_fields(SlowSteps, sections["slow_steps"], causes) == []
    assert _missing_fields(SlowSteps, sections["late_starts"], causes) != []
