"""What trials teach beyond calibration: a Bayesian linear model of the cost model's remaining error.

Calibration fits one factor per time term (physics). What it cannot express, e.g. "the allgather
dispatcher is 8% slower on this cluster than the model thinks", is learnt here: log(measured / predicted)
regressed on one-hot layout features (each value of every searched dimension, layout/dimensions.py)
with a Gaussian prior on every weight. The posterior gives each
candidate a corrected prediction and its own uncertainty: small near measured layouts, the prior's far
from them. Pure numpy; a few microseconds per candidate.
"""

from __future__ import annotations

import numpy as np

from ..layout import LayoutTable
from ..layout.dimensions import feature_columns

__all__ = ["ResidualModel", "features", "feature_columns"]


def features(t: LayoutTable, vocab: list[dict] | None = None) -> tuple[np.ndarray, list[dict]]:
    """One-hot encoding (plus an intercept) of each layout's feature values; `vocab` maps values to columns."""
    cols = feature_columns(t)
    if vocab is None:
        vocab = [{v: j for j, v in enumerate(np.unique(c))} for c in cols]
    width = 1 + sum(len(v) for v in vocab)
    X = np.zeros((len(t), width))
    X[:, 0] = 1.0
    off = 1
    for c, voc in zip(cols, vocab):
        idx = np.array([voc.get(v, -1) for v in c])
        hit = idx >= 0
        X[np.flatnonzero(hit), off + idx[hit]] = 1.0
        off += len(voc)
    return X, vocab


class ResidualModel:
    """Posterior over per-feature log-corrections; prior N(0, tau^2) per weight, noise sigma_n."""

    def __init__(self, candidates: LayoutTable, tau: float = 0.03, sigma_n: float = 0.02):
        self.Xc, self.vocab = features(candidates)
        self.tau, self.sigma_n = tau, sigma_n
        self.mean = np.zeros(self.Xc.shape[1])
        self.cov = np.eye(self.Xc.shape[1]) * tau**2

    def fit(self, measured: LayoutTable, log_ratio: np.ndarray) -> None:
        """log_ratio = log(measured / predicted by the calibrated model) for each measured layout."""
        X, _ = features(measured, self.vocab)
        d = X.shape[1]
        A = X.T @ X / self.sigma_n**2 + np.eye(d) / self.tau**2
        self.cov = np.linalg.inv(A)
        self.mean = self.cov @ X.T @ np.asarray(log_ratio) / self.sigma_n**2

    def predict(self) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate: multiplicative correction exp(x.m) and relative std sqrt(x' C x)."""
        corr = np.exp(self.Xc @ self.mean)
        std = np.sqrt(np.einsum("ij,jk,ik->i", self.Xc, self.cov, self.Xc))
        return corr, std
