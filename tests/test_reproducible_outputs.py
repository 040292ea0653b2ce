"""Reproducible outputs: the same input and options give byte-identical files, analysis after analysis.

Every row of every output has a defined order (a total ORDER BY key where the
query engine's threads would otherwise decide), so three analyses of one
multi-rank run, each followed by both exports and a span-table ingest, write
the same bytes. No output embeds a time stamp; ``dsprof_version`` in
summary.json is the installed package's and cannot differ within one test.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from dsprof.cli.main import cli
from dsprof.testing.synthetic import SyntheticRun

ANALYZE_OUTPUTS = ("summary.json", "summary.md", "report.html", "combined-swimlane.json")
EXPORTS = ("trace.pftrace", "trace.json")
SPAN_TABLE = "spans.jsonl"

pytestmark = pytest.mark.slow  # nine command runs


def _invoke(*args: str) -> None:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output


def _analyse_and_export(run, exports) -> dict[str, bytes]:
    """Analyse ``run`` in place, export both formats and the span table; every output's bytes."""
    _invoke("analyze", str(run))
    for name in EXPORTS:
        _invoke("export", str(run), "-o", str(exports / name))
    _invoke("ingest", str(run / "server.log"), str(run / "serving-trace"), "-o", str(exports / SPAN_TABLE))
    outputs = {name: (run / name).read_bytes() for name in ANALYZE_OUTPUTS}
    return outputs | {name: (exports / name).read_bytes() for name in (*EXPORTS, SPAN_TABLE)}


def test_three_analyses_of_one_input_write_identical_bytes(tmp_path):
    ranks, steps = 6, 60
    fence = np.full((ranks, steps), 9_000_000, dtype=np.int64)
    fence[2, 17] += 15_000_000  # a tail step, so that findings and causes are written too
    run = SyntheticRun(ranks=ranks, steps=steps, fence_wait_ns=fence, host_evidence=True, dispatch_ids=True).write(tmp_path / "run")
    first, *others = [_analyse_and_export(run, tmp_path / f"exports-{i}") for i in range(3)]
    assert all(first.values()), "every output has content"
    for other in others:
        differing = sorted(name for name in first if first[name] != other[name])
        assert not differing, f"outputs differ from one analysis of the same input to the next: {differing}"
