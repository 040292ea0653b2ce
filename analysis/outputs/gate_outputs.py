"""What the gate prints and writes: the text verdict, JUnit XML, the JSON verdict, GitHub annotations and step summary.

Everything names the rule and passes untrusted text (rule names, figure paths,
summary strings) through :func:`dsprof.textsafe.terminal_safe`, then through
the escaping of its format (XML, GitHub workflow commands, markdown), so a
crafted rules file or summary cannot forge an annotation, a table row or a
terminal control sequence.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from dsprof.analysis.policy.gate import GateVerdict
from dsprof.fileio import atomic_output, atomic_write_text
from dsprof.textsafe import terminal_safe

RULES_ERROR_TITLE = "dsprof gate: rules error"


def write_verdict_json(verdict: GateVerdict, path: str | Path) -> Path:
    """The verdict as ``dsprof.gate_verdict/1`` JSON, for programs."""
    atomic_write_text(path, json.dumps(verdict.to_json(), indent=2, allow_nan=False) + "\n")
    return Path(path)


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
    why = f" — run {terminal_safe(verdict.run_verdict)}" if not verdict.passed and verdict.run_verdict else ""
    return (
        f"gate {'PASSED' if verdict.passed else 'FAILED'}: {c.get('pass', 0)} passed, {c.get('fail', 0)} failed, "
        f"{c.get('missing', 0)} missing, {c.get('skipped', 0)} skipped ({terminal_safe(verdict.rules_path)}){why}"
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
    lines = [f"### dsprof {_markdown_cell(_verdict_line(verdict))}", ""]
    if verdict.run_verdict:
        lines += [f"**verdict** {_markdown_cell(verdict.run_verdict)}", ""]
    lines += ["| status | rule | figure | outcome |", "|---|---|---|---|"]
    for r in verdict.results:
        status = f"**{r.status.upper()}**" if r.failed else r.status.upper()
        lines.append(f"| {status} | {_markdown_cell(r.name)} | {_markdown_cell(r.path)} | {_markdown_cell(r.detail)} |")
    return "\n".join(lines) + "\n\n"


def github_error_annotation(message: str) -> str:
    """``::error title=dsprof gate: rules error::<message>``: a gate that could not judge, shown on the run's page."""
    return f"::error title={_github_property(RULES_ERROR_TITLE)}::{_github_data(_log_safe(message))}"


def format_step_summary_error(message: str) -> str:
    """The step summary's line for a gate that could not judge (bad rules or summary)."""
    return f"### dsprof gate ERROR: {_markdown_cell(message)}\n\n"
