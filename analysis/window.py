"""Windows of a run: the one home of ``--steps A:B`` and ``--since/--until`` (analyze, report, export).

A window is the decode steps numbered A to B (both included) and/or the steps
whose runs' roots all start in ``[since, until)`` on the host clock (a step the
window cuts is left out whole). Parsing happens before any input is read
(:func:`parse_window`); resolving needs the trace's anchors
(:func:`resolve_window`); cutting is :mod:`dsprof.analysis.window_cut`.
Time forms and clocks: docs/CLI.md, "Windows".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pyarrow as pa

from dsprof.analysis.summary_schema import WindowBlock
from dsprof.errors import DsprofError

_UNIT_NS = {"h": 3_600_000_000_000, "m": 60_000_000_000, "s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_OFFSET_TERM = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,9})?)(ms|us|ns|h|m|s)", re.ASCII)
_OFFSET = re.compile(r"\+?(?:[0-9]{1,12}(?:\.[0-9]{1,9})?(?:ms|us|ns|h|m|s))+", re.ASCII)
_ISO_SHAPE = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,9})?)?(?:Z|[+-][0-9]{2}:?[0-9]{2})", re.ASCII
)
_FRACTION = re.compile(r"\.([0-9]{1,9})")
_ZONE = re.compile(r"([+-])([0-9]{2}):?([0-9]{2})$", re.ASCII)
_DIGITS = re.compile(r"[0-9]+", re.ASCII)
MAX_STEP = 2**63 - 1  # steps and times are int64 wherever they are compared (Arrow, DuckDB)
# The instants int64 ns since the epoch can hold: 1677-09-21T00:12:43.145224192Z to 2262-04-11T23:47:16.854775807Z.
_MIN_NS, _MAX_NS = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class TimeBound:
    """One side of a time window as given: a wall-clock instant (ns since the epoch) or an offset from the run's start."""

    text: str
    wall_ns: int | None = None
    offset_ns: int | None = None


@dataclass(frozen=True)
class WindowSpec:
    """A window as the options gave it, not yet placed on the trace's clock."""

    steps: tuple[int, int] | None = None
    since: TimeBound | None = None
    until: TimeBound | None = None

    @property
    def timed(self) -> bool:
        return self.since is not None or self.until is not None


@dataclass(frozen=True)
class Window:
    """A window placed on the host monotonic clock: ``[from_ns, until_ns)``, a side None when open."""

    spec: WindowSpec
    from_ns: int | None = None
    until_ns: int | None = None
    run_start_ns: int | None = None
    # no root carries a step attribute: --steps counts decode runs by position, in the swimlane
    steps_by_position: bool = False
    partial_steps: int = 0  # steps the window cut, left out whole (analysis/window_cut.py)

    @property
    def steps(self) -> tuple[int, int] | None:
        return self.spec.steps

    def block(self) -> WindowBlock:
        """What the summary says of the window (``inputs.window``, docs/SUMMARY_SCHEMA.md)."""
        spec = self.spec
        return {
            "steps": None if spec.steps is None else [int(spec.steps[0]), int(spec.steps[1])],
            "since": None if spec.since is None else spec.since.text,
            "until": None if spec.until is None else spec.until.text,
            "host_ns": [self.from_ns, self.until_ns],
            "run_start_ns": self.run_start_ns,
            "steps_by": None if spec.steps is None else "position" if self.steps_by_position else "step attribute",
            "partial_steps_left_out": self.partial_steps,
        }

    def describe(self) -> str:
        """One line for people: ``steps 1000:1999, since +5m``."""
        spec = self.spec
        said = [f"steps {spec.steps[0]}:{spec.steps[1]}"] if spec.steps else []
        said += [f"since {spec.since.text}"] if spec.since else []
        said += [f"until {spec.until.text}"] if spec.until else []
        return ", ".join(said)


def parse_steps(text: str) -> tuple[int, int]:
    """``A:B`` (either side may be left out) -> (first, last) step, both included; DsprofError on anything else.

    ASCII digits only (``int()`` would take ``1_0`` and other scripts' digits), and within int64 as the
    step column is: an open end is the largest step, so that ``0:`` keeps every step the run has.
    """
    first, sep, last = text.strip().partition(":")
    if not sep or not (first or last) or not all(_DIGITS.fullmatch(side) for side in (first, last) if side):
        raise DsprofError(f"bad step window {text[:80]!r} (expected A:B in ASCII digits, e.g. 1000:1999, or 1000: for the rest)")
    first, last = (side.lstrip("0") or side[:1] for side in (first, last))  # "" stays open, "000" is 0
    if any(len(side) > len(str(MAX_STEP)) or int(side or 0) > MAX_STEP for side in (first, last)):
        raise DsprofError(f"bad step window {text[:80]!r}: steps are numbered at most {MAX_STEP} (int64)")
    window = (int(first) if first else 0, int(last) if last else MAX_STEP)
    if window[1] < window[0]:
        raise DsprofError(f"bad step window {text[:80]!r}: the first step must not be after the last")
    return window


def parse_window(steps: str | None = None, since: str | None = None, until: str | None = None) -> WindowSpec | None:
    """The options' text -> a WindowSpec (None when no option is given); DsprofError, one line, on a bad value."""
    if steps is None and since is None and until is None:
        return None
    spec = WindowSpec(
        steps=None if steps is None else parse_steps(steps),
        since=None if since is None else parse_time(since, "--since"),
        until=None if until is None else parse_time(until, "--until"),
    )
    if spec.since and spec.until and _same_kind(spec.since, spec.until):
        first, last = _comparable(spec.since), _comparable(spec.until)
        if last <= first:
            raise DsprofError(f"bad time window: --until {spec.until.text!r} is not after --since {spec.since.text!r}")
    return spec


def parse_time(text: str, option: str = "time") -> TimeBound:
    """``+90s`` / ``1h30m`` (an offset from the run's start) or an ISO 8601 instant with its zone."""
    value = text.strip()
    if _OFFSET.fullmatch(value):
        total = sum(_term_ns(number, unit) for number, unit in _OFFSET_TERM.findall(value))
        if total > _MAX_NS:
            raise DsprofError(f"bad {option} value {value[:80]!r}: an offset is at most {_MAX_NS // _UNIT_NS['h']:,}h (int64 ns)")
        return TimeBound(text=value, offset_ns=total)
    if _ISO_SHAPE.fullmatch(value):
        return TimeBound(text=value, wall_ns=_iso_ns(value, option))
    raise DsprofError(
        f"bad {option} value {text[:80]!r} (expected an offset from the run's start such as +90s, +5m or 1h30m, "
        "or a wall-clock time with its zone such as 2026-12-01T10:00:00Z)"
    )


def _term_ns(number: str, unit: str) -> int:
    whole, _, fraction = number.partition(".")
    scale = _UNIT_NS[unit]
    return int(whole) * scale + (int(fraction) * scale) // 10 ** len(fraction) if fraction else int(whole) * scale


def _iso_ns(value: str, option: str) -> int:
    """Nanoseconds since the epoch of an ISO 8601 instant, exact (the fraction is kept to the ns, never a float).

    Refused in one readable line: a zone beyond ±23:59 (datetime's own message shows timedelta reprs) and an
    instant int64 ns cannot hold, which no trace clock reaches either.
    """
    zone = _ZONE.search(value)
    if zone and (int(zone[2]) > 23 or int(zone[3]) > 59):
        raise DsprofError(f"bad {option} value {value!r}: zone {zone[0]} is out of range (expected -23:59 to +23:59)")
    fraction = _FRACTION.search(value)
    digits = fraction.group(1) if fraction else ""
    try:
        stamp = datetime.fromisoformat(_FRACTION.sub("", value, count=1).replace("Z", "+00:00"))
    except ValueError as exc:
        raise DsprofError(f"bad {option} value {value!r}: {exc}") from None
    seconds = int(stamp.timestamp())
    total = seconds * 1_000_000_000 + (int(digits.ljust(9, "0")) if digits else 0)
    if not _MIN_NS <= total <= _MAX_NS:
        raise DsprofError(
            f"bad {option} value {value!r}: out of range (expected a time from 1677-09-21T00:12:44Z to 2262-04-11T23:47:16Z, what int64 ns hold)"
        )
    return total


def _same_kind(a: TimeBound, b: TimeBound) -> bool:
    return (a.wall_ns is None) == (b.wall_ns is None)


def _comparable(bound: TimeBound) -> int:
    return bound.wall_ns if bound.wall_ns is not None else int(bound.offset_ns or 0)


def _int64(ns: int) -> int:
    """``ns`` held to int64, which the span columns compare against: a bound beyond every time is as good as the extreme."""
    return min(max(ns, _MIN_NS), _MAX_NS)


def clock_offset_ns(anchors: pa.Table) -> int | None:
    """wall − monotonic (ns) of the trace's processes: the median over its CLOCK_ANCHOR lines; None without one."""
    if anchors.num_rows == 0:
        return None
    offsets = np.asarray(anchors.column("wall_ns").to_numpy(), np.int64) - np.asarray(anchors.column("mono_ns").to_numpy(), np.int64)
    ordered = np.sort(offsets)
    return int(ordered[(len(ordered) - 1) // 2])  # the lower median: an offset some process really had


def anchor_start_ns(anchors: pa.Table) -> int | None:
    """The earliest CLOCK_ANCHOR (monotonic ns): when the run's first process came up."""
    return None if anchors.num_rows == 0 else int(np.min(anchors.column("mono_ns").to_numpy()))


def resolve_window(spec: WindowSpec, anchors: pa.Table, run_start_ns: int | None) -> Window:
    """Place ``spec`` on the host monotonic clock; DsprofError where the trace cannot place a bound."""
    if not spec.timed:
        return Window(spec, run_start_ns=run_start_ns)
    offset = clock_offset_ns(anchors)

    def host_ns(bound: TimeBound | None) -> int | None:
        if bound is None:
            return None
        if bound.wall_ns is not None:
            if offset is None:
                raise DsprofError(
                    f"cannot place {bound.text!r} on the trace's clock: it has no CLOCK_ANCHOR line (use an offset such as +5m)"
                )
            return _int64(bound.wall_ns - offset)
        if run_start_ns is None:
            raise DsprofError(f"cannot place {bound.text!r}: the trace has no host-clock span to start the run from")
        return _int64(run_start_ns + int(bound.offset_ns or 0))

    first, last = host_ns(spec.since), host_ns(spec.until)
    if first is not None and last is not None and last <= first:
        said = {name: bound.text if bound else "" for name, bound in (("since", spec.since), ("until", spec.until))}
        raise DsprofError(f"bad time window: --until {said['until']!r} is not after --since {said['since']!r} on the trace's clock")
    return Window(spec, from_ns=first, until_ns=last, run_start_ns=run_start_ns)
