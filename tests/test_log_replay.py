"""The replay harness's measurable parts (dsprof.testing.log_replay, used by benchmarks/bench_watch.py).

Known answers only: the index against the generator's own timings, the pace
schedule and the latency and backlog arithmetic on hand-made events, and the
appender's output against the bytes it replays. No timings are asserted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dsprof.testing.log_replay import Appender, Loop, backlog_growth, backlog_steps, index_log, step_latencies, write_schedule
from dsprof.testing.synthetic import SyntheticRun

RUN = {"ranks": 3, "host_evidence": True, "sa_profile": False}


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def test_a_continuation_holds_the_same_records_as_the_longer_run(tmp_path):
    SyntheticRun(steps=6, **RUN).write_server_log(tmp_path / "whole.log")
    SyntheticRun(steps=4, **RUN).write_server_log(tmp_path / "head.log")
    SyntheticRun(steps=2, first_step=4, anchors=False, chip_ready_lines=False, **RUN).write_server_log(tmp_path / "tail.log")
    # the same records; only at the seam may they come in another order (step 4 binds while step 3 still runs)
    assert sorted(_lines(tmp_path / "head.log") + _lines(tmp_path / "tail.log")) == sorted(_lines(tmp_path / "whole.log"))
    assert b" step=4 " in (tmp_path / "tail.log").read_bytes()
    assert b"[CLOCK_ANCHOR]" not in (tmp_path / "tail.log").read_bytes()


def test_the_index_finds_each_steps_last_record_and_its_write_time(tmp_path):
    fence = np.full((3, 5), 9_000_000)
    fence[1, 2] += 30_000_000  # rank 1 closes step 2 last, and late
    run = SyntheticRun(steps=5, fence_wait_ns=fence, two_per_line_every=0, **RUN)
    run.write_server_log(tmp_path / "server.log")
    index = index_log(tmp_path / "server.log")
    data = (tmp_path / "server.log").read_bytes()
    assert index.line_end[-1] == len(data)
    assert len(index.line_end) == data.count(b"\n")
    assert index.step.tolist() == [0, 1, 2, 3, 4]
    assert index.written_ns[index.step_last_line].tolist() == run.timings().root_end_ns.max(axis=0).tolist()
    last_of_step_2 = data[index.line_end[index.step_last_line[2] - 1] : index.line_end[index.step_last_line[2]]]
    assert b"pid=41001 " in last_of_step_2
    assert (np.diff(index.written_ns) >= 0).all()


def test_the_schedule_divides_recorded_time_by_the_pace_and_never_goes_back():
    written = np.array([1_000_000_000, 3_000_000_000, 2_000_000_000, 5_000_000_000])
    assert write_schedule(written, 2.0, 1_000_000_000).tolist() == [0.0, 1.0, 1.0, 2.0]
    assert write_schedule(written, 1.0, 0, floor_ns=4_000_000_000).tolist() == [4.0, 4.0, 4.0, 5.0]


def test_latency_is_the_first_event_that_reaches_the_step():
    step = np.array([10, 11, 12, 13])
    written = np.array([100.0, 100.5, 101.0, 101.5])
    event_wall = np.array([101.2, 100.8, 102.0, 103.0])  # not in time order in the file
    new_last = np.array([12, 10, np.nan, 12.0])  # a refresh with nothing new, a step shown again
    latency = step_latencies(step, written, event_wall, new_last)
    assert latency[:3] == pytest.approx([0.8, 0.7, 0.2])
    assert np.isnan(latency[3])  # never shown


def test_backlog_counts_written_steps_not_yet_shown():
    step = np.arange(6)
    written = np.arange(6, dtype=float)  # step s written at s seconds
    event_wall = np.array([0.5, 2.5, 4.5, 5.5])
    new_last = np.array([0, 1, 2, 3])
    assert backlog_steps(step, written, event_wall, new_last).tolist() == [0, 1, 2, 2]
    saw_tooth = np.array([0, 3, 0, 3, 0, 3, 0, 3, 0])
    assert backlog_growth(np.arange(9.0), saw_tooth, 0.0, 8.0) == pytest.approx(0.0, abs=1e-9)
    growing = np.arange(9) * 2
    assert backlog_growth(np.arange(9.0), growing, 0.0, 8.0) == pytest.approx(16.0)
    assert np.isnan(backlog_growth(np.arange(9.0), growing, 7.5, 8.5))  # one event in the span


def test_the_appender_writes_the_loops_byte_for_byte_and_notes_every_step(tmp_path):
    loops = []
    for k in range(2):
        path = tmp_path / f"loop-{k}.log"
        SyntheticRun(steps=4, first_step=4 * k, anchors=k == 0, chip_ready_lines=k == 0, **RUN).write_server_log(path)
        loops.append(Loop(path, index_log(path)))
    appender = Appender(loops, tmp_path / "replayed.log", pace=4.0, duration_s=600.0, torn_every=2)
    appender.thread.start()
    appender.thread.join()
    assert (tmp_path / "replayed.log").read_bytes() == b"".join(loop.path.read_bytes() for loop in loops)
    step, wall = appender.written_steps()
    assert step.tolist() == list(range(8))
    assert (np.diff(wall) >= 0).all()
    assert appender.torn_writes > 0
