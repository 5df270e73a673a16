"""Where the next trial is worth its GPU-hours, and when no trial is: pure functions over arrays.

A candidate's throughput is lognormal around its prediction: log y ~ N(log pred, std^2), std the
residual model's relative uncertainty (search/residual.py). Against the incumbent (the best measured
value) each candidate has

- a probability of improvement, P(y > best x (1 + noise)): beating it by more than trial noise;
- an expected improvement, E[max(0, log y - log best)] (a relative gain; EI of a normal in log space);
- a cost, the GPU-hours its trial takes: (start-up + steps x predicted step time) x GPUs.

The planner ranks by expected improvement per GPU-hour; a batch (k > 1, `--parallel`) is chosen one at a
time, each pick "believed" (its prediction taken as if measured: the incumbent becomes at least its
prediction and the candidates it is correlated with lose the uncertainty it would resolve), so parallel
trials test different hypotheses; trials still running when a slot frees are believed first, as if they were
the batch's earlier picks. The search stops when the chance that any untried candidate beats the
best by more than the noise falls under STOP_CHANCE. That chance is computed on the joint posterior when
the caller has one (candidates that share feature values rise and fall together: 1,500 candidates with a
0.5% chance each are not a 99.9% chance that one of them wins), else with candidates taken as independent
(an upper bound: the rule then stops later, never earlier).

Alternatives measured on the benchmark's realities (bench/search_efficiency.py), none consistently
better: the probability of being the best on the joint posterior (512 draws) changed the product's mean
trials to the best layout by -7% to +10% over 9 cells (30-40 seeds each); with each reality's own prior
(20 seeds) it, Thompson sampling and the knowledge gradient on the correlated posterior did no better
than expected improvement, and an entropy search on the argmax did worse (median 12.5 vs 7 trials on
Llama-3.1-70B f20+int). Dividing by GPU-hours left the trials unchanged (6 cells, within noise) and
lowered the GPU-hours per success, so it stays.
"""

from __future__ import annotations

import math

import numpy as np

from ..trials.spec import TRIAL_STARTUP_S  # a trial's start-up seconds, from the seed page

__all__ = ["prob_improvement", "expected_improvement", "trial_gpu_hours", "ei_per_gpu_hour", "select_batch",
           "believed_std", "chance_any_beats", "stop_reason", "STOP_CHANCE", "MIN_TRIALS", "TRIAL_STARTUP_S"]

STOP_CHANCE = 0.05  # stop when the chance that any untried candidate beats the best is below this
STOP_SAMPLES = 4000  # joint posterior draws for that chance: its Monte Carlo error is ~0.3% at 5%
_CHUNK = 500  # drawn in chunks; a chance clearly above STOP_CHANCE (3 standard errors) ends the count early
MIN_TRIALS = 3  # never stop before a few trials have tested the model

_SQRT2 = math.sqrt(2.0)


def _phi(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


_erf = np.frompyfunc(math.erf, 1, 1)


def _Phi(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + _erf(np.asarray(z, dtype=float) / _SQRT2).astype(float))


def prob_improvement(pred, std, best: float, noise: float = 0.0) -> np.ndarray:
    """P(candidate > best x (1 + noise)) per candidate."""
    s = np.maximum(np.asarray(std, dtype=float), 1e-9)
    return _Phi((np.log(np.asarray(pred, dtype=float)) - math.log(best * (1 + noise))) / s)


def expected_improvement(pred, std, best: float) -> np.ndarray:
    """E[max(0, log(candidate / best))]: the expected relative gain over the incumbent."""
    s = np.maximum(np.asarray(std, dtype=float), 1e-9)
    d = np.log(np.asarray(pred, dtype=float)) - math.log(best)
    z = d / s
    return np.maximum(s * _phi(z) + d * _Phi(z), 0.0)


def trial_gpu_hours(pred_tokens_per_s_per_gpu, tokens_per_step: float, gpus: int, steps: int,
                    startup_s: float = TRIAL_STARTUP_S) -> np.ndarray:
    """GPU-hours one trial of each candidate costs at its predicted speed."""
    step_s = tokens_per_step / (np.asarray(pred_tokens_per_s_per_gpu, dtype=float) * gpus)
    return (startup_s + steps * step_s) * gpus / 3600.0


def ei_per_gpu_hour(pred, std, best: float | None, cost) -> np.ndarray:
    """The acquisition: expected relative gain per GPU-hour. With no incumbent yet, the gain is over the
    best prediction (so the first trial goes where the model, with its uncertainty, expects the most)."""
    ref = float(np.max(pred)) if best is None else best
    return expected_improvement(pred, std, ref) / np.asarray(cost, dtype=float)


def believed_std(std, correlation, indices) -> np.ndarray:
    """Each candidate's uncertainty once the candidates `indices` are believed (their predictions taken as measured):
    std x sqrt(1 - corr^2) for each, corr a candidate's posterior correlation with the believed one."""
    std = np.array(std, dtype=float)
    for i in indices:
        std = std * np.sqrt(1.0 - np.clip(np.asarray(correlation(i), dtype=float), 0.0, 1.0) ** 2)
    return std


def select_batch(pred, std, best: float | None, cost, open_mask, k: int, correlation=None,
                 pending=()) -> list[int]:
    """k candidate indices by EI per GPU-hour with the believer rule (module docstring).
    `correlation(i)` returns every candidate's posterior correlation with candidate i (None: independent);
    `pending`: candidates whose trials are running, believed first as if they were this batch's earlier picks."""
    pred = np.asarray(pred, dtype=float)
    std = np.array(std, dtype=float)
    open_ = np.array(open_mask, dtype=bool)

    def believe(i: int) -> None:  # take candidate i's prediction as measured
        nonlocal best, std
        open_[i] = False
        best = float(pred[i]) if best is None else max(best, float(pred[i]))
        if correlation is not None:
            std = believed_std(std, correlation, [i])

    for i in pending:
        believe(i)
    out: list[int] = []
    while len(out) < k and open_.any():
        i = int(np.argmax(np.where(open_, ei_per_gpu_hour(pred, std, best, cost), -np.inf)))
        out.append(i)
        if len(out) < k:
            believe(i)
    return out


def chance_any_beats(pred, std, open_mask, best: float, noise: float, residual=None) -> float:
    """P(at least one untried candidate beats best x (1 + noise)): on the joint posterior when `residual`
    can draw from it (residual.py: deviations of every candidate's log throughput), else taking candidates
    as independent (an upper bound when they are positively correlated)."""
    open_ = np.asarray(open_mask, dtype=bool)
    if not open_.any():
        return 0.0
    bar = math.log(best * (1 + noise))
    if residual is not None and hasattr(residual, "deviations"):
        room = bar - np.log(np.asarray(pred, dtype=float)[open_])[:, None]
        hits = 0
        for n in range(1, STOP_SAMPLES // _CHUNK + 1):
            hits += int(np.sum(np.any(residual.deviations(_CHUNK, open_, seed=n) > room, axis=0)))
            p = hits / (n * _CHUNK)
            if p - 3 * math.sqrt(p * (1 - p) / (n * _CHUNK)) > STOP_CHANCE:
                break
        return p
    p = prob_improvement(np.asarray(pred)[open_], np.asarray(std)[open_], best, noise)
    return float(1.0 - np.exp(np.sum(np.log1p(-np.clip(p, 0.0, 1.0 - 1e-12)))))


def stop_reason(pred, std, untried_mask, best_value: float | None, noise: float, n_done: int,
                min_trials: int = MIN_TRIALS, chance: float = STOP_CHANCE, residual=None,
                known: float | None = None) -> str | None:
    """Why the search should stop now, or None. Pure: the driver passes the current predictions (and the
    residual model, for the joint chance; `known`: that chance when already computed for this belief)."""
    open_ = np.asarray(untried_mask, dtype=bool)
    if not open_.any():
        return "exhausted: every candidate was tried"
    if best_value is None or n_done < min_trials:
        return None
    p = known if known is not None else chance_any_beats(pred, std, open_, best_value, noise, residual)
    if p < chance:
        return (f"converged: the chance that any of the {int(open_.sum()):,} untried candidates beats the best "
                f"({best_value:,.1f} tokens/s/GPU) by more than the {noise:.0%} noise is {p:.1%}")
    return None
