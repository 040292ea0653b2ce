"""Perfetto / Chrome JSON export of the swimlane (``dsprof export --format perfetto-json``).

Layout (docs/REPORTS.md): one process per OS pid, named after its rank and
device; runtime spans go on one track per (thread, pipeline-slot ``lane``),
serving spans on one track per SA_PROFILE thread. Every track is made strictly
nested: a span that would partly overlap another on its track moves to an extra
track of the same thread (``_nested_tracks``), so Perfetto never sees
overlapping slices on one track. Times are exact µs (up to three decimals: whole ns);
wall-clock ns travel as strings in ``args.wall_ns``. Flow arrows go from a
serving dispatch span to the rank roots it started (see ``_flow_links``).

The JSON is assembled with Arrow string kernels, column by column, so the export
costs the same per span however many spans there are.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.outputs.json_text import json_string, us_text
from dsprof.analysis.spans import ATTRS_TYPE, attr_columns
from dsprof.profiler.synthetic import join_text, text_buffer
from dsprof.errors import DsprofError

if TYPE_CHECKING:
    from dsprof.analysis.swimlane import Swimlane

FORMATS = ("perfetto-json",)
# Synthetic thread ids start here so they never collide with a real pid (Perfetto treats tid == pid as a main thread).
TRACK_TID_BASE = 1 << 30
SERVING_PROCESS_SORT = 0
RANK_PROCESS_SORT = 1000
RUNTIME_THREAD_SORT = 100
# Serving attributes that link a dispatch span to rank roots, in order of precedence.
LINK_KEYS = ("dispatch_id", "run_id", "step")
# Only scheduler spans link by step number: every worker span carries a step too.
STEP_LINK_CATEGORY = "scheduler"
WRITE_CHUNK_EVENTS = 65_536


# ---------------------------------------------------------------- JSON text, vectorised


def _quoted(text: pa.Array) -> pa.Array:
    """Text that needs no escaping (digits) as JSON strings."""
    return pc.binary_join_element_wise('"', text, '"', "")


def _int_text(values) -> pa.Array:
    return pc.cast(pa.array(values), pa.string())


def _member(key: str, json_value: pa.Array) -> pa.Array:
    """``"key":value`` per row, null where the value is null (so joins can skip it)."""
    return pc.binary_join_element_wise(f'"{key}":', json_value, "")


def _attrs_objects(attrs: pd.Series) -> pa.Array:
    """Each row's attribute map as the inside of a JSON object (``"k":"v",...``); null when it has none."""
    arrow = pa.chunked_array(attrs.array._pa_array, type=ATTRS_TYPE).combine_chunks()
    if len(arrow) == 0:
        return pa.array([], pa.string())
    offsets = arrow.offsets
    keys = json_string(arrow.keys, null=None)
    values = json_string(arrow.items, null=None)
    pairs = pc.binary_join_element_wise(keys, values, ":")
    lists = pa.ListArray.from_arrays(offsets, pairs, mask=arrow.is_null())
    joined = pc.binary_join(lists, ",")
    return pc.if_else(pc.equal(joined, ""), pa.scalar(None, pa.string()), joined)


def _objects(members: list[pa.Array]) -> pa.Array:
    inner = pc.binary_join_element_wise(*members, ",", null_handling="skip")
    return pc.binary_join_element_wise("{", inner, "}", "")


# ---------------------------------------------------------------- tracks


def _nested_tracks(group: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Extra-track index per span so that, within each (group, track), spans nest strictly.

    A set of intervals nests iff its open/close events form a bracket sequence:
    at every nesting level the k-th open and the k-th close belong to the same
    span. Each round pairs them up per level (vectorised) and, for every pair
    that does not match, moves the later-starting of the two spans to the next
    track; real traces need no moves. Zero-length spans never conflict.
    """
    track = np.zeros(len(group), dtype=np.int64)
    candidates = np.flatnonzero(end_ns > start_ns)
    while len(candidates):
        key = pd.DataFrame({"group": group[candidates], "track": track[candidates]}).groupby(["group", "track"], sort=False).ngroup().to_numpy()
        start = start_ns[candidates]
        end = end_ns[candidates]
        span = np.arange(len(candidates))
        open_order = np.lexsort((span, -end, start, key))
        open_rank = np.empty(len(span), dtype=np.int64)
        open_rank[open_order] = np.arange(len(span))
        # events: opens after closes at equal times; inner spans close first
        ev_key = np.concatenate([key, key])
        ev_time = np.concatenate([start, end])
        ev_kind = np.concatenate([np.ones(len(span), np.int64), np.zeros(len(span), np.int64)])
        ev_tie = np.concatenate([open_rank, -open_rank])
        ev_span = np.concatenate([span, span])
        order = np.lexsort((ev_tie, ev_kind, ev_time, ev_key))
        step = np.where(ev_kind[order] == 1, 1, -1)
        depth_after = pd.Series(step).groupby(ev_key[order]).cumsum().to_numpy()
        level = np.where(step == 1, depth_after, depth_after + 1)
        events = pd.DataFrame({"key": ev_key[order], "level": level, "kind": ev_kind[order], "span": ev_span[order]})
        events["k"] = events.groupby(["key", "level", "kind"], sort=False).cumcount()
        opens = events[events["kind"] == 1]
        closes = events[events["kind"] == 0]
        pairs = opens.merge(closes, on=["key", "level", "k"], suffixes=("_open", "_close"))
        bad = pairs[pairs["span_open"] != pairs["span_close"]]
        if bad.empty:
            break
        a = bad["span_open"].to_numpy()
        b = bad["span_close"].to_numpy()
        later = np.where(open_rank[a] > open_rank[b], a, b)
        earlier = np.where(open_rank[a] > open_rank[b], b, a)
        moved = candidates[_odd_in_chains(len(span), later, earlier, open_rank)]
        left = pd.MultiIndex.from_arrays([group[moved], track[moved]])
        track[moved] += 1
        # only the tracks that spans left (a conflict may hide behind the one resolved) or joined can hold conflicts
        touched = left.append(pd.MultiIndex.from_arrays([group[moved], track[moved]])).unique()
        here = pd.MultiIndex.from_arrays([group, track]).isin(touched)
        candidates = np.flatnonzero(here & (end_ns > start_ns))
    return track


def _odd_in_chains(n: int, later: np.ndarray, earlier: np.ndarray, open_rank: np.ndarray) -> np.ndarray:
    """Spans at odd distance from the head of their conflict chain.

    Each conflicting span points at the latest-opened span it conflicts with;
    moving every other span of such a chain (pointer jumping gives the
    distances in log n vectorised steps) splits a run of pairwise overlapping
    spans — e.g. pipelined steps — over two tracks instead of one per span.
    """
    pairs = pd.DataFrame({"later": later, "earlier": earlier, "rank": open_rank[earlier]})
    closest = pairs.sort_values("rank").drop_duplicates("later", keep="last")
    parent = np.arange(n)
    parent[closest["later"].to_numpy()] = closest["earlier"].to_numpy()
    distance = (parent != np.arange(n)).astype(np.int64)
    while True:
        jumped = parent[parent]
        distance = distance + distance[parent]
        if np.array_equal(jumped, parent):
            break
        parent = jumped
    return np.flatnonzero(distance % 2 == 1)


def _wall_offsets(runtime: pd.DataFrame) -> tuple[pd.Series, int | None]:
    """wall − monotonic ns per pid (from the runtime's anchored rows) and one for the whole host."""
    anchored = runtime[runtime["wall_ns"].notna()]
    if anchored.empty:
        return pd.Series(dtype="int64"), None
    offset = (anchored["wall_ns"].astype("int64") - anchored["ts_ns"].astype("int64")).groupby(anchored["pid"]).first()
    return offset, int(offset.iloc[0])


def _span_rows(swimlane: Swimlane) -> pd.DataFrame:
    """Runtime and serving spans with their track keys, in one frame."""
    runtime = swimlane.runtime
    serving = swimlane.serving
    offsets, host_offset = _wall_offsets(runtime)
    serving_offset = serving["pid"].map(offsets).astype("Int64")
    if host_offset is not None:
        serving_offset = serving_offset.fillna(host_offset)
    serving_wall = serving["ts_ns"].astype("Int64") + serving_offset
    serving_cat = serving["cat"].astype("string").fillna("")
    frame = pd.concat(
        [
            pd.DataFrame(
                {
                    "kind": "runtime",
                    "pid": runtime["pid"].to_numpy(np.int64),
                    "tid": runtime["tid"].to_numpy(np.int64),
                    "lane": runtime["lane"].astype("Int64").fillna(0).to_numpy(np.int64),
                    "ph": "X",
                    "name": runtime["name"].astype("string").to_numpy(),
                    "cat": "runtime",
                    "ts_ns": runtime["ts_ns"].to_numpy(np.int64),
                    "dur_ns": runtime["dur_ns"].to_numpy(np.int64),
                    "phase": runtime["phase"].astype("string").to_numpy(),
                    "step": runtime["step"].astype("Int64").to_numpy(),
                    "rank": runtime["rank"].astype("Int64").to_numpy(),
                    "device": runtime["device"].astype("string").to_numpy(),
                    "inv": runtime["inv"].astype("UInt64").astype("string").to_numpy(),
                    "wall_ns": runtime["wall_ns"].astype("Int64").to_numpy(),
                    "source_row": np.arange(len(runtime)),
                }
            ),
            pd.DataFrame(
                {
                    "kind": "serving",
                    "pid": serving["pid"].to_numpy(np.int64),
                    "tid": serving["tid"].to_numpy(np.int64),
                    "lane": np.zeros(len(serving), dtype=np.int64),
                    "ph": serving["ph"].astype("string").to_numpy(),
                    "name": serving["name"].astype("string").to_numpy(),
                    "cat": serving_cat.mask(serving_cat == "", "serving").to_numpy(),
                    "ts_ns": serving["ts_ns"].to_numpy(np.int64),
                    "dur_ns": serving["dur_ns"].to_numpy(np.int64),
                    "phase": pd.array([pd.NA] * len(serving), dtype="string"),
                    "step": pd.array([pd.NA] * len(serving), dtype="Int64"),
                    "rank": pd.array([pd.NA] * len(serving), dtype="Int64"),
                    "device": pd.array([pd.NA] * len(serving), dtype="string"),
                    "inv": pd.array([pd.NA] * len(serving), dtype="string"),
                    "wall_ns": serving_wall.to_numpy(),
                    "source_row": np.arange(len(serving)),
                }
            ),
        ],
        ignore_index=True,
    )
    thread_key = frame.groupby(["kind", "pid", "tid", "lane"], sort=False).ngroup().to_numpy()
    frame["split"] = _nested_tracks(thread_key, frame["ts_ns"].to_numpy(np.int64), (frame["ts_ns"] + frame["dur_ns"]).to_numpy(np.int64))
    return frame


def _tracks(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per track: its synthetic tid, name and sort order."""
    tracks = frame.drop_duplicates(["kind", "pid", "tid", "lane", "split"])[["kind", "pid", "tid", "lane", "split"]].copy()
    tracks["kind_order"] = (tracks["kind"] == "runtime").astype(int)
    tracks = tracks.sort_values(["pid", "kind_order", "tid", "lane", "split"]).reset_index(drop=True)
    tracks["track_tid"] = TRACK_TID_BASE + np.arange(len(tracks))
    lane_part = np.where(tracks["kind"] == "runtime", " lane " + tracks["lane"].astype(str), "")
    split_part = np.where(tracks["split"] > 0, " (overlap " + tracks["split"].astype(str) + ")", "")
    tracks["thread_name"] = tracks["kind"] + " tid " + tracks["tid"].astype(str) + lane_part + split_part
    tracks["sort_index"] = tracks.groupby("pid").cumcount() + np.where(tracks["kind"] == "runtime", RUNTIME_THREAD_SORT, 0)
    return tracks


def _processes(frame: pd.DataFrame) -> pd.DataFrame:
    runtime = frame[frame["kind"] == "runtime"]
    named = runtime.groupby("pid").agg(rank=("rank", "min"), device=("device", "first"))
    pids = pd.DataFrame({"pid": np.unique(frame["pid"].to_numpy())}).set_index("pid")
    pids = pids.join(named)
    has_rank = pids["rank"].notna()
    device = pids["device"].astype("string").fillna("device unknown")
    rank_text = pids["rank"].astype("Int64").astype("string")
    pids["process_name"] = np.where(
        has_rank,
        "rank " + rank_text.fillna("") + " · " + device + " (pid " + pids.index.astype(str) + ")",
        np.where(pids.index.isin(runtime["pid"]), "runtime (pid " + pids.index.astype(str) + ")", "serving (pid " + pids.index.astype(str) + ")"),
    )
    pids["sort_index"] = np.where(has_rank, RANK_PROCESS_SORT + pids["rank"].astype("Int64").fillna(0).to_numpy(np.int64), SERVING_PROCESS_SORT)
    return pids.reset_index()


# ---------------------------------------------------------------- flows


def _flow_links(swimlane: Swimlane) -> pd.DataFrame:
    """(serving frame row, root frame row) pairs: which dispatch span started which rank root.

    Frame rows are numbered as ``_span_rows`` lays them out: the runtime rows,
    then the serving rows.

    A serving span links by the first of ``dispatch_id`` (non-zero), ``run_id``
    it carries, matched against the same attribute of decode roots; a
    ``scheduler`` span with neither links by ``step`` to the roots whose
    ``step`` attribute is equal.
    """
    runtime = swimlane.runtime
    serving = swimlane.serving
    is_root = (runtime["depth"] == 0).to_numpy() & runtime["step"].notna().to_numpy()
    root_attrs = attr_columns(runtime[is_root], list(LINK_KEYS))
    root_attrs["frame_row"] = np.flatnonzero(is_root)
    serving_attrs = attr_columns(serving, list(LINK_KEYS))
    serving_attrs["frame_row"] = len(runtime) + np.arange(len(serving))
    dispatch = serving_attrs["dispatch_id"].mask(serving_attrs["dispatch_id"] == "0")
    run_id = serving_attrs["run_id"]
    is_scheduler = (serving["cat"].astype("string") == STEP_LINK_CATEGORY).fillna(False).to_numpy()
    step = serving_attrs["step"].where(is_scheduler & dispatch.isna().to_numpy() & run_id.isna().to_numpy())
    run_id = run_id.where(dispatch.isna())
    links = []
    for key, values in (("dispatch_id", dispatch), ("run_id", run_id), ("step", step)):
        source = pd.DataFrame({"value": values, "src": serving_attrs["frame_row"]}).dropna()
        target = pd.DataFrame({"value": root_attrs[key], "dst": root_attrs["frame_row"]}).dropna()
        if key == "dispatch_id":
            target = target[target["value"] != "0"]
        links.append(source.merge(target, on="value")[["src", "dst"]])
    return pd.concat(links, ignore_index=True).sort_values(["src", "dst"]).reset_index(drop=True)


# ---------------------------------------------------------------- events


def _metadata_events(processes: pd.DataFrame, tracks: pd.DataFrame) -> list[pa.Array]:
    pid = _int_text(processes["pid"].to_numpy(np.int64))
    process_name = pc.binary_join_element_wise(
        '{"ph":"M","name":"process_name","pid":', pid, ',"tid":0,"args":{"name":',
        json_string(pa.array(processes["process_name"].astype(str)), null=None), "}}", "",
    )
    process_sort = pc.binary_join_element_wise(
        '{"ph":"M","name":"process_sort_index","pid":', pid, ',"tid":0,"args":{"sort_index":',
        _int_text(processes["sort_index"].to_numpy(np.int64)), "}}", "",
    )
    tpid = _int_text(tracks["pid"].to_numpy(np.int64))
    ttid = _int_text(tracks["track_tid"].to_numpy(np.int64))
    thread_name = pc.binary_join_element_wise(
        '{"ph":"M","name":"thread_name","pid":', tpid, ',"tid":', ttid, ',"args":{"name":',
        json_string(pa.array(tracks["thread_name"].astype(str)), null=None), "}}", "",
    )
    thread_sort = pc.binary_join_element_wise(
        '{"ph":"M","name":"thread_sort_index","pid":', tpid, ',"tid":', ttid, ',"args":{"sort_index":',
        _int_text(tracks["sort_index"].to_numpy(np.int64)), "}}", "",
    )
    return [process_name, process_sort, thread_name, thread_sort]


def _span_events(frame: pd.DataFrame, attrs: pa.Array) -> pa.Array:
    """One ``X`` (or ``i``) event per span."""
    def optional_str(column: str) -> pa.Array:
        return json_string(pa.array(frame[column].astype("string").to_numpy(na_value=None), pa.string()), null=None)

    def optional_digits(column: str) -> pa.Array:
        return _quoted(pa.array(frame[column].astype("string").to_numpy(na_value=None), pa.string()))

    def optional_int(column: str) -> pa.Array:
        return pa.array(frame[column].astype("Int64").astype("string").to_numpy(na_value=None), pa.string())

    args = _objects(
        [
            _member("phase", optional_str("phase")),
            _member("step", optional_int("step")),
            _member("rank", optional_int("rank")),
            _member("device", optional_str("device")),
            _member("inv", optional_digits("inv")),
            _member("wall_ns", optional_digits("wall_ns")),
            pc.binary_join_element_wise('"attrs":{', attrs, "}", ""),
        ]
    )
    is_instant = (frame["ph"] == "i").to_numpy()
    shape = pa.array(np.where(is_instant, '"ph":"i","s":"t"', '"ph":"X"'))
    dur = pc.if_else(pa.array(is_instant), pa.scalar(""), pc.binary_join_element_wise(',"dur":', us_text(frame["dur_ns"].to_numpy()), ""))
    return pc.binary_join_element_wise(
        '{"name":', json_string(pa.array(frame["name"].to_numpy(na_value=""), pa.string()), null=None),
        ',"cat":', json_string(pa.array(frame["cat"].astype(str)), null=None),
        ",", shape,
        ',"ts":', us_text(frame["ts_ns"].to_numpy()), dur,
        ',"pid":', _int_text(frame["pid"].to_numpy(np.int64)),
        ',"tid":', _int_text(frame["track_tid"].to_numpy(np.int64)),
        ',"args":', args, "}", "",
    )


def _flow_events(frame: pd.DataFrame, links: pd.DataFrame) -> list[pa.Array]:
    if links.empty:
        return []
    flow_id = _int_text(np.arange(1, len(links) + 1))
    src = frame.iloc[links["src"].to_numpy()]
    dst = frame.iloc[links["dst"].to_numpy()]
    start = pc.binary_join_element_wise(
        '{"ph":"s","name":"dispatch","cat":"flow","id":', flow_id,
        ',"ts":', us_text(src["ts_ns"].to_numpy()),
        ',"pid":', _int_text(src["pid"].to_numpy(np.int64)), ',"tid":', _int_text(src["track_tid"].to_numpy(np.int64)), "}", "",
    )
    finish = pc.binary_join_element_wise(
        '{"ph":"f","bp":"e","name":"dispatch","cat":"flow","id":', flow_id,
        ',"ts":', us_text(dst["ts_ns"].to_numpy()),
        ',"pid":', _int_text(dst["pid"].to_numpy(np.int64)), ',"tid":', _int_text(dst["track_tid"].to_numpy(np.int64)), "}", "",
    )
    return [start, finish]


def write_perfetto_json(swimlane: Swimlane, summary: dict, path: str | Path) -> Path:
    """Write the swimlane as a Chrome JSON trace that Perfetto loads; returns ``path``."""
    path = Path(path)
    frame = _span_rows(swimlane)
    tracks = _tracks(frame)
    frame = frame.merge(tracks[["kind", "pid", "tid", "lane", "split", "track_tid"]], on=["kind", "pid", "tid", "lane", "split"], how="left", sort=False)
    attrs = pa.concat_arrays(
        [
            pc.cast(_attrs_objects(swimlane.runtime["attrs"]), pa.string()),
            pc.cast(_attrs_objects(swimlane.serving["attrs"]), pa.string()),
        ]
    )
    links = _flow_links(swimlane)
    parts = _metadata_events(_processes(frame), tracks) + [_span_events(frame, attrs)] + _flow_events(frame, links)
    validation = summary.get("validation") or {}
    other = {
        "producer": "dsprof",
        "summary_schema": summary.get("schema"),
        "valid": validation.get("valid"),
        "decode_steps": validation.get("decode_steps"),
        "ranks": validation.get("ranks"),
        "flows": len(links),
    }
    with path.open("wb") as out:
        out.write(('{"displayTimeUnit":"ns","otherData":' + json.dumps(other) + ',"traceEvents":[\n').encode())
        first = True
        for part in parts:
            for offset in range(0, len(part), WRITE_CHUNK_EVENTS):  # a loop over chunks, not events
                chunk = part.slice(offset, WRITE_CHUNK_EVENTS)
                if len(chunk) == 0:
                    continue
                out.write(b"" if first else b",\n")
                # each event's text plus its separator, written straight from the Arrow buffer
                out.write(text_buffer(join_text(chunk, ",\n")))
                out.seek(out.tell() - 2)  # the chunk's last separator
                first = False
        out.write(b"\n]}\n")
        out.truncate()
    return path


def export_from_dir(
    artifact_dir: str | Path,
    output: str | Path,
    *,
    format: str = "perfetto-json",
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Analyse an artifact directory and export it (``dsprof export``)."""
    if format not in FORMATS:
        raise DsprofError(f"unknown export format {format!r} (expected one of: {', '.join(FORMATS)})")
    from dsprof.analysis.analyze import analyze_artifact_dir

    result = analyze_artifact_dir(artifact_dir, progress=progress)
    if progress:
        progress(f"writing {output}")
    return write_perfetto_json(result.swimlane, result.summary, output)
