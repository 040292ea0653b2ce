"""combined-swimlane.json: the serving trace plus one process lane per device (Chrome trace JSON).

* Serving (SA_PROFILE / Chrome) events are re-emitted as read: name, cat, ph,
  ts/dur in µs (integers when the source had integer µs), pid, tid and args.
  Argument values that are JSON text (numbers, true/false/null, and objects or
  arrays that parse — how the readers keep non-string values) are written as
  JSON, others as strings. (A string arg that reads as a number, ``"12"``,
  comes out as ``12``: the span table keeps both as the same text.)
* Runtime host spans go to a process per device (pid ``DEVICE_PID_BASE + rank``,
  named ``device <dev> (rank <r>)``), one thread per (OS thread, pipeline-slot
  lane). Args carry step, rank, device, inv, phase, callable, lane and
  ``wall_ns`` (a string: wall nanoseconds exceed 2**53). Device-clock spans
  (``clk=dev``) are never placed on this host axis: their duration is attached
  to the runner_run span of their invocation as ``device_wall_dur_ns``.

Every line of event text is built column-wise in Arrow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.swimlane import Swimlane, phase_of
from dsprof.analysis.outputs.json_text import json_string, us_text
from dsprof.profiler.synthetic import join_text, text_buffer

DEVICE_PID_BASE = 100_000_000
CHUNK_ROWS = 500_000
# Argument values written as JSON rather than as strings: numbers and keywords by pattern;
# text that starts like an object or array only when it parses (see _is_json_text).
_JSON_SCALAR = r"^(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|true|false|null)$"
_JSON_NESTED_START = r"^[\{\[]"


def _json_int_or_null(values: pd.Series, quoted: bool = False) -> pa.Array:
    text = pc.cast(pa.array(values, type=pa.int64() if str(values.dtype) != "UInt64" else pa.uint64(), from_pandas=True), pa.string())
    if quoted:
        text = join_text('"', text, '"')
    return pc.fill_null(text, "null")


def _is_json_text(items: pa.Array) -> pa.Array:
    """Whether each value is JSON to write as it is: how the readers keep nested args, or a number/keyword.

    A string argument that merely starts with ``[`` or ``{`` must stay a string,
    or the file would not parse; only such values are parsed, once per distinct value.
    """
    literal = pc.match_substring_regex(items, _JSON_SCALAR)
    nested = pc.fill_null(pc.match_substring_regex(items, _JSON_NESTED_START), False)
    if not pc.any(nested).as_py():
        return literal
    candidates = pc.dictionary_encode(items.filter(nested))
    parses = pa.array([_parses(text) for text in candidates.dictionary.to_pylist()], pa.bool_())
    return pc.or_(literal, pc.replace_with_mask(nested, nested, parses.take(candidates.indices)))


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _args_objects(attrs: pd.Series) -> pa.Array:
    """JSON object text of each row's attribute map."""
    maps = pa.chunked_array(attrs.array._pa_array).combine_chunks() if len(attrs) else pa.array([], attrs.dtype.pyarrow_dtype)
    keys = maps.keys
    items = pc.fill_null(maps.items, "null")
    literal = _is_json_text(items)
    values = pc.if_else(literal, items, json_string(items))
    pairs = join_text(json_string(keys), ":", values)
    offsets = pc.subtract(maps.offsets, maps.offsets[0]) if len(maps) else maps.offsets
    first = maps.offsets[0].as_py() if len(maps) else 0
    last = maps.offsets[-1].as_py() if len(maps) else 0
    lists = pa.ListArray.from_arrays(offsets, pairs.slice(first, last - first))
    return join_text("{", pc.binary_join(lists, ","), "}")


def _serving_events(serving: pd.DataFrame) -> pa.Array:
    is_instant = (serving["ph"] == "i").to_numpy()
    timing = pc.if_else(
        pa.array(is_instant),
        pa.scalar('"s":"t"'),
        join_text('"dur":', us_text(serving["dur_ns"])),
    )
    return join_text(
        '{"name":', json_string(serving["name"]), ',"cat":', json_string(serving["cat"]),
        ',"ph":', json_string(serving["ph"]), ',"ts":', us_text(serving["ts_ns"]), ",", timing,
        ',"pid":', pa.array(serving["pid"].to_numpy()), ',"tid":', pa.array(serving["tid"].to_numpy()),
        ',"args":', _args_objects(serving["attrs"]), "}",
    )


@dataclass
class _RuntimeText:
    """Runtime rows reduced to what varies per span, plus the text shared by a name or an invocation.

    Spans of one invocation share their step, rank, device, lane and ids, and
    spans of one name share their phase, so that text is built once per
    invocation / name and spread to the rows with a take.
    """

    rows: pd.DataFrame          # ts_ns, dur_ns, wall_ns, device_wall_dur_ns, name_code, inv_code
    name_parts: pa.Array        # per name code
    inv_parts: pa.Array         # per invocation code
    thread_lane: pd.DataFrame   # (rank, tid, lane) -> chrome_tid


def _runtime_text(swimlane: Swimlane) -> _RuntimeText:
    runtime = swimlane.runtime
    inv_code = runtime.groupby(["pid", "inv"], sort=True).ngroup().to_numpy()
    _, first_row = np.unique(inv_code, return_index=True)
    invocations = runtime.iloc[first_row][["pid", "tid", "inv", "rank", "device", "step", "callable", "lane"]].reset_index(drop=True)
    thread_lane = invocations[["rank", "tid", "lane"]].drop_duplicates().sort_values(["rank", "tid", "lane"])
    thread_lane["chrome_tid"] = thread_lane.groupby("rank").cumcount() + 1
    invocations = invocations.merge(thread_lane, on=["rank", "tid", "lane"], how="left")
    device_wall = swimlane.device_clock[swimlane.device_clock["phase"] == "device_wall"].drop_duplicates(["pid", "inv"])
    invocations = invocations.merge(
        device_wall[["pid", "inv", "dur_ns"]].rename(columns={"dur_ns": "device_wall_dur_ns"}), on=["pid", "inv"], how="left"
    )
    rank = invocations["rank"].astype("int64")
    inv_parts = join_text(
        '"step":', _json_int_or_null(invocations["step"]), ',"rank":', pa.array(rank.to_numpy()),
        ',"device":', json_string(invocations["device"]), ',"inv":', _json_int_or_null(invocations["inv"], quoted=True),
        ',"callable":', json_string(invocations["callable"]), ',"lane":', pa.array(invocations["lane"].to_numpy(np.int64)),
        ',"os_pid":', pa.array(invocations["pid"].to_numpy()), ',"os_tid":', pa.array(invocations["tid"].to_numpy()),
        '},"pid":', pa.array((rank + DEVICE_PID_BASE).to_numpy()),
        ',"tid":', pa.array(invocations["chrome_tid"].to_numpy(np.int64)), "}",
    )
    names = pc.dictionary_encode(pa.chunked_array(runtime["name"].array._pa_array)).combine_chunks()
    name_parts = join_text(
        ',"name":', json_string(names.dictionary), ',"cat":"runtime","ph":"X","args":{"phase":',
        json_string(pa.array(phase_of(pd.Series(names.dictionary.to_pylist(), dtype="string[pyarrow]")))), ",",
    ) if len(names.dictionary) else pa.array([], pa.string())
    name_code = names.indices.to_numpy(zero_copy_only=False)
    is_runner = (runtime["phase"] == "runner_run").to_numpy(bool)
    device_wall_dur = invocations["device_wall_dur_ns"].astype("Int64").array.take(inv_code)
    rows = pd.DataFrame(
        {
            "ts_ns": runtime["ts_ns"].to_numpy(),
            "dur_ns": runtime["dur_ns"].to_numpy(),
            "wall_ns": runtime["wall_ns"].array,
            "device_wall_dur_ns": pd.array(device_wall_dur, dtype="Int64").copy(),
            "name_code": name_code,
            "inv_code": inv_code,
        }
    )
    rows.loc[~is_runner, "device_wall_dur_ns"] = pd.NA
    return _RuntimeText(rows=rows, name_parts=name_parts, inv_parts=inv_parts, thread_lane=thread_lane)


def _runtime_events(text: _RuntimeText, rows: pd.DataFrame) -> pa.Array:
    return join_text(
        '{"ts":', us_text(rows["ts_ns"]), ',"dur":', us_text(rows["dur_ns"]),
        text.name_parts.take(pa.array(rows["name_code"].to_numpy())),
        '"wall_ns":', _json_int_or_null(rows["wall_ns"], quoted=True),
        ',"device_wall_dur_ns":', _json_int_or_null(rows["device_wall_dur_ns"]), ",",
        text.inv_parts.take(pa.array(rows["inv_code"].to_numpy())),
    )


def _metadata(swimlane: Swimlane, thread_lane: pd.DataFrame, process_names: dict | None, thread_names: dict | None) -> list[dict]:
    """Process/thread names: the serving trace's own, then one per device lane (per process, not per span)."""
    meta = [{"ph": "M", "name": "process_name", "pid": int(pid), "tid": 0, "args": {"name": name}}
            for pid, name in (process_names or {}).items()]
    meta += [{"ph": "M", "name": "thread_name", "pid": int(pid), "tid": int(tid), "args": {"name": name}}
             for (pid, tid), name in (thread_names or {}).items()]
    for row in swimlane.processes.sort_values("rank").itertuples(index=False):
        pid = DEVICE_PID_BASE + int(row.rank)
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                     "args": {"name": f"device {row.device} (rank {int(row.rank)}, pid {int(row.pid)})"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": int(row.rank)}})
    for row in thread_lane.itertuples(index=False):
        meta.append({"ph": "M", "name": "thread_name", "pid": DEVICE_PID_BASE + int(row.rank), "tid": int(row.chrome_tid),
                     "args": {"name": f"tid {int(row.tid)} lane {int(row.lane)}"}})
    return meta


def write_combined_swimlane(
    swimlane: Swimlane,
    path: str | Path,
    *,
    process_names: dict | None = None,
    thread_names: dict | None = None,
) -> Path:
    """Write the combined swimlane; ``process_names``/``thread_names`` are the serving trace's metadata.

    Events are built and written CHUNK_ROWS rows at a time, so memory stays
    bounded by a chunk's text whatever the size of the trace.
    """
    path = Path(path)
    runtime = _runtime_text(swimlane)
    serving = swimlane.serving[swimlane.serving["ph"].isin(["X", "i"])]
    header = {
        "displayTimeUnit": "ns",
        "otherData": {
            "producer": "dsprof combined swimlane",
            "clock": "host CLOCK_MONOTONIC, ts/dur in us; wall_ns args from CLOCK_ANCHOR",
            "device_clock_spans_off_host_axis": int(len(swimlane.device_clock)),
        },
    }
    with open(path, "wb") as f:
        f.write(json.dumps(header)[:-1].encode() + b', "traceEvents": [\n')
        meta = _metadata(swimlane, runtime.thread_lane, process_names, thread_names)
        f.write("".join(json.dumps(m) + ",\n" for m in meta).encode())
        for start in range(0, len(serving), CHUNK_ROWS):  # a loop over chunks of rows
            f.write(text_buffer(join_text(_serving_events(serving.iloc[start : start + CHUNK_ROWS]), ",\n")))
        for start in range(0, len(runtime.rows), CHUNK_ROWS):
            f.write(text_buffer(join_text(_runtime_events(runtime, runtime.rows.iloc[start : start + CHUNK_ROWS]), ",\n")))
        if meta or len(serving) or len(runtime.rows):
            f.seek(f.tell() - 2)  # the last event's separator
        f.write(b"\n]}\n")
        f.truncate()
    return path
