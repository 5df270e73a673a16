"""The residual model: prior widths from the calibration's residuals, Student-t fit, per-candidate
uncertainty and the correlations the batch rule uses (real candidates of a catalog model)."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.search.priors import PRIOR_WIDTHS, derive_priors, group_width
from autotune.search.residual import ResidualModel, feature_groups
from autotune.space import explore, load_space


@pytest.fixture(scope="module")
def table():
    m = load_model("Llama-3.1-70B")
    res = explore(load_space(None, m), m, Workload(), ClusterSpec.of("H100", 32))
    return res.table.take(res.kept)


def test_shipped_widths_are_the_derivation():
    got = derive_priors()
    assert set(got) == set(PRIOR_WIDTHS)
    for k, v in PRIOR_WIDTHS.items():
        assert got[k] == pytest.approx(v, rel=0.02), k
    # the layout-dependent error the rows show is far wider than the old 3% per weight
    assert PRIOR_WIDTHS["feature"] > 0.05 and PRIOR_WIDTHS["intercept"] > 0.15


def test_group_width_falls_back_to_its_kind():
    w = {"feature": 0.1, "interaction": 0.2, "tp": 0.05}
    assert group_width(w, "tp") == 0.05
    assert group_width(w, "pp") == 0.1
    assert group_width(w, "ep_x_nodes") == 0.2


def test_interactions_are_features(table):
    names = [n for n, _ in feature_groups(table, hidden=8192)]
    assert {"ep_x_nodes", "pp_x_recompute", "tp_x_hidden"} <= set(names)


def test_prior_uncertainty_then_shrinks_near_measured(table):
    rm = ResidualModel(table, sigma_n=0.02, hidden=8192)
    _, std0 = rm.predict()
    assert np.all(std0 > 0.2)  # the intercept alone is 0.24 before any trial
    rm.fit(table.take([0]), np.array([0.1]))
    corr, std = rm.predict()
    assert std[0] < 0.05 < std.max()
    assert corr[0] == pytest.approx(np.exp(0.1), rel=0.02)
    d = rm.diff_std(0)
    assert d[0] == pytest.approx(0.0, abs=1e-6) and d.max() > 0.1


def test_student_t_ignores_one_broken_trial(table):
    # six trials of one layout agree on +5%; a seventh (a bad node) is 60% slow
    idx = [0] * 7
    y = np.array([0.05, 0.06, 0.04, 0.05, 0.055, 0.045, -1.0])
    robust = ResidualModel(table, sigma_n=0.02, hidden=8192)
    robust.fit(table.take(idx), y)
    gauss = ResidualModel(table, sigma_n=0.02, hidden=8192, nu=np.inf)
    gauss.fit(table.take(idx), y)
    assert np.log(robust.predict()[0][0]) == pytest.approx(0.05, abs=0.01)
    assert np.log(gauss.predict()[0][0]) < -0.08  # the mean of all seven
    assert robust.weights[-1] < 0.1 < robust.weights[0]


def test_correlation_with_itself_is_one(table):
    rm = ResidualModel(table, sigma_n=0.02, hidden=8192)
    rho = rm.correlation(5)
    assert rho[5] == pytest.approx(1.0)
    assert np.all(rho <= 1 + 1e-9) and np.all(rho > 0)  # the shared intercept correlates everything a priori
