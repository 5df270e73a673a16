"""What trials teach: a Bayesian linear model of log(measured / predicted by the calibrated cost model).

log(measured / predicted) regressed on one-hot layout features (each value of every searched dimension,
layout/dimensions.py, plus three interactions: EP x nodes the expert group spans, PP x recompute, TP x
hidden size), e.g. "the allgather dispatcher is 8% slower on this cluster than the model thinks". A
Gaussian prior per weight, Student-t noise (iteratively reweighted, so one broken trial cannot drag every
prediction toward itself). The features are the dimensions that set each time term's share of a step, so
a time term that is off (a slow network) is learnt through them too (measured: adding the terms' own
factors as columns, d log tokens/s / d log factor with calibrate.fit's prior, changed nothing in the
benchmark, with terms off by up to 2x).

The feature widths are not guesses, and not fixed: priors.py derives one per feature group from the
calibration's leave-one-model-out residuals (PRIOR_WIDTHS), and how wrong the model is differs between
clusters, so each study learns a scale k on every feature width from its own trials (hierarchical
empirical Bayes): log k has the spread PRIOR_WIDTHS["scale_sd"] the calibration rows show between
models. The posterior averages over DRAWS values of k (quadrature), each weighted by its hyperprior weight times
its marginal likelihood (how well the widths explain the trials), and is summarised by its mean and covariance, so the
planner, the LLM gate and the uncertainty shown per candidate read the same numbers. k^2 averages 1 over the
hyperprior, so before any trial the prior variance is exactly the calibration's. One scale for the planner, not one
per group or per kind: measured in bench/search_efficiency.py (40 seeds per cell), per-group widths (type-II MAP
under priors.HYPER_SD, 9 cells) changed the mean trials to the best layout by -7% to +4% and one scale per kind
(features, interactions, 5 cells) by -7% to +7%, neither consistently; a handful of trials cannot tell ~17 widths
apart (and with every group's width integrated out, 8 December, the medians moved by -3 to +2 trials per cell:
deviations()).

The stop rule asks a tail question (does any of thousands of untried candidates beat the best?), so it draws from the
posterior's mixture itself (deviations()), in which each group's width also differs from the calibration's by as much
as the calibration fit leaves it uncertain (priors.WIDTH_SD), importance-sampled around the widths' posterior mode
(_Widths): with one scale for every group, a group whose tried values were far off looks as well known as the rest.

Candidates sharing feature values share weights, so the posterior correlates them: a trial narrows the
uncertainty of every layout that shares its values (correlation(), the batch rule; deviations(), the stop
rule). Pure numpy; a refit is a few batched n x n (or p x p) solves, p ~ 70 columns.
"""

from __future__ import annotations

import numpy as np

from ..layout import LayoutTable
from .features import INTERACTIONS, feature_groups
from .priors import PRIOR_WIDTHS, WIDTH_SD, group_width, group_width_sd

__all__ = ["ResidualModel", "features", "feature_groups", "INTERACTIONS", "DRAWS"]

# sigma_own, each layout's own error, measured and not made the default (6 December, bench/search_efficiency.py, 30
# seeds, model-guided, trials to within 2% of the best, median): at the calibration's unexplained residual less the
# trial noise (sqrt(0.0584^2 - 0.02^2) = 0.055) it helped where reality has such errors (lomo+own: 18.5 / 21 / 10.5 ->
# 13 / 19 / 13 on Qwen3.5-122B-A10B / Qwen3-235B-A22B / Llama-3.1-70B) and hurt where it has none (f10+int on
# Qwen3-235B-A22B 13.5 -> 17.5, reached 83% -> 53%; lomo 7.5 -> 13): every near-twin of the best layout keeps an
# own upside, so the trials go to its 12,875 candidates' near-twins instead of other feature values. A handful of
# trials cannot tell own errors from feature errors, so the scale cannot be learnt per study either. The oracle of
# the lomo+own reality uses it (it knows reality has own errors). Tried on 7 December (twelfth session): sigma_own as
# a two-point mixture, 0 or the calibration's unexplained residual less the trial noise (today sqrt(0.0691^2 -
# 0.02^2) = 0.066) with prior weight 1/2 each, weighed by the marginal likelihood like the width
# scale's draws (the trials' near-twins are its only witnesses). lomo+own 15.5 / 21 / 21 -> 13 / 21 / 20.5, f10+int
# 8.5 / 14 / 9.5 -> 11.5 / 14.5 / 8.5, lomo 7.5 / 10 / 5 -> 8 / 9.5 / 5: the trade again, smaller; not adopted.

# Quadrature points of the width scale's hyperprior: log k at DRAWS points evenly spaced over +-DRAW_SPAN standard
# deviations, each weighted by the hyperprior's density there. 32 points are 0.26 sd apart, finer than a handful of
# trials can tell scales apart. The span matters: the hyperprior's quantile midpoints (the rule until 7 December) stop
# at 2.15 sd, so no posterior could put the widths beyond about 2.2x the calibration's, however wrong the trials said
# the model was; under +-20% per feature value (bench/search_efficiency.py f20+int) the learnt scale sat at 1.8-2.1
# while reality's error per feature value is about 2.6x the calibration's feature widths. At 4 sd the tail points
# weigh 3e-4 of the centre's: only trials that say so reach them.
DRAWS = 32
DRAW_SPAN = 4.0
GROUP_DRAWS = 256  # the stop rule's draws of the widths (_Widths)
INFLATE = 1.2  # the proposal's spread over the Laplace approximation's
DEFENSIVE = 0.2  # the share of the proposal that is the prior


def features(t: LayoutTable, vocab: list[np.ndarray] | None = None, hidden: int | None = None,
             gpus_per_node: int = 8) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
    """One-hot encoding (plus an intercept column 0) of each layout's feature values; `vocab` holds each
    group's sorted values (built from `t` when None; a value outside it gets no column). Also returns the
    group name of every column."""
    groups = feature_groups(t, hidden, gpus_per_node)
    if vocab is None:
        vocab = [np.unique(c) for _, c in groups]
    X = np.zeros((len(t), 1 + sum(len(v) for v in vocab)))
    X[:, 0] = 1.0
    names = ["intercept"]
    off = 1
    for (name, c), voc in zip(groups, vocab):
        pos = np.minimum(np.searchsorted(voc, c), len(voc) - 1)
        hit = np.flatnonzero(voc[pos] == c)
        X[hit, off + pos[hit]] = 1.0
        names += [name] * len(voc)
        off += len(voc)
    return X, vocab, names


def _scale_draws(groups: list[str], scale_sd: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """((n, columns) multipliers of each column's prior variance, (n,) prior weights): k^2 with log k at n points
    evenly spaced over +-DRAW_SPAN standard deviations of N(0, scale_sd^2), each weighted by that density, normalised
    so that k^2's weighted mean is 1 (the prior variance is the calibration's on average; the median width is smaller
    and the tails heavier); the intercept's stay 1."""
    z = np.linspace(-DRAW_SPAN, DRAW_SPAN, n) if n > 1 else np.zeros(1)
    prior = np.exp(-0.5 * z * z)
    prior /= prior.sum()
    k2 = np.exp(2 * scale_sd * z)
    k2 /= prior @ k2
    feat = np.array([_scaled(g) for g in groups])
    return np.where(feat[None, :], k2[:, None], 1.0), prior


def _roots(covs: np.ndarray) -> np.ndarray:
    """A square root of each covariance (L L' = C): batched Cholesky (a posterior covariance is positive definite, up
    to rounding: a jitter of 1e-12 of its largest variance), else per matrix from its eigenvalues, clipped at 0."""
    jitter = 1e-12 * np.max(np.diagonal(covs, axis1=1, axis2=2), axis=1)
    try:
        return np.linalg.cholesky(covs + jitter[:, None, None] * np.eye(covs.shape[1]))
    except np.linalg.LinAlgError:
        ev, U = np.linalg.eigh(covs)
        return U * np.sqrt(np.maximum(ev, 0.0))[:, None, :]


class _Widths:
    """The widths' posterior for the stop rule's draws: the shared scale k and every group's own factor u_g, log k ~
    N(0, scale_sd^2), log u_g ~ N(0, width_sd_g^2) (priors.WIDTH_SD: how well the calibration pins each group's width),
    column j's prior variance base_j k^2 u_g(j)^2 / E[k^2 u^2] (the calibration's on average). Too many dimensions for a
    grid, and a sample from the prior degenerates after a few trials (256 draws: 1 to 10 effective), so the draws come
    from a proposal at the posterior's mode (Newton on the log marginal likelihood plus the log prior, analytic
    gradient) with its Laplace covariance, inflated, and a share from the prior (defensive importance sampling); each
    draw carries its importance ratio prior / proposal, and the likelihood is applied by _mixture."""

    def __init__(self, groups: list[str], scale_sd: float, width_sd: dict[str, float], draws: int = GROUP_DRAWS):
        names = sorted({g for g in groups if _scaled(g)})
        feat = np.array([_scaled(g) for g in groups])
        # A[j, t]: does parameter t (0: log k, 1 + i: log u of group i) scale column j
        self.A = np.zeros((len(groups), 1 + len(names)))
        self.A[feat, 0] = 1.0
        for j, g in enumerate(groups):
            if feat[j]:
                self.A[j, 1 + names.index(g)] = 1.0
        self.sd = np.array([scale_sd] + [group_width_sd(width_sd, g) for g in names])
        self.offset = 2 * self.A @ self.sd**2  # log E[k^2 u^2] per column
        half = np.random.default_rng(0).standard_normal((draws // 2, len(self.sd)))
        self.z = np.concatenate([half, -half])  # fixed standard normal draws, antithetic

    def mult(self, theta: np.ndarray) -> np.ndarray:
        """(draws, columns) variance multipliers at parameters theta (draws, params)."""
        return np.exp(2 * theta @ self.A.T - self.offset)

    def _log_prior(self, theta: np.ndarray) -> np.ndarray:
        return -0.5 * np.sum((theta / self.sd) ** 2, axis=-1)

    def _value_and_grad(self, X, y, noise, base, theta) -> tuple[float, np.ndarray]:
        """The log posterior of the parameters theta (log marginal likelihood of the trials plus log prior, up to a
        constant) and its gradient: d/dV_j = ((X'K^-1 y)_j^2 - (X'K^-1 X)_jj) / 2 for column j's prior variance V_j,
        and dV_j/dtheta_t = 2 V_j for each parameter t that scales column j."""
        V = base * self.mult(theta[None])[0]
        K = (X * V) @ X.T + np.diag(noise)
        Kinv = np.linalg.inv(K)
        alpha = Kinv @ y
        f = -0.5 * (np.linalg.slogdet(K)[1] + alpha @ y) + self._log_prior(theta)
        dV = 0.5 * ((X.T @ alpha) ** 2 - np.einsum("nj,nm,mj->j", X, Kinv, X))
        return float(f), self.A.T @ (2 * V * dV) - theta / self.sd**2

    def prior(self) -> tuple[np.ndarray, np.ndarray]:
        """The prior's draws: ((draws, columns) variance multipliers, each column's scaled to average exactly 1, (draws,)
        equal weights)."""
        mult = self.mult(self.z * self.sd)
        return mult / mult.mean(axis=0), np.ones(len(self.z))

    def draws(self, X, y, noise, base, learn: bool) -> tuple[np.ndarray, np.ndarray]:
        """((draws, columns) variance multipliers, (draws,) prior / proposal ratios) for the trials (X, y) with their
        noise variances and the columns' prior variances `base`; the prior's when not `learn` or without trials."""
        if not learn or len(y) == 0:
            return self.prior()
        theta, H = self._mode(X, y, noise, base)
        prec = H / INFLATE**2  # the proposal's precision: the Laplace approximation's, its spread inflated
        L = np.linalg.cholesky(np.linalg.inv(prec))
        m = len(self.z)
        n_prior = int(round(DEFENSIVE * m))
        th = np.concatenate([theta + self.z[: m - n_prior] @ L.T, self.z[m - n_prior:] * self.sd])
        d = th - theta
        log_lap = -0.5 * np.einsum("mi,ij,mj->m", d, prec, d) - np.log(np.diag(L)).sum()
        log_pri = self._log_prior(th) - np.log(self.sd).sum()
        log_q = np.logaddexp(np.log(1 - DEFENSIVE) + log_lap, np.log(DEFENSIVE) + log_pri)
        r = log_pri - log_q
        return self.mult(th), np.exp(r - r.max())

    def _mode(self, X, y, noise, base) -> tuple[np.ndarray, np.ndarray]:
        """The log posterior's mode over the parameters (damped Newton) and the negative Hessian there (central
        differences of the gradient), made positive definite."""
        theta = np.zeros(len(self.sd))
        f, g = self._value_and_grad(X, y, noise, base, theta)
        for _ in range(30):
            H = self._neg_hessian(X, y, noise, base, theta)
            step = np.linalg.solve(H, g)
            t = 1.0
            while t > 1e-3:
                f_new, g_new = self._value_and_grad(X, y, noise, base, theta + t * step)
                if f_new >= f - 1e-9:
                    break
                t /= 2
            if t <= 1e-3:
                break
            theta, f, g = theta + t * step, f_new, g_new
            if np.max(np.abs(t * step)) < 1e-4:
                break
        return theta, self._neg_hessian(X, y, noise, base, theta)

    def _neg_hessian(self, X, y, noise, base, theta, h: float = 1e-4) -> np.ndarray:
        """Minus the log posterior's Hessian at theta, by central differences of the gradient."""
        n = len(theta)
        H = np.empty((n, n))
        for i in range(n):
            e = np.zeros(n)
            e[i] = h
            up = self._value_and_grad(X, y, noise, base, theta + e)[1]
            H[:, i] = -(up - self._value_and_grad(X, y, noise, base, theta - e)[1]) / (2 * h)
        H = 0.5 * (H + H.T)
        ev, U = np.linalg.eigh(H)
        floor = 1.0 / self.sd.max() ** 2  # no direction wider than the prior's widest (and positive definite)
        return (U * np.maximum(ev, floor)) @ U.T


def _scaled(group: str) -> bool:
    """Whether the width scale applies: layout features and interactions, not the offset."""
    return group != "intercept"


def _mixture(X: np.ndarray, y: np.ndarray, noise: np.ndarray, V: np.ndarray, prior: np.ndarray, with_cov: bool,
             weight_space: bool, learn_scale: bool) -> tuple[np.ndarray, tuple]:
    """The posterior over the weights as a mixture over the width draws: (every draw's weight, (the kept draws'
    weights, posterior means, posterior covariances or None)).

    A draw with prior variances V gives y ~ N(0, K), K = X V X' + N (N the rows' noise); its weight is its prior
    weight times that likelihood (`learn_scale=False`: the prior weight alone), its posterior mean V X' K^-1 y and
    covariance V - V X' K^-1 X V. Computed with n x n solves (n trials), or, in `weight_space` (more trials than
    feature columns), with the equivalent p x p ones (A = X'N^-1 X + V^-1: mean A^-1 X'N^-1 y, covariance A^-1,
    |K| = |A| |V| |N|)."""
    p = X.shape[1]
    if not weight_space:
        XV = X[None] * V[:, None, :]  # (draws, n, p)
        K = XV @ X.T + np.diag(noise)
        Kinv = np.linalg.inv(K)
        alpha = Kinv @ y
        ll = -0.5 * (np.linalg.slogdet(K)[1] + alpha @ y)
        means = np.einsum("mnp,mn->mp", XV, alpha)
    else:
        b = X.T @ (y / noise)
        A = (X.T @ (X / noise[:, None]))[None] + np.einsum("mp,pq->mpq", 1.0 / V, np.eye(p))
        Ainv = np.linalg.inv(A)
        means = Ainv @ b
        ll = -0.5 * (np.linalg.slogdet(A)[1] + np.log(V).sum(axis=1) - means @ b)
    w = prior * (np.exp(ll - ll.max()) if learn_scale else 1.0)
    w = w / w.sum()
    keep = np.flatnonzero(w > 1e-9)
    covs = None
    if with_cov:
        covs = (np.einsum("mp,pq->mpq", V[keep], np.eye(p)) - XV[keep].transpose(0, 2, 1) @ (Kinv[keep] @ XV[keep])
                if not weight_space else Ainv[keep])
    return w, (w[keep] / w[keep].sum(), means[keep], covs)


class ResidualModel:
    """Posterior over per-feature log-corrections (module docstring).

    `widths` maps group name -> prior std in log units (default: PRIOR_WIDTHS); `sigma_n` is the
    trial-to-trial noise (log units), `sigma_own` each layout's own error (independent of every other layout's:
    learnt only by measuring that layout; 0 by default: see the note on sigma_own above), `nu` the Student-t degrees of
    freedom (inf: Gaussian); `learn_widths=False` keeps the widths fixed at `widths` (one draw); `width_sd`: how
    uncertain each group's width is (sd of its log; default priors.WIDTH_SD, from the calibration fit; None: known
    exactly, only the shared scale is learnt)."""

    def __init__(self, candidates: LayoutTable, sigma_n: float = 0.02, *, widths: dict[str, float] | None = None,
                 hidden: int | None = None, gpus_per_node: int = 8, nu: float = 4.0, learn_widths: bool = True,
                 sigma_own: float = 0.0, width_sd: dict[str, float] | None = WIDTH_SD):
        self.hidden, self.gpus_per_node = hidden, gpus_per_node
        self.Xc, self.vocab, self.groups = features(candidates, hidden=hidden, gpus_per_node=gpus_per_node)
        w = dict(PRIOR_WIDTHS if widths is None else widths)
        self.prior_std = np.array([group_width(w, g) for g in self.groups])
        self.sigma_n, self.nu = sigma_n, nu
        self.sigma_own = float(sigma_own)
        self._own = None  # (candidate indices, their own-error posterior mean and variance) after fit_candidates
        scale_sd = w.get("scale_sd", PRIOR_WIDTHS["scale_sd"])
        self._mult, self._draw_prior = (_scale_draws(self.groups, scale_sd, DRAWS) if learn_widths
                                        else (np.ones((1, len(self.groups))), np.ones(1)))
        # the stop rule's draws: each group's width uncertain too (deviations())
        self._tail = _Widths(self.groups, scale_sd, width_sd) if learn_widths and width_sd is not None else None
        self.draw_weight = self._draw_prior.copy()
        self.mean = np.zeros(self.Xc.shape[1])
        self.cov = np.diag(self.prior_std**2)
        self._prior_mixture()
        self.weights = np.zeros(0)  # IRLS weight per fitted row (1: an ordinary row; << 1: an outlier)
        self.row_noise = np.zeros(0)  # each fitted row's own trial noise (log units): sigma_n, or more (fit_rows)

    @classmethod
    def of_design(cls, X: np.ndarray, prior_std: np.ndarray, sigma_n: float, nu: float = np.inf,
                  sigma_own: float = 0.0) -> "ResidualModel":
        """A model over any one-hot design (rows: candidates) with fixed per-column prior widths; fit with
        fit_candidates(). bench/search_efficiency.py's oracle uses it with a reality's own error structure."""
        self = cls.__new__(cls)
        self.hidden, self.gpus_per_node, self.vocab = None, 8, []
        self.Xc, self.prior_std = np.asarray(X, float), np.asarray(prior_std, float)
        self.groups = ["intercept"] + ["design"] * (X.shape[1] - 1)
        self.sigma_n, self.nu, self._mult, self._draw_prior = sigma_n, nu, np.ones((1, X.shape[1])), np.ones(1)
        self._tail, self.sigma_own, self._own = None, float(sigma_own), None
        self.draw_weight, self.weights, self.row_noise = np.ones(1), np.zeros(0), np.zeros(0)
        self.mean, self.cov = np.zeros(X.shape[1]), np.diag(self.prior_std**2)
        self._prior_mixture()
        return self

    def _prior_mixture(self) -> None:
        """The hyperprior's mixture before any trial: one zero-mean Gaussian per width draw (deviations())."""
        mult, prior = (self._mult, self._draw_prior) if self._tail is None else self._tail.prior()
        w = prior / prior.sum()
        V = self.prior_std[None, :] ** 2 * mult
        self._mix = (w, np.zeros_like(V), np.einsum("mp,pq->mpq", V, np.eye(V.shape[1])))
        self._mix_sqrt = None  # (the mixture's covariances, a square root of each): deviations()

    def fit(self, measured: LayoutTable, log_ratio: np.ndarray, iters: int = 20, stderr=None) -> None:
        """log_ratio = log(measured / predicted by the calibrated cost model) for each measured layout (layouts
        not known as candidates: their own errors teach the weights as noise and are not kept); `stderr`: fit_rows'."""
        self.fit_rows(features(measured, self.vocab, self.hidden, self.gpus_per_node)[0], log_ratio, iters, stderr)

    def fit_candidates(self, idx, log_ratio: np.ndarray, iters: int = 20, stderr=None,
                       learn_scale: bool = True) -> None:
        """fit() on measured candidates, by index: the weights, and each measured candidate's own error.
        `learn_scale=False`: fit_rows'."""
        idx = np.asarray(idx, dtype=int)
        self.fit_rows(self.Xc[idx], log_ratio, iters, stderr, learn_scale=learn_scale)
        if self.sigma_own > 0 and len(idx):
            # a measured layout's own error given the weights: its residual shrunk by k = own^2 / (own^2 + its
            # noise); what is left of its uncertainty: the weights' share (1 - k)^2 x' C x and k x its noise
            noise = self.row_noise**2 / self.weights
            k = self.sigma_own**2 / (self.sigma_own**2 + noise)
            r = np.asarray(log_ratio, dtype=float) - self.Xc[idx] @ self.mean
            self._own = (idx, k * r, k)

    def fit_rows(self, X: np.ndarray, log_ratio: np.ndarray, iters: int = 20, stderr=None,
                 learn_scale: bool = True) -> None:
        """fit() on rows encoded like `self.Xc`. Each row's noise is the trial's and the layout's own error
        (sn^2 + sigma_own^2). The trial's, sn, is sigma_n, the run-to-run noise, or the row's own standard error
        when that is larger (`stderr`, relative, per row; None or NaN: not known): a trial whose steps scattered
        more than a trial's usually do, or that was stopped after a few, says less. Student-t likelihood by IRLS:
        each row's weight (nu + 1) / (nu + (r / s)^2) from its residual r under the current posterior mean (s the
        row's noise), so a row many sigmas off counts like a far noisier one. The weight scales the trial's
        noise, not the layout's own error. `learn_scale=False` keeps the width scale's weights at the hyperprior's
        (the simulator's trials: their values are the model's own predictions, so they narrow what a trial there
        would resolve but say nothing of how wrong the model is)."""
        y = np.asarray(log_ratio, dtype=float)
        wt = np.ones(len(y))
        se = np.full(len(y), np.nan) if stderr is None else np.asarray(stderr, dtype=float).reshape(len(y))
        self.row_noise = np.fmax(np.where(np.isfinite(se), se, 0.0), self.sigma_n)
        s = np.sqrt(self.row_noise**2 + self.sigma_own**2)
        for _ in range(iters if np.isfinite(self.nu) else 1):
            self._posterior(X, y, wt, with_cov=False, learn_scale=learn_scale)
            r = y - X @ self.mean
            new = (self.nu + 1) / (self.nu + (r / s) ** 2) if np.isfinite(self.nu) else wt
            done = np.allclose(new, wt, rtol=1e-4, atol=1e-6)
            wt = new
            if done:
                break
        self._posterior(X, y, wt, with_cov=True, learn_scale=learn_scale)
        self.weights = wt
        self._own = None

    def _posterior(self, X: np.ndarray, y: np.ndarray, wt: np.ndarray, with_cov: bool,
                   weight_space: bool | None = None, learn_scale: bool = True) -> None:
        """The posterior under every width draw, weighted by its marginal likelihood, then moment-matched (mean, cov:
        what predict(), correlation() and the planner read); with the covariance, also the mixture deviations() draws
        from, over the draws with each group's width uncertain when the model has them (the stop rule's)."""
        sn = self.row_noise if self.row_noise.shape == y.shape else self.sigma_n  # fit_rows sets the rows' own
        noise = sn**2 / wt + self.sigma_own**2
        weight_space = X.shape[0] > X.shape[1] if weight_space is None else weight_space
        w, mix = _mixture(X, y, noise, self.prior_std[None, :] ** 2 * self._mult, self._draw_prior, with_cov,
                          weight_space, learn_scale)
        wk, means, covs = mix
        self.draw_weight, self.mean = w, wk @ means
        if not with_cov:
            return
        second = np.einsum("m,mpq->pq", wk, covs) + (means.T * wk) @ means
        self.cov = second - np.outer(self.mean, self.mean)
        if self._tail is not None:
            base = self.prior_std**2
            mult, ratio = self._tail.draws(X, y, noise, base, learn_scale)
            mix = _mixture(X, y, noise, base[None, :] * mult, ratio, True, weight_space, learn_scale)[1]
        self._mix = mix  # the mixture itself, for draws from its tails (deviations())

    def width_scale(self) -> float:
        """How wide the feature widths are now relative to the calibration's (1 before any trial; < 1 when
        the trials say the model is less wrong on this cluster than on the calibration rows)."""
        feat = np.array([_scaled(g) for g in self.groups])
        return float(np.sqrt(self.draw_weight @ self._mult[:, feat].mean(axis=1))) if feat.any() else 1.0

    def predict(self) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate: multiplicative correction exp(x.m + own) and relative std sqrt(x' C x + own variance)
        (own: a measured candidate's own error, 0 for the others; own variance: sigma_own^2 for a candidate not
        measured, what its trial left of it for one measured)."""
        log_c = self.Xc @ self.mean
        if self._own is not None:
            idx, shift, _ = self._own
            log_c[idx] += shift
        return np.exp(log_c), self._std(self.Xc, own=True)

    def _own_parts(self) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate: the factor on its weights' covariance (1, or (1 - k)^2 once measured) and its own-error
        variance (sigma_own^2, or k x the trial's noise once measured)."""
        n = len(self.Xc)
        scale, var = np.ones(n), np.full(n, self.sigma_own**2)
        if self._own is not None:
            idx, _, k = self._own
            scale[idx] = (1.0 - k) ** 2
            var[idx] = k * self.row_noise**2 / self.weights
        return scale, var

    def _std(self, X: np.ndarray, own: bool = False) -> np.ndarray:
        v = np.maximum(np.sum((X @ self.cov) * X, axis=1), 0.0)
        if own and self.sigma_own > 0:
            scale, var = self._own_parts()
            v = v * scale + var
        return np.sqrt(v)

    def deviations(self, n: int, rows: np.ndarray | None = None, seed: int = 0) -> np.ndarray:
        """(candidates, n) joint draws of log(truth / prediction) under the posterior (of `rows` only, a
        boolean mask, when given): the shared weights' draws, plus each candidate's own error, independent of
        the others'; a fixed seed, so a decision made on them is reproducible.

        The weights are drawn from a mixture over the widths (one Gaussian per width draw, at its weight), not from
        the one Gaussian with its mean and covariance that predict() and correlation() summarise the posterior by: a
        scale mixture has the heavier tails, and the stop rule asks a tail question (does any of thousands of
        candidates beat the best?). Its widths are uncertain per group as well as through the shared scale (_Widths:
        each group's width is known from the calibration only to within priors.WIDTH_SD), so trials that show one
        group's values far off widen that group's untried values without widening every other group's. Measured with
        bench/search_efficiency.py --stop-rule, where the rule promises that an untried layout beats the best by more
        than the noise in under 5% of the runs it stops: drawn from the moment-matched Gaussian, 31 of 270 runs (7
        December); from the shared scale's mixture, 23; with each group's width drawn too, 16, at 0 to 1.5 more trials
        (8 December). The planner keeps the shared scale's moments: with the per-group widths' moments its median
        trials to the goal moved by -3 to +2 per cell and the goal was reached in 740 run-points against 748 over 9
        cells (30 seeds; lomo, f10+int, f20+int), within the benchmark's noise, at 0.2 s more per refit."""
        w, means, covs = self._mix
        if self._mix_sqrt is None or self._mix_sqrt[0] is not covs:
            self._mix_sqrt = (covs, _roots(covs))
        roots = self._mix_sqrt[1]
        rng = np.random.default_rng(seed)
        comp = rng.choice(len(w), size=n, p=w / w.sum())
        W = np.empty((len(self.mean), n))
        for m in np.unique(comp):
            cols = np.flatnonzero(comp == m)
            W[:, cols] = (means[m] - self.mean)[:, None] + roots[m] @ rng.standard_normal((len(self.mean), len(cols)))
        X = self.Xc if rows is None else self.Xc[rows]
        out = X @ W
        if self.sigma_own > 0:
            scale, var = self._own_parts()
            scale, var = (scale, var) if rows is None else (scale[rows], var[rows])
            out = out * np.sqrt(scale)[:, None] + np.sqrt(var)[:, None] * rng.standard_normal(out.shape)
        return out

    def diff_std(self, ref: int) -> np.ndarray:
        """Std of log(candidate / candidate `ref`) under the posterior: what ranking them hinges on (an
        error every layout shares, such as the intercept, cancels; their own errors do not)."""
        shared = self._std(self.Xc - self.Xc[ref])
        if self.sigma_own <= 0:
            return shared
        _, var = self._own_parts()
        out = np.sqrt(shared**2 + var + var[ref])
        out[ref] = 0.0
        return out

    def correlation(self, i: int) -> np.ndarray:
        """Posterior correlation of every candidate's log-correction with candidate i's (own errors are
        independent: they add to each candidate's variance, not to the covariances)."""
        ci = self.Xc @ (self.cov @ self.Xc[i])
        sd = np.maximum(self._std(self.Xc, own=True), 1e-15)
        if self.sigma_own > 0:
            scale, _ = self._own_parts()
            ci = ci * np.sqrt(scale * scale[i])
            ci[i] = sd[i] ** 2
        return ci / (sd * sd[i])
