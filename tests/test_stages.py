"""The analysis stages declare their tables: the order is checked, scratch tables do not leak, the docs list them."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.ingest import read_paths
from dsprof.analysis.outputs.drawing import build_lanes
from dsprof.analysis.stages import runner as stages_module
from dsprof.analysis.stages.causes import diagnose
from dsprof.analysis.stages.runner import STAGES, StageOrderError, stage, stages_markdown
from dsprof.analysis.stages.skew import skew_figures
from dsprof.analysis.stages.swimlane import build_swimlane
from dsprof.analysis.stages.tables import TABLES, tables_markdown
from dsprof.analysis.store.engine import ENGINE_TABLES, open_engine
from dsprof.analysis.store.spans import SPAN_COLUMN_DOCS, SPAN_SCHEMA
from dsprof.commands.analysis_job import write_outputs
from dsprof.testing.coupled import Shape, scenario_for
from dsprof.testing.coupled_log import write_log
from dsprof.testing.synthetic import SyntheticRun

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    run = tmp_path_factory.mktemp("stages") / "run"
    SyntheticRun(ranks=3, steps=8).write(run)
    return read_paths([run])


@pytest.fixture(scope="module")
def faulty_trace(tmp_path_factory):
    """A coupled run with faults of every kind and host evidence: steps to diagnose."""
    log = tmp_path_factory.mktemp("coupled") / "server.log"
    scenario = scenario_for(Shape(ranks=4, steps=60, layers=2, seed=3))
    write_log(scenario, scenario.run(), log)
    return read_paths([log])


def test_a_stage_run_before_the_one_that_writes_its_input_is_a_clear_error(trace):
    engine = open_engine(trace)
    with pytest.raises(StageOrderError, match="'skew' reads table 'decode', which is written by stage 'swimlane'"):
        skew_figures(engine)
    build_swimlane(engine)
    with pytest.raises(StageOrderError, match="'causes' reads table 'steps', which is written by stage 'skew'"):
        diagnose(engine, 5.0)  # swapped with skew (and the step intervals): refused, not a silently wrong analysis


def test_a_stage_that_does_not_write_what_it_declares_is_refused(trace):
    @stage("test-forgetful", reads=("spans",), writes=("gc",))
    def forgetful(engine) -> None:
        """Declares a table it never creates."""

    try:
        with pytest.raises(StageOrderError, match="declares table 'gc' but did not write it"):
            forgetful(open_engine(trace))
    finally:
        STAGES.pop("test-forgetful")


def test_only_declared_tables_outlive_their_stage(trace):
    engine = analyze_trace(trace).engine
    declared = {table for s in STAGES.values() for table in s.writes}
    assert engine.relations() <= declared | set(ENGINE_TABLES)
    assert {"decode", "steps", "step_intervals", "critical_path", "diagnosed"} <= engine.relations()
    assert "cells" not in engine.relations() and "waits" not in engine.relations()  # scratch, dropped


def test_scratch_that_is_not_temp_is_refused(trace):
    """A stage run beside another sees its tables, not its TEMP ones: scratch must be TEMP to be the stage's own."""

    @stage("test-shared-scratch", reads=("spans",))
    def shared_scratch(engine) -> None:
        """Leaves a table in the database, undeclared."""
        engine.run("CREATE TABLE leftover AS SELECT 1 AS one")

    try:
        with pytest.raises(StageOrderError, match="made 'leftover', neither declared nor TEMP"):
            shared_scratch(open_engine(trace))
    finally:
        STAGES.pop("test-shared-scratch")


def _analysed(trace, workers: int) -> tuple[str, dict[str, list]]:
    """The summary of ``trace`` (JSON) and every relation the analysis left, each table's rows sorted."""
    result = analyze_trace(trace, stage_workers=workers)
    try:
        tables = {name: result.engine.rows(f'SELECT * FROM "{name}" ORDER BY ALL') for name in sorted(result.engine.relations())}
        return json.dumps(result.summary, sort_keys=True, default=str), tables
    finally:
        result.engine.close()


@pytest.mark.slow
def test_stages_run_beside_each_other_analyse_as_one_at_a_time(trace, faulty_trace, tmp_path, monkeypatch):
    """With two workers, stages whose inputs are ready run at once on connections of their own (the live window's
    analysis): the same summary and the same tables as one at a time, on a healthy run, a faulty coupled one with
    host evidence, and a run with every rank's host spans."""
    SyntheticRun(ranks=8, steps=30, host_evidence=True).write(tmp_path / "evidence")
    spans: list[tuple[str, float, float]] = []
    on_own_connection = stages_module._on_own_connection

    def timed(engine, to_run, *given):
        started = time.perf_counter()
        try:
            return on_own_connection(engine, to_run, *given)
        finally:
            spans.append((to_run.name, started, time.perf_counter()))

    monkeypatch.setattr(stages_module, "_on_own_connection", timed)
    for each in (trace, faulty_trace, read_paths([tmp_path / "evidence"])):
        assert _analysed(each, 2) == _analysed(each, 1)
    assert {name for name, _, _ in spans} >= {"swimlane", "causes", "what_if", "verdict"}  # each on a connection of its own
    overlapping = [(a, b) for a in spans for b in spans if a[0] < b[0] and a[1] < b[2] and b[1] < a[2]]
    assert overlapping  # stages did run at once


def test_architecture_lists_every_stage_and_table():
    assert "layout" in STAGES and build_lanes  # the drawing stage is declared too
    text = ARCHITECTURE.read_text()
    assert stages_markdown() in text, "docs/ARCHITECTURE.md is out of date: run scripts/stages_table.py"
    assert tables_markdown() in text, "docs/ARCHITECTURE.md is out of date: run scripts/stages_table.py"


@pytest.mark.parametrize("which", ["healthy", "faulty"])  # the causes of no flagged step are an empty table made as declared
def test_every_table_handed_on_has_its_declared_columns_and_types(trace, faulty_trace, which):
    engine = analyze_trace(trace if which == "healthy" else faulty_trace).engine
    flagged = engine.scalar("SELECT count(*) FROM diagnosed")
    assert flagged == 0 if which == "healthy" else flagged > 0
    build_lanes(engine)
    written = {table for s in STAGES.values() for table in s.writes}
    assert written == set(TABLES), "a declared table no stage writes, or the reverse"
    for table in sorted(written):
        described = [(row[0], row[1]) for row in engine.rows(f"DESCRIBE {table}")]
        assert described == [(c.name, c.type) for c in TABLES[table].columns], table


def test_a_stage_that_writes_an_undeclared_column_is_refused(trace):
    @stage("test-extra-column", reads=("spans",), writes=("gc",))
    def extra(engine) -> None:
        """Writes gc with a column analysis/stages/tables.py does not declare."""
        engine.run(
            "CREATE OR REPLACE TABLE gc AS SELECT 1::BIGINT AS pid, 2::BIGINT AS tid, 3::BIGINT AS gc_ts_ns, "
            "4::BIGINT AS gc_end_ns, 5 AS surprise"
        )

    try:
        with pytest.raises(StageOrderError, match="wrote table 'gc' with column 'surprise', which it does not declare"):
            extra(open_engine(trace))
    finally:
        STAGES.pop("test-extra-column")


def test_a_stage_cannot_declare_a_table_tables_py_does_not_know():
    with pytest.raises(ValueError, match="writes table 'mystery', which analysis/stages/tables.py does not declare"):
        stage("test-mystery", reads=("spans",), writes=("mystery",))(lambda engine: None)
    assert "test-mystery" not in STAGES


def test_the_order_comes_from_the_declarations_not_the_registration(tmp_path, monkeypatch):
    bind_ns = np.full((3, 16), 1_000_000)
    bind_ns[1, [4, 9]] = 25_000_000  # two late starts on rank 1: causes, what-if and straggler all have work
    SyntheticRun(ranks=3, steps=16, bind_ns=bind_ns, host_evidence=True).write(tmp_path / "run")
    trace = read_paths([tmp_path / "run"])
    declared = list(STAGES.items())
    outputs = []
    for seed in (0, 1, 2):
        random.Random(seed).shuffle(declared)
        monkeypatch.setattr(stages_module, "STAGES", dict(declared))
        result = analyze_trace(trace)
        write_outputs(result, tmp_path / f"out{seed}")
        outputs.append((tmp_path / f"out{seed}" / "summary.json").read_bytes())
        ran = [s.name for s in stages_module.in_order()]
        assert ran.index("swimlane") < ran.index("skew") < ran.index("causes") < ran.index("findings") < ran.index("verdict")
    assert outputs[0] == outputs[1] == outputs[2]
    assert b'"late_starts"' in outputs[0] and json.loads(outputs[0])["late_starts"]["count"] >= 2


def test_importing_the_facade_declares_every_summary_stage():
    """analyze_trace runs what is registered: a stage module it forgets to import would silently drop a block."""
    code = "import dsprof.analysis.analyze; from dsprof.analysis.stages.runner import STAGES; print(' '.join(sorted(STAGES)))"
    registered = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    sources = Path(__file__).resolve().parents[1] / "analysis"
    declared = {m for p in sources.rglob("*.py") for m in re.findall(r'^@stage\("(\w+)"', p.read_text(), re.M)}
    assert declared - {"layout"} == registered  # the drawing layout is imported by the renderers


def test_every_span_column_is_documented():
    assert list(SPAN_COLUMN_DOCS) == SPAN_SCHEMA.names
