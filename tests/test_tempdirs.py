"""Temporary folders: a live owner's folder stays, a dead owner's goes, nothing planted is followed (dsprof.tempdirs)."""

from __future__ import annotations

import os
import subprocess
import sys

from dsprof.tempdirs import make_owned_dir, remove_dead, remove_owned_dir

PREFIX = "dsprof-test-"
HOLDER = (
    "import sys; from dsprof.tempdirs import make_owned_dir; print(make_owned_dir(sys.argv[1], sys.argv[2]), flush=True); sys.stdin.read()"
)


def test_a_folder_stays_while_its_owner_lives_and_goes_when_it_is_killed(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, PREFIX, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        folder = tmp_path / os.path.basename(holder.stdout.readline().strip())
        remove_dead(tmp_path, PREFIX, young_s=0)
        assert folder.is_dir()  # its owner holds the lock
    finally:
        holder.kill()
        holder.wait(30)
    remove_dead(tmp_path, PREFIX, young_s=0)
    assert not folder.exists()


def test_young_or_unowned_folders_planted_links_and_other_prefixes_are_left_alone(tmp_path):
    young = tmp_path / (PREFIX + "young")
    young.mkdir()
    (young / ".owner").touch()  # not locked yet: maybe another process making it right now
    unowned = tmp_path / (PREFIX + "unowned")
    unowned.mkdir()  # no owner file: an older dsprof's folder, perhaps in use
    os.utime(unowned, (0, 0))
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep").write_text("x")
    (tmp_path / (PREFIX + "link")).symlink_to(target)
    other = tmp_path / "other-prefix"
    other.mkdir()
    os.utime(other, (0, 0))
    remove_dead(tmp_path, PREFIX)
    assert young.is_dir() and (target / "keep").is_file() and other.is_dir() and unowned.is_dir()
    os.utime(young, (0, 0))
    remove_dead(tmp_path, PREFIX)
    assert not young.exists() and (target / "keep").is_file() and unowned.is_dir()


def test_this_process_keeps_its_own_folders_until_it_removes_them(tmp_path):
    mine = make_owned_dir(PREFIX, tmp_path)
    os.utime(mine, (0, 0))
    remove_dead(tmp_path, PREFIX, young_s=0)
    assert mine.is_dir() and oct(mine.stat().st_mode & 0o777) == "0o700"
    remove_owned_dir(mine)
    remove_owned_dir(mine)  # twice is harmless
    assert not mine.exists()


# makes a folder, forks a child that exits normally, then exits itself without removing the folder
LEAVER = """import os, sys
from dsprof.tempdirs import make_owned_dir
folder = make_owned_dir(sys.argv[1], sys.argv[2])
(folder / "spill.tmp").write_bytes(b"x")
child = os.fork()
if child == 0:
    sys.exit(0)  # a forked child's exit leaves its parent's folder alone
os.waitpid(child, 0)
print(folder, os.path.isdir(folder), flush=True)"""


def test_a_folder_its_process_still_owns_at_exit_goes_with_it(tmp_path):
    """A signal's exception may cut a cleanup short: the folder is removed at exit all the same, by its maker only."""
    done = subprocess.run([sys.executable, "-c", LEAVER, PREFIX, str(tmp_path)], capture_output=True, text=True, timeout=60, check=True)
    folder, alive_after_child = done.stdout.split()
    assert alive_after_child == "True" and not os.path.exists(folder)
