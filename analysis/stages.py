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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, TypeVar

from dsprof.analysis.engine import ENGINE_TABLES, Engine
from dsprof.errors import DsprofError

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Stage:
    """One analysis step: its name, the relations it reads and the ones it leaves for later stages."""

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    doc: str


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
    name: str, *, reads: tuple[str, ...], writes: tuple[str, ...] = ()
) -> Callable[[Callable[Concatenate[Engine, P], R]], Callable[Concatenate[Engine, P], R]]:
    """Declare the decorated function (first argument: the engine) as the stage ``name``."""

    def declare(function: Callable[Concatenate[Engine, P], R]) -> Callable[Concatenate[Engine, P], R]:
        doc = (function.__doc__ or "").strip().splitlines()[0] if function.__doc__ else ""
        if name in STAGES:
            raise ValueError(f"stage {name!r} declared twice")
        STAGES[name] = Stage(name, tuple(reads), tuple(writes), doc)

        @functools.wraps(function)
        def run(engine: Engine, *args: P.args, **kwargs: P.kwargs) -> R:
            _check_inputs(engine, STAGES[name])
            before = engine.relations()
            result = function(engine, *args, **kwargs)
            _settle_outputs(engine, STAGES[name], before)
            return result

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
    """Record the declared writes; drop the stage's undeclared scratch relations."""
    after = engine.relation_kinds()
    absent = [t for t in declared.writes if t not in after]
    if absent:
        raise StageOrderError(f"analysis stage {declared.name!r} declares table {absent[0]!r} but did not write it")
    for table in sorted(after.keys() - before - set(declared.writes)):
        engine.drop(table, after[table])
    for table in declared.writes:
        engine.written[table] = declared.name


def in_order() -> list[Stage]:
    """The declared stages in an order that satisfies every read (writers first; ties by name)."""
    done: set[str] = set(ENGINE_TABLES)
    left = sorted(STAGES.values(), key=lambda s: s.name)
    ordered: list[Stage] = []
    while left:
        ready = next((s for s in left if set(s.reads) <= done), left[0])  # a cycle or a missing writer: listed as it is
        ordered.append(ready)
        done |= set(ready.writes)
        left.remove(ready)
    return ordered


def stages_markdown() -> str:
    """The table of stages for docs/ARCHITECTURE.md (checked by tests/test_stages.py), in the order they can run."""
    lines = ["| stage | reads | writes | what it does |", "|---|---|---|---|"]
    for s in in_order():
        reads = ", ".join(f"`{t}`" for t in s.reads) or "—"
        writes = ", ".join(f"`{t}`" for t in s.writes) or "—"
        lines.append(f"| `{s.name}` | {reads} | {writes} | {s.doc.replace('``', '`')} |")
    return "\n".join(lines)
