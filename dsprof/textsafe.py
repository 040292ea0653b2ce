"""Untrusted text made safe to print: what a summary or a trace says must not drive the terminal.

Device names, rule names, span names and error details come from files anyone
can write. Printed as they are, an ESC or CSI byte starts an escape sequence
(colours, cursor moves, OSC 52 clipboard writes, OSC 8 links, a retitled
window), a carriage return overwrites the start of a line, and bidirectional
overrides make a line read differently from what it holds. :func:`terminal_safe`
turns every such character into a visible ``\\x..``/``\\u....`` escape and leaves
all other text, non-ASCII letters included, as it is.

Its output is also valid XML 1.0 character data (no C0 controls, surrogates or
U+FFFE/U+FFFF), so the same function serves JUnit files read by CI systems.
:func:`toml_string` is the TOML target: a basic string that reads back as the
text and is terminal-safe as printed (``gate --suggest`` prints rules files).
"""

from __future__ import annotations

import re

_COMMON = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

# C0 controls and DEL, C1 controls (0x9b is a one-byte CSI on some terminals), the
# bidirectional marks, embeddings, overrides and isolates, the line and paragraph
# separators, lone surrogates (unprintable and unencodable) and the BMP noncharacters.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff\ufdd0-\ufdef\ufffe\uffff]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _COMMON:
        return _COMMON[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every character that could act on a terminal written as a visible escape.

    Idempotent: escapes are plain printable characters, so applying it twice
    changes nothing more. Backslashes are left as they are (the point is safety,
    not a reversible encoding).
    """
    return _UNSAFE.sub(_escape, text)


_TOML_UNSAFE = re.compile(f'["\\\\]|{_UNSAFE.pattern}')
_TOML_SHORT = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}


def _toml_escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _TOML_SHORT:
        return _TOML_SHORT[char]
    code = ord(char)
    return "\\ufffd" if 0xD800 <= code <= 0xDFFF else f"\\u{code:04x}"  # TOML has no escape for a lone surrogate


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string (quoted) that reads back as ``text``: a newline or quote in it cannot start a table.

    Every character :func:`terminal_safe` escapes is written as a TOML escape, so the
    line is also safe to print; a lone surrogate (an undecodable file name byte) becomes U+FFFD.
    """
    return '"' + _TOML_UNSAFE.sub(_toml_escape, text) + '"'
