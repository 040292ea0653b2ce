"""The dsprof command: entry point, one-line errors, progress, and each command end to end."""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dsprof import __version__
from dsprof.cli.group import ProgressPrinter
from dsprof.cli.main import cli
from dsprof.errors import DsprofError

DSPROF = Path(sys.executable).with_name("dsprof")
REPO = Path(__file__).resolve().parents[1]
COMMANDS = ("analyze", "diff", "export", "gate", "history", "ingest", "merge", "report", "run", "watch")


def _one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1, result.output
    assert result.output.startswith("dsprof: error: ")
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.output


def test_console_script_help_and_version():
    help_run = subprocess.run([str(DSPROF), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert help_run.returncode == 0, help_run.stderr
    listed = {line.split()[0] for line in help_run.stdout.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == set(COMMANDS)
    assert "--debug" in help_run.stdout and "--version" in help_run.stdout
    version_run = subprocess.run([str(DSPROF), "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert version_run.returncode == 0
    assert version_run.stdout.strip() == f"dsprof, version {__version__}"


def test_console_script_error_is_one_line_without_traceback(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\ncheck = "validation.valid = true"\n')
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"schema": "dsprof.summary/1", "validation": {"valid": True}}))
    proc = subprocess.run(
        [str(DSPROF), "gate", str(summary), "--rules", str(rules)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"dsprof: error: {rules}: [[rule]] #1")
    debug = subprocess.run(
        [str(DSPROF), "--debug", "gate", str(summary), "--rules", str(rules)], capture_output=True, text=True, timeout=60, check=False
    )
    assert debug.returncode != 0
    assert "Traceback" in debug.stderr and "InputError" in debug.stderr


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["run", "--inject", "meteor:rank=0"], ["bad --inject spec 'meteor:rank=0'", "unknown fault kind"]),
        (["run", "--ranks", "4", "--requests", "2"], ["invalid runtime config", "requests=2"]),
        (["run", "--inject", "straggler:rank=9,ms=5"], ["rank 9 is outside 0..3"]),
    ],
)
def test_bad_run_options_fail_before_starting_ranks(args, fragments, tmp_path):
    result = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "run")])
    _one_line_error(result, *fragments)
    assert not (tmp_path / "run").exists()


def test_debug_lets_the_exception_through(tmp_path):
    result = CliRunner().invoke(cli, ["--debug", "run", "--inject", "meteor:rank=0"])
    assert isinstance(result.exception, DsprofError)
    assert "dsprof: error" not in result.output


def test_os_errors_are_one_line(tmp_path):
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"schema": "dsprof.summary/1", "validation": {"valid": True}}))
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\ncheck = "validation.valid == true"\n')
    (tmp_path / "a-file").write_text("")
    target = tmp_path / "a-file" / "verdict.json"  # its directory cannot be created
    result = CliRunner().invoke(cli, ["gate", str(summary), "--rules", str(rules), "--verdict", str(target)])
    _one_line_error(result, str(target), "cannot write")


def test_usage_errors_are_one_line_and_exit_2():
    runner = CliRunner()
    _one_line_error(runner.invoke(cli, ["analyze"]), "Missing argument 'PATHS...'", "(see 'cli analyze --help')")
    _one_line_error(runner.invoke(cli, ["analyze", "/definitely/not/here"]), "does not exist")
    _one_line_error(runner.invoke(cli, ["run", "--metadata", "sideways"]), "'--metadata'")
    _one_line_error(runner.invoke(cli, ["run", "--ranks", "0"]), "'--ranks': 0 is not in the range x>=1")
    _one_line_error(runner.invoke(cli, ["export", ".", "--format", "svg"]), "'--format': 'svg'")
    _one_line_error(runner.invoke(cli, ["frobnicate"]), "No such command 'frobnicate'")


def test_progress_plain_lines_and_in_place_on_a_terminal():
    plain = io.StringIO()
    printer = ProgressPrinter(plain)
    printer("ranks up 4/4")
    printer("step 3/10")
    printer.done()
    assert plain.getvalue() == "ranks up 4/4\nstep 3/10\n"

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    printer = ProgressPrinter(terminal)
    printer("step 1/10")
    printer("step 2/10")
    printer.done()
    assert terminal.getvalue() == "\r\x1b[Kstep 1/10\r\x1b[Kstep 2/10\n"


def test_merge_counts_events_and_torn_lines(tmp_path):
    fragments = tmp_path / "serving-trace" / "fragments"
    fragments.mkdir(parents=True)
    event = {"name": "serving.step", "cat": "serving", "ph": "X", "ts": 10, "dur": 5, "pid": 11, "tid": 1, "args": {}}
    (fragments / "trace.11.jsonl").write_text(json.dumps(event) + "\n" + json.dumps({**event, "ts": 20}) + "\n")
    (fragments / "trace.12.jsonl").write_text(json.dumps({**event, "pid": 12}) + '\n{"name": "torn')
    result = CliRunner().invoke(cli, ["merge", str(tmp_path / "serving-trace")])
    assert result.exit_code == 0, result.output
    merged = tmp_path / "serving-trace" / "trace.json"
    assert f"merged 3 events from 2 fragment(s) into {merged} (1 malformed line(s) skipped)" in result.output
    assert len(json.loads(merged.read_text())["traceEvents"]) == 3


def test_merge_of_a_json_output_path_that_was_never_merged(tmp_path):
    fragments = tmp_path / "trace.json.fragments"
    fragments.mkdir()
    event = {"name": "serving.step", "cat": "serving", "ph": "X", "ts": 10, "dur": 5, "pid": 11, "tid": 1, "args": {}}
    (fragments / "trace.11.jsonl").write_text(json.dumps(event) + "\n")
    result = CliRunner().invoke(cli, ["merge", str(tmp_path / "trace.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"] == [event]


def test_merge_without_fragments_leaves_an_existing_file_alone(tmp_path):
    existing = tmp_path / "mine.json"
    existing.write_text('{"traceEvents": [{"name": "keep"}]}')
    result = CliRunner().invoke(cli, ["merge", str(existing)])
    _one_line_error(result, f"{tmp_path / 'mine.json.fragments'}: no SA_PROFILE fragments to merge")
    assert existing.read_text() == '{"traceEvents": [{"name": "keep"}]}'


@pytest.mark.parametrize(
    "content, fragments",
    [
        (b"", ["no spans to analyse"]),
        (b"\xc8\x00\xff" * 100, ["binary data"]),
        (b'{"traceEvents": []}', ["no spans to analyse"]),
    ],
)
def test_analyze_of_a_file_without_spans_is_one_line(tmp_path, content, fragments):
    path = tmp_path / ("input.json" if content.startswith(b"{") else "input.log")
    path.write_bytes(content)
    result = CliRunner().invoke(cli, ["analyze", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    # progress lines ("reading ...") come first; the error is the one last line
    error = result.output.splitlines()[-1]
    assert error.startswith(f"dsprof: error: {path}") and all(f in error for f in fragments), result.output
    assert not (tmp_path / "out").exists()


def test_gate_of_a_binary_summary_or_rules_file_is_one_line(tmp_path):
    summary = tmp_path / "summary.json"
    summary.write_bytes(b"\xc8\x00\xff" * 10)
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\ncheck = "validation.valid == true"\n')
    _one_line_error(CliRunner().invoke(cli, ["gate", str(summary), "--rules", str(rules)]), f"{summary}: binary data")
    summary.write_text(json.dumps({"schema": "dsprof.summary/1", "validation": {"valid": True}}))
    rules.write_bytes(b"\xc8\x00\xff" * 10)
    _one_line_error(CliRunner().invoke(cli, ["gate", str(summary), "--rules", str(rules)]), f"{rules}: binary data")


def test_ingest_writes_span_table_and_reports_drops(tmp_path):
    from dsprof.testing.synthetic import SyntheticRun

    # 2 ranks x 3 decode steps x 9 spans (root, bind, bind.args, bind.prebuilt, runner_run,
    # native_fence_wait, device_wall, claim_release, validate) + 5 prefill spans per rank (root,
    # bind, runner_run, claim_release, validate) = 64,
    # and the torn last record is dropped by reason.
    SyntheticRun(ranks=2, steps=3, torn_tail=True, sa_profile=False, performance_summary=False).write(tmp_path)
    output = tmp_path / "spans.parquet"
    result = CliRunner().invoke(cli, ["ingest", str(tmp_path / "server.log"), "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert "spans kept: 64 (strace 64)" in result.output
    assert "torn_record: 1" in result.output
    import pyarrow.parquet as pq

    assert pq.read_table(output).num_rows == 64


def _synthetic(tmp_path: Path, name: str, **kwargs) -> Path:
    from dsprof.testing.synthetic import SyntheticRun

    return SyntheticRun(**kwargs).write(tmp_path / name)


@pytest.mark.slow
def test_analyze_report_export_on_a_run_with_one_late_start(tmp_path):
    import numpy as np

    # Rank 2's bind of step 5 starts 8 ms late: one late start of +8.000 ms, start-skew max 8.000.
    offset = np.zeros((4, 12), dtype=np.int64)
    offset[2, 5] = 8_000_000
    run_dir = _synthetic(tmp_path, "late", ranks=4, steps=12, bind_start_offset_ns=offset)
    runner = CliRunner()
    result = runner.invoke(cli, ["analyze", str(run_dir), "--expect-ranks", "4"])
    assert result.exit_code == 0, result.output
    assert "swimlane   valid" in result.output and "1 late starts, 1 tail steps" in result.output
    assert f"summary.json: {run_dir / 'summary.json'}" in result.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["validation"]["valid"] is True
    assert summary["figures"]["runner_start_skew_ms"]["max"] == 8.0
    assert [(i["step"], i["rank"], i["excess_ms"]) for i in summary["late_starts"]["items"]] == [(5, 2, 8.0)]
    assert "step 5 · rank 2 (npu:2) · +8.0 ms · unattributed" in result.output

    elsewhere = tmp_path / "analysis"
    log_only = runner.invoke(cli, ["analyze", str(run_dir / "server.log"), "-o", str(elsewhere)])
    assert log_only.exit_code == 0, log_only.output
    assert (elsewhere / "summary.json").exists()

    report = runner.invoke(cli, ["report", str(run_dir)])
    assert report.exit_code == 0, report.output
    assert report.output.strip().endswith(f"report: {run_dir / 'report.html'}")
    assert (run_dir / "report.html").read_text().lstrip().lower().startswith("<!doctype html")

    exported = runner.invoke(cli, ["export", str(run_dir), "-o", str(tmp_path / "trace.json")])
    assert exported.exit_code == 0, exported.output
    events = json.loads((tmp_path / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert sum(e.get("name") == "chip.run" and e.get("ph") == "X" for e in events) >= 48


@pytest.mark.slow
def test_ci_rules_pass_a_pipelined_trace_and_fail_a_serialized_one(tmp_path):
    runner = CliRunner()
    rules = str(Path(__file__).resolve().parents[1] / "examples" / "ci-rules.toml")
    verdicts = {}
    for name, pipelined in (("pipelined", True), ("serialized", False)):
        run_dir = _synthetic(tmp_path, name, ranks=4, steps=10, pipelined=pipelined)
        assert runner.invoke(cli, ["analyze", str(run_dir)]).exit_code == 0
        verdict_path = tmp_path / f"{name}.json"
        result = runner.invoke(cli, ["gate", str(run_dir), "--rules", rules, "--verdict", str(verdict_path)])
        assert result.exit_code == (0 if pipelined else 1), result.output
        verdicts[name] = json.loads(verdict_path.read_text())
    failed = {r["path"] for r in verdicts["serialized"]["results"] if r["status"] == "fail"}
    assert failed == {"pipeline.serialized", "pipeline.overlap_share", "pipeline.violations", "pipeline.cadence_p50_ms", "verdict.status"}


def test_report_export_gate_and_diff_agree_with_summary_json_on_an_empty_rank(tmp_path):
    """A 4-rank run whose rank 3 wrote nothing, analysed with --expect-ranks 4: every later command says invalid."""
    run_dir = _synthetic(tmp_path, "empty-rank", ranks=3, steps=6)
    runner = CliRunner()
    assert runner.invoke(cli, ["analyze", str(run_dir), "--expect-ranks", "4"]).exit_code == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["validation"]["valid"] is False and "no decode steps on rank 3" in summary["validation"]["problems"]
    (run_dir / "report.html").unlink()
    assert runner.invoke(cli, ["report", str(run_dir)]).exit_code == 0
    page = (run_dir / "report.html").read_text()
    assert "NOT valid" in page and "no decode steps on rank 3" in page
    exported = runner.invoke(cli, ["export", str(run_dir), "-o", str(tmp_path / "t.json")])
    assert exported.exit_code == 0, exported.output
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["valid"] is False
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nname = "valid swimlane"\ncheck = "validation.valid == true"\n')
    assert runner.invoke(cli, ["gate", str(run_dir), "--rules", str(rules)]).exit_code == 1


def test_report_of_a_directory_never_analysed_says_to_analyse_first(tmp_path):
    run_dir = _synthetic(tmp_path, "raw", ranks=2, steps=3)
    _one_line_error(CliRunner().invoke(cli, ["report", str(run_dir)]), "summary.json", "not found", "dsprof analyze")


@pytest.mark.parametrize("value", ["nan", "inf", "1e400", "-1"])
def test_a_threshold_that_is_not_a_finite_number_is_one_line(tmp_path, value):
    run_dir = _synthetic(tmp_path, "t", ranks=2, steps=3)
    result = CliRunner().invoke(cli, ["analyze", str(run_dir), "--threshold-ms", value, "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert not (tmp_path / "out").exists()


def _dsprof_imports(path: Path) -> list[tuple[int, str]]:
    """Every ``dsprof`` module a source file imports, at any level (top, inside functions), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: a relative import"
            found.append((node.lineno, node.module or ""))
    return [(line, name) for line, name in found if name == "dsprof" or name.startswith("dsprof.")]


def test_the_cli_imports_only_the_commands_and_the_errors():
    imports = [(f"cli/{path.name}:{line}", name) for path in sorted((REPO / "cli").glob("*.py")) for line, name in _dsprof_imports(path)]
    allowed = ("dsprof.commands", "dsprof.errors", "dsprof.cli.group")
    names = {name for _, name in imports}
    assert {"dsprof.commands.run", "dsprof.commands.gate", "dsprof.errors"} <= names  # the walk sees lazy imports too
    assert [f"{where}: {name}" for where, name in imports if not (name in allowed or name.startswith("dsprof.commands."))] == []


def test_the_cli_starts_without_torch():
    code = "import sys, dsprof.cli.main; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120, check=False).returncode == 0
