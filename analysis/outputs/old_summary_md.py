"""summary.md: the verification block to paste into a pull request."""

from __future__ import annotations

from pathlib import Path

# The workload fields a reviewer needs to recognise the run; model sizes and
# other knobs stay in summary.json. A workload with none of these (another
# producer's) is shown whole.
WORKLOAD_SHAPE_KEYS = (
    "preset", "ranks", "dp", "ep", "tp", "requests", "prompt_tokens", "output_tokens",
    "rounds", "metadata", "depth", "device_phases", "inject", "seed",
)


# The percentile figures shown in the printed table and in summary.md (the rest stay in summary.json).
HEADLINE_FIGURES = ("runner_start_skew_ms", "runner_end_skew_ms", "runner_to_validate_gap_ms", "validate_ms", "bind_ms", "root_ms")


def format_value(value, unit: str = "") -> str:
    """A summary value for people: ``n/a`` where the figure could not be computed (null)."""
    return "n/a" if value is None else f"{value}{unit}"


def format_summary_md(summary: dict) -> str:
    """Markdown: workload, exit status, serving figures, skew percentiles, late starts, validation, tails."""
    validation = summary["validation"]
    serving = summary["serving"]
    figures = summary["figures"]
    late = summary["late_starts"]
    tails = summary["tail_steps"]
    pipeline = summary["pipeline"]
    workload = summary.get("workload") or {}
    lines = ["## dsprof verification", ""]
    if workload:
        shape = {k: workload[k] for k in WORKLOAD_SHAPE_KEYS if workload.get(k) not in (None, [], "")} or workload
        lines.append("Workload: " + ", ".join(f"{k}={v}" for k, v in shape.items()))
    lines.append(f"Exit status: {format_value(summary.get('exit_status'))}")
    lines.append(
        f"Tokens: {format_value(serving['tokens_returned'])} / {format_value(serving['tokens_expected'])} expected; "
        f"batch {format_value(serving['batch_elapsed_s'], ' s')}; throughput {format_value(serving['throughput_tok_s'], ' tok/s')}; "
        f"effective TPOT {format_value(serving['effective_tpot_ms'], ' ms')}"
        + (f"; acceptance {serving['acceptance_rate']}" if serving.get("acceptance_rate") is not None else "")
    )
    lines.append("")
    if validation["valid"]:
        lines.append(
            f"Validation: combined swimlane validated with {validation['decode_steps']} decode steps "
            f"and {validation['rank_roots']} rank roots"
        )
    else:
        lines.append(
            f"Validation: FAILED ({validation['decode_steps']} decode steps, {validation['rank_roots']} rank roots): "
            + "; ".join(validation["problems"])
        )
    lines += ["", "| figure | p50 ms | p95 ms | p99 ms | max ms | count |", "|---|---|---|---|---|---|"]
    for name in HEADLINE_FIGURES:
        b = figures[name]
        lines.append(f"| {name} | {format_value(b['p50'])} | {format_value(b['p95'])} | {format_value(b['p99'])} | {format_value(b['max'])} | {b['count']} |")
    lines.append("")
    lines.append(f"Late starts (> {late['threshold_ms']} ms): {late['count']}")
    for item in late["items"][:10]:
        lines.append(f"- step {item['step']}, rank {item['rank']} ({item['device']}): +{item['excess_ms']} ms, {item['phase']}")
    if late["count"] > 10:
        lines.append(f"- ... {late['count'] - 10} more late starts in summary.json")
    lines.append(f"Tail steps (> {tails['threshold_ms']} ms): {tails['count']}; straggler: {tails['straggler']['verdict']}")
    for item in tails["items"][:10]:
        lines.append(
            f"- step {item['step']}, rank {item['rank']} ({item['device']}): end skew {item['runner_end_skew_ms']} ms, "
            f"{item['phase']} +{item['phase_excess_ms']} ms"
        )
    if tails["count"] > 10:
        lines.append(f"- ... {tails['count'] - 10} more tail steps in summary.json")
    lines.append(f"Pipeline: {pipeline['diagnosis']}")
    return "\n".join(lines) + "\n"


def write_summary_md(summary: dict, path: str | Path) -> Path:
    """Write the block a reviewer pastes into a pull request (``dsprof run`` also prints it)."""
    path = Path(path)
    path.write_text(format_summary_md(summary))
    return path
