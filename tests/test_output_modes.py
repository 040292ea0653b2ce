"""Outputs are created as any file the user writes (mode 0666 less the umask), and still replaced atomically."""

from __future__ import annotations

import os
import stat

import pytest
from click.testing import CliRunner

from dsprof.cli.main import cli
from dsprof.fileio import atomic_output, atomic_write_text
from dsprof.testing.synthetic import SyntheticRun


@pytest.fixture
def umask():
    """Set the process umask for one test, and put the previous one back."""
    previous = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(previous)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600), (0o002, 0o664)])
def test_new_and_replaced_outputs_follow_the_umask(tmp_path, umask, mask, expected):
    umask(mask)
    target = tmp_path / "summary.json"
    atomic_write_text(target, "{}\n")
    assert _mode(target) == expected
    target.chmod(0o600)  # a replacement is a new file: created afresh, like any file the user writes
    atomic_write_text(target, '{"new": true}\n')
    assert _mode(target) == expected
    assert target.read_text() == '{"new": true}\n'


def test_the_new_content_is_written_next_to_the_target_flushed_then_renamed(tmp_path, umask, monkeypatch):
    """Spies on the real calls (each one still runs): a temporary file in the target's directory, fsynced, renamed over it."""
    calls: list[tuple] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(source, destination, *, src_dir_fd=None, dst_dir_fd=None):  # names relative to the directory's descriptor
        where = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in (src_dir_fd, dst_dir_fd) if fd is not None}
        calls.append(("replace", os.path.join(where.get(src_dir_fd, ""), source), os.path.join(where.get(dst_dir_fd, ""), destination)))
        return real_replace(source, destination, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "out" / "report.html"
    with atomic_output(target) as handle:
        handle.write(b"<html></html>\n")
        temporary = os.readlink(f"/proc/self/fd/{handle.fileno()}")
        assert not target.exists(), "nothing at the target before the block ends"
        assert _mode(temporary) == 0o644
    assert calls[0] == ("fsync", temporary)
    assert calls[1] == ("replace", temporary, str(target))
    assert os.path.dirname(temporary) == str(target.parent)
    assert os.path.basename(temporary).startswith(".report.html.")
    assert calls[2:] == [("fsync", str(target.parent))]  # the rename itself made durable
    assert target.read_bytes() == b"<html></html>\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.html"]


def test_analyze_and_export_outputs_are_0644_under_umask_022(tmp_path, umask):
    umask(0o022)
    run = SyntheticRun(ranks=2, steps=6).write(tmp_path / "run")
    for args in (
        ["analyze", str(run)],
        ["export", str(run), "-o", str(run / "t.pftrace")],
        ["export", str(run), "-o", str(run / "t.json")],
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
    outputs = ("summary.json", "summary.md", "report.html", "combined-swimlane.json", "t.pftrace", "t.json")
    assert {name: oct(_mode(run / name)) for name in outputs} == {name: "0o644" for name in outputs}
