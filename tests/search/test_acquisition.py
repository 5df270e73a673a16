"""Acquisition and the stop rule on hand-made predictions (pure functions)."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.search.acquisition import (chance_any_beats, expected_improvement, prob_improvement, select_batch,
                                         stop_reason, trial_gpu_hours, TRIAL_STARTUP_S)


def test_probability_and_expected_improvement():
    pred = np.array([100.0, 100.0, 120.0])
    std = np.array([0.01, 0.3, 0.01])
    p = prob_improvement(pred, std, best=100.0, noise=0.02)
    assert p[0] < 0.05 and 0.3 < p[1] < 0.5 and p[2] > 0.99
    ei = expected_improvement(pred, std, best=100.0)
    assert ei[1] > ei[0] and ei[2] == pytest.approx(np.log(1.2), rel=0.01)


def test_cost_per_gpu_hour_ranks_the_cheaper_trial_first():
    # two candidates equally likely to win, one twice as slow to run: the cheap one goes first
    pred = np.array([100.0, 100.0])
    cost = np.array([1.0, 2.0])
    assert select_batch(pred, [0.2, 0.2], 95.0, cost, [True, True], 1) == [0]
    assert TRIAL_STARTUP_S == pytest.approx(741, abs=2)  # from the seed page's 8.96 GPU-hours per trial
    h = trial_gpu_hours(np.array([2451.4]), 8192 * 128, 32, 20)
    assert h[0] == pytest.approx(8.96, rel=1e-3)


def test_batch_rule_spreads_over_hypotheses():
    # candidates 0 and 1 are one hypothesis (correlation 1), 2 another, slightly worse
    pred = np.array([110.0, 109.0, 105.0])
    corr = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=float)
    picks = select_batch(pred, [0.2, 0.2, 0.2], 100.0, np.ones(3), [True] * 3, 2, lambda i: corr[i])
    assert picks == [0, 2]
    assert select_batch(pred, [0.2, 0.2, 0.2], 100.0, np.ones(3), [True] * 3, 2) == [0, 1]  # independent


def test_batch_rule_believes_the_running_trials_first():
    """A slot that frees while others run (--parallel): the running trials are not open and count as this
    batch's earlier picks, so the next pick tests another hypothesis than a running one."""
    pred = np.array([110.0, 109.0, 105.0])
    corr = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=float)
    assert select_batch(pred, [0.2] * 3, 100.0, np.ones(3), [True] * 3, 1, lambda i: corr[i], pending=[0]) == [2]
    assert select_batch(pred, [0.2] * 3, 100.0, np.ones(3), [True] * 3, 1, lambda i: corr[i]) == [0]
    assert select_batch(pred, [0.2] * 3, None, np.ones(3), [True] * 3, 2, pending=[1]) == [0, 2]  # independent


def test_stop_rule_says_why_with_the_number():
    pred = np.array([100.0, 90.0, 80.0])
    mask = np.array([False, True, True])
    assert stop_reason(pred, [0.01] * 3, mask, 100.0, 0.02, n_done=1) is None  # too few trials
    why = stop_reason(pred, [0.01] * 3, mask, 100.0, 0.02, n_done=3)
    assert why.startswith("converged") and "2% noise" in why and "0.0%" in why
    assert stop_reason(pred, [0.3] * 3, mask, 100.0, 0.02, n_done=3) is None  # wide: keep searching
    assert stop_reason(pred, [0.3] * 3, np.zeros(3, bool), 100.0, 0.02, 0).startswith("exhausted")
    p = chance_any_beats(pred, [0.1] * 3, mask, 100.0, 0.02)
    single = prob_improvement(pred[1:], [0.1, 0.1], 100.0, 0.02)
    assert p == pytest.approx(1 - np.prod(1 - single))


class _Shared:
    """A posterior in which every candidate shares one error (perfectly correlated)."""

    def __init__(self, sd: float):
        self.sd = sd

    def deviations(self, n, rows, seed=0):
        z = np.random.default_rng(seed).normal(0.0, self.sd, n)
        return np.tile(z, (int(np.sum(rows)), 1))


def test_stop_rule_reads_the_joint_posterior():
    # 1,000 untried candidates, each with a 1% chance to beat the best: taken as independent, one of them
    # almost surely wins; if they share one error, the chance is 1% and the search stops, saying so
    sd, noise, best = 0.1, 0.02, 100.0
    pred = np.full(1001, best * (1 + noise) * np.exp(-2.326 * sd))
    mask = np.ones(1001, bool)
    mask[0] = False
    assert stop_reason(pred, [sd] * 1001, mask, best, noise, n_done=5) is None
    assert chance_any_beats(pred, [sd] * 1001, mask, best, noise) > 0.99
    why = stop_reason(pred, [sd] * 1001, mask, best, noise, n_done=5, residual=_Shared(sd))
    assert why is not None and why.startswith("converged") and "1,000 untried" in why
    p = chance_any_beats(pred, [sd] * 1001, mask, best, noise, residual=_Shared(sd))
    assert p == pytest.approx(0.01, abs=0.006)
    assert f"{p:.1%}" in why
