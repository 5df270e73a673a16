"""The search's gates stage end to end: a real local CPU search on tiny-moe verifies its winner against a
reference run of the simplest layout on the same rows; a simulated search's gates say why they did not run."""

from __future__ import annotations

import json

import pytest
import yaml

from autotune.cli.main import main


def _search(capsys, tmp_path, *args) -> dict:
    capsys.readouterr()
    assert main(["search", *args, "--runs-dir", str(tmp_path), "--study", "g", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _recipes(out: dict) -> list[dict]:
    return [yaml.safe_load(open(p)) for p in out["recipes"]]


def test_a_simulated_search_fills_correctness_but_verifies_nothing(tmp_path, capsys):
    out = _search(capsys, tmp_path, "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32", "--trials", "3")
    for r in _recipes(out):
        c = r["correctness"]
        assert r["status"] == "predicted" and c["result"] == "not run"
        assert c["configuration"] in ("pass", "needs component test") and "predicted" in c["summary"]
        assert c["convergence"] is None and c["reference"].startswith("the simplest candidate layout")
    assert all(g["status"] == "not run" for g in out["gates"].values())
    assert out["calibrate"] is None  # predictions teach a calibration nothing


@pytest.mark.slow
def test_a_local_search_verifies_its_winner_against_a_reference_run(tmp_path, capsys):
    out = _search(capsys, tmp_path, "--model", "tiny-moe", "--gpu", "cpu", "--count", "2", "--backend", "local",
                  "--trials", "1", "--steps", "8", "--seq-len", "256", "--global-batch", "8")
    [recipe] = _recipes(out)
    c = recipe["correctness"]
    gate = out["gates"][str(out["best"]["number"])]
    assert (recipe["status"] == "verified") == (gate["status"] == "verified") == (c["result"] == "pass")
    # the curves are compared over the steps both runs recorded: the candidate's steady rule may end it early (at the
    # soonest after 2 warm-up and 3 scored steps of 8; tests/runner/test_early_stop.py), the reference runs all 8
    runs = tmp_path / "g" / "trials"
    recorded = [len(json.loads((runs / d / "trial_result.json").read_text())["steps"])
                for d in ("reference", str(out["best"]["number"]))]
    assert c["configuration"] == "pass" and c["convergence"]["steps"] == min(recorded) >= 5
    assert c["convergence"]["correlation"] > 0.9999 and c["convergence"]["pointwise_failures"] == 0
    assert (tmp_path / "g" / "trials" / "reference" / "trial_result.json").exists()
    assert recipe["status"] == "verified"
    # the study keeps the measurement's standard error (what the residual model weighs the trial by, and resumes with)
    import optuna

    from autotune.trials.spec import TrialResult, read_model

    best = str(out["best"]["number"])
    res = read_model(TrialResult, runs / best / "trial_result.json")
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'g' / 'study.db'}")
    attrs = study.trials[int(best)].user_attrs
    assert res.stderr and attrs["stderr"] == pytest.approx(res.stderr)
    # the command the search prints to calibrate the model to this machine runs, on the measured trial
    cmd = out["calibrate"].split()
    assert cmd[:3] == ["autotune", "calibrate", "--measurements"] and cmd[4] == "--out"
    capsys.readouterr()
    assert main([*cmd[1:], "--no-published", "--no-seeds", "--json"]) == 0
    fitted = json.loads(capsys.readouterr().out)
    [row] = fitted["gpus"]["cpu"]["rows"]
    assert row["measured"] == pytest.approx(out["best"]["tokens_per_s_per_gpu"], rel=1e-3)
    assert (tmp_path / "g" / "calibration.json").exists()
