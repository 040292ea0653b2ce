"""The invocation table: one row per ``(pid, inv)`` with the times and host evidence of its phases.

SPEC §2: an invocation is the set of STRACE rows sharing ``(pid, inv)``; its
root is the host-clock ``depth == 0`` row, every other row is a child by
``inv`` (never by timestamp containment), known by its span name. This is the
one span-sized pass of the analysis: a single grouped aggregation, so it runs
out of core over a span dataset and, on a cluster, per time window.

Columns (ns; null where the phase or attribute is absent): ``pid, inv,
n_roots`` (host depth-0 rows; 0 = the root never closed, > 1 = duplicates), ``n_spans``,
the root's ``tid, hid, root_ts_ns, root_end_ns``, its attributes ``callable,
rank_attr, device_attr, step_attr, run_epoch, slot_id, run_id, dispatch_id,
generation``, and per phase the earliest span of that name:
``bind_ts_ns/bind_end_ns, runner_ts_ns/runner_end_ns, fence_ts_ns/fence_end_ns,
claim_ts_ns, validate_ts_ns/validate_end_ns``; host evidence ``<phase>_cpu_ns,
<phase>_rq_ns`` for root, bind, runner, fence and validate; on the device
clock ``device_wall_ns`` (duration), the executor's ``device_cpu_ns,
device_rq_ns`` where the device is a host thread, ``device_wait_ns`` (device
spans below device_wall whose name ends in ``_wait``: waiting on peers) and
``device_markers`` (depth-2-or-deeper runner spans: 0 when the run switched
device-phase markers off).
"""

from __future__ import annotations

from dsprof.profiler import strace_format as fmt



def runtime_row(alias: str = "") -> str:
    """SQL: a STRACE row of the runtime — not another producer's (``ext.*``), not a GC span."""
    a = f"{alias}." if alias else ""
    return f"{a}inv IS NOT NULL AND {a}depth IS NOT NULL AND {a}name NOT LIKE '{fmt.EXTERNAL_PREFIX}%' AND {a}name <> '{fmt.GC}'"


def serving_row(alias: str = "") -> str:
    """SQL: a serving row (SA_PROFILE or Chrome): anything that is not a STRACE record."""
    a = f"{alias}." if alias else ""
    return f"({a}inv IS NULL OR {a}depth IS NULL)"

_HOST_ROOT = f"depth = 0 AND clk <> '{fmt.CLK_DEVICE}'"


def _first(column: str, condition: str) -> str:
    """The value of ``column`` on the earliest row meeting ``condition``."""
    return f"arg_min({column}, ts_ns) FILTER (WHERE {condition})"


def _phase(name: str, prefix: str, *, end: bool = True, evidence: bool = True) -> list[str]:
    condition = f"name = '{name}' AND clk <> '{fmt.CLK_DEVICE}'"
    columns = [f"min(ts_ns) FILTER (WHERE {condition}) AS {prefix}_ts_ns"]
    if end:
        columns.append(f"{_first('ts_ns + dur_ns', condition)} AS {prefix}_end_ns")
    if evidence:
        columns += [f"{_first('os_cpu_ns', condition)} AS {prefix}_cpu_ns", f"{_first('os_rq_ns', condition)} AS {prefix}_rq_ns"]
    return columns


def _columns() -> list[str]:
    root = _HOST_ROOT
    device = f"clk = '{fmt.CLK_DEVICE}'"
    wall = f"{device} AND name = '{fmt.DEVICE_WALL}'"
    below_wall = f"{device} AND starts_with(name, '{fmt.DEVICE_WALL}.')"
    markers = f"depth >= 2 AND starts_with(name, '{fmt.RUNNER_RUN}.')"
    return [
        "pid",
        "inv",
        f"count(*) FILTER (WHERE {root}) AS n_roots",
        "count(*) AS n_spans",
        f"{_first('tid', root)} AS tid",
        f"{_first('hid', root)} AS hid",
        f"min(ts_ns) FILTER (WHERE {root}) AS root_ts_ns",
        f"{_first('ts_ns + dur_ns', root)} AS root_end_ns",
        f"{_first('callable', root)} AS callable",
        f"{_first('rank', root)} AS rank_attr",
        f"{_first('device', root)} AS device_attr",
        f"{_first('step', root)} AS step_attr",
        *(f"{_first(name, root)} AS {name}" for name in fmt.IDENTITY_ATTRS),
        f"{_first('os_cpu_ns', root)} AS root_cpu_ns",
        f"{_first('os_rq_ns', root)} AS root_rq_ns",
        *_phase(fmt.BIND, "bind"),
        *_phase(fmt.RUNNER_RUN, "runner"),
        *_phase(fmt.FENCE_WAIT, "fence"),
        *_phase(fmt.CLAIM_RELEASE, "claim", evidence=False),
        *_phase(fmt.VALIDATE, "validate"),
        f"{_first('dur_ns', wall)} AS device_wall_ns",
        f"{_first('os_cpu_ns', wall)} AS device_cpu_ns",
        f"{_first('os_rq_ns', wall)} AS device_rq_ns",
        f"sum(dur_ns) FILTER (WHERE {below_wall} AND ends_with(name, '{fmt.WAIT_SUFFIX}')) AS device_wait_ns",
        f"count(*) FILTER (WHERE {markers}) AS device_markers",
    ]


def invocation_query(where: str = "TRUE", having: str = "TRUE") -> str:
    """SQL for the invocation table of the runtime rows of ``spans`` that satisfy ``where`` (groups: ``having``)."""
    return f"SELECT {', '.join(_columns())} FROM spans WHERE {runtime_row()} AND ({where}) GROUP BY pid, inv HAVING {having}"


def in_window(window: int, window_ns: int) -> str:
    """HAVING clause: the invocation starts in time window ``window`` (its root, else its earliest host span)."""
    start = f"coalesce(min(ts_ns) FILTER (WHERE {_HOST_ROOT}), min(ts_ns) FILTER (WHERE clk <> '{fmt.CLK_DEVICE}'), min(ts_ns))"
    return f"floor({start} / {int(window_ns)}) = {int(window)}"


def gc_query() -> str:
    """SQL for the garbage collections (SPEC §2.1 ``host.gc`` spans): pid, tid, start, end."""
    return (f"SELECT pid, tid, ts_ns AS gc_ts_ns, ts_ns + dur_ns AS gc_end_ns FROM spans "
            f"WHERE name = '{fmt.GC}' AND clk <> '{fmt.CLK_DEVICE}'")
