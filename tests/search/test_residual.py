"""The residual model: prior widths from the calibration's residuals, widths learnt from the study's own
trials, Student-t fit, per-candidate uncertainty and the correlations the batch rule uses (real candidates
of a catalog model)."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.search.priors import HYPER_SD, PRIOR_WIDTHS, WIDTH_SD, derive, group_width, group_width_sd
from autotune.search.residual import ResidualModel, feature_groups
from autotune.space import explore, load_space


@pytest.fixture(scope="module")
def table():
    m = load_model("Llama-3.1-70B")
    res = explore(load_space(None, m), m, Workload(), ClusterSpec.of("H100", 32))
    return res.table.take(res.kept)


def test_shipped_widths_are_the_derivation():
    got, sds = derive()
    assert set(got) == set(PRIOR_WIDTHS)
    for k, v in PRIOR_WIDTHS.items():
        assert got[k] == pytest.approx(v, rel=0.02), k
    # how well the rows pin each group's width down: every group the rows vary, no better than the hyperprior allows
    assert set(sds) == set(WIDTH_SD) and set(sds) == set(PRIOR_WIDTHS) - {"intercept", "feature", "interaction",
                                                                          "noise", "scale_sd"}
    for k, v in WIDTH_SD.items():
        assert sds[k] == pytest.approx(v, abs=0.01), k
        assert 0.05 < v < 1.1 * HYPER_SD, k
    # the layout-dependent error the rows show is wider than the old 3% per weight (PRIOR_SIGMA / sqrt(12))
    assert PRIOR_WIDTHS["feature"] > 0.04 and PRIOR_WIDTHS["intercept"] > 0.1
    # how wrong the model is varies between models by more than a few percent
    assert 0.1 < PRIOR_WIDTHS["scale_sd"] < 2.0


def test_the_scale_spread_is_not_the_sampling_noise_of_one_row_models():
    """scale_spread fits how much the size of the error varies between models, with each model's own k integrated
    out: models measured once, all with the same error size, show no spread (the standard deviation of their log
    |residual| is about 1.1 from sampling alone), and a real spread between well-measured models is recovered."""
    from types import SimpleNamespace

    from autotune.search.priors import scale_spread

    rng = np.random.default_rng(3)
    one = [SimpleNamespace(model=f"m{i}") for i in range(300)]
    r = rng.normal(0.0, 0.1, len(one))
    assert np.std(np.log(np.abs(r)), ddof=1) > 0.9  # what the per-model log RMS would have called spread
    assert scale_spread(one, r) < 0.3
    k = np.exp(rng.normal(0.0, 0.8, 150))  # each model's own error size
    many = [SimpleNamespace(model=f"m{i}") for i in range(150) for _ in range(6)]
    r = np.concatenate([rng.normal(0.0, 0.1 * k[i], 6) for i in range(150)])
    assert scale_spread(many, r) == pytest.approx(0.8, abs=0.15)


def test_group_width_falls_back_to_its_kind():
    w = {"feature": 0.1, "interaction": 0.2, "tp": 0.05}
    assert group_width(w, "tp") == 0.05
    assert group_width(w, "pp") == 0.1
    assert group_width(w, "ep_x_nodes") == 0.2
    assert group_width_sd({"tp": 0.3}, "tp") == 0.3 and group_width_sd({"tp": 0.3}, "etp") == HYPER_SD


def test_interactions_are_features(table):
    names = [n for n, _ in feature_groups(table, hidden=8192)]
    assert {"ep_x_nodes", "pp_x_recompute", "tp_x_hidden"} <= set(names)


def test_before_any_trial_the_prior_is_the_calibrations(table):
    learnt = ResidualModel(table, sigma_n=0.02, hidden=8192)
    fixed = ResidualModel(table, sigma_n=0.02, hidden=8192, learn_widths=False)
    assert np.allclose(learnt.predict()[1], fixed.predict()[1])
    assert np.allclose(np.sqrt(np.diag(learnt.cov)), [group_width(PRIOR_WIDTHS, g) for g in learnt.groups])
    assert learnt.width_scale() == pytest.approx(1.0)


def test_prior_uncertainty_then_shrinks_near_measured(table):
    rm = ResidualModel(table, sigma_n=0.02, hidden=8192)
    _, std0 = rm.predict()
    assert np.all(std0 > 0.2)  # the intercept alone is wider than that before any trial
    rm.fit(table.take([0]), np.array([0.1]))
    corr, std = rm.predict()
    assert std[0] < 0.05 < std.max()
    assert corr[0] == pytest.approx(np.exp(0.1), rel=0.02)
    d = rm.diff_std(0)
    assert d[0] == pytest.approx(0.0, abs=1e-6) and d.max() > 0.1


def _trials(table, n, spread, seed=0):
    """n distinct candidates whose residuals follow a per-feature-value error of the given spread."""
    rm = ResidualModel(table, sigma_n=0.02, hidden=8192, learn_widths=False)
    rng = np.random.default_rng(seed)
    truth = rm.Xc[:, 1:] @ rng.normal(0.0, spread, rm.Xc.shape[1] - 1)
    idx = rng.choice(len(table), n, replace=False)
    return idx, truth[idx] + rng.normal(0.0, 0.02, n)


def test_widths_follow_how_wrong_the_model_is_on_this_cluster(table):
    # trials that agree with the model to a few percent narrow every untried layout's uncertainty; trials
    # that disagree by tens of percent keep it wide: the study learns the scale of its own errors
    idx, small = _trials(table, 8, 0.02)
    _, large = _trials(table, 8, 0.3)
    fixed = ResidualModel(table, sigma_n=0.02, hidden=8192, learn_widths=False)
    fixed.fit(table.take(idx), small)
    agree = ResidualModel(table, sigma_n=0.02, hidden=8192)
    agree.fit(table.take(idx), small)
    disagree = ResidualModel(table, sigma_n=0.02, hidden=8192)
    disagree.fit(table.take(idx), large)
    # (trials within 2% take the widths to about 2/3 of the calibration's, trials 30% off to several times them)
    assert agree.width_scale() < 0.7 and disagree.width_scale() > 1.5
    untried = np.setdiff1d(np.arange(len(table)), idx)
    s_fixed, s_agree, s_disagree = (m.predict()[1][untried] for m in (fixed, agree, disagree))
    assert np.median(s_agree) < 0.7 * np.median(s_fixed)
    assert np.median(s_disagree) > 1.5 * np.median(s_agree)


def test_correlated_candidates_lose_uncertainty(table):
    # a trial narrows most the layouts that share the most feature values with it
    rm = ResidualModel(table, sigma_n=0.02, hidden=8192)
    diff0 = rm.diff_std(0)
    rm.fit(table.take([0]), np.array([0.0]))
    shared = (rm.Xc * rm.Xc[0]).sum(axis=1)  # feature values in common with candidate 0 (intercept included)
    before, after = diff0, rm.predict()[1]
    near = shared >= np.percentile(shared[1:], 90)
    far = shared <= np.percentile(shared[1:], 10)
    near[0] = far[0] = False
    assert np.median(after[near]) < np.median(after[far])
    rho = rm.correlation(0)
    assert np.median(rho[near]) > np.median(rho[far])
    assert np.all(np.isfinite(before))


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


@pytest.mark.parametrize("n", [5, 80])
def test_both_forms_of_the_posterior_agree(table, n):
    # n x n solves (few trials) and p x p ones (more trials than feature columns) are one posterior
    idx, y = _trials(table, n, 0.1, seed=3)
    rm = ResidualModel(table, sigma_n=0.02, hidden=8192)
    X, wt = rm.Xc[idx], np.ones(n)
    rm._posterior(X, y, wt, with_cov=True, weight_space=False)
    a = (rm.mean.copy(), rm.cov.copy(), rm.draw_weight.copy())
    rm._posterior(X, y, wt, with_cov=True, weight_space=True)
    assert np.allclose(rm.mean, a[0], atol=1e-6) and np.allclose(rm.cov, a[1], atol=1e-7)
    assert np.allclose(rm.draw_weight, a[2], atol=1e-6)
    rm.fit_rows(X, y)
    assert np.allclose(np.log(rm.predict()[0][idx]), y, atol=0.1)  # the fitted rows end near their values


def test_correlation_with_itself_is_one(table):
    rm = ResidualModel(table, sigma_n=0.02, hidden=8192)
    rho = rm.correlation(5)
    assert rho[5] == pytest.approx(1.0)
    assert np.all(rho <= 1 + 1e-9) and np.all(rho > 0)  # the shared intercept correlates everything a priori


def test_a_layouts_own_error_is_learnt_by_measuring_it_and_teaches_no_other(table):
    """sigma_own: each candidate has an error of its own besides the shared feature weights (the oracle of
    bench/search_efficiency.py's lomo+own reality). Before any trial it widens every candidate alike; a trial
    takes most of its own candidate's residual into that candidate alone, and the others learn from the trial
    only through the weights, as from a noisier one."""
    own, sn = 0.05, 0.02
    plain = ResidualModel(table, sigma_n=sn, hidden=8192, learn_widths=False)
    rm = ResidualModel(table, sigma_n=sn, hidden=8192, learn_widths=False, sigma_own=own)
    s0, s1 = plain.predict()[1], rm.predict()[1]
    assert np.allclose(s1**2, s0**2 + own**2)
    rm.fit_candidates([0], np.array([0.2]))
    plain.fit_candidates([0], np.array([0.2]))
    corr, std = rm.predict()
    k = own**2 / (own**2 + sn**2 / rm.weights[0])  # the share of its residual the trial gives its own error
    r = 0.2 - rm.Xc[0] @ rm.mean
    assert np.log(corr[0]) == pytest.approx(rm.Xc[0] @ rm.mean + k * r)
    assert np.log(corr[0]) == pytest.approx(0.2, abs=0.03)  # the measured layout: near its measurement
    assert std[0] < 0.03 and np.all(np.delete(std, 0) >= own)  # the others keep their own error
    # the others learnt less from that trial than without own errors (it could be the layout's alone)
    others = np.delete(np.log(corr), 0)
    assert np.mean(np.abs(others)) < np.mean(np.abs(np.delete(np.log(plain.predict()[0]), 0)))
    # joint draws carry the same spread, and correlations stay correlations
    dev = rm.deviations(4000, seed=1)
    assert np.allclose(dev.std(axis=1)[:50], std[:50], rtol=0.1)
    c = rm.correlation(3)
    assert c[3] == pytest.approx(1.0) and np.all(np.abs(c) <= 1 + 1e-9)
    assert np.all(rm.diff_std(3)[np.arange(len(std)) != 3] >= own * np.sqrt(2) - 1e-9)


def test_a_trial_that_scattered_counts_for_less(table):
    """A measurement's own standard error, when larger than the run-to-run noise, is that row's noise. With fixed
    widths and Gaussian noise one trial's layout moves by v / (v + s^2) of the trial's log error (v: its prior
    variance, s: the row's noise), so a 15% standard error moves it less than the 2% noise does; a standard error
    below the noise, or unknown (NaN), is the noise."""
    idx, y = np.array([7]), np.array([0.2])
    fits = {}
    for name, se in (("plain", None), ("quiet", [0.005]), ("loud", [0.15]), ("nan", [np.nan])):
        rm = ResidualModel(table, sigma_n=0.02, hidden=8192, learn_widths=False, nu=np.inf)
        rm.fit(table.take(idx), y, stderr=se)
        fits[name] = (rm, *rm.predict())
    v = float(table_prior_var(fits["plain"][0], 7))
    for name, s_row in (("plain", 0.02), ("quiet", 0.02), ("loud", 0.15), ("nan", 0.02)):
        rm, corr, std = fits[name]
        assert rm.row_noise == pytest.approx([s_row])
        assert np.log(corr[7]) == pytest.approx(v / (v + s_row**2) * 0.2, rel=1e-6), name
        assert std[7] == pytest.approx(np.sqrt(v * s_row**2 / (v + s_row**2)), rel=1e-6), name
    assert fits["loud"][2][7] > 5 * fits["plain"][2][7]


def table_prior_var(rm, i):
    """Candidate i's prior variance of its log-correction: x' diag(prior_std^2) x."""
    return rm.Xc[i] ** 2 @ rm.prior_std**2


def test_the_scale_reaches_as_far_as_many_trials_say(table):
    """The hyperprior's quadrature spans +-4 sd, each point at its prior weight: k^2 averages 1 under the prior, and
    40 trials whose errors per feature value are 4x the calibration's widths take the scale to about 4x, past the
    2.2x where the quantile midpoints (the old rule) stopped any posterior."""
    from autotune.search.residual import _scale_draws

    rm = ResidualModel(table, sigma_n=0.02, hidden=8192)
    mult, prior = _scale_draws(rm.groups, PRIOR_WIDTHS["scale_sd"], 32)
    assert prior.sum() == pytest.approx(1.0) and prior @ mult[:, 1] == pytest.approx(1.0)
    assert np.sqrt(mult[:, 1].max()) > 4.0 and np.argmax(prior) in (15, 16)
    rng = np.random.default_rng(5)
    w = rm.prior_std[1:] * 4.0 * rng.standard_normal(rm.Xc.shape[1] - 1)
    idx = rng.choice(len(table), 40, replace=False)
    rm.fit(table.take(idx), rm.Xc[idx, 1:] @ w + rng.normal(0.0, 0.02, 40))
    assert 3.0 < rm.width_scale() < 5.5


def test_joint_draws_keep_the_width_scales_heavy_tails(table):
    """deviations() draws from the mixture over the width scale, not from the one Gaussian predict() summarises it by:
    the same variance, heavier tails (the stop rule asks whether any of thousands of candidates lands in one). Under
    the hyperprior (log k ~ N(0, s^2)) a candidate's kurtosis is 3 exp(4 s^2), about 6.7 at s = 0.45; with the widths
    fixed it is a Gaussian's 3. After trials the draws still centre on the posterior mean."""
    def kurtosis(rm, i=0):
        d = rm.deviations(40_000, seed=3)[i]
        return float(np.mean(d**4) / np.mean(d**2) ** 2), float(d.std())

    mixed, fixed = ResidualModel(table, hidden=8192), ResidualModel(table, hidden=8192, learn_widths=False)
    k_mixed, sd_mixed = kurtosis(mixed)
    k_fixed, sd_fixed = kurtosis(fixed)
    assert k_mixed > 4.5 and abs(k_fixed - 3.0) < 0.3
    assert sd_mixed == pytest.approx(mixed.predict()[1][0], rel=0.05)
    assert sd_fixed == pytest.approx(fixed.predict()[1][0], rel=0.05)
    mixed.fit_candidates([0, 5, 9], np.array([0.1, -0.05, 0.2]))
    d = mixed.deviations(20_000, seed=4)
    assert np.allclose(d.mean(axis=1)[:20], 0.0, atol=0.01)
    assert np.allclose(d.std(axis=1)[:20], mixed.predict()[1][:20], rtol=0.08)


def test_the_stop_rules_draws_let_each_group_learn_its_own_width(table):
    """The stop rule's draws (deviations()) come from a mixture in which each group's width is drawn about the
    calibration's (priors.WIDTH_SD) as well as the shared scale: trials whose errors are all in TP's values keep TP's
    weights uncertain while the other groups narrow, where one shared scale (the planner's moments, predict(); and
    width_sd=None) can only widen or narrow them all together, and the rule would trust TP's untried values too much."""
    fresh = ResidualModel(table, hidden=8192)  # before any trial the draws' variance is the calibration's
    assert np.allclose(np.einsum("m,mpp->p", fresh._mix[0], fresh._mix[2]), fresh.prior_std**2)

    def spread(rm):  # each column's posterior sd under the mixture deviations() draws from, over its prior sd
        w, means, covs = rm._mix
        mean = w @ means
        cov = np.einsum("m,mpq->pq", w, covs) + (means.T * w) @ means - np.outer(mean, mean)
        return np.sqrt(np.diag(cov)) / rm.prior_std

    rng = np.random.default_rng(1)
    idx = rng.choice(len(table), 25, replace=False)
    noise = rng.normal(0.0, 0.02, 25)
    rel = {}
    for label, kw in (("groups", {}), ("shared", {"width_sd": None})):
        rm = ResidualModel(table, hidden=8192, **kw)
        g = np.array(rm.groups)
        w = np.where(g == "tp", rm.prior_std * 4.0 * np.random.default_rng(2).standard_normal(len(g)), 0.0)
        rm.fit_candidates(idx, rm.Xc[idx] @ w + noise)
        sd = spread(rm)
        rel[label] = {k: float(np.mean(sd[g == k])) for k in ("tp", "pp", "recompute", "cp")}
        if label == "groups":
            moments = np.sqrt(np.diag(rm.cov))
            # the draws come from near the widths' posterior, not the prior: a prior sample's effective size is 1-10
            assert 1.0 / np.sum(rm._mix[0] ** 2) > 40
    ratio = {label: r["tp"] / max(r[k] for k in ("pp", "recompute", "cp")) for label, r in rel.items()}
    assert ratio["groups"] > 1.5 and ratio["shared"] < 1.2
    assert rel["groups"]["tp"] > rel["shared"]["tp"]
    # the planner's belief is the shared scale's either way
    assert np.allclose(moments, np.sqrt(np.diag(rm.cov)))


def test_the_widths_posterior_gradient_is_its_derivative(table):
    """_Widths finds the widths' posterior mode by Newton's method on an analytic gradient; it must be the log
    posterior's derivative (central differences agree), or the stop rule's draws would centre on the wrong widths."""
    from autotune.search.residual import _Widths

    rm = ResidualModel(table, hidden=8192)
    widths = _Widths(rm.groups, PRIOR_WIDTHS["scale_sd"], WIDTH_SD)
    rng = np.random.default_rng(4)
    X = rm.Xc[rng.choice(len(table), 12, replace=False)]
    y, noise, base = rng.normal(0.0, 0.1, 12), np.full(12, 0.02**2), rm.prior_std**2
    theta = rng.normal(0.0, 0.3, len(widths.sd))
    _, grad = widths._value_and_grad(X, y, noise, base, theta)
    h = 1e-5
    for t in range(len(theta)):
        e = np.zeros(len(theta))
        e[t] = h
        num = (widths._value_and_grad(X, y, noise, base, theta + e)[0]
               - widths._value_and_grad(X, y, noise, base, theta - e)[0]) / (2 * h)
        assert grad[t] == pytest.approx(num, rel=1e-4, abs=1e-6), t
