"""The swimlane on real-stack shaped artifacts: prefixes, unrelated lines, two records on a line,
anchors, chip_process lines, warm-up outside the window, lanes, and the combined swimlane output."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dsprof.analysis.analyze import analyze
from dsprof.analysis.outputs.combined_swimlane import DEVICE_PID_BASE
from dsprof.profiler.synthetic import DECODE_CALLABLE, PREFILL_CALLABLE, T0_MONO_NS, WALL0_NS, SyntheticRun


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    out = tmp_path_factory.mktemp("messy")
    run = SyntheticRun(ranks=4, steps=15, warmup_steps=5, two_per_line_every=3, unrelated_lines_per_step=3, torn_tail=True)
    run.write(out / "run")
    return run, analyze([out / "run"], out / "analysis"), out / "analysis"


def test_every_record_is_recovered_from_a_messy_log(messy):
    run, result, _ = messy
    validation = result.summary["validation"]
    assert validation["valid"], validation["problems"]
    assert validation["decode_steps"] == 15 and validation["rank_roots"] == 60 and validation["ranks"] == 4
    # warm-up decode rounds and the prefill invocation lie outside the serving window
    assert validation["left_out_invocations"] == 4 * (5 + 1)
    assert result.swimlane.callables == {DECODE_CALLABLE: 60}
    assert result.summary["inputs"]["dropped"] == {"torn_record": 1}
    t = run.timings()
    roots = result.swimlane.roots.sort_values(["rank", "step"])
    np.testing.assert_array_equal(roots["runner_ts_ns"].to_numpy(np.int64), t.runner_start_ns.ravel())
    np.testing.assert_array_equal(roots["device_wall_dur_ns"].to_numpy(np.int64), t.device_wall_ns.ravel())


def test_devices_ranks_and_wall_clock(messy):
    run, result, _ = messy
    processes = result.swimlane.processes.sort_values("rank")
    assert processes["pid"].tolist() == [run.pid(r) for r in range(4)]
    assert processes["device"].tolist() == [f"npu:{r}" for r in range(4)]
    runtime = result.swimlane.runtime
    assert runtime["wall_ns"].notna().all()
    # wall = wall_ns + (t - mono_ns) of the pid's anchor, exact in integers
    assert (runtime["wall_ns"] - runtime["ts_ns"]).eq(WALL0_NS - T0_MONO_NS).all()
    assert set(runtime["phase"]) == {"root", "bind", "bind.args", "bind.prebuilt", "runner_run",
                                     "native_fence_wait", "claim_release", "validate"}
    assert (result.swimlane.device_clock["phase"] == "device_wall").all()


def test_lanes_never_hold_overlapping_roots(messy):
    _, result, _ = messy
    roots = result.swimlane.runtime.query("phase == 'root'").sort_values(["pid", "tid", "lane", "ts_ns"])
    previous_end = (roots["ts_ns"] + roots["dur_ns"]).groupby([roots["pid"], roots["tid"], roots["lane"]]).shift()
    assert not (roots["ts_ns"] < previous_end).any()
    assert sorted(roots["lane"].unique()) == [0, 1]  # depth-2: two slot lanes per thread


def test_ranks_from_device_order_and_decode_from_biggest_bucket_without_root_attributes(tmp_path):
    run = SyntheticRun(ranks=12, steps=6, root_attrs=False, sa_profile=False, performance_summary=False)
    run.write(tmp_path / "run")
    result = analyze([tmp_path / "run"])
    processes = result.swimlane.processes.sort_values("rank")
    # natural device order: npu:2 before npu:10
    assert processes["device"].tolist() == [f"npu:{r}" for r in range(12)]
    assert result.swimlane.decode_label == "decode"
    assert result.swimlane.callables["decode"] == 72
    assert sum(1 for k in result.swimlane.callables if k.startswith("hid:")) == 1
    assert result.summary["validation"]["rank_roots"] == 72
    assert result.summary["serving"]["source"] is None


def test_callable_labels_from_root_attributes(tmp_path):
    SyntheticRun(ranks=2, steps=3, sa_profile=False).write(tmp_path / "run")
    result = analyze([tmp_path / "run"])
    assert result.swimlane.callables == {DECODE_CALLABLE: 6, PREFILL_CALLABLE: 2}
    assert result.swimlane.runtime.query("callable == @PREFILL_CALLABLE")["step"].isna().all()


def test_combined_swimlane_keeps_serving_events_and_adds_device_lanes(messy):
    run, result, out = messy
    data = json.loads((out / "combined-swimlane.json").read_text())
    events = data["traceEvents"]
    source = json.loads((out.parent / "run" / "serving-trace" / "trace.json").read_text())["traceEvents"]
    source_spans = [e for e in source if e["ph"] == "X"]
    serving = [e for e in events if e.get("cat") != "runtime" and e["ph"] == "X"]
    key = lambda e: (e["pid"], e["tid"], e["ts"], e["name"])  # noqa: E731
    assert sorted(serving, key=key) == sorted(source_spans, key=key)
    runtime = [e for e in events if e.get("cat") == "runtime"]
    assert len(runtime) == len(result.swimlane.runtime)
    assert {e["pid"] for e in runtime} == {DEVICE_PID_BASE + r for r in range(4)}
    root = next(e for e in runtime if e["args"]["phase"] == "runner_run" and e["args"]["step"] == 3 and e["args"]["rank"] == 2)
    t = run.timings()
    assert root["ts"] * 1000 == t.runner_start_ns[2, 3]
    assert root["args"]["wall_ns"] == str(WALL0_NS + int(t.runner_start_ns[2, 3]) - T0_MONO_NS)
    assert root["args"]["device_wall_dur_ns"] == int(t.device_wall_ns[2, 3])
    assert root["args"]["device"] == "npu:2" and isinstance(root["args"]["inv"], str)
    assert not any(e["name"].endswith("device_wall") for e in runtime)  # device clock never on the host axis
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {f"device npu:{r} (rank {r}, pid {run.pid(r)})" for r in range(4)} <= names


def test_json_text_of_odd_names_and_args(tmp_path):
    from dsprof.analysis.outputs.json_text import json_string

    values = pd.Series(['plain', 'quote " and \\ back', "tab\tnew\nline", None], dtype="string[pyarrow]")
    assert [json.loads(v) for v in json_string(values).to_pylist()] == ["plain", 'quote " and \\ back', "tab\tnew\nline", ""]


def test_serving_args_that_only_look_like_json_stay_strings(tmp_path):
    events = [{"name": "request", "cat": "request", "ph": "X", "ts": 1, "dur": 50, "pid": 1, "tid": 1,
               "args": {"note": "[not json", "brace": "{x", "nested": {"a": [1, 2]}, "list": [3], "n": 7, "flag": True}}]
    (tmp_path / "k.trace.json").write_text(json.dumps({"traceEvents": events}))
    result = analyze([tmp_path / "k.trace.json"], tmp_path / "out")
    written = json.loads(result.outputs["combined-swimlane.json"].read_text())["traceEvents"]
    request = next(e for e in written if e.get("cat") == "request")
    assert request["args"] == {"note": "[not json", "brace": "{x", "nested": {"a": [1, 2]}, "list": [3], "n": 7, "flag": True}


@pytest.mark.parametrize("seed", range(5))
def test_assign_lanes_never_overlaps_on_random_intervals(seed):
    from dsprof.analysis.swimlane import assign_lanes

    rng = np.random.default_rng(seed)
    n = 400
    start = rng.integers(0, 10_000, n)
    frame = pd.DataFrame({
        "pid": rng.integers(0, 3, n), "tid": rng.integers(0, 2, n),
        "root_ts_ns": start, "root_end_ns": start + rng.integers(1, 300, n),
        # slot ids that clash on purpose for some threads: the lanes must still never overlap
        "slot_id": pd.array(np.where(rng.random(n) < 0.5, rng.integers(0, 2, n), None), dtype="Int64"),
    })
    frame["lane"] = assign_lanes(frame)
    ordered = frame.sort_values(["pid", "tid", "lane", "root_ts_ns"])
    previous_end = ordered.groupby(["pid", "tid", "lane"])["root_end_ns"].shift()
    assert not (ordered["root_ts_ns"] < previous_end).any()
    assert (frame.groupby(["pid", "tid"])["lane"].min() == 0).all()


def test_assign_lanes_uses_two_lanes_for_a_depth_two_chain_without_slot_ids():
    from dsprof.analysis.swimlane import assign_lanes

    start = np.arange(20) * 10
    frame = pd.DataFrame({"pid": 1, "tid": 1, "root_ts_ns": start, "root_end_ns": start + 15,
                          "slot_id": pd.array([None] * 20, dtype="Int64")})
    assert assign_lanes(frame).tolist() == [0, 1] * 10
