"""The run history: the store (idempotent adds, bad stores, parallel adds), change points on series with known answers,
``history check``'s exit status and JSON, the gate's ``change = "worse"`` rules, and the trend page."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest
from click.testing import CliRunner
from test_gate import HEALTHY
from test_report_html import browse_page

from dsprof.analysis.outputs.trend_page import render_trend_page
from dsprof.analysis.policy.change_points import change_points
from dsprof.analysis.policy.gate_rules import ChangeRule, load_rules
from dsprof.analysis.policy.history import HistoryStore, check_history, headline_figures, load_history
from dsprof.cli.main import cli

REPO = Path(__file__).resolve().parents[1]
NOT_ON_GITHUB = {"GITHUB_ACTIONS": None, "GITHUB_STEP_SUMMARY": None}
# Run-to-run noise of 3%, the same for every test (a fixed generator: no test depends on luck).
NOISE = np.random.default_rng(29).standard_normal(64) * 0.03


def _run(step_interval_p50: float, throughput: float = 400.0, **figures: float) -> dict:
    """HEALTHY with the step interval and throughput given (and a few more figures, by name)."""
    summary = copy.deepcopy(HEALTHY)
    summary["figures"]["step_interval_ms"] = {"p50": step_interval_p50, "p95": 14.0, "p99": 15.0, "max": 16.0, "count": 9}
    summary["serving"]["throughput_tok_s"] = throughput
    for name, value in figures.items():
        summary["what_if"]["by_rank"][name] = value
    return summary


def _history(tmp_path: Path, levels: list[float], name: str = "history.duckdb") -> Path:
    """A store of runs whose step interval p50 is each level with 3% noise; run i labelled r<i>, commit c<i>."""
    store = tmp_path / name
    with HistoryStore.open_for_write(store) as history:
        for i, level in enumerate(levels):
            noisy = round(level * (1 + NOISE[i]), 3)
            history.add(_run(noisy, 400.0 * (1 - NOISE[i])), source=f"/runs/{i}/summary.json", label=f"r{i}", commit=f"c{i}")
    return store


def test_a_step_is_found_at_its_first_run_and_noise_is_not():
    level = 12.0 * (1 + NOISE[:30])
    assert change_points(level) == []
    stepped = np.r_[level[:20], level[20:] * 1.15]
    (found,) = change_points(stepped)
    assert found.index == 20 and found.after > found.before and found.pvalue < 0.001
    assert found.relative == pytest.approx(stepped[20:].mean() / stepped[:20].mean() - 1)


def test_one_run_far_off_in_the_middle_is_an_outlier_and_at_the_end_a_change():
    level = 12.0 * (1 + NOISE[:20])
    spiked = level.copy()
    spiked[10] *= 2
    assert change_points(spiked) == []
    newest = np.r_[level, level[-1] * 2]
    assert [c.index for c in change_points(newest)] == [20]


def test_headline_figures_are_the_percentiles_and_the_named_figures():
    summary = _run(12.0)
    summary["what_if"]["by_rank"] = {"0": 1.5, "3": 4.0}
    summary["verdict"] = {"status": "pass", "headline": "healthy", "noise_floor_ms": 0.5}
    figures = headline_figures(summary)
    assert figures["step_interval_ms.p50"] == 12.0 and figures["runner_end_skew_ms.p50"] == 0.2
    # over 10 steps a p95 or p99 is the one or two worst steps: not kept; over 400 four steps lie above a p99
    assert "runner_end_skew_ms.p95" not in figures and "runner_end_skew_ms.p99" not in figures
    summary["figures"]["runner_end_skew_ms"]["count"] = 400
    assert headline_figures(summary)["runner_end_skew_ms.p99"] == 1.0
    assert "step_interval_ms.max" not in figures and "step_interval_ms.count" not in figures
    assert figures["serving.throughput_tok_s"] == 400.0 and figures["serving.effective_tpot_ms"] == 80.0
    assert figures["what_if.by_rank.3"] == 4.0 and figures["what_if.share_of_decode_wall"] == 0.0
    assert figures["late_starts.count"] == 0 and figures["tail_steps.count"] == 0
    assert figures["verdict.status"] == "pass"
    assert "validation.decode_steps" not in figures and "serving.requests" not in figures


def test_adding_the_same_summary_twice_changes_nothing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(_run(12.0)))
    (run / "report.html").write_text("<html></html>")
    store = tmp_path / "h.duckdb"
    runner = CliRunner()
    first = runner.invoke(cli, ["history", "add", str(store), str(run), "--label", "nightly", "--commit", "abc"])
    again = runner.invoke(cli, ["history", "add", str(store), str(run / "summary.json"), "--label", "other"])
    assert (first.exit_code, again.exit_code) == (0, 0)
    assert "added: run 0" in first.output and "already stored: run 0" in again.output
    history = load_history(store)
    assert [(r["label"], r["commit"]) for r in history.runs] == [("nightly", "abc")]
    assert history.runs[0]["report"] == str((run / "report.html").resolve())


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    return lines[0]


def test_a_store_that_is_not_a_dsprof_history_is_one_line_and_exit_2(tmp_path):
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"not a database at all\n" * 100)
    other = tmp_path / "other.duckdb"
    with duckdb.connect(str(other)) as connection:
        connection.execute("CREATE TABLE t (x INTEGER)")
    newer = _history(tmp_path, [12.0, 12.0, 12.0], "newer.duckdb")
    with duckdb.connect(str(newer)) as connection:
        connection.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    runner = CliRunner()
    assert "not a readable DuckDB database" in _one_line_error(runner.invoke(cli, ["history", "check", str(junk)]))
    assert "not a dsprof history store" in _one_line_error(runner.invoke(cli, ["history", "check", str(other)]))
    assert "schema version 99" in _one_line_error(runner.invoke(cli, ["history", "check", str(newer)]))
    assert "no history store" in _one_line_error(runner.invoke(cli, ["history", "check", str(tmp_path / "absent.duckdb")]))
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps(_run(12.0)))
    assert "not a dsprof history store" in _one_line_error(runner.invoke(cli, ["history", "add", str(other), str(summary)]))
    assert other.stat().st_size > 0 and "t" in {r[0] for r in duckdb.connect(str(other)).execute("SHOW TABLES").fetchall()}


def test_check_exits_0_on_noise_and_1_when_the_newest_run_regressed(tmp_path):
    store = _history(tmp_path, [12.0] * 10)
    runner = CliRunner()
    clean = runner.invoke(cli, ["history", "check", str(store), "--json", str(tmp_path / "clean.json")])
    assert clean.exit_code == 0, clean.output
    assert json.loads((tmp_path / "clean.json").read_text())["change_points"] == []
    with HistoryStore.open_for_write(store) as history:
        history.add(_run(18.0), source="/runs/10/summary.json", label="r10", commit="c10")
    found = runner.invoke(cli, ["history", "check", str(store), "--json", str(tmp_path / "cp.json")])
    assert found.exit_code == 1, found.output
    (point,) = json.loads((tmp_path / "cp.json").read_text())["change_points"]
    assert {k: point[k] for k in ("figure", "index", "label", "commit", "direction")} == {
        "figure": "step_interval_ms.p50",
        "index": 10,
        "label": "r10",
        "commit": "c10",
        "direction": "worse",
    }
    assert point["magnitude"] == pytest.approx(0.5, abs=0.05) and point["pvalue"] < 0.001
    again = runner.invoke(cli, ["history", "check", str(store), "--json", str(tmp_path / "again.json")])
    assert again.output == found.output and (tmp_path / "again.json").read_bytes() == (tmp_path / "cp.json").read_bytes()
    assert "REGRESSION step_interval_ms.p50 worse by +" in found.output and "commit c10" in found.output
    # the same change, no longer among the newest 5 runs, is listed but does not fail the check
    with HistoryStore.open_for_write(store) as history:
        for i in range(11, 16):
            history.add(_run(round(18.0 * (1 + NOISE[i]), 3)), source=f"/runs/{i}", label=f"r{i}", commit=f"c{i}")
    later = runner.invoke(cli, ["history", "check", str(store), "--newest", "5"])
    assert later.exit_code == 0 and "change     step_interval_ms.p50 worse" in later.output


def test_an_improvement_is_better_not_a_regression_and_figure_selects(tmp_path):
    store = _history(tmp_path, [12.0] * 10 + [8.0] * 2)
    check = check_history(store)
    assert [(c.figure, c.index, c.direction) for c in check.change_points] == [("step_interval_ms.p50", 10, "better")]
    assert check.regressions == []
    assert check_history(store, figures=["serving.*"]).change_points == []
    result = CliRunner().invoke(cli, ["history", "check", str(store), "--figure", "no_such.figure"])
    assert "no stored figure matches 'no_such.figure'" in _one_line_error(result)


ADDER = """
import copy, json, sys
sys.path.insert(0, sys.argv[3])
from test_gate import HEALTHY
from test_report_html import browse_page
from dsprof.analysis.policy.history import HistoryStore
for i in range(50):
    summary = copy.deepcopy(HEALTHY)
    summary["serving"]["throughput_tok_s"] = 1000 * int(sys.argv[2]) + i
    with HistoryStore.open_for_write(sys.argv[1]) as history:
        history.add(summary, source=f"worker{sys.argv[2]}/{i}", label=f"w{sys.argv[2]}-{i}")
"""


@pytest.mark.slow
def test_two_processes_adding_50_runs_each_store_100(tmp_path):
    store = tmp_path / "shared.duckdb"
    workers = [
        subprocess.Popen([sys.executable, "-c", ADDER, str(store), str(w), str(REPO / "tests")], stderr=subprocess.PIPE, text=True)
        for w in (1, 2)
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err[-2000:]
    history = load_history(store)
    assert len(history.runs) == 100 and [r["run"] for r in history.runs] == list(range(100))
    assert sorted(history.figures["serving.throughput_tok_s"][1]) == sorted([1000.0 * w + i for w in (1, 2) for i in range(50)])


def _gate(tmp_path: Path, rules: str, summary: dict, store: Path | None, env: dict | None = None):
    (tmp_path / "rules.toml").write_text(rules)
    (tmp_path / "new.json").write_text(json.dumps(summary))
    args = ["gate", str(tmp_path / "new.json"), "--rules", str(tmp_path / "rules.toml")]
    args += ["--history", str(store)] if store is not None else []
    return CliRunner().invoke(cli, args, env=env or NOT_ON_GITHUB)


CHANGE_RULES = """
[[rule]]
name = "step interval has not moved for the worse"
figure = "step_interval_ms.p50"
change = "worse"

[[rule]]
figure = "serving.*"
change = "worse"
newest = 3

[[rule]]
check = "validation.valid == true"
"""


def test_gate_fails_a_run_that_starts_a_change_for_the_worse_and_names_it(tmp_path):
    store = _history(tmp_path, [12.0] * 10)
    passed = _gate(tmp_path, CHANGE_RULES, _run(12.1), store)
    assert passed.exit_code == 0, passed.output
    assert "PASS    step interval has not moved for the worse [step_interval_ms.p50]: no change for the worse" in passed.output
    summary_file = tmp_path / "step_summary.md"
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary_file)}
    failed = _gate(tmp_path, CHANGE_RULES, _run(18.0, throughput=300.0), store, env)
    assert failed.exit_code == 1, failed.output
    line = next(x for x in failed.output.splitlines() if x.startswith("FAIL    step interval"))
    assert "step_interval_ms.p50 worse by +" in line and "at run 10" in line and "(this run)" in line
    assert "FAIL    serving.* change" in failed.output and "serving.throughput_tok_s worse by -2" in failed.output
    annotations = [x for x in failed.output.splitlines() if x.startswith("::error title=step interval has not moved")]
    assert len(annotations) == 1 and "step_interval_ms.p50 worse by +" in annotations[0]
    assert "step\\_interval\\_ms.p50 worse by +" in summary_file.read_text()
    # the store is only read: the gated run was judged as its newest run, not added
    assert len(load_history(store).runs) == 10


def test_gate_change_rule_names_the_commit_of_a_stored_change_and_skips_without_history(tmp_path):
    store = _history(tmp_path, [12.0] * 10 + [18.0])
    failed = _gate(tmp_path, CHANGE_RULES, _run(18.2), store)
    assert failed.exit_code == 1 and "at run 10 'r10' (commit c10)" in failed.output
    skipped = _gate(tmp_path, CHANGE_RULES, _run(18.2), None)
    assert (
        skipped.exit_code == 0
        and "SKIPPED step interval has not moved for the worse [step_interval_ms.p50]: no history given" in skipped.output
    )


def test_the_example_history_rules_gate_a_serialized_run_on_its_history(tmp_path):
    rules = load_rules(REPO / "examples" / "history-rules.toml")
    assert rules and all(isinstance(rule, ChangeRule) for rule in rules)
    store = _history(tmp_path, [12.0] * 10)
    (tmp_path / "new.json").write_text(json.dumps(_run(19.2)))
    args = ["gate", str(tmp_path / "new.json"), "--rules", str(REPO / "examples" / "history-rules.toml"), "--history", str(store)]
    result = CliRunner().invoke(cli, args, env=NOT_ON_GITHUB)
    assert result.exit_code == 1 and "FAIL    decode step interval has not moved for the worse [step_interval_ms.p50]" in result.output


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ('figure = "step_interval_ms.p50"\nchange = "better"', "is not a change rule"),
        ('change = "worse"', "needs figure"),
        ('figure = "x"\nchange = "worse"\nnewest = 0', "not a whole number of runs"),
        ('figure = "x"\nchange = "worse"\nlimit = 3', "unknown key(s) ['limit']"),
    ],
)
def test_bad_change_rules_are_one_line(tmp_path, rule, message):
    store = _history(tmp_path, [12.0] * 3)
    assert message in _one_line_error(_gate(tmp_path, f"[[rule]]\n{rule}\n", _run(12.0), store))


def test_trend_page_has_a_chart_per_figure_change_points_and_report_links(tmp_path):
    store = _history(tmp_path, [12.0] * 10 + [18.0])
    with duckdb.connect(str(store)) as connection:
        connection.execute("UPDATE runs SET report = '/runs/3/report.html', label = '<b>r3</b>' WHERE run = 3")
        connection.execute("UPDATE figures SET text = 'regressed' WHERE run = 4 AND figure = 'verdict.status'")
    page = render_trend_page(check_history(store))
    figures = len(load_history(store).figures)
    assert page.count('class="chart"') == figures
    assert "step_interval_ms.p50 worse by +" in page and 'href="file:///runs/3/report.html"' in page
    assert "&lt;b&gt;r3&lt;/b&gt;" in page and "<b>r3</b>" not in page and "<td>regressed</td>" in page
    assert "cdn" not in page.lower().split("<script>")[0] and "src=" not in page.split("<script>")[0]
    result = CliRunner().invoke(cli, ["history", "report", str(store), "-o", str(tmp_path / "trend.html")])
    assert result.exit_code == 0 and (tmp_path / "trend.html").read_text() == page


TREND_READER = """<script>dsprofTrend.ready.then(function () {
  var d = dsprofTrend.data, out = {errors: __errors, rendered: document.body.dataset.rendered};
  out.plots = document.querySelectorAll('.chart .main-svg').length;
  var i = d.figures.findIndex(function (f) { return f.figure === 'step_interval_ms.p50'; });
  var div = document.getElementById('chart-' + i);
  out.marks = div.layout.shapes.map(function (s) { return [s.x0, s.line.color]; });
  out.points = div.data[0].x.length;
  out.link = document.querySelector('#runs a').getAttribute('href');
  var pre = document.createElement('pre'); pre.id = 'check'; pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});</script>"""


@pytest.mark.browser
def test_trend_page_draws_in_headless_chromium_with_the_change_marked(tmp_path):
    store = _history(tmp_path, [12.0] * 10 + [18.0])
    with duckdb.connect(str(store)) as connection:
        connection.execute("UPDATE runs SET report = '/runs/3/report.html' WHERE run = 3")
    check = check_history(store)
    out = browse_page(render_trend_page(check), TREND_READER, tmp_path, "trend.html")
    assert out["errors"] == [] and out["rendered"] == str(len(check.checked)) and out["plots"] >= len(check.checked)
    assert out["marks"] == [[9.5, "#c00"]] and out["points"] == 11
    assert out["link"] == "file:///runs/3/report.html"
