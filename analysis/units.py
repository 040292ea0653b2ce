"""Units and percentiles every analysis and output shares (docs/FIGURES.md "Percentiles").

Figures are reported in ms with three decimals; percentiles are
``quantile_cont`` (linear interpolation between order statistics) of the
nanosecond values.
"""

from __future__ import annotations

from typing import overload

from dsprof.analysis.store.engine import Engine
from dsprof.analysis.summary_schema import Percentiles

PERCENTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))


def ns_to_ms(value: float) -> float:
    """Nanoseconds as ms with three decimals, the unit of every reported figure."""
    return round(float(value) / 1e6, 3)


def _block(values: list | None, count: int) -> Percentiles:
    if not count or values is None:
        return Percentiles(p50=None, p95=None, p99=None, max=None, count=0)
    p50, p95, p99, top = (ns_to_ms(v) for v in values)
    return Percentiles(p50=p50, p95=p95, p99=p99, max=top, count=int(count))


def _quantiles(expression: str) -> str:
    points = ", ".join(str(q) for _, q in PERCENTILES)
    return f"quantile_cont({expression}, [{points}]), count({expression})"


@overload
def percentile_blocks(engine: Engine, table: str, expressions: dict[str, str], by: None = None) -> dict[str, Percentiles]: ...
@overload
def percentile_blocks(engine: Engine, table: str, expressions: dict[str, str], by: str) -> dict[str, dict[str, Percentiles]]: ...
def percentile_blocks(engine: Engine, table: str, expressions: dict[str, str], by: str | None = None) -> dict:
    """``{name: {"p50", "p95", "p99", "max", "count"}}`` of each ns expression over ``table``; per ``by`` value when given."""
    selected = ", ".join(_quantiles(e) for e in expressions.values())
    if by is None:
        row = engine.rows(f"SELECT {selected} FROM {table}")[0]
        return {name: _block(row[2 * i], row[2 * i + 1]) for i, name in enumerate(expressions)}
    rows = engine.rows(f"SELECT {by}, {selected} FROM {table} GROUP BY {by} ORDER BY {by}")
    return {str(r[0]): {name: _block(r[1 + 2 * i], r[2 + 2 * i]) for i, name in enumerate(expressions)} for r in rows}
