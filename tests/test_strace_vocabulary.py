"""The STRACE vocabulary in profiler/strace_format.py is the one the documented formats (docs/FORMATS.md) state.

A span or attribute renamed in the code and not in the docs (or the reverse)
fails here: both describe the serving stack's format, which dsprof must read
as written.
"""

from __future__ import annotations

import re
from pathlib import Path

from dsprof.profiler import strace_format as fmt

ROOT = Path(__file__).resolve().parents[1]
FORMATS = (ROOT / "docs" / "FORMATS.md").read_text()
SCANNER_C = (ROOT / "analysis" / "ingest" / "_strace_scan.c").read_text()


def _table_after(heading: str) -> list[list[str]]:
    """The rows (cells stripped of backticks) of the first table after ``heading``."""
    section = FORMATS.split(heading, 1)[1]
    rows = []
    for line in section.splitlines():
        if line.startswith("|"):
            rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # header and separator


def test_span_tree_names_and_depths():
    tree = {name: int(depth) for name, depth, _ in _table_after("### The span tree")}
    code = {
        fmt.ROOT: 0,
        fmt.BIND: 1,
        fmt.BIND_ARGS: 2,
        fmt.BIND_PREBUILT: 2,
        fmt.RUNNER_RUN: 1,
        fmt.FENCE_WAIT: 2,
        fmt.DEVICE_WALL: 2,
        fmt.CLAIM_RELEASE: 1,
        fmt.VALIDATE: 1,
    }
    assert tree == code


def test_root_and_identity_attributes():
    documented = {cell for row in _table_after("### Root attributes") for cell in re.split(r"[`, ]+", row[0]) if cell}
    assert documented == {*fmt.IDENTITY_ATTRS, fmt.RANK_ATTR, fmt.DEVICE_ATTR, fmt.CALLABLE_ATTR, fmt.STEP_ATTR}
    assert "The first five are the **pipeline identity**" in FORMATS
    assert fmt.IDENTITY_ATTRS == ("run_id", "dispatch_id", "run_epoch", "slot_id", "generation")


def test_host_evidence_and_gc_span():
    assert [row[0] for row in _table_after("### Host evidence")] == list(fmt.HOST_EVIDENCE_ATTRS)
    assert f"`name={fmt.GC}`" in FORMATS and f"`hid={fmt.GC_HID}`" in FORMATS
    assert f"`{fmt.GC_GEN_ATTR}` (0-2) and\n`{fmt.GC_COLLECTED_ATTR}`" in FORMATS


def test_record_grammar():
    assert f"{fmt.STRACE_MARKER} v={fmt.STRACE_VERSION} pid=<n> tid=<n> inv=<n> hid=<hex> depth=<n>" in FORMATS
    assert fmt.REQUIRED_FIELDS == ("v", "pid", "tid", "inv", "hid", "depth", "name", "ts", "dur")
    payload = fmt.format_strace_payload(pid=1, tid=2, inv=3, hid="ab", depth=0, name="chip.run", ts_ns=5, dur_ns=6, attrs={"k": "v w"})
    assert payload == "[STRACE] v=1 pid=1 tid=2 inv=3 hid=ab depth=0 name=chip.run ts=5 dur=6 k=v%20w"
    anchor = fmt.format_anchor_record(41, 100, 200, 0x1F)
    assert anchor == "[mono_ns=100][T0x1f][TIMING] clock_anchor: [CLOCK_ANCHOR] v=1 pid=41 mono_ns=100 wall_ns=200"
    assert fmt.DECODE_CALLABLE in FORMATS and fmt.WAIT_SUFFIX in FORMATS and f"`{fmt.EXTERNAL_PREFIX}<producer>.<span>`" in FORMATS


def test_phase_labels():
    assert fmt.phase_of(fmt.ROOT) == "root"
    assert fmt.phase_of(fmt.FENCE_WAIT) == fmt.PHASE_FENCE_WAIT
    assert fmt.phase_of(fmt.DEVICE_WALL + ".verify") == "device_wall.verify"
    assert fmt.phase_of(fmt.BIND_ARGS) == "bind.args"


def _c_functions(name: str) -> list[str]:
    """The bodies of every definition of C function ``name`` in the scanner (SSE2 and portable)."""
    return re.findall(r"static inline uint32_t " + name + r"\(.*?\n\}", SCANNER_C, re.S)


def test_the_compiled_scanner_keeps_the_format_grammar():
    """_strace_scan.c has its own grammar; where it copies names from strace_format, the copies agree."""
    kinds = re.search(r"KIND_NAMES\[\] = \{([^}]*)\}", SCANNER_C)
    assert kinds is not None
    c_kinds = re.findall(r'"(\w+)"', kinds.group(1))
    assert c_kinds == [fmt.KIND_VERSION, fmt.KIND_I64, fmt.KIND_N64, fmt.KIND_U64, fmt.KIND_TOKEN, fmt.KIND_TOKEN0]
    assert set(fmt.FIELD_KINDS.values()) <= set(c_kinds) and list(fmt.FIELD_KINDS) == list(fmt.REQUIRED_FIELDS)
    stops, special = _c_functions("stops"), _c_functions("special_bytes")
    assert len(stops) == len(special) == 2  # the SSE2 and the portable version
    for body in stops:  # the token separators (the percent sign is found for decoding, not as a separator)
        assert set(re.findall(r"'(.)'", body)) - {"%"} == set(fmt.TOKEN_SEPARATORS)
    for body in special:  # a line is searched for markers at '[' only
        assert set(re.findall(r"'(.)'", body)) == {"["}
    assert {marker[0] for marker in (fmt.STRACE_MARKER, fmt.ANCHOR_MARKER, fmt.CHIP_READY_MARKER)} == {"["}
    for char in fmt.TOKEN_SEPARATORS + "%":
        assert fmt.encode_value(char) == f"%{ord(char):02X}"
