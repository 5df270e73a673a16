"""`autotune dashboard --html` at a device node, FIFO or symlink: refused in one line (exit 2), the node kept;
a symlink to a regular file is written through and stays a link."""

from __future__ import annotations

import os
import stat

from autotune.cli.main import main


def _err(capsys, *argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_dashboard_html_refuses_a_fifo_and_a_device_and_writes_through_a_link(capsys, sim_study, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    targets = [fifo]
    try:
        os.mknod(tmp_path / "null_x", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        targets.append(tmp_path / "null_x")
    except OSError:
        pass
    for p in targets:
        rc, _, err = _err(capsys, "dashboard", sim_study, "--html", p)
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and str(p) in lines[0] and "not a regular file" in lines[0], err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    if len(targets) > 1:
        assert stat.S_ISCHR(os.lstat(targets[1]).st_mode)
    real = tmp_path / "report.html"
    real.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(real)
    rc, _, err = _err(capsys, "dashboard", sim_study, "--html", link, "--json")
    assert rc == 0, err
    assert link.is_symlink() and real.read_text().startswith("<!DOCTYPE html>")
