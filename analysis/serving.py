"""Serving figures: tokens, batch elapsed, throughput, effective TPOT, acceptance rate (SPEC §3).

Each figure is taken, field by field, from the first source that has it:

1. ``performance_summary.json``, under dsprof's own field name or a common
   alias other producers write (``output_tokens``, ``expected_output_tokens``,
   ``batch_elapsed_seconds``, ``throughput_tokens_per_second``, ...);
2. the SA_PROFILE ``request`` spans: tokens returned = Σ ``output_tokens``
   args (aliases ``completion_tokens``, ``tokens_out``); tokens expected =
   Σ ``expected_tokens`` (alias ``max_tokens``) when every request has it;
   batch elapsed = last request end − first request start; acceptance rate =
   Σ ``accepted_draft_tokens`` / Σ ``draft_tokens``;
3. derived from the others: throughput = tokens / elapsed, effective TPOT =
   elapsed / (tokens / requests).

``sources`` in the block says where each figure came from.
"""

from __future__ import annotations

import math

from dsprof.analysis.engine import Engine
from dsprof.analysis.spans import Trace
from dsprof.analysis.stages import stage
from dsprof.analysis.summary_model import Serving

FIGURES = ("tokens_returned", "tokens_expected", "batch_elapsed_s", "throughput_tok_s", "effective_tpot_ms", "acceptance_rate", "requests")
# performance_summary.json field names, dsprof's own first; (name, factor to the figure's unit)
SUMMARY_ALIASES: dict[str, tuple[tuple[str, float], ...]] = {
    "tokens_returned": (
        ("tokens_returned", 1),
        ("output_tokens", 1),
        ("total_output_tokens", 1),
        ("generated_tokens", 1),
        ("completion_tokens", 1),
    ),
    "tokens_expected": (("tokens_expected", 1), ("expected_output_tokens", 1), ("expected_tokens", 1)),
    "batch_elapsed_s": (
        ("batch_elapsed_s", 1),
        ("batch_elapsed_seconds", 1),
        ("elapsed_s", 1),
        ("elapsed_seconds", 1),
        ("batch_elapsed_ms", 1e-3),
        ("duration_s", 1),
    ),
    "throughput_tok_s": (("throughput_tok_s", 1), ("throughput_tokens_per_second", 1), ("tokens_per_second", 1), ("output_throughput", 1)),
    "effective_tpot_ms": (("effective_tpot_ms", 1), ("tpot_ms", 1), ("effective_tpot_s", 1e3)),
    "acceptance_rate": (("acceptance_rate", 1), ("mtp_acceptance_rate", 1), ("draft_acceptance_rate", 1)),
    "requests": (("requests", 1), ("num_requests", 1), ("request_count", 1)),
}
TOKEN_KEYS = ("output_tokens", "completion_tokens", "tokens_out")
EXPECTED_KEYS = ("expected_tokens", "max_tokens")
FROM_REQUEST_SPANS = "sa_profile request spans"
DERIVED = "derived"


def _number(value: object, factor: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    try:
        scaled = value * factor if factor != 1 else value
    except OverflowError:
        return None
    return scaled if isinstance(scaled, int) or math.isfinite(scaled) else None


def _from_performance_summary(summary: dict) -> dict[str, tuple[float, str]]:
    found: dict[str, tuple[float, str]] = {}
    workload: dict = summary["workload"] if isinstance(summary.get("workload"), dict) else {}
    for figure, aliases in SUMMARY_ALIASES.items():
        for name, factor in aliases:
            value = _number(summary.get(name), factor)
            if value is not None:
                found[figure] = (value, f"performance_summary.json:{name}")
                break
    if "requests" not in found and _number(workload.get("requests"), 1) is not None:
        found["requests"] = (workload["requests"], "performance_summary.json:workload.requests")
    return found


def _first_present(keys: tuple[str, ...]) -> str:
    """SQL: the first of ``attrs[key]`` that parses as a number."""
    return "coalesce(" + ", ".join(f"TRY_CAST(attrs['{k}'] AS DOUBLE)" for k in keys) + ")"


def _from_request_spans(engine: Engine) -> dict[str, tuple[float, str]]:
    row = engine.rows(f"""
        SELECT count(*), min(ts_ns), max(ts_ns + dur_ns),
               sum(tokens), count(tokens), sum(expected), count(expected), sum(accepted), sum(drafted), count(drafted)
        FROM (SELECT ts_ns, dur_ns, {_first_present(TOKEN_KEYS)} AS tokens, {_first_present(EXPECTED_KEYS)} AS expected,
                     TRY_CAST(attrs['accepted_draft_tokens'] AS DOUBLE) AS accepted, TRY_CAST(attrs['draft_tokens'] AS DOUBLE) AS drafted
              FROM spans WHERE cat = 'request' AND ph = 'X' AND inv IS NULL)""")[0]
    n, first, last, tokens, with_tokens, expected, with_expected, accepted, drafted, with_drafted = row
    if not n:
        return {}
    found = {"requests": (n, FROM_REQUEST_SPANS), "batch_elapsed_s": (round((last - first) / 1e9, 6), FROM_REQUEST_SPANS)}
    if with_tokens:
        found["tokens_returned"] = (int(tokens), FROM_REQUEST_SPANS)
    if with_expected == n:
        found["tokens_expected"] = (int(expected), FROM_REQUEST_SPANS)
    if with_drafted and drafted:
        found["acceptance_rate"] = (round(accepted / drafted, 4), FROM_REQUEST_SPANS)
    return found


@stage("serving", reads=("spans",))
def serving_figures(engine: Engine, trace: Trace) -> Serving:
    """The ``serving`` block of summary.json, with ``sources``."""
    found = _from_request_spans(engine)
    if isinstance(trace.performance_summary, dict):
        found |= _from_performance_summary(trace.performance_summary)
    values = {figure: found[figure][0] if figure in found else None for figure in FIGURES}
    sources = {figure: found[figure][1] for figure in FIGURES if figure in found}
    tokens, elapsed, requests = values["tokens_returned"], values["batch_elapsed_s"], values["requests"]
    if values["throughput_tok_s"] is None and tokens and elapsed:
        values["throughput_tok_s"], sources["throughput_tok_s"] = round(tokens / elapsed, 3), DERIVED
    if values["effective_tpot_ms"] is None and tokens and elapsed and requests:
        values["effective_tpot_ms"], sources["effective_tpot_ms"] = round(elapsed * 1000 / (tokens / requests), 3), DERIVED
    return Serving(
        tokens_returned=values["tokens_returned"],
        tokens_expected=values["tokens_expected"],
        batch_elapsed_s=values["batch_elapsed_s"],
        throughput_tok_s=values["throughput_tok_s"],
        effective_tpot_ms=values["effective_tpot_ms"],
        acceptance_rate=values["acceptance_rate"],
        requests=values["requests"],
        sources=sources,
    )
