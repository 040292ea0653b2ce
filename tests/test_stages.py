"""The analysis stages declare their tables: the order is checked, scratch tables do not leak, the docs list them."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsprof.analysis.analyze import analyze_trace
from dsprof.analysis.causes import diagnose
from dsprof.analysis.engine import ENGINE_TABLES, open_engine
from dsprof.analysis.ingest import read_paths
from dsprof.analysis.layout import build_lanes
from dsprof.analysis.skew import skew_figures
from dsprof.analysis.stages import STAGES, StageOrderError, stage, stages_markdown
from dsprof.analysis.swimlane import build_swimlane
from dsprof.testing.synthetic import SyntheticRun

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    run = tmp_path_factory.mktemp("stages") / "run"
    SyntheticRun(ranks=3, steps=8).write(run)
    return read_paths([run])


def test_a_stage_run_before_the_one_that_writes_its_input_is_a_clear_error(trace):
    engine = open_engine(trace)
    with pytest.raises(StageOrderError, match="'skew' reads table 'decode', which is written by stage 'swimlane'"):
        skew_figures(engine)
    build_swimlane(engine)
    with pytest.raises(StageOrderError, match="'causes' reads table 'steps', which is written by stage 'skew'"):
        diagnose(engine, 5.0)  # swapped with skew (and the step intervals): refused, not a silently wrong analysis


def test_a_stage_that_does_not_write_what_it_declares_is_refused(trace):
    @stage("test-forgetful", reads=("spans",), writes=("never_written",))
    def forgetful(engine) -> None:
        """Declares a table it never creates."""

    try:
        with pytest.raises(StageOrderError, match="declares table 'never_written' but did not write it"):
            forgetful(open_engine(trace))
    finally:
        STAGES.pop("test-forgetful")


def test_only_declared_tables_outlive_their_stage(trace):
    engine = analyze_trace(trace).engine
    declared = {table for s in STAGES.values() for table in s.writes}
    assert engine.relations() <= declared | set(ENGINE_TABLES)
    assert {"decode", "steps", "step_intervals", "critical_path", "diagnosed"} <= engine.relations()
    assert "cells" not in engine.relations() and "waits" not in engine.relations()  # scratch, dropped


def test_architecture_lists_every_stage_and_table():
    assert "layout" in STAGES and build_lanes  # the drawing stage is declared too
    assert stages_markdown() in ARCHITECTURE.read_text(), "docs/ARCHITECTURE.md is out of date: run scripts/stages_table.py"
