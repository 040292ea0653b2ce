"""Serving figures: tokens, batch elapsed, throughput, effective TPOT, acceptance rate (docs/FIGURES.md "Serving").

Each figure is taken, field by field, from the first source that has it:
``performance_summary.json``, then the SA_PROFILE ``request`` spans, then
derived from the others; ``sources`` in the block says which. A failed run is
marked ``partial`` and its throughput counts completed requests only, because
the runtime's own figures for it read higher than a healthy run's.
"""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.stages.runner import stage
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.store.spans import Trace
from dsprof.analysis.summary_schema import Serving
from dsprof.profiler import sa_profile

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
# The rows the figures read from the spans: SA_PROFILE request spans, complete, not STRACE records
# (SQL here; request_spans() is the same filter in Arrow, for the live windows).
REQUEST_SPANS_SQL = f"cat = '{sa_profile.CAT_REQUEST}' AND ph = 'X' AND inv IS NULL"
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


def request_spans(spans: pa.Table) -> pa.Table:
    """The rows of ``spans`` the serving figures read (those of ``REQUEST_SPANS_SQL``)."""
    chosen = pc.and_(pc.and_(pc.equal(spans["cat"], sa_profile.CAT_REQUEST), pc.equal(spans["ph"], "X")), pc.is_null(spans["inv"]))
    return spans.filter(pc.fill_null(chosen, False))


def _from_request_spans(engine: Engine) -> dict[str, tuple[float, str]]:
    row = engine.rows(f"""
        SELECT count(*), min(ts_ns), max(ts_ns + dur_ns),
               sum(tokens), count(tokens), sum(expected), count(expected), sum(accepted), sum(drafted), count(drafted)
        FROM (SELECT ts_ns, dur_ns, {_first_present(TOKEN_KEYS)} AS tokens, {_first_present(EXPECTED_KEYS)} AS expected,
                     TRY_CAST(attrs['accepted_draft_tokens'] AS DOUBLE) AS accepted, TRY_CAST(attrs['draft_tokens'] AS DOUBLE) AS drafted
              FROM spans WHERE {REQUEST_SPANS_SQL})""")[0]
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


@stage("serving", reads=("spans",), in_summary=True)
def serving_figures(engine: Engine, trace: Trace) -> Serving:
    """The ``serving`` block of summary.json, with ``sources``, ``partial`` and ``partial_reason``."""
    found = _from_request_spans(engine)
    performance_summary = trace.performance_summary if isinstance(trace.performance_summary, dict) else {}
    found |= _from_performance_summary(performance_summary)
    values = {figure: found[figure][0] if figure in found else None for figure in FIGURES}
    sources = {figure: found[figure][1] for figure in FIGURES if figure in found}
    reasons = _partial_reasons(performance_summary, values)
    if reasons:
        reasons.append(_count_completed_work(engine, values, sources))
    else:
        _derive_rates(values, sources)
    return Serving(
        tokens_returned=values["tokens_returned"],
        tokens_expected=values["tokens_expected"],
        batch_elapsed_s=values["batch_elapsed_s"],
        throughput_tok_s=values["throughput_tok_s"],
        effective_tpot_ms=values["effective_tpot_ms"],
        acceptance_rate=values["acceptance_rate"],
        requests=values["requests"],
        sources=sources,
        partial=bool(reasons),
        partial_reason="; ".join(reasons) or None,
    )


def _derive_rates(values: dict, sources: dict) -> None:
    """Throughput and TPOT from tokens, elapsed and requests, where no source gave them."""
    tokens, elapsed, requests = values["tokens_returned"], values["batch_elapsed_s"], values["requests"]
    if values["throughput_tok_s"] is None and tokens and elapsed:
        values["throughput_tok_s"], sources["throughput_tok_s"] = round(tokens / elapsed, 3), DERIVED
    if values["effective_tpot_ms"] is None and tokens and elapsed and requests:
        values["effective_tpot_ms"], sources["effective_tpot_ms"] = round(elapsed * 1000 / (tokens / requests), 3), DERIVED


def _partial_reasons(performance_summary: dict, values: dict) -> list[str]:
    """Why the run's serving figures do not describe a complete run (empty: they do)."""
    status = performance_summary.get("exit_status")
    if not isinstance(status, int) or isinstance(status, bool) or status == 0:
        return []  # fewer tokens than expected alone is no failure: requests may stop early (EOS before max_tokens)
    message = performance_summary.get("message")
    reasons = [f"the run exited with status {status}" + (f" ({message})" if isinstance(message, str) and message else "")]
    returned, expected = values["tokens_returned"], values["tokens_expected"]
    if returned is not None and expected is not None and returned < expected:
        reasons.append(f"{_count(returned)} of {_count(expected)} tokens returned")
    return reasons


def _count(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value}"


def _count_completed_work(engine: Engine, values: dict, sources: dict) -> str:
    """Throughput and TPOT of a partial run from the requests that completed; says what was counted.

    A request completed when its ``output_tokens`` reached its expected tokens
    (its own ``expected_tokens``, else tokens expected / requests).
    """
    values["throughput_tok_s"] = values["effective_tpot_ms"] = None
    sources.pop("throughput_tok_s", None)
    sources.pop("effective_tpot_ms", None)
    expected, requests, elapsed = values["tokens_expected"], values["requests"], values["batch_elapsed_s"]
    even_share = expected / requests if expected and requests else None
    row = engine.rows(
        f"""
        SELECT count(*) FILTER (WHERE tokens IS NOT NULL AND want IS NOT NULL),
               count(*) FILTER (WHERE tokens >= want), coalesce(sum(tokens) FILTER (WHERE tokens >= want), 0)
        FROM (SELECT {_first_present(TOKEN_KEYS)} AS tokens, coalesce({_first_present(EXPECTED_KEYS)}, ?) AS want
              FROM spans WHERE {REQUEST_SPANS_SQL})""",
        [even_share],
    )[0]
    judged, completed, completed_tokens = row
    if not judged or not elapsed:
        return "throughput and TPOT not measured: no request spans tell which requests completed"
    source = f"completed requests only (partial run): {completed} of {judged}"
    values["throughput_tok_s"], sources["throughput_tok_s"] = round(completed_tokens / elapsed, 3), source
    if completed:
        values["effective_tpot_ms"], sources["effective_tpot_ms"] = round(elapsed * 1000 / (completed_tokens / completed), 3), source
    return f"throughput and TPOT count the {completed} of {judged} requests that completed"
