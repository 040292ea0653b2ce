"""Memory sized by steps stays under ``--memory-limit`` (issue 28 item 8, issue 30 item 3).

A run of many steps (the shape whose step-sized work — the
replay's chains, the per_step rows, summary.json — outgrew the limit) analysed
under a small limit gives the summary it gives without one; memory that runs
out anyway is one line naming the remedies. The full-size figures (1 x 1M and
64 x 30k steps under ``--memory-limit 1GB``) are benchmarks/bench_step_memory.py's.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dsprof.analysis.store.spans import Trace
from dsprof.commands import analysis_job
from dsprof.commands.ingest import ingest_paths
from dsprof.errors import DsprofError
from dsprof.testing.synthetic import SyntheticRun

SMALL_LIMIT = 128 << 20  # far below the default (a tenth of RAM); the span-sized pass of these 55k spans needs about 64 MiB


@pytest.mark.slow
def test_a_step_heavy_run_under_a_small_memory_limit_gives_the_same_summary(tmp_path):
    steps = 2_500
    fence = np.full((2, steps), 9_000_000, dtype=np.int64)
    fence[1, ::250] += 15_000_000  # late steps, whose causes the what-if replays over the whole run
    run = SyntheticRun(ranks=2, steps=steps, fence_wait_ns=fence, device_wall_ns=fence + 100_000, host_evidence=True, sa_worker_spans=False)
    run = run.write(tmp_path / "run")
    ingest_paths([run], tmp_path / "spans")  # out of core, as a big input is read
    unlimited = analysis_job.analyze_paths([tmp_path / "spans"], tmp_path / "unlimited")
    limited = analysis_job.analyze_paths([tmp_path / "spans"], tmp_path / "limited", memory_limit=SMALL_LIMIT)
    for outcome in (unlimited, limited):
        outcome.result.engine.close()
    assert len(limited.result.summary["per_step"]) == steps and limited.result.summary["what_if"]["items"]
    assert limited.result.summary == unlimited.result.summary
    # summary.json is written a block at a time: the same bytes as one json.dumps
    written = (tmp_path / "limited" / "summary.json").read_bytes()
    assert written == (tmp_path / "unlimited" / "summary.json").read_bytes()
    assert written == (json.dumps(json.loads(written), indent=2, allow_nan=False) + "\n").encode()


def test_memory_that_runs_out_outside_duckdb_is_one_line_with_the_remedies():
    """numpy's (and Arrow's) MemoryError says what --memory-limit's error says, not a traceback."""
    with pytest.raises(DsprofError) as raised, analysis_job.explained_query_errors(Trace()):
        np.empty(1 << 60, np.uint8)  # past any address space: numpy's own MemoryError
    message = str(raised.value)
    assert "\n" not in message and message.startswith("the analysis needs more memory than its limit (")
    assert message.endswith(": raise --memory-limit, or analyse a window of the run (--steps A:B, --since, --until)")


ADDRESS_SPACE_CAP = 1 << 30  # 1 GiB of address space (ulimit -v): the analysis below needs about 0.7 GiB with the bounds


@pytest.mark.slow
def test_the_cli_analyses_under_an_address_space_cap_that_the_allocators_defaults_overrun(tmp_path):
    """dsprof.allocators: the allocators reserve no more than the analysis uses, so ``ulimit -v`` caps what it uses.

    With their defaults (DuckDB's jemalloc retaining freed address space, mimalloc's regions, 8 glibc arenas a core)
    this small analysis failed under the same 1 GiB cap in 4 runs of 4; at full size, 1 x 1M steps under
    ``--memory-limit 1GB`` completes under a 4 GiB cap (benchmarks/bench_step_memory.py --cap as).
    """
    SyntheticRun(ranks=4, steps=200).write(tmp_path / "run")
    capped = subprocess.run(
        [str(Path(sys.executable).with_name("dsprof")), "analyze", str(tmp_path / "run"), "-o", str(tmp_path / "out")],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_CAP, ADDRESS_SPACE_CAP)),
        env={
            key: value
            for key, value in os.environ.items()
            if key not in ("DUCKDB_JE_MALLOC_CONF", "ARROW_DEFAULT_MEMORY_POOL", "MALLOC_ARENA_MAX")
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert capped.returncode == 0, capped.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["validation"]["valid"]
