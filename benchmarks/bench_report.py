"""HTML report and Perfetto export: file size and time, for the production shape and a 1,000,000-span run.

Prints, per shape: spans, analysis time, report write time and size, the time
headless chromium takes from navigation to the plots being drawn, and the
Perfetto export's time and size. Targets (issue 5): the report stays under
20 MB at 1,000,000 spans and renders in a few seconds.

    .venv/bin/python benchmarks/bench_report.py [--spans 1000000] [--no-browser]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from dsprof.analysis.analyze import analyze
from dsprof.analysis.outputs.html_report import render_html
from dsprof.analysis.outputs.perfetto import write_perfetto_json
from dsprof.profiler.synthetic import SyntheticRun

CHROMIUM = "/usr/bin/chromium"
# Added to a copy of the page: the ms from the first script (before plotly.js is parsed) to "plots drawn",
# written into the DOM. The plots are drawn synchronously, so no virtual-time budget is needed.
START = "<script>window.benchStart = performance.now();</script>"
TIMING = """<script>dsprofReport.ready.then(function () {
  var pre = document.createElement('pre'); pre.id = 'bench';
  pre.textContent = String(performance.now() - window.benchStart); document.body.appendChild(pre); });</script>"""
# host spans per decode root (root, bind, bind.args, bind.prebuilt, runner_run, fence wait, claim, validate)
# plus the serving worker and kernel span of that root
SPANS_PER_ROOT = 10


def browser_render_ms(page: str, workdir: Path) -> tuple[float, float]:
    """(ms from the page's first script until its plots were drawn, wall seconds of the whole chromium run)."""
    path = workdir / "timed.html"
    path.write_text(page.replace("<head>", "<head>" + START, 1).replace("</body>", TIMING + "</body>", 1), encoding="utf-8")
    started = time.perf_counter()
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={workdir / 'profile'}", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=600,
    )
    wall = time.perf_counter() - started
    found = re.search(r'<pre id="bench">([0-9.]+)</pre>', result.stdout)
    return (float(found.group(1)) if found else float("nan")), wall


def bench(label: str, run: SyntheticRun, browser: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        started = time.perf_counter()
        run.write(workdir / "run")
        generated = time.perf_counter() - started
        started = time.perf_counter()
        result = analyze([workdir / "run"])
        analysed = time.perf_counter() - started
        spans = len(result.swimlane.runtime) + len(result.swimlane.serving)
        started = time.perf_counter()
        page = render_html(result.swimlane, result.summary)
        rendered = time.perf_counter() - started
        (workdir / "report.html").write_text(page, encoding="utf-8")
        size_mb = (workdir / "report.html").stat().st_size / 1e6
        started = time.perf_counter()
        trace = write_perfetto_json(result.swimlane, result.summary, workdir / "trace.json")
        exported = time.perf_counter() - started
        print(f"{label}: {spans:,} spans (generate {generated:.1f} s, analyze {analysed:.1f} s)")
        print(f"  report.html: {size_mb:.2f} MB, written in {rendered:.2f} s")
        if browser:
            drawn_ms, wall = browser_render_ms(page, workdir)
            print(f"  chromium: plots drawn {drawn_ms / 1000:.2f} s after the page started ({wall:.1f} s for the whole headless run)")
        print(f"  perfetto json: {trace.stat().st_size / 1e6:.1f} MB, written in {exported:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000, help="spans of the large generated run")
    parser.add_argument("--no-browser", action="store_true", help="skip the chromium timing")
    args = parser.parse_args()
    browser = not args.no_browser
    if browser and shutil.which(CHROMIUM) is None:
        raise SystemExit(f"{CHROMIUM} not found (apt-get install chromium), or pass --no-browser")
    bench("production shape (8 ranks x 143 steps)", SyntheticRun(ranks=8, steps=143), browser)
    steps = max(1, args.spans // (8 * SPANS_PER_ROOT))
    bench(f"large run (8 ranks x {steps:,} steps)", SyntheticRun(ranks=8, steps=steps), browser)


if __name__ == "__main__":
    main()
