"""A driver killed with kill -9 cannot remove the private Ray session folder it made under /tmp
(/tmp/autotune-ray-<rand>/). The folder carries its owner's pid (owner.pid), and the next RayBackend removes
the folders whose owner is dead: only real folders of this user that carry a regular owner.pid, never a link,
never a live driver's. Tested on a fake base folder, without Ray."""

from __future__ import annotations

import os
import subprocess
import sys

from autotune.trials.backends.ray import OWNER_FILE, TMP_PREFIX, make_own_tmp, sweep_stale_tmp


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_make_own_tmp_stamps_the_owner(tmp_path):
    d = make_own_tmp(str(tmp_path))
    assert os.path.basename(d).startswith(TMP_PREFIX)
    text = open(os.path.join(d, OWNER_FILE)).read().split()
    assert text[:2] == ["pid", str(os.getpid())]
    assert sweep_stale_tmp(str(tmp_path)) == [] and os.path.isdir(d)  # its owner (this process) is alive


def test_stale_folders_of_dead_drivers_are_removed_and_nothing_else(tmp_path):
    base = tmp_path / "tmp"
    base.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")

    stale = base / f"{TMP_PREFIX}stale1"
    (stale / "session_x" / "sockets").mkdir(parents=True)
    (stale / OWNER_FILE).write_text(f"pid {dead_pid()} -\n")
    (stale / "session_x" / "escape").symlink_to(outside)  # a link inside: removed as a link, not followed

    live = base / f"{TMP_PREFIX}live1"
    live.mkdir()
    (live / OWNER_FILE).write_text(f"pid {os.getpid()} -\n")
    unowned = base / f"{TMP_PREFIX}noowner"  # no owner file: not ours to judge
    unowned.mkdir()
    garbled = base / f"{TMP_PREFIX}garbled"
    garbled.mkdir()
    (garbled / OWNER_FILE).write_text("hello")
    linked = base / f"{TMP_PREFIX}link"  # a symlink named like one: never followed or removed
    linked.symlink_to(outside)
    (outside / OWNER_FILE).write_text(f"pid {dead_pid()} -\n")
    owner_link = base / f"{TMP_PREFIX}ownerlink"  # owner.pid itself a link: skipped
    owner_link.mkdir()
    (owner_link / OWNER_FILE).symlink_to(outside / OWNER_FILE)
    other = base / "other-dir"
    other.mkdir()

    removed = sweep_stale_tmp(str(base))
    assert removed == [str(stale)] and not stale.exists()
    for kept in (live, unowned, garbled, linked, owner_link, other):
        assert kept.exists() or kept.is_symlink(), kept
    assert (outside / "keep.txt").read_text() == "keep" and (outside / OWNER_FILE).exists()


def test_a_reused_pid_counts_as_dead(tmp_path):
    d = tmp_path / f"{TMP_PREFIX}reused"
    d.mkdir()
    (d / OWNER_FILE).write_text(f"pid {os.getpid()} 1\n")  # this pid, but a start time it does not have
    if os.path.exists(f"/proc/{os.getpid()}/stat"):
        assert sweep_stale_tmp(str(tmp_path)) == [str(d)]
