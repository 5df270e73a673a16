"""Least-squares fit of per-term time factors to measured runs (numpy only: the core has no scipy).

Model: log T_pred(row; f) with f = exp(theta) multiplying the terms of time.py. Objective:

    sum_rows w_r ((log T_pred - log T_measured) / noise)^2 + sum_terms ((theta - theta_base) / prior)^2

solved by Levenberg-Marquardt on theta with a finite-difference Jacobian (a handful of terms, tens of
rows: each evaluation is a few array operations over precomputed unscaled terms, see time.RawTime).
The Gaussian prior pulls every factor toward the base calibration, so one or two rows move the factors
that matter for them a little instead of running any away; terms that never reach `min_share` of any
row's step time are not fitted at all (no row says anything about them).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..layout import LayoutTable
from .memory import MemoryCoefficients
from .time import STEP_TERMS, RawTime, TimeCoefficients, factor_vector, raw_time, step_breakdown, step_times

__all__ = ["FitResult", "stack_raw", "solve", "predict_step_times", "term_shares"]

TIES = (("compute_output", "compute_dense"),)
# terms whose physics is known only as a bound, with a wider prior (a multiple of prior_sigma): the routed experts'
# FFN-width traffic (_terms.py) counts the bytes at full HBM bandwidth, but moves them in many small per-expert
# kernels whose speed nothing published states
WIDE_PRIOR = {"expert_memory": 4.0}
LOWER_BOUND = {"expert_memory"}  # terms whose physics is a lower bound on their time: factor >= 1
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 4096


@dataclass
class FitResult:
    factors: dict[str, float]  # every STEP_TERM (fitted or carried over from the base)
    fitted: list[str]  # the terms the data moved
    log_resid_before: np.ndarray  # log(pred / measured) step time per row, at the base factors
    log_resid_after: np.ndarray
    iterations: int


def _group_key(m):
    """What one vectorised evaluation shares: the model, the cluster and the whole Workload (every setting the
    Measurement passes on to it, so two rows differing in any of them, MTP training say, are never evaluated as one)."""
    return m.model, m.gpu, m.gpu_variant, m.gpu_spec, m.count, m.gpus_per_node, m.workload


def stack_raw(measurements, coef: TimeCoefficients, mcoef: MemoryCoefficients) -> RawTime:
    """Unscaled terms of every measurement, one row each (cached per measurement and physics)."""
    phys = (coef.physics_key(), mcoef)
    todo: dict[tuple, list] = {}
    for m in measurements:
        if (m, phys) not in _CACHE:
            todo.setdefault(_group_key(m), []).append(m)
    for group in todo.values():  # one vectorised evaluation per (model, cluster, workload)
        uniq = list(dict.fromkeys(group))
        m0 = uniq[0]
        raw = raw_time(m0.spec, m0.workload, m0.cluster, LayoutTable.from_layouts([m.layout for m in uniq]), coef,
                       mcoef)
        for i, m in enumerate(uniq):
            _CACHE[(m, phys)] = _row(raw, i)
            if len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    rows = [_CACHE[(m, phys)] for m in measurements]
    S = max(r.mb.shape[2] for r in rows)
    rows = [r.pad(S) for r in rows]
    return RawTime(**{f: np.concatenate([getattr(r, f) for r in rows]) for f in RawTime.FIELDS},
                   tokens_per_step=0.0, world=0)


def _row(raw: RawTime, i: int) -> RawTime:
    s = slice(i, i + 1)
    return RawTime(**{f: getattr(raw, f)[s] for f in RawTime.FIELDS}, tokens_per_step=raw.tokens_per_step,
                   world=raw.world)


def predict_step_times(measurements, coef: TimeCoefficients, mcoef: MemoryCoefficients) -> np.ndarray:
    return step_times(stack_raw(measurements, coef, mcoef), factor_vector(coef.scale))


def term_shares(raw: RawTime, f: np.ndarray) -> np.ndarray:
    """(rows, len(STEP_TERMS)) share of each term in each row's predicted step time."""
    step, _ = step_breakdown(raw, f)
    total = sum(step.values())
    return np.stack([step[k] / total for k in STEP_TERMS], axis=1)


def _pseudo_huber(z: np.ndarray, delta: float) -> np.ndarray:
    """A residual whose square is the pseudo-Huber loss: ~z inside +-delta (in noise sigmas), ~sqrt(2 delta |z|)
    beyond, so one row far off (a broken trial, a software stack unlike the others) pulls linearly, not
    quadratically, and cannot drag the factors all the way to itself."""
    return np.sign(z) * np.sqrt(2 * delta**2 * (np.sqrt(1 + (z / delta) ** 2) - 1))


def solve(measurements, coef: TimeCoefficients, mcoef: MemoryCoefficients, terms=STEP_TERMS, *,
          prior_sigma: float = 0.2, noise_sigma: float = 0.07, min_share: float = 0.01,
          tie_sigma: float = 0.15, robust: float = 2.0, max_iter: int = 50) -> FitResult:
    raw = stack_raw(measurements, coef, mcoef)
    measured = np.array([m.seq_len * m.global_batch / (m.tokens_per_s_per_gpu * m.count) for m in measurements])
    # repeated measurements of one configuration (container versions, reruns) share one row's weight:
    # their spread is noise, not extra evidence that should outvote distinct layouts
    keys = [(_group_key(m), m.layout) for m in measurements]
    dups = {k: keys.count(k) for k in set(keys)}
    weight = np.sqrt(np.array([m.weight / dups[k] for m, k in zip(measurements, keys)])) / noise_sigma
    f0 = factor_vector(coef.scale)
    shares = term_shares(raw, f0)
    idx = [STEP_TERMS.index(k) for k in terms if k in STEP_TERMS and shares[:, STEP_TERMS.index(k)].max() >= min_share]
    theta0 = np.log(f0[idx])
    sigma = prior_sigma * np.array([WIDE_PRIOR.get(STEP_TERMS[i], 1.0) for i in idx])
    floor = np.array([0.0 if STEP_TERMS[i] in LOWER_BOUND else np.log(0.05) for i in idx])

    def resid(theta: np.ndarray) -> np.ndarray:  # (rows,) or, for a batch of thetas, (B, rows)
        f = np.tile(f0, (1, 1) if theta.ndim == 1 else (len(theta), 1))
        f[:, idx] = np.exp(np.atleast_2d(theta))
        r = np.log(step_times(raw, f)) - np.log(measured)
        return r[0] if theta.ndim == 1 else r

    # GEMM-like terms share one kernel efficiency: the output layer's factor is pulled toward the dense
    # GEMMs' (a loose tie), so a few pipeline-parallel rows cannot load the whole PP penalty on it. The tie holds
    # their ratio where the base has it (1 from the physics; a fitted kind's own ratio when a study's trials or a
    # framework's rows refit on top of it), so rows the base already predicts move no factor
    ties = [(idx.index(STEP_TERMS.index(a)), idx.index(STEP_TERMS.index(b))) for a, b in TIES
            if STEP_TERMS.index(a) in idx and STEP_TERMS.index(b) in idx]

    def objective(theta):
        T = np.atleast_2d(theta)
        tie = [((T[:, a] - T[:, b]) - (theta0[a] - theta0[b])) / tie_sigma for a, b in ties]
        R = np.concatenate([_pseudo_huber(resid(T) * weight, robust), (T - theta0) / sigma,
                            np.array(tie).T.reshape(len(T), -1)],
                           axis=1)
        return (R[0], float(R[0] @ R[0])) if theta.ndim == 1 else R

    before = resid(theta0)
    theta, lam, it = theta0.copy(), 1e-2, 0
    r, cost = objective(theta)
    for it in range(1, (max_iter + 1) if idx else 1):
        eps = 1e-5
        J = ((objective(theta + eps * np.eye(len(idx))) - r) / eps).T  # forward differences, one batch
        A, grad = J.T @ J, J.T @ r
        gain = 0.0
        while lam <= 1e8:  # Levenberg-Marquardt: damp until the step lowers the cost
            step = -np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), grad)
            new = np.clip(theta + step, floor, np.log(20.0))  # factors beyond 20x mean broken physics
            r_new, cost_new = objective(new)
            if cost_new < cost:
                gain = (cost - cost_new) / max(cost, 1e-12)
                theta, r, cost, lam = new, r_new, cost_new, max(lam / 3, 1e-7)
                break
            lam *= 4
        if gain < 1e-10:
            break
    f = f0.copy()
    f[idx] = np.exp(theta)
    return FitResult(factors={k: float(v) for k, v in zip(STEP_TERMS, f)}, fitted=[STEP_TERMS[i] for i in idx],
                     log_resid_before=before, log_resid_after=resid(theta), iterations=it)

