"""Analyse once, then render: ``report`` and ``export`` on a directory that holds only the outputs of ``analyze -o``.

The spans are read from the inputs summary.json names inside the directory, from the span dataset kept there with
``--spans``, or from ``--inputs``; inputs named outside, or moved, give one line naming ``--inputs``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from dsprof.cli.main import cli
from dsprof.commands.analysis_job import analyze_paths
from dsprof.commands.report import export_from_dir, report_from_dir
from dsprof.errors import InputError
from dsprof.profiler import artifacts
from dsprof.testing.synthetic import SyntheticRun


@pytest.fixture
def analysed_elsewhere(tmp_path, monkeypatch):
    """A synthetic run analysed into a separate output directory (relative paths, as a user types them)."""
    monkeypatch.chdir(tmp_path)
    SyntheticRun(ranks=2, steps=12).write("run")
    analyze_paths(["run"], "out")
    return tmp_path


def _drawn_events(path) -> int:
    return len([e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"])


@pytest.mark.slow
def test_report_and_export_read_the_inputs_the_summary_names_inside_the_directory(analysed_elsewhere):
    analyze_paths(["run"], "run")  # the inputs lie inside the analysed directory
    notes: list[str] = []
    assert report_from_dir("run", note=notes.append).name == artifacts.REPORT_HTML
    trace = export_from_dir("run", "run/t.json", note=notes.append)
    assert _drawn_events(trace) == _drawn_events(analysed_elsewhere / "run" / artifacts.COMBINED_SWIMLANE)
    assert notes == [f"reading the spans from run/{artifacts.SERVER_LOG}, run/serving-trace/trace.json, run/performance_summary.json"] * 2


def test_inputs_named_outside_the_directory_are_read_only_when_given(analysed_elsewhere):
    with pytest.raises(InputError, match=r"out/summary.json: names inputs outside out \(run/server.log and 2 more\), .*--inputs"):
        report_from_dir("out", note=lambda _: None)
    notes: list[str] = []
    trace = export_from_dir("out", "out/t.json", inputs=["run"], note=notes.append)
    assert _drawn_events(trace) == _drawn_events(analysed_elsewhere / "out" / artifacts.COMBINED_SWIMLANE)
    assert notes == ["reading the spans from run"]


@pytest.mark.slow
def test_moved_inputs_give_one_line_naming_the_option(analysed_elsewhere):
    shutil.copytree("run", "out", dirs_exist_ok=True)
    analyze_paths(["out"], "out")  # inputs inside the directory, then moved away
    Path("moved").mkdir()
    for name in (artifacts.SERVER_LOG, "serving-trace"):
        shutil.move(f"out/{name}", "moved")
    with pytest.raises(
        InputError, match=r"summary.json: the inputs it was analysed from have moved \(out/server.log is gone\); .*--inputs"
    ):
        report_from_dir("out", note=lambda _: None)
    notes: list[str] = []
    export_from_dir("out", "out/t.json", inputs=["moved"], note=notes.append)
    assert notes == ["reading the spans from moved"]


@pytest.mark.slow
def test_the_kept_span_dataset_is_recorded_and_read(analysed_elsewhere):
    analyze_paths(["run"], "out2", spans_dir="out2/kept")
    assert json.loads((analysed_elsewhere / "out2" / artifacts.SUMMARY_JSON).read_text())["inputs"]["span_dataset"] == "out2/kept"
    shutil.rmtree("run")  # the dataset alone is enough
    notes: list[str] = []
    export_from_dir("out2", "out2/t.json", note=notes.append)
    assert notes == ["reading the spans from out2/kept"]
    assert _drawn_events(analysed_elsewhere / "out2" / "t.json") == _drawn_events(analysed_elsewhere / "out2" / artifacts.COMBINED_SWIMLANE)


@pytest.mark.slow
def test_cli_report_says_where_it_read_and_errors_in_one_line(analysed_elsewhere):
    result = CliRunner().invoke(cli, ["report", "out", "--inputs", "run"])
    assert result.exit_code == 0, result.output
    assert "reading the spans from run" in result.stderr
    shutil.move("run", "moved")
    result = CliRunner().invoke(cli, ["export", "out"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1].startswith("dsprof: error: out/summary.json: names inputs outside out (run/server.log")
    result = CliRunner().invoke(cli, ["export", "out", "--inputs", "moved", "-o", "out/t.json"])
    assert result.exit_code == 0, result.output


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fmt", "name", "message"),
    [
        ("perfetto", "x.json", "out/x.json: --format perfetto writes a protobuf trace, not JSON"),
        ("perfetto", "x.json.gz", "out/x.json.gz: --format perfetto writes a protobuf trace, not JSON"),
        ("perfetto-json", "x.pftrace", "out/x.pftrace: --format perfetto-json writes JSON, not a protobuf trace"),
    ],
)
def test_export_refuses_a_format_the_name_contradicts(analysed_elsewhere, fmt, name, message):
    result = CliRunner().invoke(cli, ["export", "out", "--format", fmt, "-o", f"out/{name}"])
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()  # refused before anything is read: no progress either
    assert line.startswith(f"dsprof: error: {message} (name it ")
    assert not (analysed_elsewhere / "out" / name).exists()
