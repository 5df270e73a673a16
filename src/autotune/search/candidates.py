"""The candidates of a search: the layouts that survived the model's screen, their keys, and what the
search currently believes about each (the cost model, corrected by what the trials taught).

`Candidates` owns the table, the layout keys (layout/dimensions.py), the residual model and the
per-candidate prediction, uncertainty and predicted breakdown. It screens a proposal (legal, supported,
predicted to fit, inside the pruned space) and builds the planners' context. No Optuna, no backends.

How trials change the belief is two functions the search and bench/search_efficiency.py both call, so the
benchmark measures the product's learning: `prior_belief` (the shipped calibration's predictions and a
residual model whose columns are the layout features and the calibration's time-term factors) and
`believe` (fit it on the measured candidates, predict). Recalibration happens inside that one posterior:
the time-term factors are columns with calibrate.fit's own prior, so a trial's information is used once.
(Measured, 40 seeds per cell: refitting the calibration separately first, then the residual model on
what it left, needed 1.5-10% more trials to the best layout in 6 of 6 benchmark cells than this: the
separate fit absorbed part of every residual without saying how uncertain it was, and the width scale
learnt from the rest came out too small.)
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import numpy as np

from ..catalog import ClusterSpec, ModelSpec, Workload
from ..cost import Calibration, evaluate, load_calibration
from ..cost.calibrate import fit as _calibrate_fit
from ..cost.time import STEP_TERMS, factor_vector, raw_time, step_times
from ..errors import BadInput
from ..layout import Layout, LayoutTable, violations
from ..layout.dimensions import layout_key, table_keys
from ..space import SearchSpace, SpaceResult, explore
from ..trials.prediction import prediction_of
from ..trials.spec import Prediction
from .planners import PlanContext, TrialRecord
from .residual import ResidualModel

__all__ = ["Candidates", "prior_belief", "believe", "posterior_calibration", "term_jacobian"]

# calibrate.fit's beliefs about the time-term factors: its prior (log units) and the share of a step time
# below which a term is not fitted (no row says anything about it)
_FIT = inspect.signature(_calibrate_fit).parameters
TERM_SD = float(_FIT["prior_sigma"].default)
MIN_SHARE = float(_FIT["min_share"].default)


def term_jacobian(model: ModelSpec, cluster: ClusterSpec, workload: Workload, table: LayoutTable,
                  cal: Calibration) -> tuple[np.ndarray, list[str]]:
    """d log(tokens/s) / d log(term factor) per candidate, for the terms that move some candidate's step
    time by at least MIN_SHARE (finite differences of the model's own step time: one batched call)."""
    raw = raw_time(model, workload, cluster, table, cal.time, cal.memory)
    f0 = factor_vector(cal.time.scale)
    eps = 1e-4
    log_t = np.log(step_times(raw, np.vstack([f0, f0 * np.exp(eps * np.eye(len(f0)))])))
    J = -(log_t[1:] - log_t[0]).T / eps
    keep = np.abs(J).max(axis=0) >= MIN_SHARE
    return J[:, keep], [t for t, k in zip(STEP_TERMS, keep) if k]


def prior_belief(model: ModelSpec, cluster: ClusterSpec, workload: Workload, table: LayoutTable,
                 cal: Calibration, noise: float) -> tuple[np.ndarray, ResidualModel]:
    """What a search believes before its first trial: the calibrated cost model's tokens/s/GPU per
    candidate, and the residual model around it (layout features with the calibration-derived widths,
    time-term factors with calibrate.fit's prior)."""
    base = evaluate(model, workload, cluster, table, cal).time.tokens_per_s_per_gpu
    J, names = term_jacobian(model, cluster, workload, table, cal)
    residual = ResidualModel(table, sigma_n=max(noise, 0.01), hidden=model.hidden_size,
                             gpus_per_node=cluster.gpus_per_node, terms=J, term_names=names, term_sd=TERM_SD)
    return base, residual


def believe(base_pred: np.ndarray, measured: list[tuple[int, float]], residual: ResidualModel,
            noise: float) -> tuple[np.ndarray, np.ndarray]:
    """(prediction, relative uncertainty) per candidate after the trials `measured` ((candidate index,
    tokens/s/GPU)): the residual model fitted on log(measured / prior prediction); the uncertainty never
    falls below the trial noise."""
    if measured:
        idx = np.array([i for i, _ in measured])
        residual.fit_candidates(idx, np.log(np.array([v for _, v in measured]) / base_pred[idx]))
    corr, std = residual.predict()
    return base_pred * corr, np.maximum(std, noise)


def posterior_calibration(base: Calibration, residual: ResidualModel, n: int) -> Calibration:
    """The calibration the trials imply: the base's time-term factors times the posterior's."""
    if n == 0:
        return base
    f = residual.term_factors()
    scale = {t: float(base.time.scale.get(t, 1.0)) * f.get(t, 1.0) for t in STEP_TERMS}
    return replace(base, time=replace(base.time, scale=scale),
                   provenance=f"{base.provenance}; refitted inside the search's posterior on {n} trial(s)")


class Candidates:
    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, space: SearchSpace,
                 noise: float = 0.02):
        self.model, self.cluster, self.workload, self.space = model, cluster, workload, space
        self.noise = noise
        self.base_calibration = self.calibration = load_calibration(cluster.gpu.name)
        res = explore(space, model, workload, cluster, self.calibration)
        self.result: SpaceResult = res
        self.funnel = res.funnel
        if len(res.kept) == 0:
            why = ", ".join(f"{k} ({v:,})" for k, v in res.last_reasons.items()) or "nothing enumerated"
            raise BadInput(f"no layout of {model.name} on {cluster.count} x {cluster.gpu.name} "
                           f"survives pruning; the last candidates were removed by: {why}. "
                           "Widen the space (--space), change --count, or shorten --seq-len")
        self.table: LayoutTable = res.table.take(res.kept)
        self.keys = table_keys(self.table)
        self.index = {k: i for i, k in enumerate(self.keys)}
        # prior widths per feature from the calibration's leave-one-model-out residuals (search/priors.py)
        self.base_pred, self.residual = prior_belief(model, cluster, workload, self.table, self.calibration, noise)
        self._measured: list[tuple[int, float]] = []  # (candidate, measured tokens/s/GPU)
        self._ev = None
        self.repredict()

    def __len__(self) -> int:
        return len(self.table)

    # --- beliefs -------------------------------------------------------------------------------------
    def repredict(self) -> None:
        """Predictions for every candidate: the cost model corrected by the residual model, with a
        per-candidate uncertainty (believe); the calibration the trials imply, for breakdowns."""
        self.pred, self.pred_std = believe(self.base_pred, self._measured, self.residual, self.noise)
        self.calibration = posterior_calibration(self.base_calibration, self.residual, len(self._measured))
        self._ev = None

    @property
    def ev(self):
        """The cost model's evaluation of every candidate under the current calibration (breakdowns)."""
        if self._ev is None:
            self._ev = evaluate(self.model, self.workload, self.cluster, self.table, self.calibration)
        return self._ev

    def learn(self, lay: Layout, measured: float) -> None:
        """A measured trial of a candidate: refit the posterior, then re-predict. (A layout outside the
        candidates teaches nothing here: its features are only known for candidates.)"""
        i = self.index.get(layout_key(lay))
        if i is not None:
            self._measured.append((i, float(measured)))
            self.repredict()

    def prediction(self, i: int) -> Prediction:
        """Candidate i's prediction, with breakdowns, at the search's current belief."""
        return prediction_of(self.ev, i, self.model, self.cluster, tokens_per_s_per_gpu=float(self.pred[i]),
                             uncertainty=float(self.pred_std[i]))

    def prediction_of_layout(self, lay: Layout) -> Prediction:
        """A layout outside the candidates (re-queued, or screened): the calibrated model's prediction."""
        ev = evaluate(self.model, self.workload, self.cluster, LayoutTable.from_layouts([lay]), self.calibration)
        return prediction_of(ev, 0, self.model, self.cluster)

    # --- screening -----------------------------------------------------------------------------------
    def screen(self, lay: Layout) -> tuple[int | None, str | None]:
        """(candidate index, None) for a candidate, else (None, why it is not one)."""
        key = layout_key(lay)
        if key in self.index:
            return self.index[key], None
        bad = violations(self.model, self.workload, lay)
        if bad:
            return None, "illegal: " + "; ".join(v.message for v in bad)
        ev = evaluate(self.model, self.workload, self.cluster, LayoutTable.from_layouts([lay]), self.calibration)
        oom = ev.memory.oom_reason(0)
        if oom:
            return None, oom
        return None, "outside the pruned space (unsupported, impractical or cannot win)"

    # --- the planners' view --------------------------------------------------------------------------
    def context(self, records: list[TrialRecord], seed: int, trial_steps: int | None = None) -> PlanContext:
        tried = {layout_key(r.layout) for r in records}
        return PlanContext(self.model, self.cluster, self.workload, self.table, self.pred, self.keys, tried,
                           records, sigma=self.pred_std, rng=np.random.default_rng(seed + len(records)),
                           breakdown=self.prediction, funnel=list(self.funnel), residual=self.residual,
                           noise=self.noise, trial_steps=trial_steps)
