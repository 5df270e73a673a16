"""The candidates of a search: the layouts that survived the model's screen, their keys, and what the
search currently believes about each (the calibrated cost model, corrected by what the trials taught).

`Candidates` owns the table, the layout keys (layout/dimensions.py), the calibration with the
measurements it was refitted on, the residual model and the per-candidate prediction, uncertainty and
predicted breakdown. It screens a proposal (legal, supported, predicted to fit, inside the pruned space)
and builds the planners' context. No Optuna, no backends.
"""

from __future__ import annotations

import numpy as np

from ..catalog import ClusterSpec, ModelSpec, Workload
from ..cost import evaluate, load_calibration
from ..errors import BadInput
from ..layout import Layout, LayoutTable, violations
from ..layout.dimensions import layout_key, table_keys
from ..space import SearchSpace, SpaceResult, explore
from ..trials.prediction import prediction_of
from ..trials.spec import Prediction
from .planners import PlanContext, TrialRecord
from .residual import ResidualModel

__all__ = ["Candidates"]


class Candidates:
    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, space: SearchSpace,
                 noise: float = 0.02):
        self.model, self.cluster, self.workload, self.space = model, cluster, workload, space
        self.noise = noise
        self.calibration = load_calibration(cluster.gpu.name)
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
        per-candidate uncertainty."""
        self.ev = evaluate(self.model, self.workload, self.cluster, self.table, self.calibration)
        self.base_pred = self.ev.time.tokens_per_s_per_gpu
        self.peak = self.ev.memory.peak
        if self._measured:
            idx = np.array([i for i, _ in self._measured])
            vals = np.array([v for _, v in self._measured])
            self.residual.fit(self.table.take(idx), np.log(vals / self.base_pred[idx]))
        corr, std = self.residual.predict()
        self.pred = self.base_pred * corr
        self.pred_std = np.maximum(std, self.noise)

    def learn(self, lay: Layout, measured: float, study: str) -> None:
        """A measured trial: refit the calibration on every measurement so far, then re-predict."""
        from ..cost.calibrate import fit
        from ..cost.measurements import Measurement

        w, c = self.workload, self.cluster
        self.measurements.append(Measurement(
            model=self.model.source.removeprefix("catalog:") or self.model.name, gpu=c.gpu.name, count=c.count,
            layout=lay, tokens_per_s_per_gpu=float(measured), gpus_per_node=c.gpus_per_node,
            seq_len=w.seq_len, global_batch=w.global_batch, load_balancing_loss=w.load_balancing_loss,
            grads_fp32=w.grads_fp32, source=f"trial of study {study}"))
        i = self.index.get(layout_key(lay))
        if i is not None:
            self._measured.append((i, float(measured)))
        self.calibration = fit(self.measurements, base=load_calibration(c.gpu.name))
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
