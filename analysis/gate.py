"""The CI gate: check a run's ``summary.json`` against a TOML rules file.

A gate turns the analysis into a pass/fail signal a CI job can act on. Rules are
small comparisons on summary figures named by dotted path, parsed by a tiny
tokenizer (never ``eval``), plus relative limits against a baseline run's
summary. The grammar is documented in ``docs/GATE_RULES.md``.

Outcomes per rule: ``pass``, ``fail``, ``missing`` (the figure belongs to the
summary's schema but this run did not produce it: null, or a rank or item the
run does not have; this fails the gate) and ``skipped`` (a relative rule when
no baseline was given). The gate passes when no rule is ``fail`` or
``missing``. A rules file that cannot be understood, a figure path the summary
does not have (a typo: the error suggests the closest paths), a NaN or infinite
limit, or a rule that compares a whole block or values of the wrong type raises
:class:`~dsprof.errors.InputError` naming the rules file and the rule.

Everything printed or written for people (text lines, JUnit XML, GitHub
annotations and step summary) names the rule, shows numbers at the figure's own
precision with its unit, and passes untrusted text through
:func:`dsprof.textsafe.terminal_safe`.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import re
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from dsprof.analysis.summary import load_summary as read_summary
from dsprof.analysis.summary import summary_path
from dsprof.errors import InputError
from dsprof.fileio import atomic_output, atomic_write_text
from dsprof.textsafe import terminal_safe

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
# What holds when a comparison does not: a failed rule shows the relation the values really have.
_NEGATED = {"<=": ">", "<": ">=", ">=": "<", ">": "<=", "==": "!=", "!=": "=="}

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
      | (?P<path>"""
    + _PATH_PATTERN
    + r""")
    )""",
    re.VERBOSE,
)
_LITERAL_WORDS = {"true": True, "false": False, "null": None}
_NOT_FINITE_WORDS = {"nan", "inf", "infinity"}

# Blocks of summary/1 whose keys are the run's own (ranks, devices, drop reasons,
# workload settings): a key one of them lacks is a figure this run did not
# produce. Every other block has the same keys in every summary (null when not
# measured), so a path missing there is a mistake in the rules. Lists (items,
# per_step) are run-dependent as well: an index past the end was not produced.
RUN_KEYED_BLOCKS = frozenset(
    {
        "workload",
        "inputs.dropped",
        "validation.dropped",
        "validation.steps_per_rank",
        "figures.per_rank",
        "tail_steps.devices",
        "pipeline.cadence_ms",
        "pipeline.achieved_depth",
    }
)

# Units by figure-name suffix, longest first (``_tok_s`` before ``_s``).
_UNITS = (("_tok_s", "tok/s"), ("_ms", "ms"), ("_us", "us"), ("_ns", "ns"), ("_s", "s"))
_MAX_DECIMALS = 6  # float noise in a summary (0.30000000000000004) is not precision


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
        """The sum as a person would write it (``runner_run_ms.p50 + 0.5 * bind_ms.p50``)."""
        if not self.terms:
            return json.dumps(self.literal)
        parts = []
        for factor, path in self.terms:
            magnitude = abs(factor)
            text = _plain(magnitude) if path is None else path if magnitude == 1 else f"{_plain(magnitude)} * {path}"
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


@dataclass
class RuleResult:
    """The outcome of one rule (one row per concrete path when a rule has ``*``).

    ``detail`` is the sentence people read ("value 58.5 ms > limit 39.6 ms");
    ``value``, ``limit`` and ``baseline`` are the raw numbers for programs.
    """

    name: str
    kind: str  # "check" | "relative"
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
            "results": [{k: v for k, v in asdict(r).items() if k != "wildcard"} for r in self.results],
        }


def _plain(value: float) -> str:
    return f"{value:g}"


def _tokenize(text: str, rules_path: Path, label: str) -> list[tuple[str, str]]:
    """``(kind, text)`` tokens; kinds: op, times, number, string, path."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    stripped_end = len(text.rstrip())
    while pos < stripped_end:
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise InputError(
                rules_path,
                f"{label}: cannot read {text[pos:].strip()!r} in {text!r}",
                expected="<figure> <op> <value>, op one of <= < >= > == !=",
            )
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    return tokens


def _finite_literal(token: str, rules_path: Path, label: str, text: str) -> int | float:
    """A number written in a rule; one that is not a finite float (``1e999``, 400 digits) is an error."""
    value = float(token)  # float() reads any length of digits; int() would refuse beyond 4300
    if not math.isfinite(value):
        raise InputError(rules_path, f"{label}: {token[:40]!r} in {text!r} is not a finite number", expected="a limit within ±1.8e308")
    return value if any(c in token for c in ".eE") else int(token)


def _operand(tokens: list[tuple[str, str]], rules_path: Path, label: str, text: str) -> Operand:
    """``literal`` or ``[-] term (+|- term)*`` with ``term = number | path | number * path | path * number``."""

    def bad(what: str) -> InputError:
        return InputError(
            rules_path,
            f"{label}: {what} in {text!r}",
            expected="true/false/null, a quoted string, or a sum of numbers and figure paths (e.g. runner_run_ms.p50 + 0.5 * bind_ms.p50)",
        )

    def number(token: str) -> int | float:
        return _finite_literal(token, rules_path, label, text)

    for kind, value in tokens:
        if kind == "path" and value.lower() in _NOT_FINITE_WORDS:
            raise InputError(
                rules_path,
                f"{label}: {value!r} in {text!r} is not a finite number",
                expected="a finite limit; NaN compares false with everything",
            )
    if len(tokens) == 1 and tokens[0][0] == "string":
        return Operand(literal=tokens[0][1][1:-1])
    if len(tokens) == 1 and tokens[0][1] in _LITERAL_WORDS:
        return Operand(literal=_LITERAL_WORDS[tokens[0][1]])
    if len(tokens) == 1 and tokens[0][0] == "number":
        return Operand(literal=number(tokens[0][1]))
    if len(tokens) == 2 and tokens[0] == ("sign", "-") and tokens[1][0] == "number":
        return Operand(literal=-number(tokens[1][1]))

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
            terms.append((sign * number(term[0][1]), None))
        elif shape == ["path"] and term[0][1] not in _LITERAL_WORDS:
            terms.append((sign, term[0][1]))
        elif shape == ["number", "times", "path"]:
            terms.append((sign * number(term[0][1]), term[2][1]))
        elif shape == ["path", "times", "number"]:
            terms.append((sign * number(term[2][1]), term[0][1]))
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
        raise InputError(
            rules_path,
            f"{label}: {text!r} needs exactly one comparison operator",
            expected="<figure> <op> <value>, op one of <= < >= > == !=",
        )
    split = ops[0]
    left_tokens, right_tokens = tokens[:split], tokens[split + 1 :]
    if len(left_tokens) != 1 or left_tokens[0][0] != "path" or left_tokens[0][1] in _LITERAL_WORDS:
        raise InputError(
            rules_path, f"{label}: the left side of {text!r} must be one figure path", expected="e.g. runner_start_skew_ms.p95 <= 0.5"
        )
    if not right_tokens:
        raise InputError(rules_path, f"{label}: {text!r} has nothing after the operator")
    op, right = tokens[split][1], _operand(right_tokens, rules_path, label, text)
    if op in _ORDERING and not right.terms and _kind(right.literal) != "number":
        raise InputError(
            rules_path,
            f"{label}: {op} needs numbers, not {_text(right.literal)} in {text!r}",
            expected="== or != for booleans, strings and null",
        )
    return CheckRule(name=name or text, text=text, left=left_tokens[0][1], op=op, right=right, label=label)


def _parse_tolerance(raw: Any, rules_path: Path, label: str) -> tuple[float | None, float | None]:
    """``"20%"`` → (0.20, None); a plain number → (None, that many figure units). NaN and inf are refused."""
    expected = 'a finite, non-negative number or percentage, e.g. "20%" or 0.5'
    if isinstance(raw, bool):
        raise InputError(rules_path, f"{label}: tolerance {raw!r} is not a number or percentage", expected=expected)
    if isinstance(raw, (int, float)):
        if not _is_float_range(raw) or not math.isfinite(raw) or raw < 0:
            raise InputError(rules_path, f"{label}: tolerance {raw!r} is not finite and non-negative", expected=expected)
        return None, float(raw)
    if isinstance(raw, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*%\s*", raw)
        if match and math.isfinite(float(match.group(1))):
            return float(match.group(1)) / 100.0, None
    raise InputError(rules_path, f"{label}: tolerance {raw!r} is not a number or percentage", expected=expected)


def _rule_name(table: dict, rules_path: Path, label: str) -> str | None:
    name = table.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise InputError(rules_path, f"{label}: name must be a non-empty string", expected='name = "what the rule asks"')
    return name


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
        raise InputError(rules_path, f"unknown top-level key(s) {sorted(unknown)}", expected="[[rule]] and [[relative]] tables")
    rules: list[CheckRule | RelativeRule] = []
    for index, table in enumerate(_tables(document, "rule", rules_path), start=1):
        label = f"[[rule]] #{index}"
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
    if (
        isinstance(slack, bool)
        or not isinstance(slack, (int, float))
        or not _is_float_range(slack)
        or not math.isfinite(slack)
        or slack < 0
    ):
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
        tolerance_text=f"{key} = {json.dumps(raw)}" + (f", slack = {_plain(slack)}" if slack else ""),
        label=label,
    )


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
    """A summary dict as given, or the summary of a ``summary.json`` path or artifact dir, with its path."""
    if isinstance(summary_or_dir, dict):
        return summary_or_dir, None
    return dict(read_summary(summary_or_dir)), str(summary_path(summary_or_dir))


def _is_float_range(value: float) -> bool:
    try:
        float(value)
    except OverflowError:
        return False
    return True


def is_number(value: Any) -> bool:
    """A finite int or float, not a bool: what the gate can compare and the diff can average."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return _is_float_range(value) and math.isfinite(value)


@dataclass(frozen=True)
class Unavailable:
    """A figure of the summary's schema that this run did not produce; ``reason`` says why."""

    reason: str


class UnknownFigure(Exception):
    """A path the summary does not have: a mistake in the rules, not a property of the run."""

    def __init__(self, path: str, missing_at: str, suggestions: list[str]):
        self.path = path
        self.missing_at = missing_at
        self.suggestions = suggestions
        super().__init__(path)

    def describe(self) -> str:
        """``"x.y" is not a figure of this summary (no "x.y"); did you mean ...?"``"""
        text = f"{terminal_safe(self.path)} is not a figure of this summary"
        if self.missing_at != self.path:
            text += f" (it has no {terminal_safe(self.missing_at)})"
        if self.suggestions:
            text += "; did you mean " + " or ".join(terminal_safe(s) for s in self.suggestions) + "?"
        return text


def _figure_paths(summary: dict, limit: int = 20_000) -> Iterator[str]:
    """Leaf paths of a summary for suggestions: every fixed key, and ``*`` for run keys and list items (the first one's keys)."""
    stack: list[tuple[list[str], Any]] = [([], summary)]
    produced = 0
    while stack and produced < limit:
        prefix, node = stack.pop()
        if isinstance(node, dict):
            keyed = ".".join(prefix) in RUN_KEYED_BLOCKS
            children = itertools.islice(node.items(), 1) if keyed else node.items()
            stack.extend(([*prefix, "*" if keyed else str(k)], v) for k, v in children)
        elif isinstance(node, list):
            if node:
                stack.append(([*prefix, "*"], node[0]))
        elif prefix:
            produced += 1
            path = ".".join(prefix)
            yield path
            if prefix[0] == "figures" and len(prefix) > 1:
                yield path.removeprefix("figures.")


def _closest(path: str, candidates: Iterator[str], cutoff: float = 0.6, band: float = 0.05) -> list[str]:
    """Up to three paths most like ``path`` (difflib ratio), only those about as close as the best one."""
    scored = []
    for candidate in dict.fromkeys(candidates):
        matcher = difflib.SequenceMatcher(None, path, candidate)
        if matcher.real_quick_ratio() >= cutoff and matcher.quick_ratio() >= cutoff and matcher.ratio() >= cutoff:
            scored.append((-matcher.ratio(), candidate))
    scored.sort()
    return [candidate for score, candidate in scored[:3] if -score >= -scored[0][0] - band]


def _unknown(summary: dict, path: str, missing_at: str) -> UnknownFigure:
    return UnknownFigure(path, missing_at, _closest(path, _figure_paths(summary)))


def resolve(summary: dict, path: str) -> list[tuple[str, Any]]:
    """Concrete ``(path, value)`` pairs for a dotted path.

    A path not found from the top is tried under ``figures.``; a ``*`` segment
    matches every key of the dict (or index of the list) at that level. A value
    the run did not produce (under a null block, a rank or item it does not
    have, every rank of an empty per-rank block) comes back as
    :class:`Unavailable`; a wildcard over an empty list matches nothing (no
    items: nothing to check). A path the summary's schema does not have raises
    :class:`UnknownFigure`.
    """
    parts = path.split(".")
    if parts[0] not in summary and isinstance(summary.get("figures"), dict) and parts[0] in summary["figures"]:
        parts = ["figures", *parts]
    matches: list[tuple[list[str], Any]] = [([], summary)]
    for part in parts:
        expanded: list[tuple[list[str], Any]] = []
        for prefix, node in matches:
            where = ".".join(prefix)
            if isinstance(node, Unavailable):
                expanded.append(([*prefix, part], node))
            elif node is None:
                expanded.append(([*prefix, part], Unavailable(f"{where} is null in this run")))
            elif part == "*" and isinstance(node, dict):
                if not node:
                    expanded.append(([*prefix, part], Unavailable(f"{where} is empty in this run")))
                expanded.extend(([*prefix, str(k)], v) for k, v in node.items())
            elif part == "*" and isinstance(node, list):
                expanded.extend(([*prefix, str(i)], v) for i, v in enumerate(node))
            elif isinstance(node, dict) and part in node:
                expanded.append(([*prefix, part], node[part]))
            elif isinstance(node, dict) and where in RUN_KEYED_BLOCKS:
                expanded.append(([*prefix, part], Unavailable(f"{where} has no {part} in this run")))
            elif isinstance(node, list) and part.isdecimal():
                if int(part) < len(node):
                    expanded.append(([*prefix, part], node[int(part)]))
                else:
                    expanded.append(([*prefix, part], Unavailable(f"{where} has {len(node)} item(s) in this run")))
            else:
                raise _unknown(summary, path, ".".join([*prefix, part]))
        matches = expanded
    return [(".".join(p), v) for p, v in matches]


# --------------------------------------------------------------------------- numbers for people


def figure_unit(path: str) -> str:
    """The unit a figure's name declares: ``_ms`` ms, ``_s`` seconds, ``_tok_s`` tok/s; '' when none.

    The last segment with a unit suffix decides, so ``runner_end_skew_ms.p99``
    and ``pipeline.cadence_ms.3.p50`` are ms.
    """
    for segment in reversed(path.split(".")):
        for suffix, unit in _UNITS:
            if segment.endswith(suffix):
                return unit
    return ""


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


def _text(value: Any) -> str:
    """A non-numeric value as the rules write it: true, false, null, a string as it is."""
    return value if isinstance(value, str) else json.dumps(value)


def _with_unit(text: str, unit: str) -> str:
    return f"{text} {unit}" if unit else text


# --------------------------------------------------------------------------- evaluation


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "block"


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
    if _kind(value) == "number" and not is_number(value):
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
        if _kind(value) != "number":
            raise InputError(
                rules_path,
                f"{rule.label}: {term_path} is a {_kind(value)}, not a number",
                expected="figure paths on the right side of a sum to name numbers",
            )
        total += factor * float(value)
    if not math.isfinite(total):
        return None, f"the right side {rule.right.describe()} is beyond the float range"
    return total, None


def _check_detail(rule: CheckRule, path: str, value: Any, limit: Any, ok: bool) -> str:
    """``value 58.5 ms > limit 39.6 ms (runner_run_ms.p50 + 0.5 * bind_ms.p50)``: what holds, in the figure's unit."""
    op = rule.op if ok else _NEGATED[rule.op]
    if _kind(value) == "number" and _kind(limit) == "number":
        decimals = max(_decimals(value), _decimals(limit) if not rule.right.terms else 0)
        shown_value, shown_limit = _people_numbers([value, limit], decimals)
        unit = figure_unit(path)
        detail = f"value {_with_unit(shown_value, unit)} {op} limit {_with_unit(shown_limit, unit)}"
    elif ok:
        detail = f"value {_text(value)} {op} {_text(limit)}"
    else:
        detail = f"value {_text(value)}, expected {rule.op} {_text(limit)}"
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
        if _kind(value) == "block":
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
        if _kind(value) != _kind(limit) and not compares_null:
            raise InputError(
                rules_path,
                f"{rule.label}: compares {path} ({_kind(value)}, {terminal_safe(_text(value))}) with a {_kind(limit)}",
                expected=f"a {_kind(value)} on the right side",
            )
        if rule.op in _ORDERING and _kind(value) != "number":
            raise InputError(
                rules_path,
                f"{rule.label}: {rule.op} needs numbers, {path} is a {_kind(value)}",
                expected="== or != for booleans and strings",
            )
        if _kind(value) == "number" and not is_number(value):
            results.append(result(path, "missing", value, limit, f"no value: {path} is not a finite number"))
            continue
        ok = bool(_OPERATORS[rule.op](value, limit))
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
        return None, f"the baseline's {path} is {terminal_safe(_text(base))}, not a finite number"
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
        if _kind(value) != "number":
            raise InputError(
                rules_path, f"{rule.label}: {path} is a {_kind(value)}, not a number", expected="[[relative]] rules on numeric figures"
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


def gate(
    summary_or_dir: str | Path | dict,
    rules_path: str | Path,
    *,
    baseline: str | Path | dict | None = None,
    junit: str | Path | None = None,
    verdict_path: str | Path | None = None,
) -> GateVerdict:
    """Check a summary against a rules file; optionally write a JSON verdict and JUnit XML (atomically)."""
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
        atomic_write_text(verdict_path, json.dumps(verdict.to_json(), indent=2, allow_nan=False) + "\n")
    if junit is not None:
        write_junit(verdict, junit)
    return verdict


# --------------------------------------------------------------------------- outputs


def write_junit(verdict: GateVerdict, path: str | Path) -> Path:
    """One ``<testcase>`` per rule result, named by the rule, so CI systems show each rule by name.

    Every text goes through :func:`terminal_safe`, whose output holds only
    characters XML 1.0 allows: a rule name with NUL, ESC or BEL still gives a
    well-formed file.
    """
    suite = ET.Element(
        "testsuite",
        {
            "name": "dsprof.gate",
            "tests": str(len(verdict.results)),
            "failures": str(verdict.counts.get("fail", 0) + verdict.counts.get("missing", 0)),
            "errors": "0",
            "skipped": str(verdict.counts.get("skipped", 0)),
        },
    )
    for result in verdict.results:
        case = ET.SubElement(suite, "testcase", {"classname": f"dsprof.gate.{result.kind}", "name": terminal_safe(result.title)})
        if result.failed:
            failure = ET.SubElement(case, "failure", {"message": terminal_safe(result.detail), "type": result.status})
            failure.text = "\n".join(terminal_safe(line) for line in (result.detail, f"rule: {result.rule}", f"figure: {result.path}"))
        elif result.status == "skipped":
            ET.SubElement(case, "skipped", {"message": terminal_safe(result.detail)})
    root = ET.Element("testsuites")
    root.append(suite)
    with atomic_output(path) as handle:
        ET.ElementTree(root).write(handle, encoding="utf-8", xml_declaration=True)
    return Path(path)


def _verdict_line(verdict: GateVerdict) -> str:
    c = verdict.counts
    return (
        f"gate {'PASSED' if verdict.passed else 'FAILED'}: {c.get('pass', 0)} passed, {c.get('fail', 0)} failed, "
        f"{c.get('missing', 0)} missing, {c.get('skipped', 0)} skipped ({terminal_safe(verdict.rules_path)})"
    )


def format_verdict(verdict: GateVerdict) -> str:
    """One line per rule result (status, rule name, figure, value vs limit), then the overall verdict."""
    lines = [terminal_safe(f"{r.status.upper():7} {r.name} [{r.path}]: {r.detail}") for r in verdict.results]
    lines.append(_verdict_line(verdict))
    return "\n".join(lines)


def _github_data(text: str) -> str:
    """GitHub workflow-command message escaping: ``%``, CR and LF."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _github_property(text: str) -> str:
    """GitHub workflow-command property escaping: the message escapes plus ``:`` and ``,``."""
    return _github_data(text).replace(":", "%3A").replace(",", "%2C")


def _log_safe(text: str) -> str:
    """Untrusted text for the CI log: line breaks kept (GitHub escapes them), every other control made visible."""
    return "\n".join(terminal_safe(line) for line in text.split("\n"))


def github_annotations(verdict: GateVerdict) -> list[str]:
    """``::error title=<rule name>::<figure>: <detail>`` for every failed or missing rule result."""
    return [
        f"::error title={_github_property(_log_safe(r.title))}::{_github_data(_log_safe(f'{r.path}: {r.detail}'))}"
        for r in verdict.results
        if r.failed
    ]


_MARKDOWN_ESCAPES = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    "|": "&#124;",
    "\\": "\\\\",
    "`": "\\`",
    "*": "\\*",
    "_": "\\_",
    "[": "\\[",
    "]": "\\]",
}


def _markdown_cell(text: str) -> str:
    """Untrusted text as one markdown table cell: no controls, no cell breaks, no markup."""
    return "".join(_MARKDOWN_ESCAPES.get(char, char) for char in terminal_safe(text))


def format_step_summary(verdict: GateVerdict) -> str:
    """A markdown table of every rule's outcome, for ``$GITHUB_STEP_SUMMARY``."""
    lines = [f"### dsprof {_markdown_cell(_verdict_line(verdict))}", "", "| status | rule | figure | outcome |", "|---|---|---|---|"]
    for r in verdict.results:
        status = f"**{r.status.upper()}**" if r.failed else r.status.upper()
        lines.append(f"| {status} | {_markdown_cell(r.name)} | {_markdown_cell(r.path)} | {_markdown_cell(r.detail)} |")
    return "\n".join(lines) + "\n\n"
