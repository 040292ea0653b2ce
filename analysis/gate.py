"""The CI gate: check a run's ``summary.json`` against a TOML rules file.

A gate turns the analysis into a pass/fail signal a CI job can act on. Rules are
small comparisons on summary figures named by dotted path, parsed by a tiny
tokenizer (never ``eval``), plus relative limits against a baseline run's
summary. The grammar is documented in ``docs/GATE_RULES.md``.

Outcomes per rule: ``pass``, ``fail``, ``missing`` (the figure is absent or
null in the summary: the run did not produce it, which fails the gate) and
``skipped`` (a relative rule when no baseline was given). The gate passes when
no rule is ``fail`` or ``missing``. A rules file that cannot be understood, or
a rule that compares a whole block or values of the wrong type, raises
:class:`~dsprof.errors.InputError` naming the rules file and the rule.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dsprof.errors import InputError

VERDICT_SCHEMA = "dsprof.gate_verdict/1"

_OPERATORS = {
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}
_ORDERING = {"<=", "<", ">=", ">"}

_PATH_PATTERN = r"[A-Za-z_]\w*(?:\.(?:\w+|\*))*"
_PATH = re.compile(_PATH_PATTERN)
# One token per alternative; anything the pattern does not match is a syntax error.
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<op><=|>=|==|!=|<|>)
      | (?P<sign>[-+])
      | (?P<times>\*)
      | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
      | (?P<string>"[^"]*"|'[^']*')
      | (?P<path>""" + _PATH_PATTERN + r""")
    )""",
    re.VERBOSE,
)
_LITERAL_WORDS = {"true": True, "false": False, "null": None}


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Operand:
    """The right side of a comparison: a literal, or a sum of figure paths and numbers.

    ``terms`` holds ``(factor, path)`` pairs, ``path`` None for a plain number:
    ``runner_run_ms.p50 + 0.5 * bind_ms.p50`` is ``((1, "runner_run_ms.p50"), (0.5, "bind_ms.p50"))``.
    """

    literal: Any = None
    terms: tuple[tuple[float, str | None], ...] = ()

    def describe(self) -> str:
        if not self.terms:
            return json.dumps(self.literal)
        parts = []
        for factor, path in self.terms:
            magnitude = abs(factor)
            text = _number(magnitude) if path is None else path if magnitude == 1 else f"{_number(magnitude)} * {path}"
            parts.append(("- " if factor < 0 else "+ ") + text)
        return " ".join(parts).removeprefix("+ ")


@dataclass(frozen=True)
class CheckRule:
    """``<path> <op> <operand>`` evaluated on one summary."""

    name: str
    text: str
    left: str
    op: str
    right: Operand


@dataclass(frozen=True)
class RelativeRule:
    """A figure may not get worse than the baseline's by more than a tolerance.

    ``worse`` says which direction is worse (``higher`` for latencies, ``lower``
    for throughput). The limit is ``baseline * (1 ± fraction) ± slack``, where
    ``slack`` is an absolute allowance in the figure's own unit so that a
    near-zero baseline does not make every change a failure.
    """

    name: str
    figure: str
    worse: str
    fraction: float | None
    absolute: float | None
    slack: float
    tolerance_text: str


@dataclass
class RuleResult:
    """The outcome of one rule (one row per concrete path when a rule has ``*``)."""

    name: str
    kind: str  # "check" | "relative"
    rule: str  # the rule as written
    path: str  # the concrete summary path checked
    status: str  # "pass" | "fail" | "missing" | "skipped"
    value: Any = None
    limit: Any = None
    baseline: Any = None
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "missing")


@dataclass
class GateVerdict:
    """The gate's answer; ``passed`` is what CI acts on."""

    passed: bool
    results: list[RuleResult]
    summary_path: str | None
    rules_path: str
    baseline_path: str | None = None
    counts: dict[str, int] = field(default_factory=dict)

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
            "results": [asdict(r) for r in self.results],
        }


def _number(value: float) -> str:
    return f"{value:g}"


def _tokenize(text: str, rules_path: Path, label: str) -> list[tuple[str, str]]:
    """``(kind, text)`` tokens; kinds: op, times, number, string, path."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    stripped_end = len(text.rstrip())
    while pos < stripped_end:
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise InputError(rules_path, f"{label}: cannot read {text[pos:].strip()!r} in {text!r}",
                             expected="<figure> <op> <value>, op one of <= < >= > == !=")
        kind = match.lastgroup
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    return tokens


def _operand(tokens: list[tuple[str, str]], rules_path: Path, label: str, text: str) -> Operand:
    """``literal`` or ``[-] term (+|- term)*`` with ``term = number | path | number * path | path * number``."""

    def bad(what: str) -> InputError:
        return InputError(rules_path, f"{label}: {what} in {text!r}",
                          expected="true/false/null, a quoted string, or a sum of numbers and figure paths "
                                   "(e.g. runner_run_ms.p50 + 0.5 * bind_ms.p50)")

    if len(tokens) == 1 and tokens[0][0] == "string":
        return Operand(literal=tokens[0][1][1:-1])
    if len(tokens) == 1 and tokens[0][1] in _LITERAL_WORDS:
        return Operand(literal=_LITERAL_WORDS[tokens[0][1]])
    if len(tokens) == 1 and tokens[0][0] == "number":
        value = tokens[0][1]
        return Operand(literal=float(value) if any(c in value for c in ".eE") else int(value))
    if len(tokens) == 2 and tokens[0] == ("sign", "-") and tokens[1][0] == "number":
        value = tokens[1][1]
        return Operand(literal=-(float(value) if any(c in value for c in ".eE") else int(value)))

    if tokens[0] == ("sign", "-"):  # a leading minus negates the first term
        tokens = tokens[1:]
        sign = -1.0
    else:
        sign = 1.0
    terms: list[tuple[float, str | None]] = []
    term: list[tuple[str, str]] = []
    for kind, value in [*tokens, ("sign", "+")]:  # a trailing '+' closes the last term
        if kind != "sign":
            term.append((kind, value))
            continue
        shape = [k for k, _ in term]
        if shape == ["number"]:
            terms.append((sign * float(term[0][1]), None))
        elif shape == ["path"] and term[0][1] not in _LITERAL_WORDS:
            terms.append((sign, term[0][1]))
        elif shape == ["number", "times", "path"]:
            terms.append((sign * float(term[0][1]), term[2][1]))
        elif shape == ["path", "times", "number"]:
            terms.append((sign * float(term[2][1]), term[0][1]))
        else:
            raise bad(f"cannot read {' '.join(v for _, v in term) or value!r} as a term")
        sign, term = (1.0 if value == "+" else -1.0), []
    if any(path is not None and "*" in path.split(".") for _, path in terms):
        raise bad("a '*' path is only allowed on the left side")
    return Operand(terms=tuple(terms))


def parse_check(text: str, rules_path: Path, label: str, name: str | None = None) -> CheckRule:
    """Parse ``"<path> <op> <operand>"`` into a :class:`CheckRule`."""
    tokens = _tokenize(text, rules_path, label)
    ops = [i for i, (kind, _) in enumerate(tokens) if kind == "op"]
    if len(ops) != 1:
        raise InputError(rules_path, f"{label}: {text!r} needs exactly one comparison operator",
                         expected="<figure> <op> <value>, op one of <= < >= > == !=")
    split = ops[0]
    left_tokens, right_tokens = tokens[:split], tokens[split + 1:]
    if len(left_tokens) != 1 or left_tokens[0][0] != "path" or left_tokens[0][1] in _LITERAL_WORDS:
        raise InputError(rules_path, f"{label}: the left side of {text!r} must be one figure path",
                         expected="e.g. runner_start_skew_ms.p95 <= 0.5")
    if not right_tokens:
        raise InputError(rules_path, f"{label}: {text!r} has nothing after the operator")
    return CheckRule(
        name=name or text,
        text=text,
        left=left_tokens[0][1],
        op=tokens[split][1],
        right=_operand(right_tokens, rules_path, label, text),
    )


def _parse_tolerance(raw: Any, rules_path: Path, label: str) -> tuple[float | None, float | None]:
    """``"20%"`` → (0.20, None); a plain number → (None, that many figure units)."""
    if isinstance(raw, bool):
        raise InputError(rules_path, f"{label}: tolerance {raw!r} is not a number or percentage",
                         expected='e.g. "20%" or 0.5')
    if isinstance(raw, (int, float)):
        if raw < 0:
            raise InputError(rules_path, f"{label}: tolerance {raw!r} is negative")
        return None, float(raw)
    if isinstance(raw, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*%\s*", raw)
        if match:
            return float(match.group(1)) / 100.0, None
    raise InputError(rules_path, f"{label}: tolerance {raw!r} is not a number or percentage",
                     expected='e.g. "20%" or 0.5')


def load_rules(rules_path: str | Path) -> list[CheckRule | RelativeRule]:
    """Read and parse a rules file; raise :class:`InputError` on anything unclear."""
    rules_path = Path(rules_path)
    try:
        with rules_path.open("rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError:
        raise InputError(rules_path, "rules file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(rules_path, f"not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise InputError(rules_path, "binary data, not TOML text", expected="a UTF-8 rules file") from None
    unknown = set(document) - {"rule", "relative"}
    if unknown:
        raise InputError(rules_path, f"unknown top-level key(s) {sorted(unknown)}",
                         expected="[[rule]] and [[relative]] tables")
    rules: list[CheckRule | RelativeRule] = []
    for index, table in enumerate(_tables(document, "rule", rules_path), start=1):
        label = f"[[rule]] #{index}"
        _only_keys(table, {"check", "name"}, rules_path, label)
        check = table.get("check")
        if not isinstance(check, str) or not check.strip():
            raise InputError(rules_path, f"{label}: needs check = \"<figure> <op> <value>\"")
        rules.append(parse_check(check.strip(), rules_path, f"{label} {table.get('name', '')}".rstrip(),
                                 name=table.get("name")))
    for index, table in enumerate(_tables(document, "relative", rules_path), start=1):
        label = f"[[relative]] #{index}"
        _only_keys(table, {"figure", "name", "max_increase", "max_decrease", "slack"}, rules_path, label)
        figure = table.get("figure")
        if not isinstance(figure, str) or not _PATH.fullmatch(figure):
            raise InputError(rules_path, f"{label}: figure must be a dotted figure path", expected='e.g. "runner_end_skew_ms.p99"')
        has_inc, has_dec = "max_increase" in table, "max_decrease" in table
        if has_inc == has_dec:
            raise InputError(rules_path, f"{label} ({figure}): give exactly one of max_increase or max_decrease")
        raw = table["max_increase"] if has_inc else table["max_decrease"]
        fraction, absolute = _parse_tolerance(raw, rules_path, f"{label} ({figure})")
        slack = table.get("slack", 0.0)
        if isinstance(slack, bool) or not isinstance(slack, (int, float)) or slack < 0:
            raise InputError(rules_path, f"{label} ({figure}): slack must be a non-negative number")
        key = "max_increase" if has_inc else "max_decrease"
        rules.append(RelativeRule(
            name=table.get("name") or f"{figure} {key} {raw}",
            figure=figure,
            worse="higher" if has_inc else "lower",
            fraction=fraction,
            absolute=absolute,
            slack=float(slack),
            tolerance_text=f"{key} = {json.dumps(raw)}" + (f", slack = {_number(slack)}" if slack else ""),
        ))
    if not rules:
        raise InputError(rules_path, "no rules", expected="at least one [[rule]] or [[relative]] table")
    return rules


def _tables(document: dict, key: str, rules_path: Path) -> list[dict]:
    tables = document.get(key, [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise InputError(rules_path, f"{key} must be an array of tables", expected=f"[[{key}]]")
    return tables


def _only_keys(table: dict, allowed: set[str], rules_path: Path, label: str) -> None:
    unknown = set(table) - allowed
    if unknown:
        raise InputError(rules_path, f"{label}: unknown key(s) {sorted(unknown)}", expected=f"keys {sorted(allowed)}")


# --------------------------------------------------------------------------- summaries


def load_summary(summary_or_dir: str | Path | dict) -> tuple[dict, str | None]:
    """A summary dict, a ``summary.json`` path, or an artifact dir holding one."""
    if isinstance(summary_or_dir, dict):
        return summary_or_dir, None
    path = Path(summary_or_dir)
    if path.is_dir():
        path = path / "summary.json"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(path, "not found", expected="summary.json or an artifact directory holding one") from None
    except IsADirectoryError:
        raise InputError(path, "is a directory", expected="summary.json") from None
    except UnicodeDecodeError:
        raise InputError(path, "binary data, not JSON text", expected="summary.json") from None
    try:
        summary = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(path, f"not valid JSON: {exc.msg}", line=exc.lineno) from None
    if not isinstance(summary, dict) or not str(summary.get("schema", "")).startswith("dsprof.summary/"):
        raise InputError(path, "not a dsprof summary", expected='a JSON object with "schema": "dsprof.summary/1"')
    return summary, str(path)


ABSENT = object()  # what resolve() returns for a path the summary lacks


def _lookup(summary: dict, parts: list[str]) -> Any:
    node: Any = summary
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return ABSENT
    return node


def resolve(summary: dict, path: str) -> list[tuple[str, Any]]:
    """Concrete ``(path, value)`` pairs for a dotted path; absent values come back as :data:`ABSENT`.

    A path not found from the top is tried under ``figures.``; a ``*`` segment
    matches every key of the dict (or index of the list) at that level.
    """
    parts = path.split(".")
    if parts[0] not in summary and "figures" in summary and isinstance(summary["figures"], dict) \
            and parts[0] in summary["figures"]:
        parts = ["figures", *parts]
    matches: list[tuple[list[str], Any]] = [([], summary)]
    for part in parts:
        expanded: list[tuple[list[str], Any]] = []
        for prefix, node in matches:
            if part == "*":
                if isinstance(node, dict):
                    expanded.extend(([*prefix, str(k)], v) for k, v in node.items())
                elif isinstance(node, list):
                    expanded.extend(([*prefix, str(i)], v) for i, v in enumerate(node))
            else:
                expanded.append(([*prefix, part], _lookup(node, [part]) if node is not ABSENT else ABSENT))
        matches = expanded
    if not matches:  # a wildcard over an empty or absent block
        return [(path, ABSENT)]
    return [(".".join(p), v) for p, v in matches]


# --------------------------------------------------------------------------- evaluation


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    if _is_number(value):
        return "number"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "block"


def _right_side(rule: CheckRule, summary: dict, rules_path: Path) -> tuple[Any, str | None]:
    """The right side's value, or the path that is missing from the summary."""
    if not rule.right.terms:
        return rule.right.literal, None
    if len(rule.right.terms) == 1 and rule.right.terms[0][0] == 1.0:  # one path as it is, of any type
        (concrete, value), = resolve(summary, rule.right.terms[0][1])
        return (None, concrete) if value is ABSENT or value is None else (value, None)
    total = 0.0
    for factor, term_path in rule.right.terms:
        if term_path is None:
            total += factor
            continue
        (concrete, value), = resolve(summary, term_path)
        if value is ABSENT or value is None:
            return None, concrete
        if not _is_number(value):
            raise InputError(rules_path, f"rule {rule.text!r}: {concrete} is a {_kind(value)}, not a number",
                             expected="figure paths on the right side of a sum to name numbers")
        total += factor * value
    return total, None


def _evaluate_check(rule: CheckRule, summary: dict, rules_path: Path) -> list[RuleResult]:
    results = []
    for path, value in resolve(summary, rule.left):
        def result(status: str, limit: Any = None, detail: str = "") -> RuleResult:
            shown = None if value is ABSENT else value
            return RuleResult(rule.name, "check", rule.text, path, status, shown, limit, None, detail)

        limit, missing = _right_side(rule, summary, rules_path)
        if missing is not None:
            results.append(result("missing", None, f"{missing} is missing from the summary"))
            continue
        if value is ABSENT or (value is None and limit is not None):
            results.append(result("missing", limit, f"{path} is missing from the summary"))
            continue
        if _kind(value) == "block":
            raise InputError(rules_path, f"rule {rule.text!r}: {path} is a block, not a value",
                             expected=f"a leaf such as {path}.{next(iter(value), 'p95')}" if isinstance(value, dict) else "a leaf value")
        if _kind(value) != _kind(limit) and not (limit is None and rule.op in ("==", "!=")):
            raise InputError(rules_path, f"rule {rule.text!r}: compares {path} ({_kind(value)}, {value!r}) "
                                         f"with a {_kind(limit)}", expected=f"a {_kind(value)} on the right side")
        if rule.op in _ORDERING and _kind(value) != "number":
            raise InputError(rules_path, f"rule {rule.text!r}: {rule.op} needs numbers, {path} is a {_kind(value)}",
                             expected="== or != for booleans and strings")
        ok = _OPERATORS[rule.op](value, limit)
        detail = f"{_show(value)} {rule.op} {_show(limit)}"
        if rule.right.terms:
            detail += f" ({rule.right.describe()})"
        results.append(result("pass" if ok else "fail", limit, detail))
    return results


def _evaluate_relative(rule: RelativeRule, summary: dict, baseline: dict | None, rules_path: Path) -> list[RuleResult]:
    results = []
    for path, value in resolve(summary, rule.figure):
        def result(status: str, limit: Any = None, base: Any = None, detail: str = "") -> RuleResult:
            shown = None if value is ABSENT else value
            return RuleResult(rule.name, "relative", f"{rule.figure} {rule.tolerance_text}", path, status,
                              shown, limit, base, detail)

        if baseline is None:
            results.append(result("skipped", detail="no baseline given"))
            continue
        base = _lookup(baseline, path.split("."))
        if value is ABSENT or value is None:
            results.append(result("missing", detail=f"{path} is missing from the summary"))
            continue
        if base is ABSENT or base is None:
            results.append(result("missing", detail=f"{path} is missing from the baseline"))
            continue
        if not (_is_number(value) and _is_number(base)):
            raise InputError(rules_path, f"relative rule {rule.name!r}: {path} is a {_kind(value)}, not a number")
        sign = 1.0 if rule.worse == "higher" else -1.0
        allowance = abs(base) * rule.fraction if rule.fraction is not None else rule.absolute
        limit = base + sign * (allowance + rule.slack)
        ok = value <= limit if rule.worse == "higher" else value >= limit
        change = value - base
        relative = f", {change / abs(base):+.1%}" if base != 0 else ""
        detail = (f"{_show(value)} vs baseline {_show(base)} ({change:+.3f}{relative}); "
                  f"limit {'<=' if sign > 0 else '>='} {_show(limit)}")
        results.append(result("pass" if ok else "fail", round(limit, 6), base, detail))
    return results


def _show(value: Any) -> str:
    if _is_number(value):
        return f"{value:.3f}" if isinstance(value, float) and not math.isinf(value) else str(value)
    return json.dumps(value)


def gate(
    summary_or_dir: str | Path | dict,
    rules_path: str | Path,
    *,
    baseline: str | Path | dict | None = None,
    junit: str | Path | None = None,
    verdict_path: str | Path | None = None,
) -> GateVerdict:
    """Check a summary against a rules file; optionally write a JSON verdict and JUnit XML."""
    rules_path = Path(rules_path)
    rules = load_rules(rules_path)
    summary, summary_path = load_summary(summary_or_dir)
    baseline_summary, baseline_path = load_summary(baseline) if baseline is not None else (None, None)
    results: list[RuleResult] = []
    for rule in rules:
        if isinstance(rule, CheckRule):
            results.extend(_evaluate_check(rule, summary, rules_path))
        else:
            results.extend(_evaluate_relative(rule, summary, baseline_summary, rules_path))
    counts = {status: sum(r.status == status for r in results) for status in ("pass", "fail", "missing", "skipped")}
    verdict = GateVerdict(
        passed=not any(r.failed for r in results),
        results=results,
        summary_path=summary_path,
        rules_path=str(rules_path),
        baseline_path=baseline_path,
        counts=counts,
    )
    if verdict_path is not None:
        Path(verdict_path).write_text(json.dumps(verdict.to_json(), indent=2) + "\n")
    if junit is not None:
        write_junit(verdict, junit)
    return verdict


def write_junit(verdict: GateVerdict, path: str | Path) -> Path:
    """One ``<testcase>`` per rule result, so CI systems show each rule by name."""
    suite = ET.Element("testsuite", {
        "name": "dsprof.gate",
        "tests": str(len(verdict.results)),
        "failures": str(verdict.counts.get("fail", 0) + verdict.counts.get("missing", 0)),
        "errors": "0",
        "skipped": str(verdict.counts.get("skipped", 0)),
    })
    for result in verdict.results:
        wildcard = "*" in result.rule.split()[0]
        name = f"{result.name} [{result.path}]" if wildcard else result.name
        case = ET.SubElement(suite, "testcase", {"classname": f"dsprof.gate.{result.kind}", "name": name})
        if result.failed:
            failure = ET.SubElement(case, "failure", {"message": f"{result.status}: {result.detail}",
                                                       "type": result.status})
            failure.text = f"rule: {result.rule}\npath: {result.path}\nvalue: {result.value}\nlimit: {result.limit}"
        elif result.status == "skipped":
            ET.SubElement(case, "skipped", {"message": result.detail})
    path = Path(path)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return path


def format_verdict(verdict: GateVerdict) -> str:
    """One line per rule result (status, path, value vs limit), then the overall verdict."""
    width = max((len(r.path) for r in verdict.results), default=0)
    lines = []
    for r in verdict.results:
        lines.append(f"{r.status.upper():7} {r.path:<{width}}  {r.detail}")
    c = verdict.counts
    lines.append(
        f"gate {'PASSED' if verdict.passed else 'FAILED'}: {c.get('pass', 0)} passed, {c.get('fail', 0)} failed, "
        f"{c.get('missing', 0)} missing, {c.get('skipped', 0)} skipped ({verdict.rules_path})"
    )
    return "\n".join(lines)
