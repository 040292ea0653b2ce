"""terminal_safe and toml_string: untrusted text cannot drive a terminal or break out of a TOML string, and stays readable."""

from __future__ import annotations

import tomllib
import unicodedata
import xml.etree.ElementTree as ET

from hypothesis import given
from hypothesis import strategies as st

from dsprof.textsafe import terminal_safe, toml_string


def test_escape_sequences_become_visible_text():
    osc52 = "npu:0\x1b]52;c;ZWNobyBwd25lZA==\x07"  # OSC 52: write the clipboard
    assert terminal_safe(osc52) == "npu:0\\x1b]52;c;ZWNobyBwd25lZA==\\x07"
    assert terminal_safe("\x1b[2J\x1b[H") == "\\x1b[2J\\x1b[H"  # clear screen, cursor home
    assert terminal_safe("ok\rFAIL") == "ok\\rFAIL"  # a carriage return would overwrite the line
    assert terminal_safe("a\nb\tc\x00d\x7fe") == "a\\nb\\tc\\x00d\\x7fe"
    assert terminal_safe("\x9b31m") == "\\x9b31m"  # one-byte CSI (C1)
    assert terminal_safe("rank \u202e1 kcal") == "rank \\u202e1 kcal"  # bidi override
    assert terminal_safe("x\u2028y\u2066z") == "x\\u2028y\\u2066z"
    assert terminal_safe("\ud800") == "\\ud800"  # a lone surrogate cannot even be encoded


def test_ordinary_text_is_left_alone():
    text = "runner_start_skew_ms.p95 <= 0.5 ± 0.1 — Größe 日本語 🙂 \\x1b already escaped"
    assert terminal_safe(text) == text
    assert terminal_safe("") == ""


@given(st.text(alphabet=st.characters(exclude_categories=()), max_size=60))
def test_output_has_no_control_characters_is_idempotent_and_valid_xml(text):
    safe = terminal_safe(text)
    assert not any(unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp") for c in safe)
    assert not any(c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c" for c in safe)
    assert terminal_safe(safe) == safe
    element = ET.Element("case", {"name": safe})
    element.text = safe
    parsed = ET.fromstring(ET.tostring(element, encoding="unicode"))
    assert parsed.get("name") == safe and (parsed.text or "") == safe


@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=60))
def test_toml_strings_read_back_as_the_text_and_are_terminal_safe(text):
    quoted = toml_string(text)
    assert tomllib.loads(f"v = {quoted}\n# {quoted}\n") == {"v": text}  # as a value, and inside a comment
    assert terminal_safe(quoted) == quoted


def test_toml_string_escapes_what_would_end_the_string_or_the_line():
    assert toml_string('a"b\\c\n[[rule]]\x1b\u202e') == '"a\\"b\\\\c\\n[[rule]]\\u001b\\u202e"'
    assert toml_string("x\udc80") == '"x\\ufffd"'  # an undecodable file name byte: TOML has no escape for it
