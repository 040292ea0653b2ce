"""The STRACE text format (SPEC §2), written and read in one place.

Every producer (the live emitter, the synthetic log generator) formats records
through these functions and every reader decodes values through
:func:`decode_value`, so the escaping rules cannot drift apart.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

STRACE_VERSION = 1
# Linux guarantees a single write() of at most PIPE_BUF bytes to a pipe is not
# interleaved with writes of other processes sharing it.
PIPE_BUF = 4096
# Longest attribute value (after escaping) kept before capping it with "~".
MAX_VALUE_CHARS = 256
VALUE_CAP_MARK = "~"
# The `callable` attribute of a decode root (SPEC §2): the fused decode program.
DECODE_CALLABLE = "decode.main+verify+mtp"

# Bytes that would break the space-separated k=v grammar or the log prefix.
_NEEDS_ESCAPE = re.compile(r"[\x00-\x20\x7f\[\]%=]")


def encode_value(value: object, cap: int = MAX_VALUE_CHARS) -> str:
    """Percent-encode a name or attribute value and cap its length with ``~``."""
    text = value if isinstance(value, str) else str(value)
    if _NEEDS_ESCAPE.search(text):
        text = _NEEDS_ESCAPE.sub(lambda m: "%{:02X}".format(ord(m.group())), text)
    if len(text) > cap:
        text = text[: cap - 1]
        # never cut an escape sequence in half
        cut = text.rfind("%", len(text) - 2)
        if cut != -1:
            text = text[:cut]
        text += VALUE_CAP_MARK
    return text


def decode_value(text: str) -> str:
    """Undo :func:`encode_value` (a capped value keeps its trailing ``~``)."""
    if "%" not in text:
        return text
    return unquote(text, errors="replace")


def format_prefix(mono_ns: int, thread_ident: int, level: str, func: str) -> str:
    """The log-record prefix every line of the native runtime's log starts with."""
    return f"[mono_ns={mono_ns}][T0x{thread_ident:x}][{level}] {func}: "


def format_strace_payload(
    *,
    pid: int,
    tid: int,
    inv: int,
    hid: str,
    depth: int,
    name: str,
    ts_ns: int,
    dur_ns: int,
    attrs: dict | None = None,
) -> str:
    """One ``[STRACE]`` payload; attribute order is kept as given."""
    parts = [
        f"[STRACE] v={STRACE_VERSION} pid={pid} tid={tid} inv={inv} hid={hid}",
        f"depth={depth} name={encode_value(name)} ts={ts_ns} dur={dur_ns}",
    ]
    if attrs:
        parts.append(" ".join(f"{encode_value(k)}={encode_value(v)}" for k, v in attrs.items()))
    return " ".join(parts)


def format_anchor_payload(pid: int, mono_ns: int, wall_ns: int) -> str:
    return f"[CLOCK_ANCHOR] v=1 pid={pid} mono_ns={mono_ns} wall_ns={wall_ns}"


def format_chip_ready_payload(pid: int, device: str) -> str:
    return f"[chip_process pid={pid} dev={encode_value(device)}] ready"


def fit_record(line: str, limit: int = PIPE_BUF) -> str:
    """Trim trailing attributes so a whole record (newline included) fits one atomic write.

    Attributes are dropped from the end, whole, and ``trunc=1`` marks the record,
    so a reader never sees half a key=value pair.
    """
    if len(line.encode()) + 1 <= limit:
        return line
    marker = " trunc=1"
    body = line
    while len(body.encode()) + len(marker) + 1 > limit and " " in body:
        body = body.rsplit(" ", 1)[0]
    return body + marker
