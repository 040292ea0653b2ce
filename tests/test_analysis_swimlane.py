"""The swimlane on real-stack shaped artifacts: prefixes, unrelated lines, two records on a line,
anchors, chip_process lines, warm-up outside the window, lanes, and the combined swimlane output."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dsprof.analysis.outputs.drawing import assign_lanes, build_lanes, runtime_spans_sql
from dsprof.analysis.outputs.text import json_string
from dsprof.commands.analysis_job import analyze_paths
from dsprof.profiler import strace_format as fmt
from dsprof.testing.synthetic import PREFILL_CALLABLE, T0_MONO_NS, WALL0_NS, SyntheticRun

DECODE_CALLABLE = fmt.DECODE_CALLABLE


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    out = tmp_path_factory.mktemp("messy")
    run = SyntheticRun(ranks=4, steps=15, warmup_steps=5, two_per_line_every=3, unrelated_lines_per_step=3, torn_tail=True)
    run.write(out / "run")
    return run, analyze_paths([out / "run"], out / "analysis"), out / "analysis"


def test_every_record_is_recovered_from_a_messy_log(messy):
    run, outcome, _ = messy
    validation = outcome.summary["validation"]
    assert validation["valid"], validation["problems"]
    assert validation["decode_steps"] == 15 and validation["rank_roots"] == 60 and validation["ranks"] == 4
    # warm-up decode rounds and the prefill invocation lie outside the serving window
    assert validation["left_out_invocations"] == 4 * (5 + 1)
    assert outcome.result.swimlane.callables == {DECODE_CALLABLE: 60}
    assert outcome.summary["inputs"]["dropped"] == {"torn_record": 1}
    t = run.timings()
    roots = outcome.result.engine.arrow("SELECT runner_ts_ns, device_wall_ns FROM decode ORDER BY rank, step")
    np.testing.assert_array_equal(roots["runner_ts_ns"].to_numpy(), t.runner_start_ns.ravel())
    np.testing.assert_array_equal(roots["device_wall_ns"].to_numpy(), t.device_wall_ns.ravel())


def test_devices_ranks_and_wall_clock(messy):
    run, outcome, _ = messy
    processes = sorted(outcome.result.swimlane.processes, key=lambda p: p["rank"])
    assert [p["pid"] for p in processes] == [run.pid(r) for r in range(4)]
    assert [p["device"] for p in processes] == [f"npu:{r}" for r in range(4)]
    engine = outcome.result.engine
    build_lanes(engine)
    runtime = engine.arrow(runtime_spans_sql()).to_pandas()
    assert runtime["wall_ns"].notna().all()
    # wall = wall_ns + (t - mono_ns) of the pid's anchor, exact in integers
    assert (runtime["wall_ns"] - runtime["ts_ns"]).eq(WALL0_NS - T0_MONO_NS).all()
    assert set(runtime["phase"]) == {
        "root",
        "bind",
        "bind.args",
        "bind.prebuilt",
        "runner_run",
        "native_fence_wait",
        "claim_release",
        "validate",
    }
    assert {row[0] for row in engine.rows("SELECT DISTINCT name FROM spans WHERE clk = 'dev'")} == {fmt.DEVICE_WALL}


def test_lanes_never_hold_overlapping_roots(messy):
    _, outcome, _ = messy
    engine = outcome.result.engine
    build_lanes(engine)
    clashes = engine.scalar("""SELECT count(*) FROM (SELECT root_ts_ns < lag(root_end_ns) OVER (PARTITION BY pid, tid, lane ORDER BY root_ts_ns) AS clash
                               FROM runs JOIN lanes USING (pid, inv)) WHERE clash""")
    assert clashes == 0
    assert [row[0] for row in engine.rows("SELECT DISTINCT lane FROM lanes ORDER BY 1")] == [0, 1]  # depth 2: two slot lanes


def test_lanes_are_the_same_when_laid_out_a_few_threads_at_a_time(messy, monkeypatch):
    from dsprof.analysis.outputs import drawing

    _, outcome, _ = messy
    engine = outcome.result.engine
    build_lanes(engine)
    whole = engine.rows("SELECT pid, inv, lane FROM lanes ORDER BY pid, inv")
    engine.run("DROP TABLE lanes")
    monkeypatch.setattr(drawing, "LANE_CHUNK_RUNS", 7)  # fewer runs than one thread holds: one thread per pass
    build_lanes(engine)
    assert engine.rows("SELECT pid, inv, lane FROM lanes ORDER BY pid, inv") == whole
    assert len(whole) == engine.scalar("SELECT count(*) FROM runs")


def test_ranks_from_device_order_and_decode_from_biggest_bucket_without_root_attributes(tmp_path):
    run = SyntheticRun(ranks=12, steps=6, root_attrs=False, sa_profile=False, performance_summary=False)
    run.write(tmp_path / "run")
    outcome = analyze_paths([tmp_path / "run"], None)
    swimlane = outcome.result.swimlane
    # natural device order: npu:2 before npu:10
    assert [p["device"] for p in sorted(swimlane.processes, key=lambda p: p["rank"])] == [f"npu:{r}" for r in range(12)]
    assert swimlane.decode_label == "decode"
    assert swimlane.callables["decode"] == 72
    assert sum(1 for k in swimlane.callables if k.startswith("hid:")) == 1
    assert outcome.summary["validation"]["rank_roots"] == 72
    assert outcome.summary["validation"]["step_numbering"] == "position"
    assert outcome.summary["serving"]["sources"] == {} and outcome.summary["serving"]["tokens_returned"] is None


def test_callable_labels_from_root_attributes(tmp_path):
    SyntheticRun(ranks=2, steps=3, sa_profile=False).write(tmp_path / "run")
    outcome = analyze_paths([tmp_path / "run"], None)
    assert outcome.result.swimlane.callables == {DECODE_CALLABLE: 6, PREFILL_CALLABLE: 2}
    assert outcome.result.engine.scalar(f"SELECT count(*) FROM decode WHERE callable_label = '{PREFILL_CALLABLE}'") == 0


def test_combined_swimlane_keeps_serving_events_and_adds_rank_lanes(messy):
    run, outcome, out = messy
    events = json.loads((out / "combined-swimlane.json").read_text())["traceEvents"]
    source = json.loads((out.parent / "run" / "serving-trace" / "trace.json").read_text())["traceEvents"]
    source_spans = [e for e in source if e["ph"] == "X" and e["cat"] != "request"]
    serving = [e for e in events if e.get("cat") not in ("runtime", "device", "request", "flow") and e["ph"] == "X"]
    key = lambda e: (e["pid"], e["ts"], e["name"], e["dur"])  # noqa: E731
    assert sorted(map(key, serving)) == sorted(map(key, source_spans))
    # serving spans sit on tracks per (thread, category, lane) named after their thread (docs/REPORTS.md)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    source_tid = {key(e): e["tid"] for e in source_spans}
    assert all(f"tid {source_tid[key(e)]} · {e['cat']}" in names[(e["pid"], e["tid"])] for e in serving)
    requests = [e for e in source if e.get("cat") == "request"]
    assert sum(e["ph"] == "b" for e in events) == sum(e["ph"] == "e" for e in events) == len(requests)
    runtime = [e for e in events if e.get("cat") == "runtime"]
    assert len(runtime) == outcome.result.engine.scalar(
        "SELECT sum(n_spans) - count(*) FILTER (WHERE device_wall_ns IS NOT NULL) FROM runs"
    )
    assert {e["pid"] for e in runtime} == {run.pid(r) for r in range(4)}
    runner = next(e for e in runtime if e["args"]["phase"] == "runner_run" and e["args"]["step"] == 3 and e["args"]["rank"] == 2)
    t = run.timings()
    assert runner["ts"] * 1000 == t.runner_start_ns[2, 3]
    assert runner["args"]["wall_ns"] == str(WALL0_NS + int(t.runner_start_ns[2, 3]) - T0_MONO_NS)
    assert runner["args"]["device_wall_dur_ns"] == int(t.device_wall_ns[2, 3])
    assert runner["args"]["device"] == "npu:2" and isinstance(runner["args"]["inv"], str)
    assert not any(e["name"].endswith("device_wall") for e in runtime)  # device-clock spans are not host spans
    device = [e for e in events if e.get("cat") == "device"]  # on a device track, placed at their run's runner_run start
    assert len(device) == outcome.result.engine.scalar("SELECT count(*) FILTER (WHERE device_wall_ns IS NOT NULL) FROM runs")
    assert {names[(e["pid"], e["tid"])] for e in device} == {"device"}
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {f"rank {r} · npu:{r} (pid {run.pid(r)})" for r in range(4)} <= names


def test_json_text_of_odd_names_and_args():
    values = ["plain", 'quote " and \\ back', "tab\tnew\nline", None]
    assert [json.loads(v) for v in json_string(values).to_pylist()] == ["plain", 'quote " and \\ back', "tab\tnew\nline", ""]


def test_serving_args_keep_the_text_they_were_read_as(tmp_path):
    events = [
        {
            "name": "worker.step",
            "cat": "worker",
            "ph": "X",
            "ts": 1,
            "dur": 50,
            "pid": 1,
            "tid": 1,
            "args": {"note": "[not json", "brace": "{x", "nested": {"a": [1, 2]}, "list": [3], "n": 7, "flag": True, "step": 4},
        }
    ]
    (tmp_path / "k.trace.json").write_text(json.dumps({"traceEvents": events}))
    outcome = analyze_paths([tmp_path / "k.trace.json"], tmp_path / "out")
    written = json.loads(outcome.outputs["combined-swimlane.json"].read_text())["traceEvents"]
    span = next(e for e in written if e.get("cat") == "worker")
    assert span["args"] == {"note": "[not json", "brace": "{x", "nested": '{"a":[1,2]}', "list": "[3]", "n": "7", "flag": "true", "step": 4}


@pytest.mark.parametrize("seed", range(5))
def test_assign_lanes_never_overlaps_on_random_intervals(seed):
    rng = np.random.default_rng(seed)
    n = 400
    start = rng.integers(0, 10_000, n)
    end = start + rng.integers(1, 300, n)
    thread = rng.integers(0, 6, n)
    # slot ids that clash on purpose for some threads: the lanes must still never overlap
    slot = np.where(rng.random(n) < 0.5, rng.integers(0, 2, n), -1)
    lane = assign_lanes(thread, start, end, slot)
    order = np.lexsort((start, lane, thread))
    same = (thread[order][1:] == thread[order][:-1]) & (lane[order][1:] == lane[order][:-1])
    assert not (same & (start[order][1:] < end[order][:-1])).any()
    assert all(lane[thread == t].min() == 0 for t in np.unique(thread))


def test_assign_lanes_uses_two_lanes_for_a_depth_two_chain_without_slot_ids():
    start = np.arange(20) * 10
    assert assign_lanes(np.ones(20, np.int64), start, start + 15, None).tolist() == [0, 1] * 10
