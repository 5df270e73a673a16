"""What trials teach beyond calibration: a Bayesian linear model of the cost model's remaining error.

Calibration fits one factor per time term (physics). What it cannot express, e.g. "the allgather
dispatcher is 8% slower on this cluster than the model thinks", is learnt here: log(measured / predicted)
regressed on one-hot layout features (each value of every searched dimension, layout/dimensions.py, plus
three interactions: EP x nodes the expert group spans, PP x recompute, TP x hidden size) with a Gaussian
prior per weight. The prior widths are not guesses: priors.py derives them from the calibration's own
leave-one-model-out residuals (PRIOR_WIDTHS). The noise is Student-t (fitted by iteratively reweighted
least squares), so one broken trial cannot drag every prediction toward itself. The posterior gives each
candidate a corrected prediction and its own uncertainty: small near measured layouts, the prior's far
from them. Pure numpy; a few microseconds per candidate.
"""

from __future__ import annotations

import numpy as np

from ..layout import LayoutTable
from ..layout.dimensions import feature_columns
from .features import INTERACTIONS, feature_groups
from .priors import PRIOR_WIDTHS, group_width

__all__ = ["ResidualModel", "features", "feature_columns", "feature_groups", "INTERACTIONS"]

def features(t: LayoutTable, vocab: list[dict] | None = None, hidden: int | None = None,
             gpus_per_node: int = 8) -> tuple[np.ndarray, list[dict], list[str]]:
    """One-hot encoding (plus an intercept column 0) of each layout's feature values; `vocab` maps values
    to columns (built from `t` when None). Also returns the group name of every column."""
    groups = feature_groups(t, hidden, gpus_per_node)
    if vocab is None:
        vocab = [{v: j for j, v in enumerate(np.unique(c))} for _, c in groups]
    width = 1 + sum(len(v) for v in vocab)
    X = np.zeros((len(t), width))
    X[:, 0] = 1.0
    names = ["intercept"]
    off = 1
    for (name, c), voc in zip(groups, vocab):
        idx = np.array([voc.get(v, -1) for v in c], dtype=np.int64)
        hit = idx >= 0
        X[np.flatnonzero(hit), off + idx[hit]] = 1.0
        names += [name] * len(voc)
        off += len(voc)
    return X, vocab, names


class ResidualModel:
    """Posterior over per-feature log-corrections; prior N(0, width(group)^2) per weight, Student-t noise.

    `widths` maps group name -> prior std in log units (default: PRIOR_WIDTHS, derived from calibration
    data); `tau`, when given, overrides every width but the intercept's (the old single-width model).
    `sigma_n` is the trial-to-trial noise (log units), `nu` the Student-t degrees of freedom (inf: Gaussian).
    """

    def __init__(self, candidates: LayoutTable, tau: float | None = None, sigma_n: float = 0.02, *,
                 widths: dict[str, float] | None = None, hidden: int | None = None, gpus_per_node: int = 8,
                 nu: float = 4.0):
        self.hidden, self.gpus_per_node = hidden, gpus_per_node
        self.Xc, self.vocab, self.groups = features(candidates, hidden=hidden, gpus_per_node=gpus_per_node)
        w = dict(PRIOR_WIDTHS if widths is None else widths)
        self.prior_std = np.array([group_width(w, g) if (tau is None or g == "intercept") else tau
                                   for g in self.groups])
        self.tau, self.sigma_n, self.nu = tau, sigma_n, nu
        self.mean = np.zeros(self.Xc.shape[1])
        self.cov = np.diag(self.prior_std**2)
        self.weights = np.zeros(0)  # IRLS weight per fitted row (1: an ordinary row; << 1: an outlier)

    def fit(self, measured: LayoutTable, log_ratio: np.ndarray, iters: int = 20) -> None:
        """log_ratio = log(measured / predicted by the calibrated model) for each measured layout.

        Student-t likelihood by IRLS: each row's weight (nu + 1) / (nu + (r / sigma_n)^2) from its residual
        under the current posterior mean, so a row many sigmas off counts like a far noisier one."""
        X, _, _ = features(measured, self.vocab, self.hidden, self.gpus_per_node)
        y = np.asarray(log_ratio, dtype=float)
        P = np.diag(1.0 / self.prior_std**2)
        wt = np.ones(len(y))
        for _ in range(iters):
            Xw = X * (wt / self.sigma_n**2)[:, None]
            cov = np.linalg.inv(X.T @ Xw + P)
            mean = cov @ (Xw.T @ y)
            if not np.isfinite(self.nu):
                break
            r = y - X @ mean
            new = (self.nu + 1) / (self.nu + (r / self.sigma_n) ** 2)
            if np.allclose(new, wt, rtol=1e-4, atol=1e-6):
                wt = new
                break
            wt = new
        self.mean, self.cov, self.weights = mean, cov, wt

    def predict(self) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate: multiplicative correction exp(x.m) and relative std sqrt(x' C x)."""
        corr = np.exp(self.Xc @ self.mean)
        std = np.sqrt(np.einsum("ij,jk,ik->i", self.Xc, self.cov, self.Xc))
        return corr, std

    def diff_std(self, ref: int) -> np.ndarray:
        """Std of log(candidate / candidate `ref`) under the posterior: what ranking them hinges on (an
        error every layout shares, such as the intercept, cancels)."""
        D = self.Xc - self.Xc[ref]
        return np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", D, self.cov, D), 0.0))

    def correlation(self, i: int) -> np.ndarray:
        """Posterior correlation of every candidate's log-correction with candidate i's."""
        ci = self.Xc @ (self.cov @ self.Xc[i])
        sd = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", self.Xc, self.cov, self.Xc), 1e-30))
        return ci / (sd * sd[i])
