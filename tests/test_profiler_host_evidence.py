"""Host evidence (SPEC §2.1) and host.gc spans of the STRACE emitter, measured against real CPU work.

Every figure here is one the OS really produced: CPU burnt by busy loops, run
-queue waits caused by a competing process pinned to the same CPU, garbage
collected by real collections.
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from dsprof.profiler import strace
from dsprof.profiler.strace_format import GC, GC_HID, HOST_EVIDENCE_ATTRS, OS_CPU_NS, OS_MAJFLT, OS_NIVCSW, OS_RQ_NS

RECORD = re.compile(r"\[STRACE\] v=1 pid=(\d+) tid=(\d+) inv=(\d+) hid=(\S+) depth=(\d+) name=(\S+) ts=(\d+) dur=(\d+)(.*)$")
MS = 1_000_000


def records(path) -> list[dict]:
    """Every STRACE record of a log as a dict of its fields and attributes (values as text)."""
    found = []
    for line in path.read_text().splitlines():
        match = RECORD.search(line)
        if match:
            pid, tid, inv, hid, depth, name, ts, dur, rest = match.groups()
            found.append(
                {
                    "pid": pid,
                    "tid": tid,
                    "inv": inv,
                    "hid": hid,
                    "depth": depth,
                    "name": name,
                    "ts": ts,
                    "dur": dur,
                    **dict(item.split("=", 1) for item in rest.split()),
                }
            )
    return found


@pytest.fixture
def emitter(tmp_path):
    """The emitter on a fresh log with host evidence on; yields the log's path."""
    path = tmp_path / "server.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    was = strace.host_evidence_enabled()
    strace.set_host_evidence(True)
    strace.enable(fd, gc_spans=False)
    yield path
    strace.disable()
    strace.set_host_evidence(was)
    os.close(fd)


def burn(ms: float) -> None:
    """Busy work for ``ms`` of this thread's CPU time."""
    deadline = time.thread_time_ns() + int(ms * MS)
    while time.thread_time_ns() < deadline:
        pass


def test_evidence_of_two_samples_known_answer():
    assert strace.evidence((10, 20, 3, 1), (110, 70, 5, 4)) == {OS_CPU_NS: 100, OS_RQ_NS: 50, OS_NIVCSW: 2, OS_MAJFLT: 3}
    assert strace.evidence((10, -1, 3, 1), (110, -1, 5, 4)) == {OS_CPU_NS: 100, OS_NIVCSW: 2, OS_MAJFLT: 3}
    assert strace.evidence((10, -1, -1, -1), (110, -1, -1, -1)) == {OS_CPU_NS: 100}
    assert strace.evidence(None, (1, 2, 3, 4)) == strace.evidence((1, 2, 3, 4), None) == {}


def test_span_evidence_tells_cpu_work_from_sleep(emitter):
    with strace.span("busy", inv=1, hid="h", step=3):
        burn(30)
    with strace.span("asleep", inv=1, hid="h"):
        time.sleep(0.03)
    busy, asleep = records(emitter)
    assert list(busy)[-5:] == ["step", *HOST_EVIDENCE_ATTRS]  # the span's attributes, then the evidence
    assert 30 * MS <= int(busy[OS_CPU_NS]) <= int(busy["dur"])
    assert int(asleep["dur"]) >= 30 * MS and int(asleep[OS_CPU_NS]) < 5 * MS
    for record in (busy, asleep):
        assert int(record[OS_RQ_NS]) >= 0 and int(record[OS_NIVCSW]) >= 0 and int(record[OS_MAJFLT]) >= 0


def test_run_queue_wait_shows_when_a_process_competes_for_the_cpu(emitter):
    """A busy process pinned to this thread's CPU: the span's CPU share drops and os.rq_ns shows the wait."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    competitor = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (f"import os, time\nos.sched_setaffinity(0, {{{cpu}}})\nend = time.monotonic() + 5\nwhile time.monotonic() < end:\n    pass\n"),
        ]
    )
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.3)  # the competitor is pinned and spinning
        with strace.span("contended", inv=1, hid="h"):
            burn(60)
    finally:
        os.sched_setaffinity(0, before)
        competitor.kill()
        competitor.wait()
    contended = records(emitter)[0]
    dur, cpu_ns, rq_ns = int(contended["dur"]), int(contended[OS_CPU_NS]), int(contended[OS_RQ_NS])
    assert cpu_ns >= 60 * MS
    # the CPU was shared: the span waited in the run queue for much of what it did not run
    assert rq_ns >= 20 * MS and rq_ns <= dur - cpu_ns + 2 * MS
    assert int(contended[OS_NIVCSW]) >= 1


def test_each_thread_reports_its_own_evidence(emitter):
    barrier = threading.Barrier(2)

    def work(name: str, busy: bool) -> None:
        barrier.wait()
        with strace.span(name, inv=2, hid="h"):
            burn(40) if busy else time.sleep(0.04)

    threads = [threading.Thread(target=work, args=("busy", True)), threading.Thread(target=work, args=("idle", False))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    found = {r["name"]: r for r in records(emitter)}
    assert found["busy"]["tid"] != found["idle"]["tid"]
    assert int(found["busy"][OS_CPU_NS]) >= 40 * MS
    assert int(found["idle"][OS_CPU_NS]) < 10 * MS


def test_a_forked_child_samples_its_own_thread(emitter):
    strace.host_sample()  # the parent's thread has its schedstat open now
    parent_fd = strace.TRACER.per_thread.state.schedstat_fd
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with strace.span("child", inv=3, hid="h"):
                burn(20)
            fd = strace.TRACER.per_thread.state.schedstat_fd
            os.write(write_fd, f"{fd} {os.readlink(f'/proc/self/fd/{fd}')}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        child_fd, child_path = pipe.read().split()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # the child reopened schedstat for its own thread, not the copy of the parent's
    assert child_path == f"/proc/{pid}/task/{pid}/schedstat"
    assert os.readlink(f"/proc/self/fd/{parent_fd}") == f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat"
    child = records(emitter)[0]
    assert child["pid"] == str(pid) and int(child[OS_CPU_NS]) >= 20 * MS and OS_RQ_NS in child
    assert int(child_fd) >= 0


def test_without_schedstat_cpu_comes_from_the_thread_and_rq_is_omitted(emitter, monkeypatch):
    """The fallback of a kernel without schedstats, exercised with a path that does not exist."""
    monkeypatch.setattr(strace, "SCHEDSTAT_PATH", "/proc/thread-self/no-such-schedstat")

    def work() -> None:  # a fresh thread opens (tries to open) its schedstat anew
        with strace.span("fallback", inv=4, hid="h"):
            burn(20)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    fallback = records(emitter)[0]
    assert int(fallback[OS_CPU_NS]) >= 20 * MS
    assert OS_RQ_NS not in fallback and OS_NIVCSW in fallback and OS_MAJFLT in fallback


def test_switched_off_there_is_no_evidence_and_no_sample(emitter):
    strace.set_host_evidence(False)
    assert strace.host_sample() is None and strace.TRACER.sampling is False
    with strace.span("plain", inv=5, hid="h", step=1):
        pass
    plain = records(emitter)[0]
    assert not set(HOST_EVIDENCE_ATTRS) & set(plain) and plain["step"] == "1"
    strace.set_host_evidence(True)
    assert strace.TRACER.sampling is True and len(strace.host_sample()) == 4
    strace.disable()  # the emitter off: no sampling either
    assert strace.host_sample() is None


def test_environment_switch_turns_evidence_off_for_other_users_of_the_emitter():
    code = "from dsprof.profiler import strace\nwith strace.span('x', inv=1, hid='h'):\n    pass\n"
    found = {}
    for value in ("0", "1"):
        env = dict(os.environ, DSPROF_STRACE="1", DSPROF_HOST_EVIDENCE=value)
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
        found[value] = next(line for line in proc.stderr.splitlines() if "name=x " in line)
    assert OS_CPU_NS not in found["0"] and OS_CPU_NS in found["1"]


def test_every_collection_is_a_host_gc_span_of_the_collecting_thread(tmp_path):
    path = tmp_path / "gc.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    strace.set_host_evidence(True)
    strace.enable(fd)  # gc spans are on by default
    collected: list[int] = []
    tids: list[int] = []

    def collect() -> None:
        tids.append(threading.get_native_id())
        with strace.span("around", inv=9, hid="h"):  # a collection inside an open span is still depth 0
            for _ in range(2):
                garbage = [[] for _ in range(500)]
                garbage.append(garbage)
                del garbage
                collected.append(gc.collect())

    try:
        thread = threading.Thread(target=collect)
        thread.start()
        thread.join()
        strace.disable()
        gc.collect()  # after disable: the callback is gone, nothing is written
        assert strace.TRACER.on_gc not in gc.callbacks
        strace.enable(fd, gc_spans=False)
        gc.collect()
        assert strace.TRACER.on_gc not in gc.callbacks
    finally:
        strace.disable()
        os.close(fd)
    spans = [r for r in records(path) if r["name"] == GC and r["tid"] == str(tids[0])]
    explicit = [r for r in spans if r["gen"] == "2"]
    assert len(explicit) == 2 and len(records(path)) == len(spans) + 1  # + the "around" span
    for span, count in zip(explicit, collected, strict=True):
        assert (span["depth"], span["hid"], span["pid"]) == ("0", GC_HID, str(os.getpid()))
        assert int(span["collected"]) == count >= 501
        assert int(span[OS_CPU_NS]) > 0 and OS_RQ_NS in span
    assert len({s["inv"] for s in spans}) == len(spans)  # one invocation per collection
    around = next(r for r in records(path) if r["name"] == "around")
    assert all(int(around["ts"]) <= int(s["ts"]) for s in explicit)
