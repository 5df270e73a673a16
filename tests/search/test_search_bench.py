"""bench/search_efficiency.py measures the product: its learner is the driver's (candidates.believe), its
oracle is a true floor, and its explanation of a missed run names the numbers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from autotune.search.candidates import Candidates
from autotune.space import load_space

BENCH = Path(__file__).resolve().parents[2] / "bench" / "search_efficiency.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("search_efficiency", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["search_efficiency"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def setup(bench):
    return bench.Setup(("Llama-3.1-70B", "H100", 32))


def test_the_bench_believes_what_the_driver_believes(bench, setup):
    cands = Candidates(setup.model, setup.cluster, setup.workload, load_space(None, setup.model), noise=0.02)
    assert cands.keys == setup.keys
    rng = np.random.default_rng(1)
    measured = []
    for i in rng.choice(len(setup.keys), 4, replace=False):
        v = float(cands.pred[i] * rng.uniform(0.7, 1.3))
        cands.learn(cands.table.row(int(i)), v)
        measured.append((int(i), v))
    pred, std, _ = setup.belief(measured, 0.02)
    assert np.allclose(pred, cands.pred, rtol=1e-9) and np.allclose(std, cands.pred_std, rtol=1e-9)
    # and with a trial that reports its own standard error
    i = int(rng.choice(len(setup.keys)))
    v = float(cands.pred[i] * 0.8)
    cands.learn(cands.table.row(i), v, stderr=0.1)
    pred, std, _ = setup.belief(measured + [(i, v, 0.1)], 0.02)
    assert np.allclose(pred, cands.pred, rtol=1e-9) and np.allclose(std, cands.pred_std, rtol=1e-9)


def test_noisy_trials_scatter_by_their_reported_error(bench, setup):
    """--noisy SHARE:SE: that share of trials scatter with relative error SE and report it; the rest report none."""
    reality = bench.Reality("terms", setup.model, setup.cluster, setup.workload, setup.table,
                            np.random.default_rng(0), 0.3)
    got = [reality.measure(0, 0.02, (0.5, 0.1)) for _ in range(4000)]
    loud = np.array([v for v, se in got if se is not None]) / reality.truth[0] - 1
    quiet = np.array([v for v, se in got if se is None]) / reality.truth[0] - 1
    assert {se for _, se in got} == {None, 0.1} and 0.45 < len(loud) / len(got) < 0.55
    assert np.std(loud) == pytest.approx(0.1, rel=0.1) and np.std(quiet) == pytest.approx(0.02, rel=0.1)
    assert all(se is None for _, se in (reality.measure(0, 0.02) for _ in range(10)))


def test_the_oracle_knows_a_terms_only_reality(bench, setup):
    # with no per-feature error the oracle's prior is the truth: its first trial is reality's best
    reality = bench.Reality("terms", setup.model, setup.cluster, setup.workload, setup.table,
                            np.random.default_rng(0), 0.3)
    run = bench.one_run(setup, reality, "oracle", 0, 5, 0.02)
    assert run.trials == 1


def test_terms_wide_draws_term_factors_at_the_calibrations_spread(bench, setup):
    """terms-wide: no per-feature error, each time term x lognormal(0, the shipped calibration's RMS log factor);
    the spread is read from the shipped factors, and the drawn reality moves by more than terms' U[0.7, 1.3]."""
    from autotune.cost.calibrate import SHIPPED, read_calibrations

    sd = bench.term_spread()
    fitted = [f for k, c in read_calibrations(SHIPPED).items() if "+" not in k for f in c.factors.values() if f != 1.0]
    assert len(fitted) > 50 and 0.1 < sd < 1.0
    assert sd == pytest.approx(float(np.sqrt(np.mean(np.log(fitted) ** 2))))
    spread = {}
    for kind in ("terms", "terms-wide"):
        logs = [np.log(bench.Reality(kind, setup.model, setup.cluster, setup.workload, setup.table,
                                     np.random.default_rng(seed), 0.3, sd).base / setup.base_pred)
                for seed in range(6)]
        spread[kind] = float(np.std([x.mean() for x in logs]))
        assert not np.any(bench.Reality(kind, setup.model, setup.cluster, setup.workload, setup.table,
                                        np.random.default_rng(0), 0.3, sd).sd)  # the terms alone: no feature error
    assert spread["terms-wide"] > spread["terms"]


def test_a_missed_run_is_explained_with_its_numbers(bench, setup):
    reality = bench.Reality("f20+int", setup.model, setup.cluster, setup.workload, setup.table,
                            np.random.default_rng(3), 0.3)
    run = bench.one_run(setup, reality, "model", 3, 1, 0.02)
    assert run.trials is None  # one trial rarely finds the best under +-20% per feature value
    line = bench.explain(setup, reality, run, 0.02)
    assert "first predicted rank" in line and "last belief" in line and "width scale" in line


def test_lomo_own_splits_the_measured_error_into_features_and_each_layouts_own(bench, setup):
    # the layout's own part is the calibration rows' unexplained residual less the trial noise; the features
    # take the rest, so the total spread is still the leave-one-model-out RMS
    from autotune.search.priors import PRIOR_WIDTHS

    rms = 0.18
    reality = bench.Reality("lomo+own", setup.model, setup.cluster, setup.workload, setup.table,
                            np.random.default_rng(5), rms)
    own = np.sqrt(PRIOR_WIDTHS["noise"] ** 2 - bench.NOISE**2)
    assert reality.own == pytest.approx(own)
    assert np.sqrt(np.sum(reality.sd**2) + own**2) == pytest.approx(rms)
    plain = bench.Reality("lomo", setup.model, setup.cluster, setup.workload, setup.table,
                          np.random.default_rng(5), rms)
    assert plain.own == 0 and len(plain.cols) == len(reality.cols) and np.sqrt(np.sum(plain.sd**2)) == pytest.approx(rms)
    # the layouts' own errors are in the truth: beyond what the feature values explain
    X = np.hstack([np.eye(len(np.unique(c)))[np.unique(c, return_inverse=True)[1]] for c in reality.cols])
    log_f = np.log(reality.truth / reality.base)
    resid = log_f - X @ np.linalg.lstsq(X, log_f, rcond=None)[0]
    assert np.std(resid) > own / 2
    # the oracle knows the own part too (each candidate's sigma_own) and still runs
    run = bench.one_run(setup, reality, "oracle", 5, 3, 0.02)
    assert len(run.measured) >= 1
    assert bench.Oracle(reality, 0.02).residual.sigma_own == pytest.approx(own)


def test_lomo_pairs_moves_half_the_measured_error_onto_pairs_the_planner_cannot_represent(bench, setup):
    rms = 0.18
    reality = bench.Reality("lomo+pairs", setup.model, setup.cluster, setup.workload, setup.table,
                            np.random.default_rng(7), rms)
    plain = bench.Reality("lomo", setup.model, setup.cluster, setup.workload, setup.table,
                          np.random.default_rng(7), rms)
    n = len(plain.cols)
    pairs = len(bench.PAIRED) * (len(bench.PAIRED) - 1) // 2
    assert len(reality.cols) == n + pairs and np.sqrt(np.sum(reality.sd**2)) == pytest.approx(rms)
    assert np.sum(reality.sd[n:] ** 2) == pytest.approx(rms**2 / 2) and reality.own == 0
    # the pairs are in the truth: the planner's own features (single values and its three interactions) leave
    # part of the error unexplained, which they do not under plain lomo
    X = setup._prior.Xc

    def unexplained(r):
        log_f = np.log(r.truth / r.base)
        return float(np.std(log_f - X @ np.linalg.lstsq(X, log_f, rcond=None)[0]))

    assert unexplained(plain) < 1e-6 < 0.02 < unexplained(reality)
    run = bench.one_run(setup, reality, "oracle", 7, 3, 0.02)  # the oracle carries the pairs' columns
    assert len(run.measured) >= 1


def test_hardness_finds_reality_best_where_the_model_ranks_it(bench, setup):
    # with reality equal to the model (up to the terms' factors, which barely move the ranking) the model's
    # favourite is reality's best; under +-20% per feature value it sits further down the model's list
    easy = bench.Reality("terms", setup.model, setup.cluster, setup.workload, setup.table,
                         np.random.default_rng(0), 0.3)
    easy.truth = setup.base_pred.copy()
    at_goal, rank, top5, top10 = bench.hardness(setup, easy)
    assert rank == 1 and top5 and top10
    assert at_goal == int(np.sum(setup.base_pred >= bench.GOAL * setup.base_pred.max()))
    ranks = [bench.hardness(setup, bench.Reality("f20+int", setup.model, setup.cluster, setup.workload, setup.table,
                                                 np.random.default_rng(s), 0.3))[1] for s in range(5)]
    assert max(ranks) > 1 and all(1 <= r <= len(setup.table) for r in ranks)
