"""Per-step skew, gap, validate, bind and root figures with their percentiles (docs/FIGURES.md).

SQL over the engine's ``decode`` table (one row per rank and step). Percentiles
are ``quantile_cont`` — linear interpolation between order statistics of the
nanosecond values — reported in ms with three decimals.
"""

from __future__ import annotations

from dsprof.analysis.stages.runner import stage
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.summary_schema import Figures, Percentiles, RankFigures, StepRow
from dsprof.analysis.units import ns_to_ms, percentile_blocks

# figure name -> nanosecond expression over a decode row
DURATIONS = {
    "bind_ms": "bind_end_ns - bind_ts_ns",
    "runner_run_ms": "runner_end_ns - runner_ts_ns",
    "root_ms": "root_end_ns - root_ts_ns",
    "validate_ms": "validate_end_ns - validate_ts_ns",
    "runner_to_validate_gap_ms": "validate_ts_ns - runner_end_ns",
}
PER_RANK_FIGURES = ("bind_ms", "root_ms", "validate_ms", "runner_to_validate_gap_ms")
STEP_FIGURES = ("runner_start_skew_ms", "runner_end_skew_ms")


STEPS_SQL = """
SELECT step, count(DISTINCT rank) AS ranks,
       min(runner_ts_ns) AS min_start_ns,
       max(runner_ts_ns) - min(runner_ts_ns) AS runner_start_skew_ns,
       max(runner_end_ns) - min(runner_end_ns) AS runner_end_skew_ns,
       arg_max(rank, (runner_ts_ns, -rank)) AS latest_start_rank,
       arg_max(rank, (runner_end_ns, -rank)) AS latest_end_rank
FROM decode WHERE runner_ts_ns IS NOT NULL AND runner_end_ns IS NOT NULL
GROUP BY step
"""


# the columns of ``steps`` that make a per_step row, in StepRow's order
_STEP_ROW_COLUMNS = ("step", "ranks", "runner_start_skew_ns", "runner_end_skew_ns", "latest_start_rank", "latest_end_rank")


@stage("skew", reads=("decode",), writes=("steps",))
def skew_figures(engine: Engine) -> tuple[Figures, list[StepRow]]:
    """The ``figures`` block and the ``per_step`` list of summary.json; leaves the ``steps`` table in the engine."""
    engine.run(f"CREATE OR REPLACE TABLE steps AS {STEPS_SQL}")
    skews = percentile_blocks(engine, "steps", {name: name.replace("_ms", "_ns") for name in STEP_FIGURES})
    durations = percentile_blocks(engine, "decode", DURATIONS)
    per_rank = percentile_blocks(engine, "decode", {name: DURATIONS[name] for name in PER_RANK_FIGURES}, by="rank")
    devices = dict(engine.rows("SELECT rank, min(device) FROM decode GROUP BY rank"))
    figures = Figures(
        runner_start_skew_ms=skews["runner_start_skew_ms"],
        runner_end_skew_ms=skews["runner_end_skew_ms"],
        bind_ms=durations["bind_ms"],
        runner_run_ms=durations["runner_run_ms"],
        root_ms=durations["root_ms"],
        validate_ms=durations["validate_ms"],
        runner_to_validate_gap_ms=durations["runner_to_validate_gap_ms"],
        per_rank={rank: _rank_figures(blocks, str(devices[int(rank)])) for rank, blocks in per_rank.items()},
    )
    # column by column: one dict per step is built once (a million steps hold no second, Arrow-shaped copy of the rows)
    table = engine.arrow("SELECT * FROM steps ORDER BY step")
    columns = [table.column(name).to_pylist() for name in _STEP_ROW_COLUMNS]
    del table
    per_step = [
        StepRow(
            step=step,
            ranks=ranks,
            runner_start_skew_ms=ns_to_ms(start_skew),
            runner_end_skew_ms=ns_to_ms(end_skew),
            latest_start_rank=latest_start,
            latest_end_rank=latest_end,
        )
        for step, ranks, start_skew, end_skew, latest_start, latest_end in zip(*columns, strict=True)  # output rows, one per step
    ]
    return figures, per_step


def _rank_figures(blocks: dict[str, Percentiles], device: str) -> RankFigures:
    return RankFigures(
        bind_ms=blocks["bind_ms"],
        root_ms=blocks["root_ms"],
        validate_ms=blocks["validate_ms"],
        runner_to_validate_gap_ms=blocks["runner_to_validate_gap_ms"],
        device=device,
    )
