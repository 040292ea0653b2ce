"""Hostile corpus, round 3 (issue 28): option values bounded where they are parsed, text escaped per target.

Every case runs the real CLI and must end in a result or in one ``dsprof: error:`` line with exit 2, never a
traceback; cases that could block (FIFOs) run in a child process under a timeout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_hostile_round2 import one_error_line, run_cli

from dsprof.analysis.policy.gate_rules import load_rules
from dsprof.analysis.window import MAX_STEP, parse_steps
from dsprof.cli.main import cli
from dsprof.commands.analysis_job import analyze_paths
from dsprof.profiler import artifacts
from dsprof.testing.synthetic import SyntheticRun


@pytest.fixture(scope="module")
def analysed(tmp_path_factory) -> Path:
    """A small run analysed into its own directory (its summary's inputs lie inside it)."""
    run = SyntheticRun(ranks=2, steps=4).write(tmp_path_factory.mktemp("run") / "run")
    result = CliRunner().invoke(cli, ["analyze", str(run)])
    assert result.exit_code == 0, result.output
    return run


def _summary(analysed: Path) -> dict:
    return json.loads((analysed / artifacts.SUMMARY_JSON).read_text())


# -- 7. --expect-ranks -------------------------------------------------------------------------------------


def test_expect_ranks_beyond_the_bound_is_one_line(analysed, tmp_path):
    result = CliRunner().invoke(cli, ["analyze", str(analysed), "-o", str(tmp_path / "o"), "--expect-ranks", "30000000"])
    one_error_line(result, "--expect-ranks", "1048576")
    assert not (tmp_path / "o").exists()


def test_missing_ranks_are_counted_without_a_set_of_every_rank(analysed, tmp_path):
    result = analyze_paths([analysed], tmp_path / "o", expect_ranks=10**12)  # the library takes any number
    detail = next(c["detail"] for c in result.summary["validation"]["checks"] if c["name"] == "ranks_present")
    assert detail == "no decode steps on rank " + ", ".join(map(str, range(2, 22))) + f" and {10**12 - 22} more"


# -- 12. windows beyond int64 --------------------------------------------------------------------------------

WINDOWS = [
    (["--steps", "0:" + "1" + "0" * 23], "steps are numbered at most 9223372036854775807"),
    (["--steps", "0:" + "9" * 5000], "steps are numbered at most"),
    (["--since", "+100000000000h"], "an offset is at most 2,562,047h"),
    (["--since", "1600-01-01T00:00:00Z"], "expected a time from 1677-09-21T00:12:44Z to 2262-04-11T23:47:16Z"),
    (["--until", "2300-01-01T00:00:00Z"], "expected a time from 1677-09-21T00:12:44Z to 2262-04-11T23:47:16Z"),
]


@pytest.mark.parametrize("command", ["analyze", "report", "export"])
@pytest.mark.parametrize(("option", "said"), WINDOWS, ids=[w[0][0] + str(i) for i, w in enumerate(WINDOWS)])
def test_windows_beyond_int64_are_one_line(analysed, tmp_path, command, option, said):
    output = tmp_path / ("o" if command == "analyze" else "out.json")
    result = CliRunner().invoke(cli, [command, str(analysed), "-o", str(output), *option])
    one_error_line(result, said)
    assert not output.exists()


def test_the_largest_offset_is_placed_without_overflow(analysed, tmp_path):
    result = CliRunner().invoke(cli, ["export", str(analysed), "-o", str(tmp_path / "t.json"), "--since", "+2562047h"])
    one_error_line(result, "no run of the trace lies in the window since +2562047h")


# -- 13. gate --suggest arithmetic ---------------------------------------------------------------------------


def test_a_margin_beyond_the_bound_is_one_line(analysed):
    one_error_line(CliRunner().invoke(cli, ["gate", "--suggest", "--margin", "1e308", str(analysed)]), "--margin", "1000")


@pytest.mark.parametrize(
    ("path", "value", "left_out"),
    [
        ("what_if.share_of_decode_wall", 1e308, "what_if.share_of_decode_wall"),
        ("tail_cost.share_of_decode_wall", 10**300, "tail_cost.share_of_decode_wall"),
        ("slow_steps.count", 10**300, "slow_steps"),
    ],
    ids=["share 1e308", "share 10**300", "count 10**300"],
)
def test_huge_summary_values_are_left_out_with_a_note(analysed, tmp_path, path, value, left_out):
    summary = _summary(analysed)
    *parents, last = path.split(".")
    node = summary
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    (tmp_path / artifacts.SUMMARY_JSON).write_text(json.dumps(summary))
    result = CliRunner().invoke(cli, ["gate", "--suggest", "--margin", "1000", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rules = tomllib.loads(result.stdout)["rule"]
    assert not any(left_out in rule["check"] for rule in rules)
    if left_out != "slow_steps":
        assert f"# not suggested: {left_out} is not a number (below 2^63) in every run" in result.stdout


# -- 15. text written into TOML and onto the terminal -------------------------------------------------------


def test_a_run_directory_name_cannot_inject_a_rule_or_reach_the_terminal(analysed, tmp_path):
    hostile = tmp_path / 'h\n[[rule]]\nname = "injected"\ncheck = "exit_status == 1"\n# \x1b]52;c;cHduZWQ=\x07 "\\'
    hostile.mkdir()
    shutil.copy(analysed / artifacts.SUMMARY_JSON, hostile / artifacts.SUMMARY_JSON)
    result = CliRunner().invoke(cli, ["gate", "--suggest", str(hostile)])
    assert result.exit_code == 0, result.output
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", result.stdout)  # no ESC, BEL or CR: only line ends
    document = tomllib.loads(result.stdout)
    assert "injected" not in [rule["name"] for rule in document["rule"]]
    [quoted] = [line[len("#   ") :] for line in result.stdout.splitlines() if line.startswith('#   "')]
    assert tomllib.loads(f"source = {quoted}")["source"] == str(hostile / artifacts.SUMMARY_JSON)
    rules = tmp_path / "rules.toml"
    rules.write_text(result.stdout)
    assert "injected" not in [rule.name for rule in load_rules(rules)]


# -- 16. a summary's inputs are a record ---------------------------------------------------------------------


def _with_inputs(analysed: Path, target: Path, files: list[str]) -> Path:
    """A copy of the analysed directory's outputs whose summary names ``files`` as its inputs."""
    target.mkdir()
    summary = _summary(analysed)
    summary["inputs"]["files"] = files
    (target / artifacts.SUMMARY_JSON).write_text(json.dumps(summary))
    return target


@pytest.mark.slow
@pytest.mark.parametrize("named", ["fifo outside", "readable file outside", "link out of the directory"])
def test_inputs_a_summary_names_outside_its_directory_are_not_read(analysed, tmp_path, named):
    outside = tmp_path / "outside.log"
    if named == "fifo outside":
        os.mkfifo(outside)
    else:
        shutil.copy(analysed / artifacts.SERVER_LOG, outside)
    target = tmp_path / "out"
    if named == "link out of the directory":  # named inside, resolves outside
        _with_inputs(analysed, target, [str(target / "inputs.dat")])
        (target / "inputs.dat").symlink_to(outside)
    else:
        _with_inputs(analysed, target, [str(outside)])
    done = run_cli("report", str(target), "-o", str(tmp_path / "r.html"), timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("dsprof: error:")]
    assert f"names inputs outside {target}" in line and "--inputs" in line, line


@pytest.mark.parametrize("how", ["named by the summary", "given with --inputs"])
def test_a_fifo_input_is_refused_without_blocking(analysed, tmp_path, how):
    target = tmp_path / "out"
    fifo = target / "server.log"
    _with_inputs(analysed, target, [str(fifo)] if how == "named by the summary" else [])
    os.mkfifo(fifo)
    extra = ["--inputs", str(fifo)] if how == "given with --inputs" else []
    done = run_cli("export", str(target), "-o", str(tmp_path / "t.json"), *extra, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert (
        done.stderr.splitlines()[-1]
        == f"dsprof: error: {fifo}: is a FIFO, not a regular file (expected a trace file or a directory of them)"
    )


# -- 17. smaller ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["plain file", "/dev/null"])
def test_ingest_onto_a_file_says_a_directory_was_expected(analysed, tmp_path, where):
    output = tmp_path / "plain" if where == "plain file" else Path(os.devnull)
    if where == "plain file":
        output.write_text("mine")
    result = CliRunner().invoke(cli, ["ingest", str(analysed), "-o", str(output)])
    kind = "a regular file" if where == "plain file" else "a character device"
    one_error_line(result, f"{output}: is {kind}, not a directory (expected a new directory or a span dataset's)")
    assert where != "plain file" or output.read_text() == "mine"


def test_ingest_refuses_an_empty_output(analysed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_error_line(CliRunner().invoke(cli, ["ingest", str(analysed), "-o", ""]), "'-o'", "an empty path")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--since", "2026-12-01T10:00:00+25:00"], "zone +25:00 is out of range (expected -23:59 to +23:59)"),
        (["--steps", "٣:٥"], "in ASCII digits"),
        (["--steps", "1_0:2_0"], "in ASCII digits"),
    ],
)
def test_window_text_is_ascii_and_messages_are_readable(analysed, tmp_path, option, said):
    line = one_error_line(CliRunner().invoke(cli, ["analyze", str(analysed), "-o", str(tmp_path / "o"), *option]), said)
    assert "timedelta" not in line


def test_an_open_window_keeps_the_largest_step(analysed, tmp_path):
    assert parse_steps("0:") == (0, MAX_STEP) and parse_steps(f"{MAX_STEP}:") == (MAX_STEP, MAX_STEP)
    log = (analysed / artifacts.SERVER_LOG).read_text()
    top = max(int(s) for s in re.findall(r" step=(\d+)", log))
    run = tmp_path / "run"
    run.mkdir()
    (run / artifacts.SERVER_LOG).write_text(re.sub(r" step=(\d+)", lambda m: f" step={MAX_STEP - top + int(m[1])}", log))
    whole = analyze_paths([run], tmp_path / "whole").summary["validation"]["decode_steps"]
    result = CliRunner().invoke(cli, ["analyze", str(run), "-o", str(tmp_path / "open"), "--steps", "0:"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "open" / artifacts.SUMMARY_JSON).read_text())["validation"]["decode_steps"] == whole == 4
