"""On the simulator nothing is learnt from a trial (its value is the model's own prediction), so the model-guided
planner believes the simulated trials as its batch rule believes running ones: the next trial goes to another
hypothesis, not a recompute variant of the last one (before, the README's search spent its first four trials on one
layout)."""

from __future__ import annotations

import json

import numpy as np

from autotune.cli.main import main
from autotune.search.acquisition import believed_std


def test_believing_a_candidate_takes_the_uncertainty_it_shares():
    corr = {0: np.array([1.0, 0.9, 0.0]), 1: np.array([0.9, 1.0, 0.1])}
    std = believed_std([0.3, 0.3, 0.3], lambda i: corr[i], [0])
    assert std[0] == 0 and 0 < std[1] < 0.15 and std[2] == 0.3
    assert np.allclose(believed_std([0.3, 0.3, 0.3], lambda i: corr[i], []), 0.3)


def test_a_simulated_search_tries_different_layouts_first(tmp_path, capsys):
    """Each trial leaves the last one's parallel layout, and the first four span at least three. (A recompute variant
    of an earlier layout may come back: the calibration rows say recompute is among the least certain settings,
    PRIOR_WIDTHS' pp_x_recompute.)"""
    rc = main(["search", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32", "--trials", "4", "--json",
               "--runs-dir", str(tmp_path / "runs")])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    layouts = [t["layout"] for t in out["trials"]]
    assert len(layouts) == 4 and len(set(layouts)) >= 3, layouts
    assert all(a != b for a, b in zip(layouts, layouts[1:])), layouts
