"""The residual model's prior widths, derived from the calibration's own leave-one-model-out residuals.

How (derive_priors): take every measured BF16 Hopper row the cost model represents (the seed page's plus
the published table's, cost.calibrate), refit the calibration without each model's rows and predict them
(leave-one-model-out: how wrong the calibrated model is on a model it has never seen), and regress
r = log(measured / predicted) on the residual model's own features (features.feature_groups) as a
Gaussian process with one variance per group:

    Cov(r_i, r_j) = tau_0^2 + sum_g tau_g^2 [i and j share g's value] + sigma^2 / w_i [i = j]

The widths maximise the marginal likelihood (type-II maximum likelihood, empirical Bayes), first with all
layout features sharing one width and all interactions another ("feature", "interaction"), then per group
with a log-normal hyperprior (sd 0.5) around the shared value, so a group the rows barely inform keeps the
shared width instead of collapsing to zero. A group whose value never varies over the rows is not
identified and uses the shared width.

Why no per-model offset in that regression: the rows cannot tell one from layout-dependent error (each
model was measured on one or two layouts, so a model's offset and its layout's features are confounded;
with an offset term every feature width collapses to zero and the search would trust the model on every
layout, the failure this replaces). So the feature widths take the conservative reading: the whole
cross-model error is layout-dependent. The intercept width takes the other: the whole error may be one
offset (the RMS of the residuals); an offset is learnt from the first trial and never changes the ranking.

How wrong the model is differs from one model and cluster to the next, so a search does not take these
widths as fixed: residual.py updates them from the study's own trials (type-II ML, averaged over a hyperprior). The
hyperprior's spread comes from the same rows: "scale_sd" is how much the log of a model's leave-one-model-out error
size varies from one model to the next ("how wrong the model is"), estimated by maximum likelihood (scale_spread):
each model's residuals N(0, (s k_m)^2) with log k_m ~ N(0, sd^2), k_m integrated out, s and sd fitted. On the shipped
rows (100 BF16 Hopper rows of 29 models) sd is 0.45 (0.46 before the fit's output-layer tie kept a base's ratio),
within 2 log-likelihood units of the best from about 0.25 to 0.95. Until 6 December it was the standard deviation over
the models of each model's log RMS error, 1.08: 20 of the 29 models have one row, the log of one residual's size alone
varies by about 1.1 (a chi-square with one degree of freedom), and that sampling noise was counted as spread (1.08 is
4 log-likelihood units below the best). The wider value had been kept as a heavier-tailed hyperprior on a benchmark
comparison within its noise. With the width scale's draws normalised to the calibration's mean variance (residual.py),
a spread of 1.08 put the prior median width at 0.31 of the calibration's, so a few trials that agreed with the model
made a study trust it: in bench/search_efficiency.py (model-guided, 30 seeds per cell; 6 December) 4 of 30 runs on
Qwen3-235B-A22B under `terms-wide` ended 20 trials short of the goal with the scale at 0.21-0.30, five feature values
of reality's best never measured. At 0.46 that cell reaches the goal in 29 of 30 (p90 21 -> 4.2 trials); summed over
the 18 cells of six realities the goal is reached in 1,480 points against 1,467 and the median improves in 8 cells,
worsens in 3 (by 1-1.5 trials), within the benchmark's noise elsewhere. Each group may further differ from the others
by HYPER_SD, the hyperprior the per-group derivation above uses.

How well the rows pin each group's width down (WIDTH_SD): the standard deviation of the log of each group's width
under the per-group fit, from the inverse Hessian of its objective (negative log marginal likelihood plus the
hyperprior) at the optimum (a Laplace approximation). 0.26-0.52 on the shipped rows: 100 rows of 29 models tell the
shared width well and each group's own little, so a study should not take any one group's width as known
(residual.py's stop rule draws them).

PRIOR_WIDTHS and WIDTH_SD hold the result (rounded), so a search does not refit 12 calibrations at start-up;
tests/search/test_residual.py recomputes them and checks they match. Re-derive after the data change:
`python -c "from autotune.search.priors import derive; print(derive())"`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PRIOR_WIDTHS", "WIDTH_SD", "derive", "derive_priors", "lomo_residuals", "group_width", "group_width_sd"]

HOPPER = ("H100", "H200")
HERMITE = 40  # quadrature points over each model's log k in scale_spread
HYPER_SD = 0.5  # log-normal hyperprior on each group's width around the shared one (a factor of 1.65)

# derive_priors() on the shipped data (see the module docstring); log units (0.1 = about 10%)
PRIOR_WIDTHS: dict[str, float] = {
    "intercept": 0.139, "feature": 0.0436, "interaction": 0.0822, "noise": 0.0691, "tp": 0.0451, "pp": 0.0582,
    "vpp": 0.0392, "cp": 0.0591, "ep": 0.0401, "recompute": 0.0421, "recompute_1": 0.0428, "dispatcher": 0.0376,
    "max_tokens_per_gpu": 0.0423, "precision_aware_optimizer": 0.0423, "moe_shared_expert_overlap": 0.0402,
    "ep_overlap": 0.0453, "tp_comm_overlap": 0.0437, "cuda_graphs": 0.0445, "moe_capacity_factor": 0.0407,
    "layer_split": 0.0396, "ep_x_nodes": 0.0657, "pp_x_recompute": 0.0784, "tp_x_hidden": 0.0879, "scale_sd": 0.45,
}


# derive()'s second half on the shipped data: how well the calibration rows pin each group's width down, the standard
# deviation of its log under the fit (Laplace: the inverse Hessian of the negative log marginal likelihood plus the
# hyperprior at the optimum). Near HYPER_SD for most groups: 100 rows tell the shared width well and each group's
# own little; the three interactions, which the rows vary most, are pinned best. residual.py draws each group's
# width from it.
WIDTH_SD: dict[str, float] = {
    "tp": 0.453, "pp": 0.522, "vpp": 0.397, "cp": 0.463, "ep": 0.466, "recompute": 0.459, "recompute_1": 0.491,
    "dispatcher": 0.45, "max_tokens_per_gpu": 0.487, "precision_aware_optimizer": 0.487,
    "moe_shared_expert_overlap": 0.473, "ep_overlap": 0.493, "tp_comm_overlap": 0.431, "cuda_graphs": 0.492,
    "moe_capacity_factor": 0.475, "layer_split": 0.47, "ep_x_nodes": 0.432, "pp_x_recompute": 0.355,
    "tp_x_hidden": 0.257,
}


def group_width_sd(sds: dict[str, float], group: str) -> float:
    """How uncertain a group's width is (sd of its log): its own, else the hyperprior's (a group the calibration
    rows never vary is known only through the shared width: HYPER_SD around it)."""
    return float(sds.get(group, HYPER_SD))


def group_width(widths: dict[str, float], group: str) -> float:
    """The prior std of one feature group: its own, else the shared one of its kind."""
    if group in widths:
        return float(widths[group])
    if group == "intercept":
        return float(widths.get("intercept", 0.25))
    kind = "interaction" if "_x_" in group else "feature"
    return float(widths.get(kind, 0.1))


def lomo_residuals(rows=None):
    """(rows, log(measured / leave-one-model-out prediction)) over the BF16 Hopper rows."""
    from ..cost.calibrate import calibration_for, fit_kinds, predict, published_measurements, seed_measurements

    if rows is None:
        kept, _ = published_measurements(None)
        # the rows the calibration fit leaves out (a filed regression, a model not yet priced) stay out here too
        rows = [m for m in seed_measurements() + kept if m.gpu in HOPPER and not m.kept_out]
    pred = np.zeros(len(rows))
    for model in sorted({m.model for m in rows}):
        cals = fit_kinds([m for m in rows if m.model != model], sorted({m.gpu for m in rows}))
        for i, m in enumerate(rows):
            if m.model == model:
                pred[i] = predict([m], calibration_for(m, cals))[0]
    meas = np.array([m.tokens_per_s_per_gpu for m in rows])
    return rows, np.log(meas / pred)


def _design(rows) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per group, the rows' 'same value' matrix; and each row's noise weight (repeats share one weight)."""
    from ..layout import LayoutTable
    from .features import feature_groups

    cols: dict[str, list] = {"model": [m.model for m in rows]}
    for m in rows:
        for name, c in feature_groups(LayoutTable.from_layouts([m.layout]), m.spec.hidden_size, m.gpus_per_node):
            cols.setdefault(name, []).append(int(c[0]))
    same = {g: (np.array(v)[:, None] == np.array(v)[None, :]).astype(float) for g, v in cols.items()
            if len(set(v)) > 1}
    keys = [(m.model, m.gpu, m.count, m.layout) for m in rows]
    w = np.array([m.weight / keys.count(k) for m, k in zip(rows, keys)])
    return same, w


def _nll(r, same, w, log_tau: dict[str, float], log_sigma: float) -> float:
    K = np.diag(np.exp(2 * log_sigma) / w)
    for g, lt in log_tau.items():
        K = K + np.exp(2 * lt) * same[g]
    sign, logdet = np.linalg.slogdet(K)
    return 0.5 * (logdet + r @ np.linalg.solve(K, r)) if sign > 0 else np.inf


def _coordinate_min(f, x: dict[str, float], lo=np.log(0.003), hi=np.log(1.5), sweeps=6) -> dict[str, float]:
    """Minimise f over each coordinate in turn by golden-section search (a handful of smooth coordinates)."""
    g = (np.sqrt(5) - 1) / 2
    for _ in range(sweeps):
        for k in list(x):
            a, b = lo, hi
            for _ in range(40):
                c, d = b - g * (b - a), a + g * (b - a)
                if f({**x, k: c}) < f({**x, k: d}):
                    b = d
                else:
                    a = c
            x[k] = (a + b) / 2
    return x


def derive_priors(rows=None) -> dict[str, float]:
    """Prior widths per residual-model group (plus 'intercept', 'feature', 'interaction', 'noise')."""
    return derive(rows)[0]


def derive(rows=None) -> tuple[dict[str, float], dict[str, float]]:
    """(PRIOR_WIDTHS, WIDTH_SD): the widths per group (derive_priors) and how uncertain each group's width is, the
    standard deviation of its log under the fit (Laplace: from the inverse of the Hessian, by central differences,
    of the per-group objective at its optimum; near the hyperprior's HYPER_SD where the rows say little of a group,
    a little above it where two groups trade off against each other, as PP's 0.52 does)."""
    rows, r = lomo_residuals(rows)
    same, w = _design(rows)
    same.pop("model", None)  # see the module docstring: the offset is not separable from the layout
    same["global"] = np.ones((len(rows), len(rows)))
    feats = [g for g in same if g != "global" and "_x_" not in g]
    inter = [g for g in same if "_x_" in g]

    def tied(x):
        lt = {"global": x["global"], **{g: x["feature"] for g in feats}, **{g: x["interaction"] for g in inter}}
        return _nll(r, same, w, lt, x["sigma"])

    start = {"global": np.log(0.1), "feature": np.log(0.05), "interaction": np.log(0.05), "sigma": np.log(0.05)}
    t = _coordinate_min(tied, dict(start))
    shared = {g: t["feature"] for g in feats} | {g: t["interaction"] for g in inter}

    def free(x):
        lt = {"global": t["global"], **{g: x[g] for g in shared}}
        hyper = sum((x[g] - shared[g]) ** 2 for g in shared) / (2 * HYPER_SD**2)
        return _nll(r, same, w, lt, t["sigma"]) + hyper

    per = _coordinate_min(free, dict(shared), sweeps=3)
    out = {"feature": t["feature"], "interaction": t["interaction"], "noise": t["sigma"], **per}
    widths = {k: round(float(np.exp(v)), 4) for k, v in out.items()}
    # the intercept: the whole leave-one-model-out error may be one offset for every layout of a model
    priors = {"intercept": round(float(np.sqrt(np.mean(r**2))), 4), **widths, "scale_sd": scale_spread(rows, r)}
    keys = list(per)
    cov = np.linalg.inv(_hessian(lambda v: free(dict(zip(keys, v))), np.array([per[k] for k in keys])))
    return priors, {k: round(float(np.sqrt(cov[i, i])), 3) for i, k in enumerate(keys)}


def _hessian(f, x: np.ndarray, h: float = 1e-3) -> np.ndarray:
    """f's Hessian at x by central differences."""
    n = len(x)
    H = np.zeros((n, n))
    e = np.eye(n) * h
    for i in range(n):
        for j in range(i, n):
            H[i, j] = H[j, i] = (f(x + e[i] + e[j]) - f(x + e[i] - e[j]) - f(x - e[i] + e[j])
                                 + f(x - e[i] - e[j])) / (4 * h * h)
    return H


def scale_spread(rows, r) -> float:
    """How much the size of the model's error varies between models (the hyperprior on a study's width scale,
    residual.py), by maximum likelihood: each model's residuals are N(0, (s k_m)^2) with log k_m ~ N(0, sd^2), k_m
    integrated out (Gauss-Hermite, HERMITE points) and (s, sd) fitted. A model measured on one or two rows says little
    of its own k_m: the naive spread (the standard deviation over models of each model's log RMS) counts that
    sampling noise as spread (the log of one residual's size alone varies by about 1.1) and overstates it."""
    groups = [np.array([x for m, x in zip(rows, r) if m.model == name]) for name in sorted({m.model for m in rows})]
    z, wq = np.polynomial.hermite_e.hermegauss(HERMITE)  # nodes and weights for N(0, 1)
    wq = wq / wq.sum()
    ss = np.array([float(np.sum(g**2)) for g in groups])
    ns = np.array([len(g) for g in groups], dtype=float)

    def nll(log_s: float, sd: float) -> float:
        log_scale = log_s + sd * z[None, :]  # (models, nodes): log(s k)
        ll = -ns[:, None] * log_scale - 0.5 * ss[:, None] * np.exp(-2 * log_scale)
        top = ll.max(axis=1, keepdims=True)
        return -float(np.sum(top[:, 0] + np.log(np.exp(ll - top) @ wq)))

    best = (np.inf, 0.0)
    for sd in np.linspace(0.0, 2.0, 201):  # sd on a grid of 0.01, s by golden section at each
        a, b, g = np.log(0.005), np.log(2.0), (np.sqrt(5) - 1) / 2
        for _ in range(60):
            c, d = b - g * (b - a), a + g * (b - a)
            if nll(c, sd) < nll(d, sd):
                b = d
            else:
                a = c
        best = min(best, (nll((a + b) / 2, sd), float(sd)))
    return round(best[1], 4)
