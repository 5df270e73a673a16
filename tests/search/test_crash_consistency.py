"""Crash consistency of a search: a kill -9 at each exact point between enqueue and tell (and while the
outputs are published), then a resume, leaves a study whose params match its layouts, with no trial left
WAITING or RUNNING, no layout measured twice, and outputs that are one whole set. Study names that would
escape runs/ are refused with nothing written."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.cli.main import main
from autotune.killpoints import POINTS
from autotune.layout import Layout
from autotune.layout.dimensions import layout_params

ARGS = ["search", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32"]


def _tree_sum(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("name", ["..", ".", "../x", "a/b", "x" * 300, "-rf", ""])
def test_study_names_that_escape_runs_are_refused_and_nothing_changes(tmp_path, monkeypatch, capsys, name):
    work = tmp_path / "work"
    (work / "runs").mkdir(parents=True)
    (work / "keep.txt").write_text("precious\n")
    monkeypatch.chdir(work)
    before = _tree_sum(tmp_path)
    rc = main([*ARGS, "--study", name, "--trials", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--study" in err
    assert _tree_sum(tmp_path) == before


def test_a_failed_start_removes_only_what_it_created(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "notes.txt").write_text("mine\n")
    rc = main([*ARGS, "--runs-dir", str(tmp_path), "--study", "old", "--trials", "1", "--sampler", "gp",
               "--planner", "optuna", "--model", "no-such-model"])
    assert rc == 2
    assert (tmp_path / "old" / "notes.txt").read_text() == "mine\n"


def _run(tmp_path: Path, kill_at: str | None, trials: int, extra: tuple = ()) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_KILL_AT"}
    if kill_at:
        env["AUTOTUNE_KILL_AT"] = kill_at
    cmd = [sys.executable, "-m", "autotune.cli.main", *ARGS, "--runs-dir", str(tmp_path), "--study", "k",
           "--trials", str(trials), "--json", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def _check_study(db: Path) -> list:
    study = optuna.load_study(study_name="k", storage=f"sqlite:///{db}")
    TS = optuna.trial.TrialState
    assert not [t.number for t in study.trials if t.state in (TS.WAITING, TS.RUNNING)]
    complete = [t for t in study.trials if t.state == TS.COMPLETE]
    for t in complete:
        lay = Layout.from_dict(t.user_attrs["layout"])
        assert t.params == layout_params(lay), f"trial {t.number}: params do not match its layout"
    keys = [json.dumps(t.params, sort_keys=True) for t in complete]
    assert len(keys) == len(set(keys)), "a layout was measured twice"
    return complete


def _check_outputs(study_root: Path) -> dict:
    summary = json.loads((study_root / "summary.json").read_text())
    for p in summary["recipes"]:
        assert Path(p).is_file(), f"summary lists {p}, which is not there"
    listed = {Path(p).name for p in summary["recipes"]}
    assert {p.name for p in (study_root / "recipes").glob("*.yaml")} == listed
    assert not list(study_root.rglob("*.tmp"))
    return summary


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
def test_kill_at_each_point_then_resume(tmp_path, point):
    first = _run(tmp_path, None, 2)  # a finished study with published outputs to protect
    assert first.returncode == 0, first.stderr
    nth = 1 if point.startswith("outputs") else 2  # outputs are published once per run; trials pass twice
    killed = _run(tmp_path, f"{point}:{nth}", 5)
    assert killed.returncode == -9, (point, killed.returncode, killed.stderr[-500:])
    _check_outputs(tmp_path / "k")  # the previous set is whole (or the new one, after the swap)
    done = _run(tmp_path, None, 5)
    assert done.returncode == 0, done.stderr
    complete = _check_study(tmp_path / "k" / "study.db")
    assert len(complete) == 5 == json.loads(done.stdout)["dispatched"]
    summary = _check_outputs(tmp_path / "k")
    assert summary["best"]["number"] in {t.number for t in complete}


@pytest.mark.slow
def test_optuna_planner_spends_no_trial_twice(tmp_path):
    done = _run(tmp_path, None, 40, ("--planner", "optuna", "--seed", "1"))
    assert done.returncode == 0, done.stderr
    complete = _check_study(tmp_path / "k" / "study.db")
    assert len(complete) == 40


def test_a_publication_keeps_the_set_it_replaced_one_round(tmp_path):
    from autotune.fsutil import published_dir
    from autotune.search.outputs import Publication

    sets = []
    for n in range(3):
        pub = Publication(tmp_path)
        pub.write_json("summary.json", {"n": n})
        sets.append(pub.commit())
    assert published_dir(tmp_path) == sets[-1]
    assert json.loads((tmp_path / "summary.json").read_text()) == {"n": 2}
    assert not sets[0].exists() and sets[1].is_dir()  # a reader of the replaced set can still finish
