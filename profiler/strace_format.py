"""The STRACE text format (docs/FORMATS.md, "STRACE"): the one place that defines it.

Every producer (the live emitter :mod:`dsprof.profiler.strace`, the synthetic
generator :mod:`dsprof.testing.synthetic`) builds records with
:func:`format_prefix` and :func:`format_strace_payload` (clock anchors and
chip_process lines with their own ``format_*`` functions), and every reader
takes the markers, the version, the field list, the span names and the
attribute names from here, so the grammar, the escaping and the vocabulary
cannot drift apart.

The vocabulary is the serving stack's. ``tests/test_strace_vocabulary.py``
checks it against the span tree and attribute tables of ``docs/FORMATS.md``,
so a name changed here and not there fails a test. The compiled scanner
(``analysis/ingest/_strace_scan.c``) keeps its own copy of the field kinds and
of the token separators; the same test file checks them against this module.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

# -- record grammar -------------------------------------------------------------------

STRACE_MARKER = "[STRACE]"
STRACE_VERSION = 1
ANCHOR_MARKER = "[CLOCK_ANCHOR]"
ANCHOR_VERSION = 1
CHIP_READY_MARKER = "[chip_process "
CHIP_READY_END = "] ready"
# The fields every record has, in this order, before its free ``k=v`` attributes.
VERSION_FIELD, TS_FIELD, DUR_FIELD = "v", "ts", "dur"
REQUIRED_FIELDS = (VERSION_FIELD, "pid", "tid", "inv", "hid", "depth", "name", TS_FIELD, DUR_FIELD)
# The fields after the version, which every record of a version has in this order.
VALUE_FIELDS = REQUIRED_FIELDS[1:]
# What each field's value is: KIND_VERSION the version's digits; KIND_I64 -?digits
# that fit int64; KIND_N64 digits that fit int64; KIND_U64 digits that fit uint64;
# KIND_TOKEN one or more token characters (encoded text, see encode_value);
# KIND_TOKEN0 possibly none. (The compiled scanner _strace_scan.c keeps a copy of the
# kind names: tests/test_strace_vocabulary.py::test_the_compiled_scanner_keeps_the_format_grammar.)
KIND_VERSION, KIND_I64, KIND_N64, KIND_U64, KIND_TOKEN, KIND_TOKEN0 = "version", "i64", "n64", "u64", "token", "token0"
FIELD_KINDS = {
    VERSION_FIELD: KIND_VERSION,
    "pid": KIND_I64,
    "tid": KIND_I64,
    "inv": KIND_U64,
    "hid": KIND_TOKEN,
    "depth": KIND_N64,
    "name": KIND_TOKEN0,
    TS_FIELD: KIND_I64,
    DUR_FIELD: KIND_I64,
}
# Characters that end a token besides ASCII space and control characters (so
# encode_value escapes them, with '%' itself). _strace_scan.c keeps a copy:
# tests/test_strace_vocabulary.py::test_the_compiled_scanner_keeps_the_format_grammar.
TOKEN_SEPARATORS = "[]="
# The fields of a clock anchor and of a chip_process line, in this order.
ANCHOR_FIELDS = (VERSION_FIELD, "pid", "mono_ns", "wall_ns")
CHIP_READY_FIELDS = ("pid", "dev")
# The log prefix (format_prefix): ``[<PREFIX_CLOCK>=<ns>][<PREFIX_THREAD><hex>][<level>] <func>: ``.
PREFIX_CLOCK, PREFIX_THREAD = "mono_ns", "T0x"
# Linux guarantees a single write() of at most PIPE_BUF bytes to a pipe is not
# interleaved with writes of other processes sharing it.
PIPE_BUF = 4096
# Longest attribute value (after escaping) kept before capping it with "~".
MAX_VALUE_CHARS = 256
VALUE_CAP_MARK = "~"
# The log prefix's function part for the lines the serving stack's reader insists
# on: it accepts a clock anchor only from a ``clock_anchor:`` record.
ANCHOR_FUNC = "clock_anchor"
ANCHOR_LEVEL = "TIMING"

# -- span names (docs/FORMATS.md, "The span tree of one rank's part of one run") ---------

ROOT = "chip.run"
BIND = "chip.run.bind"
BIND_ARGS = "chip.run.bind.args"
BIND_PREBUILT = "chip.run.bind.prebuilt"
RUNNER_RUN = "chip.run.runner_run"
FENCE_WAIT = "chip.run.runner_run.native_fence_wait"
DEVICE_WALL = "chip.run.runner_run.device_wall"
CLAIM_RELEASE = "chip.run.claim_release"
VALIDATE = "chip.run.validate"
# One Python garbage collection (docs/FORMATS.md, "Host evidence"): its own invocation, depth 0, hid 0.
GC = "host.gc"
GC_HID = "0"
# Spans of other producers: ``ext.<producer>.<span>``; never runtime spans.
EXTERNAL_PREFIX = "ext."
# A span whose last name segment ends so is time spent waiting on something else.
WAIT_SUFFIX = "_wait"
# A device-clock span waiting on a peer rank names it in this attribute.
PEER_ATTR = "peer"
# Device phases below ``device_wall`` (clk=dev): the fused decode program's three
# stages, and inside them one span per collective call, which waits for the peer
# ranks (``chip.run.runner_run.device_wall.forward.a2a_wait``).
DEVICE_FORWARD, DEVICE_VERIFY, DEVICE_MTP = "forward", "verify", "mtp"
A2A_WAIT = "a2a_wait"  # the MoE all-to-all (EP dispatch / combine)
ALLREDUCE_WAIT = "allreduce_wait"  # the TP all-reduce


def device_phase_name(path: str) -> str:
    """The span name of a device phase given its path below device_wall (``forward.a2a_wait``)."""
    return f"{DEVICE_WALL}.{path}"


# Phase labels: the span name below the root, with the runner_run level dropped
# (``chip.run.runner_run.native_fence_wait`` -> ``native_fence_wait``).
PHASE_ROOT = "root"
PHASE_BIND = "bind"
PHASE_RUNNER = "runner_run"
PHASE_FENCE_WAIT = "native_fence_wait"
PHASE_DEVICE_WALL = "device_wall"
PHASE_VALIDATE = "validate"


def phase_of(name: str) -> str:
    """The phase label of a runtime span name (``chip.run`` -> ``root``)."""
    if name == ROOT:
        return PHASE_ROOT
    rest = name[len(ROOT) + 1 :] if name.startswith(ROOT + ".") else name
    return rest[len(PHASE_RUNNER) + 1 :] if rest.startswith(PHASE_RUNNER + ".") else rest


# -- attributes -----------------------------------------------------------------------

CLK_ATTR = "clk"
CLK_DEVICE = "dev"
CLK_HOST = "host"
# Pipeline identity on a pipelined root (the stack's checker needs all five).
IDENTITY_ATTRS = ("run_id", "dispatch_id", "run_epoch", "slot_id", "generation")
# Further root attributes: where and what the run was.
RANK_ATTR, DEVICE_ATTR, CALLABLE_ATTR, STEP_ATTR = "rank", "device", "callable", "step"
# Host evidence (docs/FORMATS.md, "Host evidence"): deltas over the span of what the OS saw of the emitting thread.
OS_CPU_NS, OS_RQ_NS, OS_NIVCSW, OS_MAJFLT = "os.cpu_ns", "os.rq_ns", "os.nivcsw", "os.majflt"
HOST_EVIDENCE_ATTRS = (OS_CPU_NS, OS_RQ_NS, OS_NIVCSW, OS_MAJFLT)
# host.gc attributes
GC_GEN_ATTR, GC_COLLECTED_ATTR = "gen", "collected"
# The ``callable`` of a decode root: the fused decode program.
DECODE_CALLABLE = "decode.main+verify+mtp"

# -- diagnosis vocabulary (docs/FIGURES.md, "Causes") -----------------------------------
# The mechanisms an analysis names for a late (rank, step), and the runtime's
# faults.json records as ground truth for each injected fault.
MECH_DEVICE, MECH_HOST_CPU, MECH_RUN_QUEUE, MECH_GC = "device", "host_cpu", "run_queue", "gc"
MECH_CARRIED_OVER, MECH_PEER_WAIT, MECH_UNATTRIBUTED = "carried_over", "peer_wait", "unattributed"
MECHANISMS = (MECH_DEVICE, MECH_HOST_CPU, MECH_RUN_QUEUE, MECH_GC, MECH_CARRIED_OVER, MECH_PEER_WAIT, MECH_UNATTRIBUTED)

# -- escaping -------------------------------------------------------------------------

# Bytes that would break the space-separated k=v grammar or the log prefix.
_NEEDS_ESCAPE = re.compile(r"[\x00-\x20\x7f%" + re.escape(TOKEN_SEPARATORS) + "]")


def encode_value(value: object, cap: int = MAX_VALUE_CHARS) -> str:
    """Percent-encode a name or attribute value and cap its length with ``~``."""
    text = value if isinstance(value, str) else str(value)
    if _NEEDS_ESCAPE.search(text):
        text = _NEEDS_ESCAPE.sub(lambda m: f"%{ord(m.group()):02X}", text)
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


# -- formatting -----------------------------------------------------------------------


def format_prefix(mono_ns: int, thread_ident: int, level: str, func: str) -> str:
    """The log-record prefix every line of the native runtime's log starts with."""
    return f"[{PREFIX_CLOCK}={mono_ns}][{PREFIX_THREAD}{thread_ident:x}][{level}] {func}: "


# The payload's fixed start; the required fields follow as `` key=value`` in REQUIRED_FIELDS order.
RECORD_HEAD = f"{STRACE_MARKER} v={STRACE_VERSION}"


def payload_parts(values: dict) -> list:
    """The payload up to its attributes as literal text and field values, in order.

    ``values`` maps the fields after ``v`` (pid .. dur) to anything: scalars for
    one record, or whole columns for a vectorised writer that joins the parts
    element-wise. Names must already be encoded.
    """
    parts: list = [RECORD_HEAD]
    for key in REQUIRED_FIELDS[1:]:
        parts += [f" {key}=", values[key]]
    return parts


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
    values = {"pid": pid, "tid": tid, "inv": inv, "hid": hid, "depth": depth, "name": encode_value(name), "ts": ts_ns, "dur": dur_ns}
    head = "".join(str(part) for part in payload_parts(values))
    if not attrs:
        return head
    return head + " " + " ".join(f"{encode_value(k)}={encode_value(v)}" for k, v in attrs.items())


def format_anchor_payload(pid: int, mono_ns: int, wall_ns: int) -> str:
    values = (ANCHOR_VERSION, pid, mono_ns, wall_ns)
    return ANCHOR_MARKER + "".join(f" {key}={value}" for key, value in zip(ANCHOR_FIELDS, values, strict=True))


def format_anchor_record(pid: int, mono_ns: int, wall_ns: int, thread_ident: int) -> str:
    """A whole clock-anchor log record, as the serving stack's reader accepts it (no newline)."""
    return format_prefix(mono_ns, thread_ident, ANCHOR_LEVEL, ANCHOR_FUNC) + format_anchor_payload(pid, mono_ns, wall_ns)


def format_chip_ready_payload(pid: int, device: str) -> str:
    pid_key, device_key = CHIP_READY_FIELDS
    return f"{CHIP_READY_MARKER}{pid_key}={pid} {device_key}={encode_value(device)}{CHIP_READY_END}"


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
