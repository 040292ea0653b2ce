"""The Ray engine on a real local cluster gives the same summary.json as the embedded engine.

The test starts a two-node Ray cluster on loopback (`ray start --head` and a
second `ray start` joining it, one CPU each), analyses one artifact with both
engines, and compares the summaries. Skipped where Ray is not installed (it is
the optional `cluster` extra, which `make test` installs).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dsprof.commands.analysis_job import analyze_paths
from dsprof.testing.synthetic import SyntheticRun

pytest.importorskip("ray")
pytestmark = pytest.mark.cluster
RAY = Path(sys.executable).with_name("ray")
DSPROF = Path(sys.executable).with_name("dsprof")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """A head node and one worker node on 127.0.0.1; stopped afterwards."""
    # Ray's socket paths under it must fit AF_UNIX's 107 bytes; pytest's (xdist's popen-gwN/ too) can be longer
    temp = Path(tempfile.mkdtemp(prefix="ray-"))
    # Ray wants every node and the driver to share an authentication token
    auth = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    saved = {key: os.environ.get(key) for key in auth}
    os.environ.update(auth)
    env = dict(os.environ)
    address = f"127.0.0.1:{_free_port()}"
    common = ["--num-cpus", "1", "--disable-usage-stats"]
    head = [
        str(RAY),
        "start",
        "--head",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        address.split(":")[1],
        "--include-dashboard",
        "false",
        "--temp-dir",
        str(temp),
        *common,
    ]
    subprocess.run(head, check=True, capture_output=True, env=env, timeout=180)
    try:
        subprocess.run(
            [str(RAY), "start", "--address", address, "--node-ip-address", "127.0.0.1", *common],
            check=True,
            capture_output=True,
            env=env,
            timeout=180,
        )
        yield address
    finally:
        subprocess.run([str(RAY), "stop", "--force"], capture_output=True, env=env, timeout=120, check=False)
        shutil.rmtree(temp, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_ray_engine_on_two_nodes_gives_the_embedded_summary(cluster, tmp_path):
    import numpy as np

    fence = np.full((16, 150), 9_000_000, dtype=np.int64)
    fence[5, 40] += 30_000_000
    fence[11, 90:] += 2_000_000
    SyntheticRun(ranks=16, steps=150, fence_wait_ns=fence, two_per_line_every=11, launch_waits_for_claim=True).write(tmp_path / "run")
    embedded = analyze_paths([tmp_path / "run"], tmp_path / "embedded").summary
    # the CLI as a user runs it against a cluster, in a process of its own
    proc = subprocess.run(
        [str(DSPROF), "analyze", str(tmp_path / "run"), "-o", str(tmp_path / "ray"), "--engine", "ray", "--address", cluster],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    distributed = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert distributed == json.loads(json.dumps(embedded))
    assert embedded["tail_steps"]["count"] > 0 and embedded["validation"]["valid"]


# -- a local cluster started for the run leaves nothing behind, however the run ends (issue 21) ---------------


def _process_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, start time, command line) of every live process (zombies are dead)."""
    table = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] == "Z":  # dead, waiting to be reaped
                    continue
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                table[int(entry.name)] = (int(fields[1]), fields[19], command)
        except (OSError, IndexError):
            continue
    return table


def _below(root: int) -> dict[int, tuple[str, str]]:
    """pid -> (start time, command line) of every process below ``root``."""
    table = _process_table()
    found, stack = {}, [root]
    while stack:
        parent = stack.pop()
        for pid, (ppid, started, command) in table.items():
            if ppid == parent:
                found[pid] = (started, command)
                stack.append(pid)
    return found


def _alive(processes: dict[int, tuple[str, str]]) -> list[str]:
    """Those of ``processes`` still running (the same pid and start time), as command lines."""
    table = _process_table()
    return [command for pid, (started, command) in processes.items() if pid in table and table[pid][1] == started]


@pytest.fixture
def held_run(tmp_path_factory):
    """A run, a short TMPDIR (Ray's sockets under it must fit AF_UNIX's 107 bytes) and a side folder whose
    performance_summary.json is a FIFO without a writer: the driver, given it as an input, blocks there once the
    ingest tasks are done, with the cluster up (its agents running), so the test stops it in a known state."""
    root = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    SyntheticRun(ranks=4, steps=60).write(root / "run")
    (root / "side").mkdir()
    os.mkfifo(root / "side" / "performance_summary.json")
    (root / "t").mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _held_analysis(root: Path) -> tuple[subprocess.Popen, dict[int, tuple[str, str]]]:
    """``dsprof analyze --engine ray`` on a local cluster of its own, held on the FIFO; its processes once its agents run."""
    env = {**os.environ, "TMPDIR": str(root / "t"), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    held = root / "side" / "performance_summary.json"
    command = [str(DSPROF), "analyze", str(root / "run"), str(held), "-o", str(root / "out"), "--engine", "ray"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("cluster: ingesting"):
            break
    else:
        raise AssertionError(f"the command ended before it was held: exit status {proc.wait()}")
    below = _below(proc.pid)
    while not any(command.startswith("ray::RuntimeEnvAgent") for _, command in below.values()):  # a state, not a time
        assert proc.poll() is None
        time.sleep(0.1)
        below = _below(proc.pid)
    return proc, below


def test_sigterm_of_a_local_ray_analysis_is_one_line_and_leaves_nothing(held_run):
    proc, cluster = _held_analysis(held_run)
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 143, rest[-3000:]
    assert rest.strip().splitlines() == ["dsprof: error: stopped by SIGTERM; no partial output is left"]  # no native stack dump
    assert _alive(cluster) == [], "Ray processes outlived the command"
    assert list((held_run / "t").iterdir()) == [], "dsprof-spans-* or Ray's session directory left in TMPDIR"


def test_sigkill_of_a_local_ray_analysis_takes_the_cluster_with_it(held_run):
    proc, cluster = _held_analysis(held_run)
    guards = [pid for pid, (_, command) in cluster.items() if "dsprof.analysis.cluster.guard" in command]
    assert len(guards) == 1
    proc.kill()
    proc.wait(timeout=60)
    while _alive({pid: cluster[pid] for pid in guards}):  # until the guard is done: a state, not a time
        time.sleep(0.05)
    assert _alive(cluster) == [], "Ray processes outlived the SIGKILLed command"
    left = [p.name for p in (held_run / "t").iterdir()]
    assert [name for name in left if not name.startswith("dsprof-spans-")] == [], "Ray's session directory left in TMPDIR"


def test_a_bad_log_in_a_ray_task_is_one_line_and_leaves_nothing(held_run):
    os.unlink(held_run / "side" / "performance_summary.json")
    (held_run / "run" / "zz.log").write_bytes(b"\0\1\2\3" * 1000)
    env = {**os.environ, "TMPDIR": str(held_run / "t"), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [str(DSPROF), "analyze", str(held_run / "run"), "-o", str(held_run / "out"), "--engine", "ray"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dsprof: error: {held_run / 'run' / 'zz.log'}") and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert list((held_run / "t").iterdir()) == []
