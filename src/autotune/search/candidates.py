"""The candidates of a search: the layouts that survived the model's screen, their keys, and what the
search currently believes about each (the calibrated cost model, corrected by what the trials taught).

`Candidates` owns the table, the layout keys (layout/dimensions.py), the calibration with the
measurements it was refitted on, the residual model and the per-candidate prediction, uncertainty and
predicted breakdown. It screens a proposal (legal, supported, predicted to fit, inside the pruned space)
and builds the planners' context. No Optuna, no backends.

`believe` is how trials change the belief (refit the calibration, then the residual model, then predict);
the search and bench/search_efficiency.py both call it, so the benchmark measures the product's learning.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..catalog import ClusterSpec, ModelSpec, Workload
from ..cost import Calibration, Evaluation, evaluate, load_calibration
from ..errors import BadInput
from ..layout import Layout, LayoutTable, violations
from ..layout.dimensions import layout_key, table_keys
from ..space import SearchSpace, SpaceResult, explore
from ..trials.prediction import prediction_of
from ..trials.spec import Prediction
from .planners import PlanContext, TrialRecord
from .residual import ResidualModel

__all__ = ["Candidates", "Belief", "believe", "trial_measurement"]


@dataclass
class Belief:
    calibration: Calibration
    ev: Evaluation  # the calibrated cost model's evaluation of every candidate
    base_pred: np.ndarray  # its tokens/s/GPU
    pred: np.ndarray  # corrected by the residual model
    std: np.ndarray  # relative uncertainty of `pred` (never below the trial noise)


def believe(model: ModelSpec, cluster: ClusterSpec, workload: Workload, table: LayoutTable, base: Calibration,
            measurements: list, measured: list[tuple[int, float]], residual: ResidualModel, noise: float) -> Belief:
    """What the search believes after its trials: the calibration refitted on every measurement (time-term
    factors, physics), then the residual model fitted on log(measured / calibrated prediction) of the
    measured candidates (`measured`: (candidate index, tokens/s/GPU)), which learns what the terms cannot
    express and how wide its own prior should be (residual.py)."""
    from ..cost.calibrate import fit

    cal = fit(measurements, base=base) if measurements else base
    ev = evaluate(model, workload, cluster, table, cal)
    base_pred = ev.time.tokens_per_s_per_gpu
    if measured:
        idx = np.array([i for i, _ in measured])
        residual.fit(table.take(idx), np.log(np.array([v for _, v in measured]) / base_pred[idx]))
    corr, std = residual.predict()
    return Belief(cal, ev, base_pred, base_pred * corr, np.maximum(std, noise))


def trial_measurement(model: ModelSpec, cluster: ClusterSpec, workload: Workload, lay: Layout, value: float,
                      source: str):
    """A measured trial as a calibration row."""
    from ..cost.measurements import Measurement

    w, c = workload, cluster
    return Measurement(model=model.source.removeprefix("catalog:") or model.name, gpu=c.gpu.name, count=c.count,
                       layout=lay, tokens_per_s_per_gpu=float(value), gpus_per_node=c.gpus_per_node,
                       seq_len=w.seq_len, global_batch=w.global_batch, load_balancing_loss=w.load_balancing_loss,
                       grads_fp32=w.grads_fp32, source=source)


class Candidates:
    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, space: SearchSpace,
                 noise: float = 0.02):
        self.model, self.cluster, self.workload, self.space = model, cluster, workload, space
        self.noise = noise
        self.base_calibration = self.calibration = load_calibration(cluster.gpu.name)
        self.measurements: list = []
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
        self.residual = ResidualModel(self.table, sigma_n=max(noise, 0.01), hidden=model.hidden_size,
                                      gpus_per_node=cluster.gpus_per_node)
        self._measured: list[tuple[int, float]] = []  # (candidate, measured tokens/s/GPU)
        self.repredict()

    def __len__(self) -> int:
        return len(self.table)

    # --- beliefs -------------------------------------------------------------------------------------
    def repredict(self) -> None:
        """Predictions for every candidate: the calibrated model, corrected by the residual model, with a
        per-candidate uncertainty (believe)."""
        b = believe(self.model, self.cluster, self.workload, self.table, self.base_calibration, self.measurements,
                    self._measured, self.residual, self.noise)
        self.calibration, self.ev, self.base_pred, self.pred, self.pred_std = b.calibration, b.ev, b.base_pred, b.pred, b.std
        self.peak = self.ev.memory.peak

    def learn(self, lay: Layout, measured: float, study: str) -> None:
        """A measured trial: refit the calibration on every measurement so far, then re-predict."""
        self.measurements.append(trial_measurement(self.model, self.cluster, self.workload, lay, measured,
                                                   f"trial of study {study}"))
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
