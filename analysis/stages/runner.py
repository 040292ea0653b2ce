"""Analysis stages: each analysis declares the engine tables it reads and the ones it writes.

The analyses share their results through DuckDB relations (``decode``,
``steps``, ...). A relation that one analysis creates and another reads is a
contract, so it is declared here, on the function that keeps it: ``@stage``
checks before the call that every table the stage reads was written by a stage
that already ran (or is one of the engine's own inputs), and after it that the
stage wrote what it promised. Relations a stage creates without declaring them
are its scratch space and are dropped when it returns, so no other stage can
come to depend on them unnoticed. Reordering two stages is then a clear error,
never a silently wrong analysis.

docs/ARCHITECTURE.md lists every stage and table; ``tests/test_stages.py``
checks that list against :data:`STAGES`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, TypeVar

from dsprof.analysis.stages.tables import TABLES
from dsprof.analysis.store.engine import ENGINE_TABLES, Engine
from dsprof.errors import DsprofError

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Stage:
    """One analysis step: the relations it reads and leaves for later stages, and the results it takes.

    ``needs``: the stage function's parameters after the engine. A parameter
    named like a stage takes that stage's result; any other is an input of the
    run (``threshold_ms``, ``trace``, ...). ``in_summary``: the result is
    summary.json's block of the stage's name (None: the block is left out).
    """

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    doc: str
    needs: tuple[str, ...]
    function: Callable[..., object]
    in_summary: bool


# name -> Stage, in the order the modules declare them (import order of analysis/analyze.py)
STAGES: dict[str, Stage] = {}


class StageOrderError(DsprofError):
    """A stage ran before the stage that writes a table it reads."""


def writer_of(table: str) -> str:
    """The stage that declares ``table`` among its writes (``engine`` for the engine's own inputs)."""
    if table in ENGINE_TABLES:
        return "engine"
    return next((s.name for s in STAGES.values() if table in s.writes), "no stage")


def stage(
    name: str, *, reads: tuple[str, ...], writes: tuple[str, ...] = (), in_summary: bool = False
) -> Callable[[Callable[Concatenate[Engine, P], R]], Callable[Concatenate[Engine, P], R]]:
    """Declare the decorated function (first argument: the engine) as the stage ``name``."""

    def declare(function: Callable[Concatenate[Engine, P], R]) -> Callable[Concatenate[Engine, P], R]:
        doc = (function.__doc__ or "").strip().splitlines()[0] if function.__doc__ else ""
        if name in STAGES:
            raise ValueError(f"stage {name!r} declared twice")
        undeclared = [t for t in writes if t not in TABLES]
        if undeclared:
            raise ValueError(f"stage {name!r} writes table {undeclared[0]!r}, which analysis/stages/tables.py does not declare")

        @functools.wraps(function)
        def run(engine: Engine, *args: P.args, **kwargs: P.kwargs) -> R:
            _check_inputs(engine, STAGES[name])
            before = engine.relations() if engine.settled_relations is None else engine.settled_relations
            result = function(engine, *args, **kwargs)
            _settle_outputs(engine, STAGES[name], before)
            return result

        needs = tuple(inspect.signature(function).parameters)[1:]
        STAGES[name] = Stage(name, tuple(reads), tuple(writes), doc, needs, run, in_summary)
        return run

    return declare


def _check_inputs(engine: Engine, declared: Stage) -> None:
    missing = [t for t in declared.reads if t not in engine.written and t not in ENGINE_TABLES]
    if missing:
        table = missing[0]
        raise StageOrderError(
            f"analysis stage {declared.name!r} reads table {table!r}, which is written by stage {writer_of(table)!r}; "
            "that stage has not run on this engine yet (the stages are out of order)"
        )


def _settle_outputs(engine: Engine, declared: Stage, before: set[str]) -> None:
    """Record the declared writes; drop the stage's undeclared scratch relations; compress the tables written.

    Scratch is TEMP, the stage's connection's own: a stage run beside it (:func:`run_stages`' workers) makes
    its tables in the same database, and they are no scratch of this one.
    """
    after = engine.relation_kinds()
    absent = [t for t in declared.writes if t not in after]
    if absent:
        raise StageOrderError(f"analysis stage {declared.name!r} declares table {absent[0]!r} but did not write it")
    beside = set(TABLES) if engine.beside else set()  # every table a stage declares (tests/test_stages.py)
    scratch = sorted(after.keys() - before - set(declared.writes) - beside)
    shared = [t for t in scratch if not after[t].temporary]
    if shared:
        raise StageOrderError(f"analysis stage {declared.name!r} made {shared[0]!r}, neither declared nor TEMP (scratch must be TEMP)")
    for table in scratch:
        engine.drop(table, after[table].kind)
    for table in declared.writes:
        _check_columns(engine, declared.name, table)
        engine.written[table] = declared.name
    if any(after[t].kind == "table" for t in declared.writes):
        engine.compact()
    if engine.settled_relations is not None:  # the next stage of run_stages starts from these
        engine.settled_relations = after.keys() - set(scratch)


def _check_columns(engine: Engine, stage_name: str, table: str) -> None:
    """The columns the stage wrote to ``table`` are exactly those analysis/stages/tables.py declares."""
    written = [row[0] for row in engine.rows(f'DESCRIBE "{table}"')]
    declared = TABLES[table].column_names
    extra = [c for c in written if c not in declared]
    missing = [c for c in declared if c not in written]
    if extra or missing:
        wrong = f"column {extra[0]!r}, which it does not declare" if extra else f"no column {missing[0]!r}, which it declares"
        raise StageOrderError(f"analysis stage {stage_name!r} wrote table {table!r} with {wrong} (analysis/stages/tables.py)")


def in_order(stages: Collection[Stage] | None = None) -> list[Stage]:
    """``stages`` (all declared ones by default) in an order that satisfies every read and need: writers first, ties by name.

    The order comes from the declarations alone, never from the order the
    stages were registered in.
    """
    done: set[str] = set(ENGINE_TABLES)
    left = sorted(STAGES.values() if stages is None else stages, key=lambda s: s.name)
    ordered: list[Stage] = []
    while left:
        ready = next((s for s in left if _ready(s, done)), left[0])  # a cycle or a missing writer: listed as it is
        ordered.append(ready)
        done |= {*ready.writes, ready.name}
        left.remove(ready)
    return ordered


def _ready(candidate: Stage, done: set[str]) -> bool:
    return set(candidate.reads) <= done and all(need in done or need not in STAGES for need in candidate.needs)


def _with_prerequisites(wanted: Collection[str]) -> list[Stage]:
    """The stages ``wanted`` and every stage whose tables or result they need, transitively."""
    chosen: dict[str, Stage] = {}
    todo = list(wanted)
    while todo:
        name = todo.pop()
        if name in chosen:
            continue
        chosen[name] = STAGES[name]
        todo += [writer_of(t) for t in chosen[name].reads if writer_of(t) in STAGES]
        todo += [need for need in chosen[name].needs if need in STAGES]
    return list(chosen.values())


def run_stages(
    engine: Engine,
    inputs: Mapping[str, object],
    wanted: Collection[str],
    *,
    announce: Callable[[Stage], None] | None = None,
    workers: int = 1,
) -> dict[str, object]:
    """Run the ``wanted`` stages and what they need, each given its needs by name; their results by stage.

    One at a time in declaration order, or with ``workers`` > 1 each as soon as the stages it reads and takes
    from have run, up to ``workers`` at once on connections of their own (:meth:`Engine.cursor`): a small
    trace's analysis is mostly the planning of its queries, which runs on one core a query (a live view's window).
    """
    order = in_order(_with_prerequisites(wanted))
    if workers > 1:
        return _run_beside(engine, inputs, order, announce, workers)
    results: dict[str, object] = {}
    # nothing touches the engine between two stages here: each starts from the relations the one before left
    engine.settled_relations = engine.relations()
    try:
        for next_stage in order:
            if announce:
                announce(next_stage)
            results[next_stage.name] = next_stage.function(engine, **_given(next_stage, inputs, results))
    finally:
        engine.settled_relations = None
    return results


def _given(to_run: Stage, inputs: Mapping[str, object], results: Mapping[str, object]) -> dict[str, object]:
    """The stage's needs by name: earlier stages' results, or the run's inputs."""
    return {need: results[need] if need in STAGES else inputs[need] for need in to_run.needs if need in STAGES or need in inputs}


def _run_beside(
    engine: Engine, inputs: Mapping[str, object], order: list[Stage], announce: Callable[[Stage], None] | None, workers: int
) -> dict[str, object]:
    """:func:`run_stages` with ``workers`` stages at once: each started, in ``order``, once its reads and needs are done."""
    results: dict[str, object] = {}
    done: set[str] = set(ENGINE_TABLES)
    initial = engine.relations()  # what each stage starts from, but the declared tables the stages before it wrote
    waiting_on = _dependents(order)
    # the stages more wait on first: the chain to the verdict (swimlane, skew, causes, what_if) sets the time
    pending = sorted(order, key=lambda s: -len(waiting_on[s.name]))
    running = dict[Future, Stage]()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dsprof-stage") as pool:
        while pending or running:
            ready = [s for s in pending if _ready(s, done)] or ([] if running else pending[:1])  # none ready: the first fails
            for to_run in ready[: workers - len(running)]:
                pending.remove(to_run)
                if announce:
                    announce(to_run)
                running[pool.submit(_on_own_connection, engine, to_run, _given(to_run, inputs, results), initial)] = to_run
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                ran = running.pop(future)
                results[ran.name] = future.result()  # a failure stops the run here (the stages under way end first)
                done |= {*ran.writes, ran.name}
    engine.compact()
    return results


def _dependents(order: list[Stage]) -> dict[str, set[str]]:
    """Per stage, the stages of ``order`` that read its tables or take its result, directly or through others."""
    dependents: dict[str, set[str]] = {s.name: set() for s in order}
    for later in reversed(order):  # in_order puts every stage after those it depends on
        for earlier in order:
            if earlier is not later and (set(earlier.writes) & set(later.reads) or earlier.name in later.needs):
                dependents[earlier.name] |= {later.name, *dependents[later.name]}
    return dependents


def _on_own_connection(engine: Engine, to_run: Stage, given: dict[str, object], initial: set[str]) -> object:
    """Run one stage on a connection of its own, closed after (its TEMP scratch goes with it).

    It starts from the relations ``initial`` (no catalog query): any other it sees after is a declared table of a
    stage, or its own scratch.
    """
    beside = engine.cursor()
    beside.settled_relations = set(initial)
    try:
        return to_run.function(beside, **given)
    finally:
        beside.close()


def stages_markdown() -> str:
    """The table of stages for docs/ARCHITECTURE.md (checked by tests/test_stages.py), in the order they can run."""
    lines = ["| stage | reads | writes | takes | what it does |", "|---|---|---|---|---|"]
    for s in in_order():
        reads = ", ".join(f"`{t}`" for t in s.reads) or "—"
        writes = ", ".join(f"`{t}`" for t in s.writes) or "—"
        takes = ", ".join(f"`{n}`" for n in s.needs) or "—"
        lines.append(f"| `{s.name}` | {reads} | {writes} | {takes} | {s.doc.replace('``', '`')} |")
    return "\n".join(lines)
