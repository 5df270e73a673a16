"""Symlinks planted in a study folder: the lock is opened without following a link (a link at .lock used to get
its target truncated to 'pid N'), and a link where the study writes (trials/, a trial folder or a file in one,
planner/) is refused in one line naming it, before anything is written, instead of sending trial files outside."""

from __future__ import annotations

import pytest

from autotune.cli.main import main
from autotune.errors import ConfigError
from autotune.search.study import StudyDir

SEARCH = ["search", "--model", "tiny-moe", "--gpu", "cpu", "--count", "2", "--backend", "simulate", "--trials", "2"]


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "outside" / "victim.txt"
    v.parent.mkdir()
    v.write_text("precious\n")
    return v


def test_a_symlinked_lock_is_refused_and_its_target_kept(tmp_path, victim):
    sd = StudyDir(tmp_path / "runs", "s")
    sd.root.mkdir(parents=True)
    (sd.root / ".lock").symlink_to(victim)
    with pytest.raises(ConfigError, match=r"\.lock is a symbolic link"):
        sd.lock()
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("where", ["trials", "trials/3", "trials/3/steps.jsonl", "trials/3/logs", "planner",
                                   "planner/usage.json", "planner/exchanges", "study.db"])
def test_a_link_where_the_study_writes_is_refused(tmp_path, victim, where):
    sd = StudyDir(tmp_path / "runs", "s")
    link = sd.root / where
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim.parent if not where.endswith((".jsonl", ".json", ".db")) else victim)
    with pytest.raises(ConfigError, match="symbolic link") as exc:
        sd.lock()
    assert str(link) in str(exc.value) and "\n" not in str(exc.value)
    assert sd._lock_fh is None  # not left locked
    assert victim.read_text() == "precious\n" and sorted(p.name for p in victim.parent.iterdir()) == ["victim.txt"]


def test_trial_dir_refuses_a_link_made_after_the_lock(tmp_path, victim):
    sd = StudyDir(tmp_path / "runs", "s")
    sd.lock()
    try:
        assert sd.trial_dir(0) == sd.root / "trials" / "0"
        (sd.root / "trials").symlink_to(victim.parent)
        with pytest.raises(ConfigError, match="trials is a symbolic link"):
            sd.trial_dir(1)
    finally:
        sd.unlock()


def test_the_cli_refuses_a_planted_trials_link_in_one_line(tmp_path, victim, capsys):
    runs = tmp_path / "runs"
    (runs / "sl").mkdir(parents=True)
    (runs / "sl" / ".lock").symlink_to(victim)
    capsys.readouterr()
    rc = main([*SEARCH, "--runs-dir", str(runs), "--study", "sl"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and ".lock" in err and "Traceback" not in err
    (runs / "sl" / ".lock").unlink()
    (runs / "sl" / "trials").symlink_to(victim.parent)
    rc = main([*SEARCH, "--runs-dir", str(runs), "--study", "sl"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "trials is a symbolic link" in err
    assert victim.read_text() == "precious\n" and sorted(p.name for p in victim.parent.iterdir()) == ["victim.txt"]
