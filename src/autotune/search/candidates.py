"""The candidates of a search: the layouts that survived the model's screen, their keys, and what the
search currently believes about each (the cost model, corrected by what the trials taught).

`Candidates` owns the table, the layout keys (layout/dimensions.py), the residual model, the per-candidate
prediction, uncertainty and predicted breakdown, and the calibration refitted on the trials. It screens a
proposal (legal, supported, predicted to fit, inside the pruned space) and builds the planners' context.
No Optuna, no backends.

How trials change the ranking is two functions the search and bench/search_efficiency.py both call, so the
benchmark measures the product's learning: `prior_belief` (the calibrated cost model's predictions and the
residual model around them) and `believe` (fit the residual model on the measured candidates, predict).
A trial that runs out of memory teaches the memory side: the memory model under-predicts this cluster by at least
the GPU's capacity over that layout's predicted peak. With the model's error taken as one factor across layouts
(the simplest reading of one OOM), every candidate predicted to need as much memory or more would run out too;
those are set aside (`walled`: planners do not see them as open, the driver screens them with the reason).
The calibration is still refitted on the trials (time-term factors), but for the breakdowns that say why a
layout is slow, not for the ranking: each trial's information enters the ranking once, through one
posterior with its uncertainty. (Measured, 40 seeds per cell: ranking by the refitted calibration and then
the residual model on what it left needed 1.5-10% more trials to the best layout in 6 of 6 benchmark
cells: the refit absorbed part of every residual without saying how uncertain it was, and the width scale
learnt from the rest came out too small.)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..catalog import ClusterSpec, ModelSpec, Workload, load_model
from ..catalog.hardware import GiB, custom_gpu
from ..cost import Calibration, evaluate, load_calibration
from ..errors import BadInput
from ..layout import Layout, LayoutTable, violations
from ..layout.dimensions import layout_key, table_keys
from ..space import SearchSpace, SpaceResult, explore, nothing_survives
from ..trials.prediction import prediction_of
from ..trials.spec import Prediction
from .planners import PlanContext, TrialRecord
from .residual import ResidualModel

__all__ = ["Candidates", "prior_belief", "believe"]


def prior_belief(model: ModelSpec, cluster: ClusterSpec, workload: Workload, table: LayoutTable,
                 cal: Calibration, noise: float) -> tuple[np.ndarray, ResidualModel]:
    """What a search believes before its first trial: the calibrated cost model's tokens/s/GPU per
    candidate, and the residual model around it (calibration-derived widths, learnt scale)."""
    base = evaluate(model, workload, cluster, table, cal).time.tokens_per_s_per_gpu
    residual = ResidualModel(table, sigma_n=max(noise, 0.01), hidden=model.hidden_size,
                             gpus_per_node=cluster.gpus_per_node)
    return base, residual


def believe(base_pred: np.ndarray, measured: list[tuple], residual: ResidualModel,
            noise: float) -> tuple[np.ndarray, np.ndarray]:
    """(prediction, relative uncertainty) per candidate after the trials `measured` ((candidate index,
    tokens/s/GPU) or (candidate index, tokens/s/GPU, its relative standard error or None)): the residual model
    fitted on log(measured / prior prediction); the uncertainty never falls below the trial noise."""
    if measured:
        idx = np.array([m[0] for m in measured])
        value = np.array([m[1] for m in measured], dtype=float)
        se = np.array([m[2] if len(m) > 2 and m[2] is not None else np.nan for m in measured], dtype=float)
        residual.fit_candidates(idx, np.log(value / base_pred[idx]), stderr=se)
    corr, std = residual.predict()
    return base_pred * corr, np.maximum(std, noise)


def _trial_measurement(model: ModelSpec, cluster: ClusterSpec, workload: Workload, lay: Layout, value: float,
                       source: str):
    """A measured trial as a calibration row, priced under the study's own workload: every setting a measurement
    shares with Workload (precision, FP8 options, routing, gradients, framework, ...), not only its rows."""
    from ..cost.measurements import Measurement

    c = cluster
    shared = {f.name for f in dataclasses.fields(Measurement)} & {f.name for f in dataclasses.fields(Workload)}
    return Measurement(model=model.source.removeprefix("catalog:") or model.name, gpu=c.gpu.name,
                       gpu_spec=custom_gpu(c.gpu), count=c.count,
                       layout=lay, tokens_per_s_per_gpu=float(value), gpus_per_node=c.gpus_per_node,
                       source=source, **{k: _frozen(getattr(workload, k)) for k in sorted(shared)})


def _frozen(v):
    """Lists (a workload read back from a trial's JSON) as tuples: a measurement is hashed (the fit's cache)."""
    return tuple(_frozen(x) for x in v) if isinstance(v, (list, tuple)) else v


def study_measurements(study_dir: str | Path) -> tuple[list, list[tuple[dict, str]]]:
    """A study's measured trials as calibration rows (`autotune calibrate --measurements runs/<study>`): each trial's
    own spec (model, GPU, layout, workload) and its measured tokens/s/GPU, through the row a search learns from
    (_trial_measurement). Skipped, each with its reason: simulated trials (predictions), failed or cancelled ones,
    trials of a shrunk proxy model, trials with no result yet."""
    from ..trials.plan import spec_layout, spec_workload
    from ..trials.spec import TrialResult, TrialSpec, read_model

    root = Path(study_dir) / "trials"
    if not root.is_dir():
        raise BadInput(f"--measurements {study_dir}: not a study folder (no trials/ in it); pass runs/<study>, "
                       "a .csv in the published columns or a .json list of measurements")
    rows, skipped = [], []
    numbered = sorted((d for d in root.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name))
    for d in numbered:
        spec_p, res_p = d / "trial_spec.json", d / "trial_result.json"
        if not (spec_p.is_file() and res_p.is_file()):
            skipped.append(({"trial": int(d.name)}, "no result yet"))
            continue
        spec, res = read_model(TrialSpec, spec_p), read_model(TrialResult, res_p)
        why = ("simulated: a prediction, not a measurement" if res.source != "measured"
               else "cancelled" if res.cancelled
               else f"status {res.status}" if not res.ok or not res.tokens_per_s_per_gpu
               else "ran a shrunk proxy model, not the study's" if spec.proxy or res.proxy else None)
        if why is None:
            try:
                model, cluster = load_model(spec.model), spec.cluster()
                rows.append(_trial_measurement(model, cluster, spec_workload(spec), spec_layout(spec),
                                               float(res.tokens_per_s_per_gpu),
                                               f"trial {spec.number} of study {spec.study}"))
                continue
            except BadInput as exc:  # a model config moved away, a GPU file's kind unknown here: said, not fatal
                why = str(exc)
        skipped.append(({"trial": spec.number, "layout": spec.layout.get("label", "")}, why))
    return rows, skipped


class Candidates:
    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, space: SearchSpace,
                 noise: float = 0.02):
        self.model, self.cluster, self.workload, self.space = model, cluster, workload, space
        self.noise = noise
        self.base_calibration = load_calibration(cluster.gpu.name)
        self.measurements: list = []  # every measured trial, as calibration rows
        self._calibration: Calibration | None = None
        res = explore(space, model, workload, cluster, self.base_calibration)
        self.result: SpaceResult = res
        self.funnel = res.funnel
        self.space_notes = list(res.notes)  # what the cluster's software took out of the space, and why
        if len(res.kept) == 0:
            exc = BadInput(nothing_survives(res, workload, f"no layout of {model.name} on {cluster.count} x "
                                                           f"{cluster.gpu.name}"))
            exc.space_result = res  # what removed the last layouts: a caller may retry a default it chose
            raise exc
        self.table: LayoutTable = res.table.take(res.kept)
        self.keys = table_keys(self.table)
        # predicted peak GPU memory per candidate, and the lowest one a trial ran out of memory at (with its trial)
        self.peak = np.asarray(res.evaluation.memory.peak, dtype=float)[res.kept]
        self.capacity = float(res.evaluation.memory.capacity_bytes)
        self.wall: tuple[float, int] | None = None
        self.index = {k: i for i, k in enumerate(self.keys)}
        # prior widths per feature from the calibration's leave-one-model-out residuals (search/priors.py)
        self.base_pred, self.residual = prior_belief(model, cluster, workload, self.table, self.base_calibration,
                                                     noise)
        self._measured: list[tuple] = []  # (candidate, measured tokens/s/GPU, its relative standard error or None)
        self._simulated: list[int] = []  # candidates the simulator ran (simulated())
        self._ev = None
        self.repredict()

    def __len__(self) -> int:
        return len(self.table)

    # --- beliefs -------------------------------------------------------------------------------------
    def repredict(self) -> None:
        """Predictions for every candidate: the cost model corrected by the residual model, with a
        per-candidate uncertainty (believe). With nothing measured, the simulator's trials are believed (simulated())."""
        if self._measured or not self._simulated:
            self.pred, self.pred_std = believe(self.base_pred, self._measured, self.residual, self.noise)
            return
        idx = np.array(self._simulated)
        self.residual.fit_candidates(idx, np.zeros(len(idx)), learn_scale=False)
        corr, std = self.residual.predict()
        self.pred, self.pred_std = self.base_pred * corr, np.maximum(std, self.noise)

    @property
    def calibration(self) -> Calibration:
        """The calibration refitted on every measured trial (for breakdowns; computed when asked)."""
        if self._calibration is None:
            from ..cost.calibrate import fit

            self._calibration = fit(self.measurements, base=self.base_calibration) if self.measurements \
                else self.base_calibration
        return self._calibration

    @property
    def ev(self):
        """The cost model's evaluation of every candidate under that calibration (breakdowns)."""
        if self._ev is None:
            self._ev = evaluate(self.model, self.workload, self.cluster, self.table, self.calibration)
        return self._ev

    def learn(self, lay: Layout, measured: float, study: str = "", stderr: float | None = None) -> None:
        """A measured trial: refit the residual model and re-predict; the calibration and breakdowns are
        refitted when next asked for. `stderr`: the measurement's relative standard error (TrialResult.stderr),
        when its trial knows it: the residual model counts a trial that scattered more than the noise for less."""
        self.measurements.append(_trial_measurement(self.model, self.cluster, self.workload, lay, measured,
                                                    f"trial of study {study}"))
        self._calibration = self._ev = None
        i = self.index.get(layout_key(lay))
        if i is not None:
            self._measured.append((i, float(measured), stderr))
            self.repredict()

    def simulated(self, lay: Layout) -> None:
        """A trial the cost-model simulator ran: its value is the model's own prediction, so nothing is learnt from
        it (no calibration row, the width scale stays the hyperprior's), but it is believed, as the batch rule
        believes a running trial: the residual model is conditioned on it at the trial noise, so the candidates
        that share its feature values lose the uncertainty a trial of it would have resolved. The planner's next
        pick, the uncertainty shown and the stop rule then read one belief, and a simulated search converges
        when a measured one with the same results would (ignored once a trial was measured)."""
        i = self.index.get(layout_key(lay))
        if i is not None and not self._measured and i not in self._simulated:
            self._simulated.append(i)
            self.repredict()

    def learn_oom(self, lay: Layout, number: int) -> str | None:
        """Trial `number` ran `lay` out of memory: lower the memory wall to its predicted peak when that is below
        the wall so far, and say what that sets aside (None when the wall did not move)."""
        i = self.index.get(layout_key(lay))
        peak = float(self.peak[i]) if i is not None else float(
            evaluate(self.model, self.workload, self.cluster, LayoutTable.from_layouts([lay]),
                     self.calibration).memory.peak[0])
        if self.wall is not None and peak >= self.wall[0]:
            return None
        self.wall = (peak, number)
        n = int((self.peak >= peak).sum())
        return (f"trial {number} ran out of memory at a predicted peak of {peak / GiB:.1f} GiB "
                f"({peak / self.capacity:.0%} of {self.capacity / GiB:.1f}): the memory model under-predicts this "
                f"cluster, so the {n} candidate(s) predicted to need as much or more are set aside")

    def walled(self) -> set[str]:
        """Keys of the candidates predicted to need at least the memory of a trial that ran out."""
        if self.wall is None:
            return set()
        return {self.keys[j] for j in np.flatnonzero(self.peak >= self.wall[0])}

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
            i = self.index[key]
            if self.wall is not None and self.peak[i] >= self.wall[0]:
                return None, (f"needs as much memory as trial {self.wall[1]}, which ran out: predicted peak "
                              f"{self.peak[i] / GiB:.1f} GiB >= {self.wall[0] / GiB:.1f}")
            return i, None
        bad = violations(self.model, self.workload, lay)
        if bad:
            return None, "illegal: " + "; ".join(v.message for v in bad)
        ev = evaluate(self.model, self.workload, self.cluster, LayoutTable.from_layouts([lay]), self.calibration)
        oom = ev.memory.oom_reason(0)
        if oom:
            return None, oom
        return None, "outside the pruned space (unsupported, impractical or cannot win)"

    # --- the planners' view --------------------------------------------------------------------------
    def context(self, records: list[TrialRecord], seed: int, trial_steps: int | None = None,
                pending: set[str] | None = None) -> PlanContext:
        """The planners' view; `pending`: keys of the trials running now (--parallel)."""
        tried = {layout_key(r.layout) for r in records}
        pending = set(pending or ())
        # the generator moves with every trial started, finished or running, so a planner that draws at random
        # does not draw the same layout again for the next free slot
        rng = np.random.default_rng([seed, len(records), len(pending)])
        return PlanContext(self.model, self.cluster, self.workload, self.table, self.pred, self.keys, tried,
                           records, sigma=self.pred_std, rng=rng, breakdown=self.prediction,
                           funnel=list(self.funnel), residual=self.residual, noise=self.noise,
                           trial_steps=trial_steps, walled=self.walled(), pending=pending)
