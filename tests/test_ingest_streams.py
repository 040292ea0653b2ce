"""Logs that are not plain files: pipes (``cat server.log | dsprof analyze /dev/stdin``).

Each case runs on both STRACE readers (the compiled scanner and the Python reader).
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from dsprof.analysis.ingest import read_paths
from dsprof.testing.strace_readers import READERS, select_reader
from dsprof.testing.synthetic import SyntheticRun

# Reads /dev/stdin as dsprof analyze would, and hands back what it read.
READ_STDIN = """
import pickle, sys
from dsprof.analysis.ingest import read_paths
trace = read_paths(["/dev/stdin"])
spans = trace.spans.drop_columns(["file"]).to_pylist()
sys.stdout.buffer.write(pickle.dumps((spans, trace.anchors.to_pylist(), trace.chip_devices.to_pylist(), trace.dropped, trace.lines_read)))
"""


@pytest.fixture(params=READERS)
def reader(request, monkeypatch):
    select_reader(request.param, monkeypatch)
    return request.param


def test_a_piped_log_gives_the_spans_and_anchors_of_the_file(reader, tmp_path):
    log = tmp_path / "server.log"
    SyntheticRun(ranks=2, steps=60).write_server_log(log)
    data = log.read_bytes()
    assert len(data) > 1 << 17  # more than a pipe's buffer and a file object's read-ahead
    piped = subprocess.run([sys.executable, "-c", READ_STDIN], input=data, capture_output=True, check=True)
    spans, anchors, chips, dropped, lines = pickle.loads(piped.stdout)
    from_file = read_paths([log])
    assert anchors == from_file.anchors.to_pylist() and len(anchors) == 2
    assert chips == from_file.chip_devices.to_pylist()
    assert (dropped, lines) == (from_file.dropped, from_file.lines_read)
    assert spans == from_file.spans.drop_columns(["file"]).to_pylist() and len(spans) > 1000
