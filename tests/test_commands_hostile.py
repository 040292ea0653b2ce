"""Every command, fed hostile values: nothing raises past the CLI, and an error is one line with exit 2.

Hypothesis takes a small valid artifact directory and breaks one thing in it —
a number in a log record, a field of a serving event, a value in
performance_summary.json or summary.json, a rules file — with values a broken
or hostile producer could write: numbers past int64 and past the float range,
NaN and infinities, deep nesting, control bytes, wrong types. Each command
must then either work (exit 0 or 1) or say what is wrong in one line (exit 2).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsprof.cli.main import cli
from dsprof.testing.synthetic import SyntheticRun

NUMBERS = st.sampled_from(
    [
        "1e30",
        "1e999999",
        "-1",
        "9223372036854775807",
        "18446744073709551616",
        "NaN",
        "Infinity",
        "-9223372036854775808",
        "0.5",
        "1" * 400,
        "-0",
        "0x10",
    ]
)
JSON_VALUES = st.one_of(
    st.just(10**400),
    st.just(1e308),
    st.just(-(2**70)),
    st.sampled_from(["\x1b]8;;x\x07", "<script>", "%00", ""]),
    st.just([[[[[[[[]]]]]]]]),
    st.booleans(),
    st.none(),
    st.integers(),
    st.floats(allow_nan=False),
)
DEEP = "[" * 100_000 + "]" * 100_000
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    run = SyntheticRun(ranks=2, steps=4).write(tmp_path_factory.mktemp("pristine") / "run")
    assert CliRunner().invoke(cli, ["analyze", str(run)]).exit_code == 0
    return run


def _copy(pristine: Path, tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(pristine, target)
    return target


def _contained(result) -> None:
    """The command ended on purpose: success, a failed check, or one error line."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 1, 2), result.output
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        last = result.output.rstrip("\n").splitlines()[-1]
        assert last.startswith("dsprof: error: ") and "\x1b" not in last, result.output


@pytest.mark.slow
@SETTINGS
@given(
    field=st.sampled_from(["pid", "tid", "inv", "depth", "ts", "dur", "rank", "step", "os.rq_ns"]), value=NUMBERS, line=st.integers(0, 60)
)
def test_hostile_numbers_in_a_log(pristine, tmp_path, field, value, line):
    run = _copy(pristine, tmp_path, "run")
    log = run / "server.log"
    lines = log.read_text().splitlines()
    index = line % len(lines)
    if f" {field}=" in lines[index]:
        head, _, tail = lines[index].partition(f" {field}=")
        lines[index] = f"{head} {field}={value} {tail.partition(' ')[2]}".rstrip()
    else:
        lines[index] += f" {field}={value}"
    log.write_text("\n".join(lines) + "\n")
    for args in (
        ["analyze", str(run)],
        ["report", str(run)],
        ["export", str(run), "-o", str(tmp_path / "t.json")],
        ["ingest", str(log), "-o", str(tmp_path / "spans.parquet")],
    ):
        _contained(CliRunner().invoke(cli, args))


@pytest.mark.slow
@SETTINGS
@given(key=st.sampled_from(["ts", "dur", "pid", "tid", "args", "ph", "name", "cat"]), value=JSON_VALUES)
def test_hostile_values_in_the_serving_trace(pristine, tmp_path, key, value):
    run = _copy(pristine, tmp_path, "run")
    path = run / "serving-trace" / "trace.json"
    document = json.loads(path.read_text())
    document["traceEvents"][3][key] = value
    path.write_text(json.dumps(document))
    _contained(CliRunner().invoke(cli, ["analyze", str(run)]))


@pytest.mark.slow
@SETTINGS
@given(
    key=st.sampled_from(["tokens_returned", "batch_elapsed_s", "exit_status", "failed_rank", "workload", "devices", "message"]),
    value=JSON_VALUES,
)
def test_hostile_values_in_performance_summary(pristine, tmp_path, key, value):
    run = _copy(pristine, tmp_path, "run")
    path = run / "performance_summary.json"
    content = json.loads(path.read_text())
    content[key] = value
    path.write_text(json.dumps(content))
    result = CliRunner().invoke(cli, ["analyze", str(run)])
    _contained(result)
    if result.exit_code == 0:
        json.loads((run / "summary.json").read_text())  # what was written is strict JSON


@pytest.mark.slow
@SETTINGS
@given(
    path=st.sampled_from(
        [
            ("validation", "valid"),
            ("pipeline", "serialized"),
            ("figures", "runner_start_skew_ms", "p95"),
            ("tail_steps", "items"),
            ("serving", "tokens_returned"),
            ("schema",),
        ]
    ),
    value=JSON_VALUES,
)
def test_hostile_values_in_summary_json(pristine, tmp_path, path, value):
    run = _copy(pristine, tmp_path, "run")
    summary = json.loads((run / "summary.json").read_text())
    node = summary
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    (run / "summary.json").write_text(json.dumps(summary))
    rules = Path(__file__).resolve().parents[1] / "examples" / "ci-rules.toml"
    for args in (
        ["gate", str(run), "--rules", str(rules)],
        ["diff", str(pristine), str(run)],
        ["report", str(run)],
        ["export", str(run), "-o", str(tmp_path / "t.json")],
    ):
        _contained(CliRunner().invoke(cli, args))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, content",
    [
        ("summary.json", DEEP),
        ("summary.json", '{"schema": "dsprof.summary/2", "validation": ' + "[" * 5000 + "]" * 5000 + "}"),
        ("summary.json", '{"schema": "dsprof.summary/2", "exit_status": NaN}'),
        ("performance_summary.json", DEEP),
        ("server.log", "\x00" * 4096),
        ("serving-trace/trace.json", DEEP),
    ],
)
def test_deep_or_binary_files_are_one_line(pristine, tmp_path, name, content):
    run = _copy(pristine, tmp_path, "run")
    (run / name).write_text(content)
    for args in (
        ["analyze", str(run)],
        ["gate", str(run), "--rules", str(Path(__file__).resolve().parents[1] / "examples" / "ci-rules.toml")],
        ["report", str(run)],
    ):
        _contained(CliRunner().invoke(cli, args))


@pytest.mark.parametrize(
    "text", [DEEP, '[[rule]]\ncheck = "exit_status <= nan"\n', '[[rule]]\ncheck = "' + "a." * 5000 + 'b > 1"\n', "\x00\x01\x02"]
)
def test_hostile_rules_files_are_one_line(pristine, tmp_path, text):
    rules = tmp_path / "rules.toml"
    rules.write_text(text)
    result = CliRunner().invoke(cli, ["gate", str(pristine), "--rules", str(rules)])
    _contained(result)
    assert result.exit_code == 2
