"""The trend page of a run history (``dsprof history report``): one small chart per figure over the runs.

One offline file: plotly.js inlined once, the history as JSON in a
``<script type="application/json">`` block, and a short script that draws
each figure's series with its change points marked (a dashed line before the
first run after the change: red for worse, green for better, grey for a
figure with no better direction). Clicking a run whose report is known opens
it; the runs table links to the same reports and shows each run's
``verdict.status`` when its summary had one. Every text from the store
(labels, commits, paths) is escaped; nothing is recomputed here: the change
points are :class:`~dsprof.analysis.policy.history.HistoryCheck`'s.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

from plotly.offline import get_plotlyjs

from dsprof.analysis.outputs.html_report import script_json
from dsprof.analysis.policy.history import VERDICT_STATUS, HistoryCheck
from dsprof.analysis.summary import figure_unit
from dsprof.fileio import atomic_write_text
from dsprof.textsafe import terminal_safe

_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
_STYLE = """body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}h1{font-size:1.3em}
#charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(360px,1fr));gap:8px}
.chart{height:220px;border:1px solid #ddd}.worse{color:#b00}.better{color:#070}
table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}"""
_SCRIPT = """(function () {
  var data = JSON.parse(document.getElementById('trend-data').textContent);
  var colors = {worse: '#c00', better: '#080', '': '#888'};
  var drawn = data.figures.map(function (f, i) {
    var div = document.getElementById('chart-' + i);
    var marks = f.changes.map(function (c) {
      return {type: 'line', xref: 'x', yref: 'paper', x0: c.index - 0.5, x1: c.index - 0.5, y0: 0, y1: 1,
              line: {color: colors[c.direction], dash: 'dash', width: 2}};
    });
    var labels = f.runs.map(function (r) { return data.runs[r].label; });
    var trace = {x: f.runs, y: f.values, text: labels, mode: 'lines+markers', marker: {size: 5},
                 hovertemplate: 'run %{x} %{text}<br>%{y}' + (f.unit ? ' ' + f.unit : '') + '<extra></extra>'};
    var layout = {title: {text: f.figure, font: {size: 12}}, margin: {l: 50, r: 10, t: 28, b: 28}, shapes: marks,
                  xaxis: {title: {text: 'run'}, range: [-0.5, data.runs.length - 0.5]}, showlegend: false};
    return Plotly.newPlot(div, [trace], layout, {displayModeBar: false, staticPlot: false}).then(function () {
      div.on('plotly_click', function (e) {
        var report = data.runs[e.points[0].x].report;
        if (report) { window.location.href = report; }
      });
    });
  });
  window.dsprofTrend = {data: data, ready: Promise.all(drawn).then(function () {
    document.body.dataset.rendered = String(drawn.length);
  })};
})();"""


def _report_link(report: str | None) -> str | None:
    """A file URL for a run's report, when its path was known when it was added."""
    return Path(report).as_uri() if report and os.path.isabs(report) else None


def trend_data(check: HistoryCheck) -> dict:
    """What the page draws: the runs, and per figure its series and change points."""
    runs = [
        {"label": terminal_safe(str(r["label"])), "commit": r.get("commit"), "report": _report_link(r.get("report"))}
        for r in check.history.runs
    ]
    by_figure: dict[str, list[dict]] = {}
    for change in check.change_points:
        by_figure.setdefault(change.figure, []).append(change.to_json())
    figures = [
        {
            "figure": name,
            "unit": figure_unit(name),
            "runs": [int(i) for i in check.series[name][0]],
            "values": [float(v) for v in check.series[name][1]],
            "changes": by_figure.get(name, []),
        }
        for name in check.checked
    ]
    return {"runs": runs, "figures": figures}


def _change_list(check: HistoryCheck) -> str:
    regressions = set(check.regressions)
    items = [
        f'<li class="{c.direction}">{"<b>regression</b> " if c in regressions else ""}{html.escape(terminal_safe(c.describe()))}</li>'
        for c in check.change_points
    ]
    return f'<ol id="changes">{"".join(items)}</ol>' if items else '<p id="changes">No change points.</p>'


def _runs_table(check: HistoryCheck) -> str:
    rows = []
    verdicts = check.history.texts.get(VERDICT_STATUS, {})
    for run in check.history.runs:
        label = html.escape(terminal_safe(str(run["label"])))
        link = _report_link(run.get("report"))
        shown = f'<a href="{html.escape(link)}">{label}</a>' if link else label
        commit = html.escape(terminal_safe(str(run.get("commit") or "")))
        rows.append(
            f"<tr><td>{run['run']}</td><td>{shown}</td><td>{commit}</td><td>{html.escape(str(run.get('added_at') or ''))}</td>"
            f"<td>{html.escape(terminal_safe(verdicts.get(run['run'], '')))}</td></tr>"
        )
    return f'<table id="runs"><tr><th>run</th><th>label</th><th>commit</th><th>added</th><th>verdict</th></tr>{"".join(rows)}</table>'


def render_trend_page(check: HistoryCheck) -> str:
    """The whole page as text."""
    runs = len(check.history.runs)
    charts = "".join(f'<div id="chart-{i}" class="chart"></div>' for i in range(len(check.checked)))
    heading = (
        f"{runs} run(s), {len(check.checked)} figure(s), {len(check.change_points)} change point(s), "
        f"{len(check.regressions)} regression(s) in the newest {min(check.newest, runs)} run(s)"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_CSP}">
<title>dsprof trend</title><style>{_STYLE}</style>
</head><body>
<h1>dsprof trend: {html.escape(heading)}</h1>
<section><h2>Change points</h2>{_change_list(check)}</section>
<section><h2>Figures over the runs</h2><div id="charts">{charts}</div></section>
<section><h2>Runs</h2>{_runs_table(check)}</section>
<script type="application/json" id="trend-data">{script_json(trend_data(check))}</script>
<script>{get_plotlyjs()}</script>
<script>{_SCRIPT}</script>
</body></html>
"""


def write_trend_page(check: HistoryCheck, path: str | os.PathLike) -> Path:
    """Write the trend page atomically and return its path."""
    return atomic_write_text(path, render_trend_page(check))
