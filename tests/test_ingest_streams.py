"""Logs that are not plain files: pipes (``cat server.log | dsprof analyze /dev/stdin``).

Each case runs on both STRACE readers (the compiled scanner and the Python reader).
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import subprocess
import sys

import pytest

from dsprof.analysis.ingest import read_paths, strace_pieces
from dsprof.analysis.store import dataset
from dsprof.commands.ingest import ingest_paths
from dsprof.errors import InputError
from dsprof.profiler.strace_format import format_prefix
from dsprof.testing.strace_readers import READERS, select_reader
from dsprof.testing.synthetic import SyntheticRun

PREFIX = format_prefix(1, 1, "INFO", "f").encode()
# Reads /dev/stdin as dsprof analyze would, and hands back what it read.
READ_STDIN = """
import pickle, sys
from dsprof.analysis.store import dataset
from dsprof.analysis.ingest import read_paths, strace_pieces
from dsprof.commands.ingest import ingest_paths
from dsprof.errors import InputError
from dsprof.profiler.strace_format import format_prefix
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


# dsprof itself, as a user runs it.
DSPROF = [sys.executable, "-c", "from dsprof.cli.main import main; main()"]


@pytest.mark.slow
@pytest.mark.parametrize("source", ["device", "pipe"])
def test_endless_binary_input_is_refused_in_one_line(reader, tmp_path, source):
    """/dev/zero never ends: only a look at its head can refuse it (a timeout stands in for a hang)."""
    if source == "device":
        run = subprocess.run([*DSPROF, "ingest", "/dev/zero", "-o", str(tmp_path / "ds")], check=False, capture_output=True, timeout=120)
        named = "/dev/zero"
    else:
        with open("/dev/zero", "rb") as zeros:
            run = subprocess.run(
                [*DSPROF, "analyze", "/dev/stdin", "-o", str(tmp_path / "out")], stdin=zeros, check=False, capture_output=True, timeout=120
            )
        named = "/dev/stdin"
    errors = run.stderr.decode().strip().splitlines()
    assert (
        run.returncode == 2
        and errors[-1] == f"dsprof: error: {named}:1: binary data, not a text log (expected a text log with [STRACE] records)"
    )
    assert "Traceback" not in run.stderr.decode()


def test_binary_file_is_refused_from_its_head_even_with_a_record_further_on(reader, tmp_path):
    noise = random.Random(7).randbytes(4 << 20)
    path = tmp_path / "blob.bin"
    path.write_bytes(noise + b"\n" + PREFIX + b"[STRACE] v=1 pid=1 tid=1 inv=1 hid=a depth=0 name=n ts=1 dur=1\n")
    first_nul = noise.index(b"\0")
    with pytest.raises(InputError) as info:
        read_paths([path])
    assert info.value.path == str(path) and info.value.line <= noise[:first_nul].count(b"\n") + 1


def test_a_record_in_the_head_keeps_a_damaged_log_readable(reader, tmp_path):
    record = PREFIX + b"[STRACE] v=1 pid=1 tid=1 inv=1 hid=a depth=0 name=n ts=1 dur=1\n"
    path = tmp_path / "damaged.log"
    path.write_bytes(record + bytes(3 << 20) + b"\n" + record)
    trace = read_paths([path])
    assert trace.spans.column("line").to_pylist() == [1, 3]


@pytest.mark.parametrize("interrupt_at", [1, 6])
def test_an_interrupted_ingest_leaves_no_output(reader, tmp_path, monkeypatch, interrupt_at):
    """SIGINT while a log is read (the first piece, or after time windows were closed): nothing of the dataset stays."""
    log = tmp_path / "server.log"
    SyntheticRun(ranks=2, steps=3000, period_ns=50_000_000).write_server_log(log)  # 150 s: about 9 time windows
    monkeypatch.setattr(strace_pieces, "PIECE_BYTES", 1 << 20)  # many pieces, a progress line after each
    messages: list[str] = []

    def progress(message: str) -> None:
        messages.append(message)
        if len(messages) == interrupt_at + 1:  # "reading ...", then one line per piece
            os.kill(os.getpid(), signal.SIGINT)

    output = tmp_path / "spans"
    with pytest.raises(KeyboardInterrupt):
        ingest_paths([log], output, progress=progress)
    assert not output.exists()
    ingest_paths([log], output)  # the same ingest, uninterrupted, completes
    assert (output / dataset.MANIFEST).is_file() and len(list(output.glob("*/*.parquet"))) > 6
