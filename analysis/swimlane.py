"""Invocations, span trees, decode steps and pipeline-slot lanes (SPEC §2-§3).

Everything here is a groupby/merge over the span table: an invocation is the
set of STRACE rows sharing ``(pid, inv)``; its root is the ``depth == 0`` row
and every other row of the invocation is a child by ``inv`` (never by
timestamp containment), named by its span name. The result is the
:class:`Swimlane` described in docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.spans import Trace, attr_columns
from dsprof.profiler.strace_format import DECODE_CALLABLE

EXTERNAL_PREFIX = "ext."
ROOT_ATTRS = ("callable", "rank", "device", "run_epoch", "slot_id", "step")


@dataclass
class Swimlane:
    """The analysed trace; column contracts are in docs/ARCHITECTURE.md ("Swimlane")."""

    runtime: pd.DataFrame
    roots: pd.DataFrame
    serving: pd.DataFrame
    device_clock: pd.DataFrame
    left_out_invocations: int
    # invocations whose rows were read but whose root never closed (crash, torn log)
    rootless_invocations: int = 0
    # roots repeated for one (pid, inv): the first is kept
    duplicate_roots: int = 0
    serving_window_ns: tuple[int, int] | None = None
    # callable label -> number of roots in the window; decode_label names the decode bucket
    callables: dict[str, int] = field(default_factory=dict)
    decode_label: str | None = None
    # runtime pids without a CLOCK_ANCHOR
    unanchored_pids: list[int] = field(default_factory=list)
    # pid -> (rank, device) as resolved
    processes: pd.DataFrame = field(default_factory=pd.DataFrame)


def _int_column(text: pd.Series) -> pd.arrays.IntegerArray:
    """Integer attribute values (Int64; null where absent or not an integer)."""
    arrow = pa.chunked_array(text.array._pa_array)
    try:
        values = pc.cast(arrow, pa.int64())
    except pa.ArrowInvalid:  # some value is not an integer: parse leniently
        return pd.array(pd.to_numeric(text, errors="coerce"), dtype="Int64")
    return pd.array(values.to_pandas(types_mapper=pd.ArrowDtype), dtype="Int64")


def phase_of(names: pd.Series) -> pd.Series:
    """Phase label from the span name: ``chip.run`` -> root, ``chip.run.runner_run.X`` -> X.

    Computed once per distinct name (a trace has a handful), then spread to the rows.
    """
    codes, uniques = pd.factorize(names)
    phase = pd.Series(uniques).str.replace(r"^chip\.run\.?", "", regex=True)
    phase = phase.str.replace(r"^runner_run\.", "", regex=True)
    phase = phase.mask(phase == "", "root").astype("string[pyarrow]")
    return pd.Series(phase.array.take(codes), index=names.index, dtype="string[pyarrow]")


def _natural_key(text: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def build_swimlane(trace: Trace, progress: Callable[[str], None] | None = None) -> Swimlane:
    """Rebuild invocations from the span table and lay them out per device and lane."""
    spans = trace.spans
    is_strace = (spans["inv"].notna() & spans["depth"].notna()).to_numpy(bool)
    serving = spans[~is_strace].reset_index(drop=True)
    names = pc.dictionary_encode(pa.chunked_array(spans["name"].array._pa_array)).combine_chunks()
    external = pc.starts_with(names.dictionary, EXTERNAL_PREFIX).to_numpy(zero_copy_only=False)
    is_runtime = is_strace & ~external[names.indices.to_numpy(zero_copy_only=False)]
    is_dev = (spans["clk"] == "dev").to_numpy(bool)
    is_root = is_runtime & ~is_dev & (spans["depth"] == 0).fillna(False).to_numpy(bool)
    if progress:
        progress(f"swimlane: {int((is_runtime & ~is_dev).sum())} host runtime spans, {len(serving)} serving spans")

    roots = spans[is_root].sort_values(["pid", "inv", "ts_ns"], kind="stable")
    duplicate = roots.duplicated(["pid", "inv"])
    duplicate_roots = int(duplicate.sum())
    roots = roots[~duplicate]
    # every runtime row's invocation key, looked up once in the root index
    runtime_rows = np.flatnonzero(is_runtime)
    row_keys = pd.MultiIndex.from_arrays(
        [spans["pid"].to_numpy()[runtime_rows], spans["inv"].to_numpy(np.uint64, na_value=0)[runtime_rows]]
    )
    root_of_row = pd.MultiIndex.from_arrays([roots["pid"].to_numpy(), roots["inv"].to_numpy(np.uint64)]).get_indexer(row_keys)
    rootless = int(row_keys[root_of_row < 0].unique().size)

    attrs = attr_columns(roots, list(ROOT_ATTRS))
    inv = pd.DataFrame(
        {
            "pid": roots["pid"].to_numpy(),
            "tid": roots["tid"].to_numpy(),
            "inv": roots["inv"].to_numpy(),
            "hid": roots["hid"].to_numpy(),
            "root_ts_ns": roots["ts_ns"].to_numpy(),
            "root_end_ns": (roots["ts_ns"] + roots["dur_ns"]).to_numpy(),
            "callable_attr": attrs["callable"].to_numpy(),
            "rank_attr": _int_column(attrs["rank"]),
            "device_attr": attrs["device"].to_numpy(),
            "run_epoch": _int_column(attrs["run_epoch"]),
            "slot_id": _int_column(attrs["slot_id"]),
            "step_attr": _int_column(attrs["step"]),
        }
    )

    # profile window: invocations whose roots overlap the serving window
    window = None
    timed = _window_spans(serving)
    if len(timed):
        window = (int(timed["ts_ns"].min()), int((timed["ts_ns"] + timed["dur_ns"]).max()))
        inside = (inv["root_ts_ns"] < window[1]) & (inv["root_end_ns"] > window[0])
    else:
        inside = pd.Series(True, index=inv.index)
    left_out = int((~inside).sum())
    # invocation rows renumbered after the window: -1 for rows of left-out or rootless
    # invocations (the extra last entry is where a root index of -1, "no root", lands)
    kept_row = np.full(len(inv) + 1, -1, dtype=np.int64)
    kept_row[np.flatnonzero(inside.to_numpy())] = np.arange(int(inside.sum()))
    row_inv = kept_row[root_of_row]
    inv = inv[inside.to_numpy()].reset_index(drop=True)

    inv["callable"], decode_label = _label_callables(inv)
    processes = _resolve_processes(inv, trace)
    inv = inv.merge(processes, on="pid", how="left")
    inv["lane"] = assign_lanes(inv)
    inv["is_decode"] = inv["callable"] == decode_label

    decode = inv[inv["is_decode"]].sort_values(["rank", "root_ts_ns", "pid", "inv"], kind="stable")
    inv["step"] = pd.Series(pd.NA, index=inv.index, dtype="Int64")
    inv.loc[decode.index, "step"] = decode.groupby("rank", dropna=False).cumcount().to_numpy()

    # runtime rows of the kept invocations, carrying their invocation's identity
    kept = row_inv >= 0
    dev_rows = is_dev[runtime_rows] & kept
    host_rows = ~is_dev[runtime_rows] & kept
    runtime = _with_invocation(spans, runtime_rows[host_rows], row_inv[host_rows], inv)
    runtime["wall_ns"] = _wall_ns(runtime, trace.anchors)
    device_clock = _with_invocation(spans, runtime_rows[dev_rows], row_inv[dev_rows], inv)

    root_table = _decode_roots(inv, runtime, device_clock)
    runtime = runtime.drop(columns="inv_row")
    device_clock = device_clock.drop(columns="inv_row")
    anchored = set(trace.anchors["pid"].tolist())
    unanchored = sorted(int(p) for p in processes["pid"] if int(p) not in anchored)
    callables = inv["callable"].value_counts().to_dict()
    if progress:
        progress(f"swimlane: {len(root_table)} decode roots on {processes['rank'].nunique()} ranks")
    return Swimlane(
        runtime=runtime,
        roots=root_table,
        serving=serving,
        device_clock=device_clock,
        left_out_invocations=left_out,
        rootless_invocations=int(rootless),
        duplicate_roots=duplicate_roots,
        serving_window_ns=window,
        callables={str(k): int(v) for k, v in callables.items()},
        decode_label=decode_label,
        unanchored_pids=unanchored,
        processes=processes,
    )


def _window_spans(serving: pd.DataFrame) -> pd.DataFrame:
    """The spans that define the serving window: the requests, else the serving spans, else every span.

    Start-up spans (e.g. ``worker.init``) and warm-up rounds lie before the
    first request, so the request spans are the measured batch.
    """
    timed = serving[(serving["ph"] == "X") & (serving["clk"] != "dev")]
    for category in ("request", "serving"):
        chosen = timed[timed["cat"] == category]
        if len(chosen):
            return chosen
    return timed


def _with_invocation(spans: pd.DataFrame, rows: np.ndarray, inv_rows: np.ndarray, inv: pd.DataFrame) -> pd.DataFrame:
    """The span rows ``rows`` plus their invocation's rank, device, step, callable, lane and phase."""
    out = spans.take(rows).reset_index(drop=True)
    for column in ("rank", "device", "step", "callable", "lane"):
        out[column] = inv[column].array.take(inv_rows)
    out["inv_row"] = inv_rows
    out["phase"] = phase_of(out["name"])
    return out


def _label_callables(inv: pd.DataFrame) -> tuple[pd.Series, str | None]:
    """Label each root's callable bucket (by hid); decode = its ``callable`` attribute, else the biggest bucket."""
    if len(inv) == 0:
        return pd.Series([], dtype="string[pyarrow]"), None
    named = inv.dropna(subset=["callable_attr"])
    label_by_hid = (
        named.groupby(["hid", "callable_attr"], observed=True).size().reset_index(name="n")
        .sort_values(["hid", "n"], ascending=[True, False]).drop_duplicates("hid")
        .set_index("hid")["callable_attr"]
    )
    bucket_sizes = inv["hid"].value_counts()
    labels = inv["hid"].map(label_by_hid)
    if (label_by_hid == DECODE_CALLABLE).any():
        decode_label = DECODE_CALLABLE
    elif (label_by_hid.str.startswith("decode")).any():
        decode_label = str(label_by_hid[label_by_hid.str.startswith("decode")].iloc[0])
    else:
        # no callable names: the most frequent bucket is decode (SPEC §2)
        biggest = bucket_sizes.index[0]
        decode_label = str(label_by_hid.get(biggest, "decode"))
        labels = labels.mask(inv["hid"] == biggest, decode_label)
    labels = labels.fillna("hid:" + inv["hid"].astype(str))
    return labels.astype("string[pyarrow]"), decode_label


def _resolve_processes(inv: pd.DataFrame, trace: Trace) -> pd.DataFrame:
    """pid -> device (chip_process lines, else root attribute) and rank (root attribute, else device order)."""
    pids = pd.DataFrame({"pid": np.sort(inv["pid"].unique())})
    chip = trace.chip_devices.drop_duplicates("pid")[["pid", "device"]]
    attr_device = inv.dropna(subset=["device_attr"]).groupby("pid")["device_attr"].agg(lambda s: s.mode().iloc[0])
    attr_rank = inv.dropna(subset=["rank_attr"]).groupby("pid")["rank_attr"].min()
    out = pids.merge(chip, on="pid", how="left")
    out["device"] = out["device"].astype("object").fillna(out["pid"].map(attr_device))
    out["rank"] = out["pid"].map(attr_rank).astype("Int64")
    if out["rank"].isna().any():
        # ranks follow the order of devices (natural order: npu:2 before npu:10), then of pids;
        # this sorts processes, not spans
        order_key = [((0, _natural_key(d)) if isinstance(d, str) else (1, ()), p) for d, p in zip(out["device"], out["pid"])]
        ranked = sorted(range(len(out)), key=order_key.__getitem__)
        fallback = np.empty(len(out), dtype=np.int64)
        fallback[ranked] = np.arange(len(out))
        out["rank"] = out["rank"].fillna(pd.Series(fallback, index=out.index)).astype("Int64")
    out["device"] = out["device"].fillna("pid:" + out["pid"].astype(str)).astype("string[pyarrow]")
    return out[["pid", "rank", "device"]]


def assign_lanes(inv: pd.DataFrame) -> np.ndarray:
    """Pipeline-slot lane per root within its thread, such that overlapping roots never share a lane.

    Start from the root's ``slot_id`` (the ping-pong slot) where every root of
    the thread has one, else take turns over as many lanes as the thread's
    deepest overlap; then move roots that still overlap their lane's
    predecessor to a fresh lane until no lane holds two overlapping roots. Each round is
    vectorised and settles at least one root; real traces need none.
    """
    if len(inv) == 0:
        return np.zeros(0, dtype=np.int64)
    frame = pd.DataFrame(
        {
            "thread": inv.groupby(["pid", "tid"], sort=True).ngroup().to_numpy(),
            "start": inv["root_ts_ns"].to_numpy(np.int64),
            "end": inv["root_end_ns"].to_numpy(np.int64),
            "slot": inv["slot_id"].to_numpy(),
        }
    ).sort_values(["thread", "start"], kind="stable")
    # roots running at each start = started before it - ended at or before it, within the thread;
    # times are dense-ranked so that (thread, time) packs into one sortable int64 key
    times, codes = np.unique(np.concatenate([frame["start"].to_numpy(), frame["end"].to_numpy()]), return_inverse=True)
    width = len(times) + 1
    thread = frame["thread"].to_numpy(np.int64)
    start_key = thread * width + codes[: len(frame)]
    end_key = np.sort(thread * width + codes[len(frame) :])
    thread_first = np.searchsorted(end_key, thread * width, side="left")
    ended = np.searchsorted(end_key, start_key, side="right") - thread_first
    started = frame.groupby("thread").cumcount().to_numpy()
    running = pd.Series(np.maximum(started - ended, 0), index=frame.index)
    depth = running.groupby(frame["thread"]).transform("max").to_numpy() + 1
    slot_known = frame["slot"].notna().groupby(frame["thread"]).transform("all").to_numpy()
    lane = np.where(slot_known, pd.array(frame["slot"], dtype="Int64").fillna(0).to_numpy(np.int64), started % depth)

    frame["lane"] = lane
    while True:
        by_lane = frame.sort_values(["thread", "lane", "start"], kind="stable")
        previous_end = by_lane.groupby(["thread", "lane"])["end"].shift()
        clash = by_lane.index[(by_lane["start"] < previous_end).to_numpy()]
        if len(clash) == 0:
            break
        frame.loc[clash, "lane"] = frame["lane"].max() + 1
    # number lanes 0.. densely within each thread
    dense = frame.groupby("thread")["lane"].rank(method="dense").astype(np.int64) - 1
    return dense.sort_index().to_numpy()


def _wall_ns(rows: pd.DataFrame, anchors: pd.DataFrame) -> pd.Series:
    """Wall-clock start per row from its pid's CLOCK_ANCHOR (integers; null when unanchored)."""
    first = anchors.drop_duplicates("pid").set_index("pid")
    mono = rows["pid"].map(first["mono_ns"]).astype("Int64")
    wall = rows["pid"].map(first["wall_ns"]).astype("Int64")
    return (wall + (rows["ts_ns"].astype("Int64") - mono)).astype("Int64")


def _decode_roots(inv: pd.DataFrame, runtime: pd.DataFrame, device_clock: pd.DataFrame) -> pd.DataFrame:
    """One row per decode root with the times of its phases (the earliest span of each phase).

    Rows carry ``inv_row`` (their invocation's row in ``inv``), so each phase
    column is one scatter into an array per invocation; scattering in
    descending start order leaves the earliest span of a repeated phase.
    """
    out = inv[["pid", "inv", "rank", "device", "step", "run_epoch", "slot_id", "root_ts_ns", "root_end_ns", "step_attr"]].copy()

    def scatter(rows: pd.DataFrame, values: pd.Series) -> pd.Series:
        column = np.zeros(len(inv), dtype=np.int64)
        present = np.zeros(len(inv), dtype=bool)
        order = np.argsort(-rows["ts_ns"].to_numpy(), kind="stable")
        target = rows["inv_row"].to_numpy()[order]
        column[target] = values.to_numpy(np.int64)[order]
        present[target] = True
        return pd.Series(pd.arrays.IntegerArray(column, ~present), index=out.index)

    runtime = runtime[["phase", "ts_ns", "dur_ns", "inv_row"]]
    device_clock = device_clock[["phase", "ts_ns", "dur_ns", "inv_row"]]
    for phase, prefix in (("bind", "bind"), ("runner_run", "runner"), ("claim_release", "claim"), ("validate", "validate")):
        rows = runtime[runtime["phase"] == phase]
        out[f"{prefix}_ts_ns"] = scatter(rows, rows["ts_ns"])
        if prefix != "claim":
            out[f"{prefix}_end_ns"] = scatter(rows, rows["ts_ns"] + rows["dur_ns"])
    fence = runtime[runtime["phase"] == "native_fence_wait"]
    out["fence_wait_dur_ns"] = scatter(fence, fence["dur_ns"])
    device_wall = device_clock[device_clock["phase"] == "device_wall"]
    out["device_wall_dur_ns"] = scatter(device_wall, device_wall["dur_ns"])
    out = out[inv["is_decode"].to_numpy()]
    return out.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)
