"""The search's belief about its candidates: trials on a cluster whose TP communication is slower than the
catalog says move the ranking's predictions toward the truth (the residual model, through the layout
features that set the term's share) and the refitted calibration's factor for that term (the breakdowns
that say why a layout is slow)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import evaluate
from autotune.search.candidates import Candidates
from autotune.space import load_space


@pytest.fixture()
def cands():
    m = load_model("Llama-3.1-70B")
    return Candidates(m, ClusterSpec.of("H100", 32), Workload(), load_space(None, m))


def _learn(cands, seed: int):
    """8 random trials against a truth whose TP communication is 3x the calibration's; (truth, untried, spread ratio)."""
    base = cands.base_calibration
    scale = dict(base.time.scale, tp_comm=base.time.scale.get("tp_comm", 1.0) * 3.0)
    slow = dataclasses.replace(base, time=dataclasses.replace(base.time, scale=scale))
    truth = evaluate(cands.model, cands.workload, cands.cluster, cands.table, slow).time.tokens_per_s_per_gpu
    assert cands.calibration is base and cands.ev.time.tokens_per_s_per_gpu == pytest.approx(cands.base_pred)
    tried = np.random.default_rng(seed).choice(len(cands), 8, replace=False)
    for i in tried:
        cands.learn(cands.table.row(int(i)), float(truth[i]), "test")
    untried = np.setdiff1d(np.arange(len(cands)), tried)

    def spread(pred):  # error relative to the other candidates (an offset every layout shares cancels)
        r = np.log(pred / truth)[untried]
        return float(np.sqrt(np.mean((r - np.median(r)) ** 2)))

    return truth, untried, spread(cands.pred) / spread(cands.base_pred)


def test_trials_on_a_slow_network_move_the_ranking_and_the_breakdowns(cands):
    base = cands.base_calibration
    _, untried, ratio = _learn(cands, 0)
    m = cands.model
    others = [Candidates(m, ClusterSpec.of("H100", 32), Workload(), load_space(None, m)) for _ in range(1, 5)]
    ratios = [ratio] + [_learn(c, s)[2] for s, c in enumerate(others, start=1)]
    moved = [c.calibration.time.scale["tp_comm"] / base.time.scale.get("tp_comm", 1.0) for c in [cands, *others]]
    # 8 random trials of 1,000+, over 5 draws of the 8 (what one draw can teach depends on its layouts' TP mix).
    # Measured on the shipped calibration: the ranking's error ratio 0.60-0.77 (mean 0.67), the refitted tp_comm
    # factor 1.03-1.05x in every draw (mean 1.04; the truth is 3x, the refit's prior log sd 0.2). Since H100's
    # factors are fitted on Megatron's rows alone (torchtitan's fit their own), its tp_comm factor is 0.67, not
    # 0.93: TP communication is a smaller share of each step and moves less. Before that: 0.45-0.98 (mean 0.69)
    # and 1.04-1.17x (mean 1.14). Before Megatron's selective recompute was costed by module
    # the same draws gave 0.43-0.81 and 1.12-1.25x. Earlier fits of
    # the H100 rows gave 0.44-1.00 and 1.05-1.29x (before the LoRA, packed fine-tuning, Llama 4 and expert-memory
    # changes) and 0.53-0.72 and 1.24-1.65x (before the torchtitan and AutoModel readings). A search that learns
    # nothing gives 1.0 and 1.0.
    assert np.mean(ratios) < 0.8
    assert np.mean(moved) > 1.02 and min(moved) > 1.0
    assert cands.ev.time.tokens_per_s_per_gpu[untried].mean() < cands.base_pred[untried].mean()


@pytest.mark.parametrize("workload", [Workload(precision="fp8-tensorwise"), Workload(force_balance=True),
                                      Workload(precision="fp8-tensorwise", fp8_attention=True, grads_fp32=False)])
def test_a_trial_is_recalibrated_under_the_studys_own_workload(workload):
    """A trial measured exactly at its prediction teaches the refitted calibration nothing: it is priced with the
    study's precision, routing and gradients, not as a BF16 run of the seed's defaults (which would read an FP8
    trial as a BF16 layout running far faster than predicted and bend every factor)."""
    m = load_model("Qwen3-30B-A3B")
    c = Candidates(m, ClusterSpec.of("H100", 16), workload, load_space(None, m))
    for i in (0, len(c) // 3, len(c) // 2):
        c.learn(c.table.row(i), float(c.base_pred[i]), "test")
    row = c.measurements[0]
    assert row.workload == dataclasses.replace(workload, steps=row.workload.steps, window=row.workload.window)
    base, refit = c.base_calibration.time.scale, c.calibration.time.scale
    assert all(refit.get(k, 1.0) == pytest.approx(base.get(k, 1.0), rel=0.02) for k in set(base) | set(refit)), \
        {k: (base.get(k, 1.0), refit.get(k, 1.0)) for k in set(base) | set(refit)}


def test_a_trial_that_scattered_moves_the_belief_less():
    """Candidates.learn passes a measurement's standard error to the residual model: the same trial 25% under its
    prediction moves its layout's prediction less when its steps scattered (10% standard error) than at the noise."""
    m = load_model("Llama-3.1-70B")
    moved = []
    for stderr in (None, 0.10):
        c = Candidates(m, ClusterSpec.of("H100", 32), Workload(), load_space(None, m))
        i = int(np.argmax(c.base_pred))
        c.learn(c.table.row(i), 0.75 * float(c.base_pred[i]), "test", stderr)
        moved.append(float(np.log(c.base_pred[i] / c.pred[i])))
    assert 0 < moved[1] < 0.95 * moved[0]
