"""HTML report and Perfetto exports: size and time, for the production shape and a 1,000,000-span run.

Prints, per shape: spans, generation and analysis time, the report's write time
and size, the time headless chromium takes from the page's first script to the
swimlane and charts drawn, and the time and size of the Perfetto JSON and the
native .pftrace. Targets (issue 12): the report of a 1,000,000-span run stays
under 20 MB and renders in under 10 s.

    .venv/bin/python benchmarks/bench_report.py [--spans 1000000] [--no-browser] [--no-export]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from dsprof.analysis.outputs.chrome_trace import write_chrome_trace
from dsprof.analysis.outputs.html_report import render_html
from dsprof.analysis.outputs.perfetto_proto import write_perfetto_proto
from dsprof.commands.analysis_job import analyze_paths
from dsprof.testing.synthetic import SyntheticRun

CHROMIUM = "/usr/bin/chromium"
# Added to a copy of the page: the ms from the first script (before plotly.js is parsed) to "drawn", written into the DOM.
START = "<script>window.benchStart = performance.now();</script>"
TIMING = """<script>dsprofReport.ready.then(function () {
  var pre = document.createElement('pre'); pre.id = 'bench';
  pre.textContent = String(performance.now() - window.benchStart); document.body.appendChild(pre); });</script>"""
# spans per decode root: 8 host spans (root, bind, bind.args, bind.prebuilt, runner_run, fence wait, claim, validate),
# the device wall, and the serving worker and kernel span of that root
SPANS_PER_ROOT = 11


def browser_render_s(page: str, workdir: Path) -> tuple[float, float]:
    """(seconds from the page's first script until it was drawn, wall seconds of the whole chromium run)."""
    path = workdir / "timed.html"
    path.write_text(page.replace("<head>", "<head>" + START, 1).replace("</body>", TIMING + "</body>", 1), encoding="utf-8")
    started = time.perf_counter()
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--window-size=1400,1000",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={workdir / 'profile'}",
            "--dump-dom",
            path.as_uri(),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - started
    found = re.search(r'<pre id="bench">([0-9.]+)</pre>', result.stdout)
    return (float(found.group(1)) / 1000 if found else float("nan")), wall


def bench(label: str, run: SyntheticRun, browser: bool, export: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        started = time.perf_counter()
        run.write(workdir / "run")
        generated = time.perf_counter() - started
        started = time.perf_counter()
        result = analyze_paths([workdir / "run"], None).result
        analysed = time.perf_counter() - started
        spans = int(result.trace.span_count)
        started = time.perf_counter()
        page = render_html(result)
        rendered = time.perf_counter() - started
        (workdir / "report.html").write_text(page, encoding="utf-8")
        size_mb = (workdir / "report.html").stat().st_size / 1e6
        print(f"{label}: {spans:,} spans (generate {generated:.1f} s, analyze {analysed:.1f} s)")
        print(f"  report.html: {size_mb:.2f} MB, written in {rendered:.2f} s")
        if browser:
            drawn, wall = browser_render_s(page, workdir)
            print(
                f"  chromium: swimlane and charts drawn {drawn:.2f} s after the page's first script ({wall:.1f} s for the whole headless run)"
            )
        if export:
            for name, writer in (("perfetto json", write_chrome_trace), ("perfetto .pftrace", write_perfetto_proto)):
                started = time.perf_counter()
                path = writer(result, workdir / ("trace.json" if "json" in name else "trace.pftrace"))
                print(f"  {name}: {path.stat().st_size / 1e6:.1f} MB, written in {time.perf_counter() - started:.1f} s")
                path.unlink()
        result.engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000, help="spans of the large generated run")
    parser.add_argument("--no-browser", action="store_true", help="skip the chromium timing")
    parser.add_argument("--no-export", action="store_true", help="skip the Perfetto exports")
    args = parser.parse_args()
    browser = not args.no_browser
    if browser and shutil.which(CHROMIUM) is None:
        raise SystemExit(f"{CHROMIUM} not found (make browser), or pass --no-browser")
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    bench("production shape (8 ranks x 143 steps)", SyntheticRun(ranks=8, steps=143), browser, not args.no_export)
    steps = max(1, args.spans // (8 * SPANS_PER_ROOT))
    bench(f"large run (8 ranks x {steps:,} steps)", SyntheticRun(ranks=8, steps=steps), browser, not args.no_export)


if __name__ == "__main__":
    main()
