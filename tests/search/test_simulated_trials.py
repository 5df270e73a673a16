"""On the simulator nothing is learnt from a trial (its value is the model's own prediction), but the candidates
believe it (Candidates.simulated): the residual model is conditioned on it at the trial noise, with the width scale
held at the hyperprior's. The planner, the uncertainty shown and the stop rule then read one belief. Before, only the
planner believed simulated trials (a product of correlations, which shrank to +/-0% after a dozen trials) while the
stop rule read the prior: a simulated search said "0% chance to beat the best" trial after trial and never converged
(the README's search, --trials 40: the stop rule's chance stayed at 81% and all 40 ran)."""

from __future__ import annotations

import json

import numpy as np

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cli.main import main
from autotune.search.acquisition import believed_std
from autotune.search.candidates import Candidates
from autotune.space import load_space


def test_believing_a_candidate_takes_the_uncertainty_it_shares():
    corr = {0: np.array([1.0, 0.9, 0.0]), 1: np.array([0.9, 1.0, 0.1])}
    std = believed_std([0.3, 0.3, 0.3], lambda i: corr[i], [0])
    assert std[0] == 0 and 0 < std[1] < 0.15 and std[2] == 0.3
    assert np.allclose(believed_std([0.3, 0.3, 0.3], lambda i: corr[i], []), 0.3)


def _candidates():
    model = load_model("Llama-3.1-8B")
    return Candidates(model, ClusterSpec.of("H100", 8), Workload(), load_space(None, model))


def test_a_simulated_trial_is_believed_not_learnt():
    c = _candidates()
    pred0, std0 = c.pred.copy(), c.pred_std.copy()
    best = int(np.argmax(pred0))
    c.simulated(c.table.row(best))
    # its own uncertainty falls to the trial noise, its neighbours' part of the way, the predictions stay the model's
    assert c.pred_std[best] <= c.noise + 1e-9 < std0[best]
    shared = c.residual.correlation(best) > 0.5
    assert np.all(c.pred_std[shared] <= std0[shared] + 1e-12) and np.any(c.pred_std[shared] < 0.9 * std0[shared])
    assert np.allclose(c.pred, pred0)
    # nothing is learnt: no calibration row, and the width scale stays the hyperprior's
    assert c.measurements == [] and abs(c.residual.width_scale() - 1.0) < 1e-9
    # believing the same trial twice changes nothing; a measured trial takes over from the simulated ones
    std1 = c.pred_std.copy()
    c.simulated(c.table.row(best))
    assert np.allclose(c.pred_std, std1)
    c.learn(c.table.row(best), 0.8 * float(pred0[best]))
    assert c.pred[best] < 0.9 * pred0[best] and len(c.measurements) == 1


def test_a_simulated_search_converges_by_the_stop_rule(tmp_path, capsys):
    rc = main(["search", "--model", "Llama-3.1-8B", "--gpu", "H100", "--count", "8", "--trials", "80", "--json",
               "--runs-dir", str(tmp_path / "runs")])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["stop_reason"].startswith("converged"), out["stop_reason"]
    layouts = [t["layout"] for t in out["trials"]]
    assert 3 <= len(layouts) < 80 and len(set(layouts)) >= 3, layouts
