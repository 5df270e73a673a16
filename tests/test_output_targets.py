"""Output paths that are not regular files: a device node (/dev/null), a FIFO, a socket, a symlink. The atomic
writer (temp file + os.replace) used to put a regular file in their place (it turned /dev/null into one); now a
target that is not a regular file is refused in one line (exit 2) naming the path, and a symlink to a regular file
is written through (the link stays). No test touches a real device: the nodes are made under tmp_path.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from autotune.cli.main import main
from autotune.errors import Unwritable
from autotune.fsutil import write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "recipes" / "qwen3.5-122b-a10b" / "h200" / "attune-tp1-pp4-ep8-rc2.yaml"


def run(capsys, *argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def fake_null(where: Path) -> Path | None:
    """A character device like /dev/null (1, 3) under tmp_path, or None where mknod is not allowed."""
    p = where / "null_x"
    try:
        os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        return None
    return p


@pytest.fixture
def nodes(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = {"fifo": fifo}
    dev = fake_null(tmp_path)
    if dev is not None:
        out["device"] = dev
    sock = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    out["socket"] = sock
    link = tmp_path / "link_to_fifo"
    link.symlink_to(fifo)
    out["link"] = link
    yield out
    s.close()


def kinds_kept(nodes) -> None:
    checks = {"fifo": stat.S_ISFIFO, "device": stat.S_ISCHR, "socket": stat.S_ISSOCK}
    for name, test in checks.items():
        if name in nodes:
            assert test(os.lstat(nodes[name]).st_mode), name
    assert nodes["link"].is_symlink() and stat.S_ISFIFO(os.stat(nodes["link"]).st_mode)


def test_the_atomic_writer_never_replaces_a_node(tmp_path, nodes):
    for name, p in nodes.items():
        for make_parents in (False, True):
            with pytest.raises(Unwritable, match="not a regular file|symbolic link"):
                write_text_atomic(p, "x\n", make_parents=make_parents)
    kinds_kept(nodes)
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_symlink_is_written_through_for_a_named_path_and_refused_in_own_trees(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old\n")
    os.chmod(real, 0o640)
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    write_text_atomic(link, "new\n", make_parents=False)  # a path the user named: through the link
    assert link.is_symlink() and real.read_text() == "new\n" and real.stat().st_mode & 0o777 == 0o640
    with pytest.raises(Unwritable, match="symbolic link"):
        write_text_atomic(link, "own\n")  # autotune's own tree: a planted link does not redirect the write
    assert link.is_symlink() and real.read_text() == "new\n"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere" / "x")
    with pytest.raises(Unwritable, match="does not exist"):
        write_text_atomic(dangling, "x", make_parents=False)


def test_export_refuses_nodes_and_writes_through_a_link(tmp_path, capsys, nodes):
    for name, p in nodes.items():
        rc, _, err = run(capsys, "export", SEED, "--out", p, "--format", "script")
        line = one_line(err)
        assert rc == 2 and str(p) in line and "not a regular file" in line and "stdout" in line, (name, line)
    kinds_kept(nodes)
    dangling = tmp_path / "gone.sh"
    dangling.symlink_to(tmp_path / "nowhere.sh")
    rc, _, err = run(capsys, "export", SEED, "--out", dangling, "--format", "script")
    line = one_line(err)
    assert rc == 2 and f"--out {dangling}: it is a symbolic link to" in line and "does not exist" in line, line
    assert "cannot write" not in line and line.count("give a file path") == 1 and "stdout" in line, line
    assert not (tmp_path / "nowhere.sh").exists()
    real = tmp_path / "launch.sh"
    real.write_text("old\n")
    link = tmp_path / "launch_link.sh"
    link.symlink_to(real)
    rc, _, err = run(capsys, "export", SEED, "--out", link)
    assert rc == 0, err
    assert link.is_symlink() and real.read_text().startswith("#!") and os.access(real, os.X_OK)


def test_recipes_list_html_refuses_nodes(tmp_path, capsys, nodes):
    for name, p in nodes.items():
        rc, _, err = run(capsys, "recipes", "list", "--html", p)
        line = one_line(err)
        assert rc == 2 and str(p) in line and "not a regular file" in line, (name, line)
    kinds_kept(nodes)


def test_calibrate_out_refuses_a_fifo_without_offering_stdout(tmp_path, capsys, nodes):
    rc, _, err = run(capsys, "calibrate", "--gpu", "H200", "--out", nodes["fifo"])
    line = one_line(err)
    assert rc == 2 and "not a regular file" in line and "stdout" not in line
    kinds_kept(nodes)
