"""The gate's rules language: a TOML rules file read into typed rules (docs/GATE_RULES.md).

Rules are small comparisons on summary figures named by dotted path, read by a
tiny tokenizer (never ``eval``), plus relative limits against a baseline run's
summary and ``change = "worse"`` rules judged on a run history. Anything unclear (bad TOML, nesting deeper than a rules file needs, an
unknown key, a non-finite limit, a digit outside ASCII) is an
:class:`~dsprof.errors.InputError` naming the rules file and the rule; checking
rules against a summary is :mod:`dsprof.analysis.policy.gate`.
"""

from __future__ import annotations

import json
import operator
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsprof.analysis.summary import is_number
from dsprof.errors import InputError

COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
    "==": operator.eq,
    "!=": operator.ne,
}
ORDERING = frozenset({"<=", "<", ">=", ">"})

# A rules file needs two levels of brackets ([[rule]]); the TOML reader recurses once per level,
# so a deeper file is refused before it is parsed instead of exhausting the stack.
MAX_NESTING = 32

# ASCII only: '\d' and '\w' would otherwise read '٥' as the digit 5.
_PATH_PATTERN = r"[A-Za-z_]\w*(?:\.(?:\w+|\*))*"
_PATH = re.compile(_PATH_PATTERN, re.ASCII)
# One token per alternative; anything the pattern does not match is a syntax error.
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<op><=|>=|==|!=|<|>)
      | (?P<sign>[-+])
      | (?P<times>\*)
      | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
      | (?P<string>"[^"]*"|'[^']*')
      | (?P<path>"""
    + _PATH_PATTERN
    + r""")
    )""",
    re.VERBOSE | re.ASCII,
)
_PERCENTAGE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*%\s*", re.ASCII)
# What can hold a bracket in TOML without opening a level: strings (multi-line first) and comments.
_TOML_NESTING = re.compile(r'"""(?:\\.|[^\\])*?"""|\'\'\'.*?\'\'\'|"(?:\\.|[^"\\\n])*"|\'[^\'\n]*\'|#[^\n]*|[\[{]|[\]}]', re.DOTALL)
_LITERAL_WORDS = {"true": True, "false": False, "null": None}
_NOT_FINITE_WORDS = {"nan", "inf", "infinity"}
_CHECK_EXPECTED = "<figure> <op> <value>, op one of <= < >= > == !="


@dataclass(frozen=True)
class Operand:
    """The right side of a comparison: a literal, or a sum of figure paths and numbers.

    ``terms`` holds ``(factor, path)`` pairs, ``path`` None for a plain number:
    ``runner_run_ms.p50 + 0.5 * bind_ms.p50`` is ``((1, "runner_run_ms.p50"), (0.5, "bind_ms.p50"))``.
    """

    literal: Any = None
    terms: tuple[tuple[float, str | None], ...] = ()

    def describe(self) -> str:
        """The sum as a person would write it (``runner_run_ms.p50 + 0.5 * bind_ms.p50``)."""
        if not self.terms:
            return json.dumps(self.literal)
        parts = []
        for factor, path in self.terms:
            magnitude = abs(factor)
            text = plain(magnitude) if path is None else path if magnitude == 1 else f"{plain(magnitude)} * {path}"
            parts.append(("- " if factor < 0 else "+ ") + text)
        return " ".join(parts).removeprefix("+ ")


@dataclass(frozen=True)
class CheckRule:
    """``<path> <op> <operand>`` evaluated on one summary; ``label`` names it in errors."""

    name: str
    text: str
    left: str
    op: str
    right: Operand
    label: str


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
    label: str


@dataclass(frozen=True)
class ChangeRule:
    """``change = "worse"``: fail when the figure's history has a change for the worse in its newest runs.

    Judged on the run history given to ``gate --history`` (the run being gated
    appended as its newest run when it is not stored yet); ``figure`` may hold
    ``*`` segments, matched against the figures the history stores.
    """

    name: str
    figure: str
    newest: int
    label: str


Rule = CheckRule | RelativeRule | ChangeRule


def plain(value: float) -> str:
    """A number as a rule would write it (``0.5``, ``20``)."""
    return f"{value:g}"


def value_kind(value: Any) -> str:
    """What a rule can compare a value as: number, boolean, string, null, or a whole block."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "block"


def value_text(value: Any) -> str:
    """A non-numeric value as the rules write it: true, false, null, a string as it is."""
    return value if isinstance(value, str) else json.dumps(value)


# --------------------------------------------------------------------------- the file


def load_rules(rules_path: str | Path) -> list[Rule]:
    """Read and parse a rules file; raise :class:`InputError` on anything unclear."""
    rules_path = Path(rules_path)
    document = _read_toml(rules_path)
    unknown = set(document) - {"rule", "relative"}
    if unknown:
        raise InputError(rules_path, f"unknown top-level key(s) {sorted(unknown)}", expected="[[rule]] and [[relative]] tables")
    rules: list[Rule] = []
    for index, table in enumerate(_tables(document, "rule", rules_path), start=1):
        label = f"[[rule]] #{index}"
        if "change" in table:
            rules.append(_change_rule(table, rules_path, label))
            continue
        _only_keys(table, {"check", "name"}, rules_path, label)
        name = _rule_name(table, rules_path, label)
        label = f"{label} {name!r}" if name else label
        check = table.get("check")
        if not isinstance(check, str) or not check.strip():
            raise InputError(rules_path, f'{label}: needs check = "<figure> <op> <value>"')
        rules.append(parse_check(check.strip(), rules_path, label, name=name))
    for index, table in enumerate(_tables(document, "relative", rules_path), start=1):
        rules.append(_relative_rule(table, rules_path, f"[[relative]] #{index}"))
    if not rules:
        raise InputError(rules_path, "no rules", expected="at least one [[rule]] or [[relative]] table")
    return rules


def _read_toml(rules_path: Path) -> dict:
    try:
        text = rules_path.read_bytes().decode()
    except FileNotFoundError:
        raise InputError(rules_path, "rules file not found") from None
    except UnicodeDecodeError:
        raise InputError(rules_path, "binary data, not TOML text", expected="a UTF-8 rules file") from None
    _check_nesting(text, rules_path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(rules_path, f"not valid TOML: {exc}") from None


def _check_nesting(text: str, rules_path: Path) -> None:
    """Refuse brackets and braces nested deeper than :data:`MAX_NESTING` (strings and comments aside)."""
    depth = 0
    for match in _TOML_NESTING.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_NESTING:
                line = text.count("\n", 0, match.start()) + 1
                raise InputError(rules_path, f"nested more than {MAX_NESTING} levels deep", line=line, expected="a flat rules file")
        elif token in "]}":
            depth = max(depth - 1, 0)


def _tables(document: dict, key: str, rules_path: Path) -> list[dict]:
    tables = document.get(key, [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise InputError(rules_path, f"{key} must be an array of tables", expected=f"[[{key}]]")
    return tables


def _only_keys(table: dict, allowed: set[str], rules_path: Path, label: str) -> None:
    unknown = set(table) - allowed
    if unknown:
        raise InputError(rules_path, f"{label}: unknown key(s) {sorted(unknown)}", expected=f"keys {sorted(allowed)}")


def _rule_name(table: dict, rules_path: Path, label: str) -> str | None:
    name = table.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise InputError(rules_path, f"{label}: name must be a non-empty string", expected='name = "what the rule asks"')
    return name


# --------------------------------------------------------------------------- [[rule]] check = "..."


def _tokenize(text: str, rules_path: Path, label: str) -> list[tuple[str, str]]:
    """``(kind, text)`` tokens; kinds: op, sign, times, number, string, path."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    stripped_end = len(text.rstrip())
    while pos < stripped_end:
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise InputError(rules_path, f"{label}: cannot read {text[pos:].strip()!r} in {text!r}", expected=_CHECK_EXPECTED)
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    return tokens


def _finite_literal(token: str, rules_path: Path, label: str, text: str) -> int | float:
    """A number written in a rule; one that is not a finite float (``1e999``, 400 digits) is an error."""
    value = float(token)  # float() reads any length of digits; int() would refuse beyond 4300
    if not is_number(value):
        raise InputError(rules_path, f"{label}: {token[:40]!r} in {text!r} is not a finite number", expected="a limit within ±1.8e308")
    return value if any(c in token for c in ".eE") else int(token)


def _operand(tokens: list[tuple[str, str]], rules_path: Path, label: str, text: str) -> Operand:
    """``literal`` or ``[-] term (+|- term)*`` with ``term = number | path | number * path | path * number``."""
    for kind, value in tokens:
        if kind == "path" and value.lower() in _NOT_FINITE_WORDS:
            raise InputError(
                rules_path,
                f"{label}: {value!r} in {text!r} is not a finite number",
                expected="a finite limit; NaN compares false with everything",
            )
    literal = _literal(tokens, rules_path, label, text)
    if literal is not None:
        return literal
    if tokens[0] == ("sign", "-"):  # a leading minus negates the first term
        tokens, sign = tokens[1:], -1.0
    else:
        sign = 1.0
    terms: list[tuple[float, str | None]] = []
    term: list[tuple[str, str]] = []
    for kind, value in [*tokens, ("sign", "+")]:  # a trailing '+' closes the last term
        if kind != "sign":
            term.append((kind, value))
            continue
        terms.append(_term(term, sign, value, rules_path, label, text))
        sign, term = (1.0 if value == "+" else -1.0), []
    if any(path is not None and "*" in path.split(".") for _, path in terms):
        raise _operand_error("a '*' path is only allowed on the left side", rules_path, label, text)
    return Operand(terms=tuple(terms))


def _literal(tokens: list[tuple[str, str]], rules_path: Path, label: str, text: str) -> Operand | None:
    """A right side that is one value: a string, true/false/null, or a (negative) number."""
    if len(tokens) == 1 and tokens[0][0] == "string":
        return Operand(literal=tokens[0][1][1:-1])
    if len(tokens) == 1 and tokens[0][1] in _LITERAL_WORDS:
        return Operand(literal=_LITERAL_WORDS[tokens[0][1]])
    if len(tokens) == 1 and tokens[0][0] == "number":
        return Operand(literal=_finite_literal(tokens[0][1], rules_path, label, text))
    if len(tokens) == 2 and tokens[0] == ("sign", "-") and tokens[1][0] == "number":
        return Operand(literal=-_finite_literal(tokens[1][1], rules_path, label, text))
    return None


def _term(term: list[tuple[str, str]], sign: float, closing: str, rules_path: Path, label: str, text: str) -> tuple[float, str | None]:
    """One ``(factor, path)`` term of a sum."""
    shape = [kind for kind, _ in term]
    if shape == ["number"]:
        return sign * _finite_literal(term[0][1], rules_path, label, text), None
    if shape == ["path"] and term[0][1] not in _LITERAL_WORDS:
        return sign, term[0][1]
    if shape == ["number", "times", "path"]:
        return sign * _finite_literal(term[0][1], rules_path, label, text), term[2][1]
    if shape == ["path", "times", "number"]:
        return sign * _finite_literal(term[2][1], rules_path, label, text), term[0][1]
    raise _operand_error(f"cannot read {' '.join(v for _, v in term) or closing!r} as a term", rules_path, label, text)


def _operand_error(what: str, rules_path: Path, label: str, text: str) -> InputError:
    return InputError(
        rules_path,
        f"{label}: {what} in {text!r}",
        expected="true/false/null, a quoted string, or a sum of numbers and figure paths (e.g. runner_run_ms.p50 + 0.5 * bind_ms.p50)",
    )


def parse_check(text: str, rules_path: Path, label: str, name: str | None = None) -> CheckRule:
    """Parse ``"<path> <op> <operand>"`` into a :class:`CheckRule`."""
    tokens = _tokenize(text, rules_path, label)
    ops = [i for i, (kind, _) in enumerate(tokens) if kind == "op"]
    if len(ops) != 1:
        raise InputError(rules_path, f"{label}: {text!r} needs exactly one comparison operator", expected=_CHECK_EXPECTED)
    split = ops[0]
    left_tokens, right_tokens = tokens[:split], tokens[split + 1 :]
    if len(left_tokens) != 1 or left_tokens[0][0] != "path" or left_tokens[0][1] in _LITERAL_WORDS:
        raise InputError(
            rules_path, f"{label}: the left side of {text!r} must be one figure path", expected="e.g. runner_start_skew_ms.p95 <= 0.5"
        )
    if not right_tokens:
        raise InputError(rules_path, f"{label}: {text!r} has nothing after the operator")
    op, right = tokens[split][1], _operand(right_tokens, rules_path, label, text)
    if op in ORDERING and not right.terms and value_kind(right.literal) != "number":
        raise InputError(
            rules_path,
            f"{label}: {op} needs numbers, not {value_text(right.literal)} in {text!r}",
            expected="== or != for booleans, strings and null",
        )
    return CheckRule(name=name or text, text=text, left=left_tokens[0][1], op=op, right=right, label=label)


# --------------------------------------------------------------------------- [[rule]] change = "worse"

MAX_NEWEST = 10_000


def _change_rule(table: dict, rules_path: Path, label: str) -> ChangeRule:
    """``[[rule]] figure = "<path>"  change = "worse"  newest = N`` (N default 5)."""
    _only_keys(table, {"figure", "change", "newest", "name"}, rules_path, label)
    name = _rule_name(table, rules_path, label)
    figure = table.get("figure")
    if not isinstance(figure, str) or not _PATH.fullmatch(figure):
        raise InputError(
            rules_path, f'{label}: change = "worse" needs figure = a dotted figure path', expected='e.g. "step_interval_ms.p50"'
        )
    if table["change"] != "worse":
        raise InputError(rules_path, f"{label}: change = {table['change']!r} is not a change rule", expected='change = "worse"')
    newest = table.get("newest", 5)
    if isinstance(newest, bool) or not isinstance(newest, int) or not 1 <= newest <= MAX_NEWEST:
        raise InputError(rules_path, f"{label}: newest = {newest!r} is not a whole number of runs", expected=f"1 to {MAX_NEWEST}")
    return ChangeRule(name=name or f'{figure} change = "worse"', figure=figure, newest=newest, label=f"{label} ({name or figure!r})")


# --------------------------------------------------------------------------- [[relative]]


def _relative_rule(table: dict, rules_path: Path, label: str) -> RelativeRule:
    """One ``[[relative]]`` table: a figure, one of max_increase / max_decrease, an optional slack."""
    _only_keys(table, {"figure", "name", "max_increase", "max_decrease", "slack"}, rules_path, label)
    name = _rule_name(table, rules_path, label)
    figure = table.get("figure")
    if not isinstance(figure, str) or not _PATH.fullmatch(figure):
        raise InputError(rules_path, f"{label}: figure must be a dotted figure path", expected='e.g. "runner_end_skew_ms.p99"')
    label = f"{label} ({name or figure!r})"
    has_inc, has_dec = "max_increase" in table, "max_decrease" in table
    if has_inc == has_dec:
        raise InputError(rules_path, f"{label}: give exactly one of max_increase or max_decrease")
    key = "max_increase" if has_inc else "max_decrease"
    raw = table[key]
    fraction, absolute = _parse_tolerance(raw, rules_path, label)
    slack = table.get("slack", 0.0)
    if not is_number(slack) or slack < 0:
        raise InputError(
            rules_path,
            f"{label}: slack {slack!r} is not a finite, non-negative number",
            expected="e.g. slack = 0.05 (in the figure's unit)",
        )
    return RelativeRule(
        name=name or f"{figure} {key} {raw}",
        figure=figure,
        worse="higher" if has_inc else "lower",
        fraction=fraction,
        absolute=absolute,
        slack=float(slack),
        tolerance_text=f"{key} = {json.dumps(raw)}" + (f", slack = {plain(slack)}" if slack else ""),
        label=label,
    )


def _parse_tolerance(raw: Any, rules_path: Path, label: str) -> tuple[float | None, float | None]:
    """``"20%"`` → (0.20, None); a plain number → (None, that many figure units). NaN and inf are refused."""
    expected = 'a finite, non-negative number or percentage, e.g. "20%" or 0.5'
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        if not is_number(raw) or raw < 0:
            raise InputError(rules_path, f"{label}: tolerance {raw!r} is not finite and non-negative", expected=expected)
        return None, float(raw)
    if isinstance(raw, str):
        match = _PERCENTAGE.fullmatch(raw)
        if match and is_number(float(match.group(1))):
            return float(match.group(1)) / 100.0, None
    raise InputError(rules_path, f"{label}: tolerance {raw!r} is not a number or percentage", expected=expected)
