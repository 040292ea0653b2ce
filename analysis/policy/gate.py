"""The CI gate: check a run's ``summary.json`` against gate rules (docs/GATE_RULES.md).

The rules come from :mod:`dsprof.analysis.policy.gate_rules`, the figures from
:func:`dsprof.analysis.summary.resolve`, change rules from
:mod:`dsprof.analysis.policy.history`. A failed run never passes: it gets a
built-in failing result first (:data:`RUN_FAILED_RULE`), whatever the rules say,
so a crash cannot pass as an improvement. Outcomes and errors:
docs/GATE_RULES.md, "Outcomes"; the renderers are in
:mod:`dsprof.analysis.outputs.gate_outputs`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from dsprof.analysis.policy.diff import run_failure
from dsprof.analysis.policy.gate_rules import (
    COMPARISONS,
    ORDERING,
    ChangeRule,
    CheckRule,
    RelativeRule,
    Rule,
    load_rules,
    value_kind,
    value_text,
)
from dsprof.analysis.policy.history import History, find_changes, load_history, with_candidate
from dsprof.analysis.summary import Unavailable, UnknownFigure, figure_unit, is_number, resolve, summary_with_path
from dsprof.errors import InputError
from dsprof.textsafe import terminal_safe

VERDICT_SCHEMA = "dsprof.gate_verdict/1"
RUN_FAILED_RULE = "the run completed (built in: a failed run never passes)"
# What holds when a comparison does not: a failed rule shows the relation the values really have.
_NEGATED = {"<=": ">", "<": ">=", ">=": "<", ">": "<=", "==": "!=", "!=": "=="}
_MAX_DECIMALS = 6  # float noise in a summary (0.30000000000000004) is not precision


@dataclass
class RuleResult:
    """The outcome of one rule (one row per concrete path when a rule has ``*``).

    ``detail`` is the sentence people read ("value 58.5 ms > limit 39.6 ms");
    ``value``, ``limit`` and ``baseline`` are the raw numbers for programs.
    """

    name: str
    kind: str  # "check" | "relative" | "change"
    rule: str  # the rule as written
    path: str  # the concrete summary path checked
    status: str  # "pass" | "fail" | "missing" | "skipped"
    value: Any = None
    limit: Any = None
    baseline: Any = None
    detail: str = ""
    wildcard: bool = False  # the rule's path has a '*': its name alone does not say which figure this row is

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "missing")

    @property
    def title(self) -> str:
        """The rule's name, with the concrete figure when one rule checks several."""
        return f"{self.name} [{self.path}]" if self.wildcard else self.name


@dataclass
class GateVerdict:
    """The gate's answer; ``passed`` is what CI acts on."""

    passed: bool
    results: list[RuleResult]
    summary_path: str | None
    rules_path: str
    baseline_path: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    run_verdict: str | None = None  # the summary's own verdict, "degraded: rank 1 ... by run-queue wait": what a failure line names

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_json(self) -> dict:
        return {
            "schema": VERDICT_SCHEMA,
            "passed": self.passed,
            "summary": self.summary_path,
            "rules": self.rules_path,
            "baseline": self.baseline_path,
            "counts": self.counts,
            "run_verdict": self.run_verdict,
            "results": [{k: v for k, v in asdict(r).items() if k != "wildcard"} for r in self.results],
        }


# --------------------------------------------------------------------------- numbers for people


def _decimals(value: Any) -> int:
    """Decimals the figure was written with (an int has none), at most :data:`_MAX_DECIMALS`."""
    if not isinstance(value, float):
        return 0
    exponent = Decimal(repr(value)).as_tuple().exponent
    return min(max(-exponent, 0), _MAX_DECIMALS) if isinstance(exponent, int) else 0


def _fixed(value: float, decimals: int) -> str:
    """``value`` rounded to ``decimals`` without trailing zeros: 58.500 → 58.5, 3.0 → 3."""
    if abs(value) >= 1e15:
        return f"{value:.6g}"
    text = f"{value:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _people_numbers(numbers: list[float], decimals: int) -> list[str]:
    """Numbers at the figure's precision, with more decimals only where rounding would make two different ones equal."""
    for places in range(decimals, 10):
        shown = [_fixed(n, places) for n in numbers]
        clashes = any(shown[i] == shown[j] and numbers[i] != numbers[j] for i in range(len(numbers)) for j in range(i + 1, len(numbers)))
        if not clashes:
            return shown
    return [repr(n) for n in numbers]


def _with_unit(text: str, unit: str) -> str:
    return f"{text} {unit}" if unit else text


# --------------------------------------------------------------------------- evaluation


def _json_value(value: Any) -> Any:
    """What the verdict JSON can hold: a NaN or oversized number becomes its text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not is_number(value):
        return "nan" if isinstance(value, float) and math.isnan(value) else "not a finite number"
    return None if isinstance(value, Unavailable) else value


def _resolve_for_rule(summary: dict, path: str, rules_path: Path, label: str) -> list[tuple[str, Any]]:
    try:
        return resolve(summary, path)
    except UnknownFigure as exc:
        raise InputError(rules_path, f"{label}: {exc.describe()}", expected="a figure path of docs/SUMMARY_SCHEMA.md") from None


def _term_value(rule: CheckRule, summary: dict, term_path: str, rules_path: Path) -> tuple[Any, str | None]:
    """One path of the right side: its value, or why this run has none."""
    ((concrete, value),) = _resolve_for_rule(summary, term_path, rules_path, rule.label)
    if isinstance(value, Unavailable):
        return None, value.reason
    if value is None:
        return None, f"{concrete} is null in this run"
    if value_kind(value) == "number" and not is_number(value):
        return None, f"{concrete} is not a finite number in this run"
    return value, None


def _right_side(rule: CheckRule, summary: dict, rules_path: Path) -> tuple[Any, str | None]:
    """The right side's value, or why this run has none."""
    if not rule.right.terms:
        return rule.right.literal, None
    if len(rule.right.terms) == 1 and rule.right.terms[0][0] == 1.0:  # one path as it is, of any type
        return _term_value(rule, summary, rule.right.terms[0][1] or "", rules_path)
    total = 0.0
    for factor, term_path in rule.right.terms:
        if term_path is None:
            total += factor
            continue
        value, missing = _term_value(rule, summary, term_path, rules_path)
        if missing is not None:
            return None, missing
        if value_kind(value) != "number":
            raise InputError(
                rules_path,
                f"{rule.label}: {term_path} is a {value_kind(value)}, not a number",
                expected="figure paths on the right side of a sum to name numbers",
            )
        total += factor * float(value)
    if not math.isfinite(total):
        return None, f"the right side {rule.right.describe()} is beyond the float range"
    return total, None


def _check_detail(rule: CheckRule, path: str, value: Any, limit: Any, ok: bool) -> str:
    """``value 58.5 ms > limit 39.6 ms (runner_run_ms.p50 + 0.5 * bind_ms.p50)``: what holds, in the figure's unit."""
    op = rule.op if ok else _NEGATED[rule.op]
    if value_kind(value) == "number" and value_kind(limit) == "number":
        decimals = max(_decimals(value), _decimals(limit) if not rule.right.terms else 0)
        shown_value, shown_limit = _people_numbers([value, limit], decimals)
        unit = figure_unit(path)
        detail = f"value {_with_unit(shown_value, unit)} {op} limit {_with_unit(shown_limit, unit)}"
    elif ok:
        detail = f"value {value_text(value)} {op} {value_text(limit)}"
    else:
        detail = f"value {value_text(value)}, expected {rule.op} {value_text(limit)}"
    if rule.right.terms and not (len(rule.right.terms) == 1 and rule.right.terms[0][1] is None):
        detail += f" ({rule.right.describe()})"
    return detail


def _evaluate_check(rule: CheckRule, summary: dict, rules_path: Path) -> list[RuleResult]:
    matches = _resolve_for_rule(summary, rule.left, rules_path, rule.label)
    wildcard = "*" in rule.left.split(".")

    def result(path: str, status: str, value: Any = None, limit: Any = None, detail: str = "") -> RuleResult:
        return RuleResult(rule.name, "check", rule.text, path, status, _json_value(value), _json_value(limit), None, detail, wildcard)

    if not matches:  # a wildcard over an empty list of items: nothing flagged, nothing to check
        return [result(rule.left, "pass", detail="no items to check")]
    limit, limit_missing = _right_side(rule, summary, rules_path)
    compares_null = not rule.right.terms and rule.right.literal is None  # '== null' / '!= null': null is a value here
    results = []
    for path, value in matches:
        if isinstance(value, Unavailable):
            results.append(result(path, "missing", None, limit, f"no value: {value.reason}"))
            continue
        if value_kind(value) == "block":
            raise InputError(
                rules_path,
                f"{rule.label}: {path} is a block, not a value",
                expected=f"a leaf such as {path}.{next(iter(value), 'p95')}" if isinstance(value, dict) else "a leaf value",
            )
        if value is None and not compares_null:
            results.append(result(path, "missing", None, limit, f"no value: {path} is null in this run (not measured)"))
            continue
        if limit_missing is not None:
            results.append(result(path, "missing", value, None, f"no limit: {limit_missing}"))
            continue
        if value_kind(value) != value_kind(limit) and not compares_null:
            raise InputError(
                rules_path,
                f"{rule.label}: compares {path} ({value_kind(value)}, {terminal_safe(value_text(value))}) with a {value_kind(limit)}",
                expected=f"a {value_kind(value)} on the right side",
            )
        if rule.op in ORDERING and value_kind(value) != "number":
            raise InputError(
                rules_path,
                f"{rule.label}: {rule.op} needs numbers, {path} is a {value_kind(value)}",
                expected="== or != for booleans and strings",
            )
        if value_kind(value) == "number" and not is_number(value):
            results.append(result(path, "missing", value, limit, f"no value: {path} is not a finite number"))
            continue
        ok = bool(COMPARISONS[rule.op](value, limit))
        results.append(result(path, "pass" if ok else "fail", value, limit, _check_detail(rule, path, value, limit, ok)))
    return results


def _baseline_value(baseline: dict, path: str) -> tuple[Any, str | None]:
    """The baseline's value of a concrete path, or why it has none (an older or partial baseline fails the rule)."""
    try:
        ((_, base),) = resolve(baseline, path)
    except UnknownFigure:
        return None, f"the baseline has no {path}"
    if isinstance(base, Unavailable):
        return None, f"in the baseline, {base.reason.removesuffix(' in this run')}"
    if base is None:
        return None, f"{path} is null in the baseline"
    if not is_number(base):
        return None, f"the baseline's {path} is {terminal_safe(value_text(base))}, not a finite number"
    return base, None


def _evaluate_relative(rule: RelativeRule, summary: dict, baseline: dict | None, rules_path: Path) -> list[RuleResult]:
    matches = _resolve_for_rule(summary, rule.figure, rules_path, rule.label)
    wildcard = "*" in rule.figure.split(".")
    text = f"{rule.figure} {rule.tolerance_text}"

    def result(path: str, status: str, value: Any = None, limit: Any = None, base: Any = None, detail: str = "") -> RuleResult:
        return RuleResult(
            rule.name, "relative", text, path, status, _json_value(value), _json_value(limit), _json_value(base), detail, wildcard
        )

    if not matches:
        return [result(rule.figure, "pass", detail="no items to check")]
    results = []
    for path, value in matches:
        if baseline is None:
            results.append(result(path, "skipped", value, detail="no baseline given"))
            continue
        if isinstance(value, Unavailable) or value is None:
            reason = value.reason if isinstance(value, Unavailable) else f"{path} is null in this run (not measured)"
            results.append(result(path, "missing", detail=f"no value: {reason}"))
            continue
        if value_kind(value) != "number":
            raise InputError(
                rules_path, f"{rule.label}: {path} is a {value_kind(value)}, not a number", expected="[[relative]] rules on numeric figures"
            )
        if not is_number(value):
            results.append(result(path, "missing", value, detail=f"no value: {path} is not a finite number"))
            continue
        base, base_missing = _baseline_value(baseline, path)
        if base_missing is not None:
            results.append(result(path, "missing", value, detail=f"no baseline: {base_missing}"))
            continue
        results.append(_relative_outcome(rule, path, value, base, result))
    return results


def _relative_outcome(rule: RelativeRule, path: str, value: float, base: float, result: Callable[..., RuleResult]) -> RuleResult:
    """Pass or fail of one figure against its baseline, with a sentence naming value, limit and baseline."""
    sign = 1.0 if rule.worse == "higher" else -1.0
    allowance = abs(base) * rule.fraction if rule.fraction is not None else (rule.absolute or 0.0)
    limit = base + sign * (allowance + rule.slack)
    ok = value <= limit if rule.worse == "higher" else value >= limit
    op = ("<=" if ok else ">") if rule.worse == "higher" else (">=" if ok else "<")
    unit = figure_unit(path)
    decimals = max(_decimals(value), _decimals(base))
    shown_value, shown_limit, shown_base = _people_numbers([value, limit, base], decimals)
    change = f", {(value - base) / abs(base):+.1%}" if base != 0 else ""
    detail = (
        f"value {_with_unit(shown_value, unit)} {op} limit {_with_unit(shown_limit, unit)} "
        f"(baseline {_with_unit(shown_base, unit)}{change}; {rule.tolerance_text})"
    )
    return result(path, "pass" if ok else "fail", value, limit, base, detail)


def _evaluate_change(rule: ChangeRule, history: History | None) -> list[RuleResult]:
    """Per stored figure matching the rule: fail on a change for the worse starting in the newest runs."""
    text = f'{rule.figure} change = "worse" (newest {rule.newest})'
    wildcard = "*" in rule.figure.split(".")

    def result(path: str, status: str, detail: str, value: Any = None, base: Any = None) -> RuleResult:
        return RuleResult(rule.name, "change", text, path, status, value, None, base, detail, wildcard)

    if history is None:
        return [result(rule.figure, "skipped", "no history given")]
    names = [name for name in history.figures if fnmatchcase(name, rule.figure)]
    if not names:
        return [result(rule.figure, "missing", f"no value: the history has no figure {rule.figure}")]
    check = find_changes(history, figures=names, newest=rule.newest)
    results = []
    for name in sorted(names):
        worse = [c for c in check.regressions if c.figure == name]
        if worse:
            change = worse[-1]
            results.append(result(name, "fail", terminal_safe(change.describe()), round(change.after, 6), round(change.before, 6)))
        else:
            runs = len(history.runs)
            results.append(result(name, "pass", f"no change for the worse in the newest {min(rule.newest, runs)} of {runs} run(s)"))
    return results


def _gate_history(store: str | Path | None, summary: dict, summary_path: str | None) -> History | None:
    """The stored history with the gated run appended as its newest run (when not stored yet)."""
    if store is None:
        return None
    return with_candidate(load_history(store), summary, summary_path or "this run")


def evaluate_gate(
    summary_or_dir: str | Path | dict,
    rules_path: str | Path,
    *,
    baseline: str | Path | dict | None = None,
    rules: list[Rule] | None = None,
    history: str | Path | None = None,
) -> GateVerdict:
    """Check a summary (a dict, a ``summary.json`` or its artifact dir) against a rules file.

    ``rules``: that file's rules already read (``watch`` checks every window against rules read once);
    ``history``: a run history store for the ``change = "worse"`` rules.
    """
    rules_path = Path(rules_path)
    rules = load_rules(rules_path) if rules is None else rules
    summary, summary_path = summary_with_path(summary_or_dir)
    baseline_summary, baseline_path = summary_with_path(baseline) if baseline is not None else (None, None)
    runs = _gate_history(history, summary, summary_path) if any(isinstance(r, ChangeRule) for r in rules) else None
    failure = run_failure(summary)
    results: list[RuleResult] = []
    if failure is not None:
        results.append(RuleResult(RUN_FAILED_RULE, "check", "built in", "run", "fail", detail=terminal_safe(failure)))
    for rule in rules:
        if isinstance(rule, CheckRule):
            results.extend(_evaluate_check(rule, summary, rules_path))
        elif isinstance(rule, ChangeRule):
            results.extend(_evaluate_change(rule, runs))
        else:
            results.extend(_evaluate_relative(rule, summary, baseline_summary, rules_path))
    counts = {status: sum(r.status == status for r in results) for status in ("pass", "fail", "missing", "skipped")}
    return GateVerdict(
        passed=not any(r.failed for r in results),
        results=results,
        summary_path=summary_path,
        rules_path=str(rules_path),
        baseline_path=baseline_path,
        counts=counts,
        run_verdict=_run_verdict(summary),
    )


def _run_verdict(summary: dict) -> str | None:
    """``status: headline`` of the summary's verdict (older summaries have none)."""
    verdict = summary.get("verdict")
    if not isinstance(verdict, dict) or not isinstance(verdict.get("status"), str):
        return None
    status, headline = str(verdict["status"]), str(verdict.get("headline") or "")
    return terminal_safe(headline if headline.startswith(status) else f"{status}: {headline}".rstrip(": "))
