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
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dsprof.commands.analyze import analyze_paths
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
