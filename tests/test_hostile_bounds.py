"""Hostile corpus, round 2 (issue 21): memory and time bounded for every reader, whatever the input's shape.

The inputs here are small, with the readers' limits scaled down to them where
the shape matters (a line longer than the longest line kept, more windows than
the bound), so each test is quick; the full-size figures (peak RSS, seconds)
are measured by benchmarks/bench_hostile_bounds.py.
"""

from __future__ import annotations

import mmap

from dsprof.analysis.ingest import strace_pieces
from dsprof.analysis.ingest.strace_log import read_strace_log

# -- 1. one-line logs ------------------------------------------------------------------------------------


def test_a_giant_line_lets_its_pages_go_as_it_is_skipped(monkeypatch, tmp_path):
    """A mapped log's overlong line is read through, never held: its pages are released as the skip passes them.

    They once stayed mapped until the next piece was cut, so a log of one 2 GiB
    line held 2 GiB of page cache in the process (2.24 GB peak RSS).
    """
    monkeypatch.setattr(strace_pieces, "CHUNK_BYTES", 4 * mmap.PAGESIZE)
    monkeypatch.setattr(strace_pieces, "MAX_LINE_BYTES", mmap.PAGESIZE)
    released: list[int] = []
    drop_pages = strace_pieces._drop_pages

    def recording(mapped, done, upto):
        released.append(upto)
        return drop_pages(mapped, done, upto)

    monkeypatch.setattr(strace_pieces, "_drop_pages", recording)
    giant = b"x" * (40 * mmap.PAGESIZE)
    log = tmp_path / "one-line.log"
    log.write_bytes(b"[head] start\n" + giant + b"\nafter\n")
    with open(log, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        pieces = [piece if isinstance(piece, int) else bytes(piece) for piece in strace_pieces.mapped_pieces(mapped)]
    assert pieces == [b"[head] start\n", 1, b"after\n"]
    line_end = len(b"[head] start\n") + len(giant)
    assert max(released) >= line_end - mmap.PAGESIZE  # all but the line's last page let go
    assert read_strace_log(log).dropped == {"overlong_line": 1}
