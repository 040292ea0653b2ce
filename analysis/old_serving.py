"""Serving figures: tokens, batch elapsed, throughput, effective TPOT, acceptance rate (SPEC §3).

Source, in order of preference:

1. ``performance_summary.json`` (``trace.extras["performance_summary"]``): its
   figures are taken as written by the runtime.
2. SA_PROFILE ``request`` spans: tokens returned = Σ ``output_tokens`` args
   (aliases ``completion_tokens``, ``tokens_out``); tokens expected =
   Σ ``expected_tokens`` (alias ``max_tokens``) when every request has it;
   batch elapsed = last request end − first request start; throughput =
   tokens / elapsed; effective TPOT = elapsed / (tokens / requests); acceptance
   rate = Σ ``accepted_draft_tokens`` / Σ ``draft_tokens`` when present.
"""

from __future__ import annotations

import pandas as pd

from dsprof.analysis.spans import Trace, attr_columns

TOKEN_KEYS = ("output_tokens", "completion_tokens", "tokens_out")
EXPECTED_KEYS = ("expected_tokens", "max_tokens")
EMPTY = {"source": None, "tokens_returned": None, "tokens_expected": None, "batch_elapsed_s": None,
         "throughput_tok_s": None, "effective_tpot_ms": None, "acceptance_rate": None, "requests": None}


def serving_figures(trace: Trace) -> dict:
    """The ``serving`` block of summary.json."""
    summary = trace.extras.get("performance_summary")
    if isinstance(summary, dict):
        return {
            "source": "performance_summary",
            "tokens_returned": summary.get("tokens_returned"),
            "tokens_expected": summary.get("tokens_expected"),
            "batch_elapsed_s": summary.get("batch_elapsed_s"),
            "throughput_tok_s": summary.get("throughput_tok_s"),
            "effective_tpot_ms": summary.get("effective_tpot_ms"),
            "acceptance_rate": summary.get("acceptance_rate"),
            "requests": (summary.get("workload") or {}).get("requests"),
        }
    return _from_request_spans(trace.spans)


def _first_present(attrs: pd.DataFrame, keys: tuple[str, ...]) -> pd.Series:
    values = pd.Series(pd.NA, index=attrs.index, dtype="Float64")
    for key in keys:
        values = values.fillna(pd.to_numeric(attrs[key], errors="coerce").astype("Float64"))
    return values


def _from_request_spans(spans: pd.DataFrame) -> dict:
    requests = spans[(spans["cat"] == "request") & (spans["ph"] == "X") & spans["inv"].isna()]
    if len(requests) == 0:
        return dict(EMPTY)
    attrs = attr_columns(requests, [*TOKEN_KEYS, *EXPECTED_KEYS, "accepted_draft_tokens", "draft_tokens"])
    tokens = _first_present(attrs, TOKEN_KEYS)
    expected = _first_present(attrs, EXPECTED_KEYS)
    elapsed_ns = int((requests["ts_ns"] + requests["dur_ns"]).max() - requests["ts_ns"].min())
    elapsed_s = elapsed_ns / 1e9
    n = len(requests)
    returned = int(tokens.sum()) if tokens.notna().any() else None
    accepted = pd.to_numeric(attrs["accepted_draft_tokens"], errors="coerce")
    drafted = pd.to_numeric(attrs["draft_tokens"], errors="coerce")
    acceptance = float(accepted.sum() / drafted.sum()) if drafted.notna().any() and drafted.sum() > 0 else None
    return {
        "source": "sa_profile",
        "tokens_returned": returned,
        "tokens_expected": int(expected.sum()) if expected.notna().all() else None,
        "batch_elapsed_s": round(elapsed_s, 6),
        "throughput_tok_s": round(returned / elapsed_s, 3) if returned and elapsed_s > 0 else None,
        "effective_tpot_ms": round(elapsed_s * 1000 / (returned / n), 3) if returned else None,
        "acceptance_rate": None if acceptance is None else round(acceptance, 4),
        "requests": n,
    }
