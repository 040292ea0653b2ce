"""Analyse once, then render: ``report`` and ``export`` on a directory that holds only the outputs of ``analyze -o``.

The spans are read from the inputs summary.json names, or from the span dataset kept with ``--spans``; inputs that
moved give one line naming ``--inputs``.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from dsprof.cli.main import cli
from dsprof.commands.analyze import analyze_paths
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


def test_report_and_export_read_the_inputs_the_summary_names(analysed_elsewhere):
    notes: list[str] = []
    assert report_from_dir("out", note=notes.append).name == artifacts.REPORT_HTML
    trace = export_from_dir("out", "out/t.json", note=notes.append)
    assert _drawn_events(trace) == _drawn_events(analysed_elsewhere / "out" / artifacts.COMBINED_SWIMLANE)
    assert notes == [f"reading the spans from run/{artifacts.SERVER_LOG}, run/serving-trace/trace.json, run/performance_summary.json"] * 2


def test_moved_inputs_give_one_line_naming_the_option(analysed_elsewhere):
    shutil.move("run", "moved")
    with pytest.raises(
        InputError, match=r"summary.json: the inputs it was analysed from have moved \(run/server.log is gone\); .*--inputs"
    ):
        report_from_dir("out", note=lambda _: None)
    notes: list[str] = []
    export_from_dir("out", "out/t.json", inputs=["moved"], note=notes.append)
    assert notes == ["reading the spans from moved"]


def test_the_kept_span_dataset_is_recorded_and_read(analysed_elsewhere):
    analyze_paths(["run"], "out2", spans_dir="kept")
    assert json.loads((analysed_elsewhere / "out2" / artifacts.SUMMARY_JSON).read_text())["inputs"]["span_dataset"] == "kept"
    shutil.rmtree("run")  # the dataset alone is enough
    notes: list[str] = []
    export_from_dir("out2", "out2/t.json", note=notes.append)
    assert notes == ["reading the spans from kept"]
    assert _drawn_events(analysed_elsewhere / "out2" / "t.json") == _drawn_events(analysed_elsewhere / "out2" / artifacts.COMBINED_SWIMLANE)


def test_cli_report_says_where_it_read_and_errors_in_one_line(analysed_elsewhere):
    result = CliRunner().invoke(cli, ["report", "out"])
    assert result.exit_code == 0, result.output
    assert "reading the spans from run/server.log" in result.stderr
    shutil.move("run", "moved")
    result = CliRunner().invoke(cli, ["export", "out"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1].startswith("dsprof: error: out/summary.json: the inputs it was analysed from have moved")
    result = CliRunner().invoke(cli, ["export", "out", "--inputs", "moved", "-o", "out/t.json"])
    assert result.exit_code == 0, result.output


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
