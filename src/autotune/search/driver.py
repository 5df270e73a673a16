"""The search driver: planners propose, the model screens, a backend runs trials, the study learns.

One loop (ask/tell): keep up to `parallel` trials running; every proposal is screened (legal, supported,
predicted to fit) before dispatch, and a screened-out proposal is recorded as PRUNED with its reason; each
finished trial is told to the Optuna study; measured trials refit the calibration and re-rank the
candidates. Stops on the trial budget, the GPU-hour budget, when no untried candidate can beat the best by
more than the noise (after calibration), or when nothing is left to try. Resumable: a trial that was
running when a driver died is re-queued (or told, if its result reached disk).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..catalog import ClusterSpec, ModelSpec, Workload
from ..cost import evaluate, load_calibration
from ..errors import BadInput
from ..layout import Layout, LayoutTable, violations
from ..space import SearchSpace, explore
from ..trials.backends import Backend, Handle
from ..trials.spec import TrialResult, TrialSpec, read_model, write_json_atomic
from .planners import PlanContext, Planner, PlannerOptions, Proposal, TrialRecord, get_planner
from .residual import ResidualModel
from .study import StudyDir, layout_key, layout_params, set_constraint

__all__ = ["SearchConfig", "SearchDriver", "SearchOutcome"]

GiB = 1024**3
MIN_TRIALS_TO_CONVERGE = 3
MAX_SCREENED_IN_A_ROW = 300  # proposals the model rejects before the planner is called stalled
PRIOR_SIGMA = 0.10  # the model's relative error on a layout unlike any measured one


@dataclass
class SearchConfig:
    trials: int = 10
    budget_gpu_hours: float | None = None
    parallel: int = 1
    planner: str = "model"
    noise: float = 0.02  # trial-to-trial noise: gains below this are not worth a trial
    steps: int | None = None  # training steps per trial (default: the workload's)
    seed: int = 0
    poll_s: float = 0.05
    timeout_s: float = 3600.0
    proxy: bool = False
    sampler: str = "auto"  # optuna planner: tpe, gp, or auto (GP when scipy and torch are installed)


@dataclass
class SearchOutcome:
    study: str
    runs_dir: str
    backend: str
    stop_reason: str
    records: list[TrialRecord]
    best: TrialRecord | None
    gpu_hours: float
    notes: list[str] = field(default_factory=list)


class SearchDriver:
    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, space: SearchSpace,
                 backend: Backend, study_dir: StudyDir, config: SearchConfig,
                 on_event: Callable[[str, dict], None] | None = None):
        self.model, self.cluster, self.workload, self.space = model, cluster, workload, space
        self.backend, self.sd, self.cfg = backend, study_dir, config
        self.emit = on_event or (lambda kind, data: None)
        self.calibration = load_calibration(cluster.gpu.name)
        self.measurements: list = []
        self.records: list[TrialRecord] = []
        self.gpu_hours = 0.0
        self.notes: list[str] = []
        self._screened_in_a_row = 0  # proposals the model rejected since the last dispatch

    # --- setup ---------------------------------------------------------------------------------------
    def _candidates(self) -> None:
        res = explore(self.space, self.model, self.workload, self.cluster, self.calibration)
        self.funnel = res.funnel
        if len(res.kept) == 0:
            why = ", ".join(f"{k} ({v:,})" for k, v in res.last_reasons.items()) or "nothing enumerated"
            raise BadInput(f"no layout of {self.model.name} on {self.cluster.count} x {self.cluster.gpu.name} "
                           f"survives pruning; the last candidates were removed by: {why}. "
                           "Widen the space (--space), change --count, or shorten --seq-len")
        self.table = res.table.take(res.kept)
        self.keys = [layout_key(self.table.row(i)) for i in range(len(self.table))]
        self.index = {k: i for i, k in enumerate(self.keys)}
        self._repredict()

    def _repredict(self) -> None:
        """Predictions for every candidate: the calibrated model, corrected by what the trials taught
        (ResidualModel), with a per-candidate uncertainty."""
        ev = evaluate(self.model, self.workload, self.cluster, self.table, self.calibration)
        self.base_pred = ev.time.tokens_per_s_per_gpu
        self.peak = ev.memory.peak
        if not hasattr(self, "residual"):
            self.residual = ResidualModel(self.table, tau=PRIOR_SIGMA / np.sqrt(12), sigma_n=max(self.cfg.noise, 0.01))
        ok = [(self.index.get(layout_key(r.layout)), r.value) for r in self.records
              if r.source == "measured" and r.status == "ok" and r.value]
        ok = [(i, v) for i, v in ok if i is not None]
        if ok:
            idx = np.array([i for i, _ in ok])
        # how wrong the model was on trials it had not yet seen (prediction at dispatch vs measured): when
        # that is large the feature model is misspecified, so every candidate keeps a wider uncertainty
        errs = [np.log(r.value / r.predicted) for r in self.records
                if r.source == "measured" and r.status == "ok" and r.value and r.predicted]
        misfit = 0.5 * float(np.sqrt(np.mean(np.square(errs[-5:])))) if errs else 0.0
        self.residual.sigma_n = max(self.cfg.noise, misfit, 0.01)
        if ok:
            self.residual.fit(self.table.take(idx), np.log(np.array([v for _, v in ok]) / self.base_pred[idx]))
        corr, std = self.residual.predict()
        self.pred = self.base_pred * corr
        self.pred_std = np.maximum(np.sqrt(std**2 + misfit**2), self.cfg.noise)

    def _study_attrs(self) -> dict:
        return {"model": self.model.name, "gpu": self.cluster.gpu.name, "count": self.cluster.count,
                "gpus_per_node": self.cluster.gpus_per_node, "workload": dataclasses.asdict(self.workload),
                "space": self.space.source, "backend": self.backend.name, "planner": self.cfg.planner}

    def _open(self):
        from .planners.optuna_planner import choices_of

        self.study = self.sd.open()
        have = self.study.user_attrs
        mine = self._study_attrs()
        for key in ("model", "gpu", "count"):
            if key in have and have[key] != mine[key]:
                raise BadInput(f"study {self.sd.name!r} was created for {key} {have[key]!r}, not {mine[key]!r}; "
                               f"use another --study")
        theirs, ours = have.get("workload") or {}, _jsonable(mine["workload"])
        for key in sorted(set(theirs) & set(ours)):  # settings a study predates keep their defaults
            if theirs[key] != ours[key]:
                raise BadInput(f"study {self.sd.name!r} was created for workload {key}={theirs[key]!r}, not "
                               f"{ours[key]!r}; resume with the study's settings or use another --study")
        for k, v in mine.items():
            if k not in have:
                self.study.set_user_attr(k, v)
        ctx = self._context()
        self.choices = choices_of(ctx)
        self.planner: Planner = get_planner(self.cfg.planner, PlannerOptions(
            seed=self.cfg.seed, sampler=self.cfg.sampler, out_dir=self.sd.root / "planner"))

    def _context(self) -> PlanContext:
        tried = {layout_key(r.layout) for r in self.records}
        return PlanContext(self.model, self.cluster, self.workload, self.table, self.pred, self.keys, tried,
                           self.records, sigma=self.pred_std, rng=np.random.default_rng(self.cfg.seed + len(self.records)))

    # --- resume ----------------------------------------------------------------------------------------
    def _resume(self) -> list[Layout]:
        import optuna

        requeue = []
        TS = optuna.trial.TrialState
        for ft in self.study.get_trials(deepcopy=False):
            lay_d = ft.user_attrs.get("layout")
            if not lay_d:
                continue
            lay = Layout.from_dict(lay_d)
            if ft.state == TS.RUNNING:
                res_path = self.sd.trial_dir(ft.number) / "trial_result.json"
                if res_path.exists():
                    self._tell(ft.number, lay, read_model(TrialResult, res_path), ft.user_attrs.get("predicted"))
                else:
                    self._trial(ft.number).set_user_attr("status", "requeued")
                    self.study.tell(ft.number, state=TS.FAIL)
                    requeue.append(lay)
                continue
            status = ft.user_attrs.get("status")
            if status in (None, "requeued"):
                continue
            rec = TrialRecord(ft.number, lay, status, ft.user_attrs.get("source", "measured"),
                              ft.user_attrs.get("measured") or ft.user_attrs.get("value"), ft.user_attrs.get("predicted"))
            self.records.append(rec)
            self.planner.observe(rec)
            if status != "screened":
                self.gpu_hours += float(ft.user_attrs.get("gpu_hours") or 0.0)
                self._learn(lay, ft.user_attrs)
        if self.records or requeue:
            self.notes.append(f"resumed: {self.n_dispatched()} finished trial(s) kept, {len(requeue)} re-queued")
        return requeue

    # --- the loop --------------------------------------------------------------------------------------
    def n_dispatched(self) -> int:
        return sum(1 for r in self.records if r.status != "screened")

    def prepare(self) -> None:
        """Everything that can fail on bad input, before any output: lock, screen the space, open the
        study, pick up a killed run. Idempotent; run() calls it if the caller did not."""
        if getattr(self, "_requeue", None) is not None:
            return
        self._candidates()  # pure computation: fails on bad input before anything is written
        fresh = not self.sd.root.exists()
        self.sd.lock()
        try:
            self._open()
            self._requeue = self._resume()
        except BaseException:
            self.backend.close()
            self.sd.unlock()
            if fresh:  # leave nothing half-written behind a failed start
                import shutil

                shutil.rmtree(self.sd.root, ignore_errors=True)
            raise

    def run(self) -> SearchOutcome:
        self.prepare()
        try:
            stop = self._loop(self._requeue)
            self.study.set_user_attr("stop_reason", stop)
            best = self.best()
            self.emit("done", {"stop_reason": stop})
            return SearchOutcome(self.sd.name, str(self.sd.root.parent), self.backend.name, stop, self.records,
                                 best, self.gpu_hours, self.notes)
        finally:
            self.backend.close()
            self.sd.unlock()

    def _loop(self, requeue: list[Layout]) -> str:
        running: dict[int, tuple[Handle, Layout, float]] = {}
        stop = None
        while True:
            if stop is None:
                stop = self._stop_reason(len(running))
            while stop is None and len(running) < self.cfg.parallel:
                props = [Proposal(l, "re-queued after the driver stopped") for l in requeue[:1]] or \
                    self.planner.propose(self._context(), 1)
                requeue = requeue[1:] if requeue else requeue
                if not props:
                    stop = stop or ("exhausted: every candidate was tried" if not running else None)
                    break
                self._dispatch(props[0], running)
                stop = self._stop_reason(len(running))
                if stop is None and self._screened_in_a_row >= MAX_SCREENED_IN_A_ROW:
                    stop = (f"planner stalled: its last {MAX_SCREENED_IN_A_ROW} proposals were all screened out "
                            "(illegal or predicted OOM); try --planner model")
            if not running:
                return stop or "exhausted: every candidate was tried"
            finished = False
            for number, (h, lay, pred) in list(running.items()):
                res = self.backend.poll(h)
                if res is not None:
                    del running[number]
                    self._tell(number, lay, res, pred)
                    finished = True
            if not finished:
                time.sleep(self.cfg.poll_s)

    def _stop_reason(self, n_running: int) -> str | None:
        done = self.n_dispatched() + n_running
        if done >= self.cfg.trials:
            return f"trial budget reached ({self.cfg.trials} trials)"
        if self.cfg.budget_gpu_hours is not None and self.gpu_hours >= self.cfg.budget_gpu_hours:
            return f"GPU-hour budget reached ({self.gpu_hours:.1f} of {self.cfg.budget_gpu_hours:g})"
        best = self.best()
        if best is not None and best.value and n_running == 0:
            ctx = self._context()
            open_ = ctx.untried()
            if not open_.any():
                return "exhausted: every candidate was tried"
            # a two-sigma optimistic bound, and never before a few trials have tested the model
            upper = float(np.max(np.where(open_, self.pred * (1 + 2 * ctx.uncertainty()), 0.0)))
            if self.n_dispatched() >= MIN_TRIALS_TO_CONVERGE and upper <= best.value * (1 + self.cfg.noise):
                return (f"converged: no untried candidate can beat the best ({best.value:,.1f} tokens/s/GPU) "
                        f"by more than the {self.cfg.noise:.0%} noise (best optimistic prediction {upper:,.1f})")
        return None

    def _screen(self, lay: Layout) -> tuple[int | None, str | None]:
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

    def _dispatch(self, prop: Proposal, running: dict) -> None:
        import optuna

        lay = prop.layout
        idx, reason = self._screen(lay)
        params = layout_params(lay)
        self.study.enqueue_trial(params, skip_if_exists=False)
        from .planners.optuna_planner import distributions

        # every distribution holds the layout's own value, so the enqueued params are the trial's params
        trial = self.study.ask(distributions({k: v if params[k] in v else [*v, params[k]]
                                              for k, v in self.choices.items()}))
        attrs = {"layout": lay.to_dict(), "label": lay.label(self.model.is_moe), "why": prop.why}
        if reason is not None:
            for k, v in {**attrs, "status": "screened", "reason": reason}.items():
                trial.set_user_attr(k, v)
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            self.records.append(TrialRecord(trial.number, lay, "screened", "predicted", None, None))
            self._screened_in_a_row += 1
            self.emit("screened", {"number": trial.number, "layout": attrs["label"], "reason": reason})
            return
        self._screened_in_a_row = 0
        pred = float(self.pred[idx])
        attrs.update(predicted=pred, predicted_peak_bytes=float(self.peak[idx]))
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        steps = self.cfg.steps or self.workload.steps
        spec = TrialSpec(
            study=self.sd.name, number=trial.number, model=self.model.source.removeprefix("catalog:") or self.model.name,
            gpu=self.cluster.gpu.name, count=self.cluster.count, gpus_per_node=self.cluster.gpus_per_node,
            layout=lay.to_dict(), workload=_jsonable(dataclasses.asdict(self.workload)),
            steps=steps, warmup_steps=min(self.workload.window[0], max(1, steps // 3)), seed=self.cfg.seed,
            timeout_s=self.cfg.timeout_s, predicted={"tokens_per_s_per_gpu": pred, "peak_bytes": float(self.peak[idx])},
        )
        if self.cfg.proxy:
            from ..trials.proxy import make_proxy

            _, spec.proxy = make_proxy(self.model, lay, target="gpu" if self.cluster.gpu.is_accelerator else "cpu")
            trial.set_user_attr("proxy", spec.proxy)
        d = self.sd.trial_dir(trial.number)
        write_json_atomic(d / "trial_spec.json", spec)
        handle = self.backend.submit(spec, d)
        running[trial.number] = (handle, lay, pred)
        self.emit("dispatched", {"number": trial.number, "layout": attrs["label"], "predicted": pred, "why": prop.why})

    def _tell(self, number: int, lay: Layout, res: TrialResult, pred: float | None) -> None:
        import optuna

        if res.proxy and res.status == "ok":
            # a proxy trial proves the layout runs; its throughput is the shrunk model's, so the ranking
            # keeps the full model's prediction and the measurement is kept beside it, not calibrated on
            self._trial(number).set_user_attr("proxy_tokens_per_s_per_gpu", res.tokens_per_s_per_gpu)
            res = res.model_copy(update={"tokens_per_s_per_gpu": pred, "source": "predicted",
                                         "reason": f"proxy trial ran ({res.tokens_per_s_per_gpu or 0:,.1f} tokens/s/GPU "
                                                   f"on the proxy); ranked by the full model's prediction"})

        attrs = {"status": res.status, "source": res.source, "reason": (res.reason or "")[:500],
                 "gpu_hours": res.gpu_hours or ((res.wall_s or 0.0) * self.cluster.count / 3600.0),
                 "measured" if res.source == "measured" else "value": res.tokens_per_s_per_gpu,
                 "peak_memory_bytes": res.peak_memory_bytes, "trial_dir": str(self.sd.trial_dir(number))}
        trial = self._trial(number)
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        if res.status == "ok":
            set_constraint(trial, 0.0)
            self.study.tell(number, res.tokens_per_s_per_gpu)
        elif res.status == "oom":
            set_constraint(trial, max(1.0, ((res.peak_memory_bytes or 0) - self.cluster.gpu.memory_bytes) / GiB))
            self.study.tell(number, 0.0)
        else:
            self.study.tell(number, state=optuna.trial.TrialState.FAIL)
        self.gpu_hours += float(attrs["gpu_hours"] or 0.0)
        rec = TrialRecord(number, lay, res.status, res.source, res.tokens_per_s_per_gpu, pred)
        self.records.append(rec)
        self.planner.observe(rec)
        self._learn(lay, {"status": res.status, "source": res.source, "measured": res.tokens_per_s_per_gpu})
        self.emit("finished", {"number": number, "layout": lay.label(self.model.is_moe), "status": res.status,
                               "value": res.tokens_per_s_per_gpu, "predicted": pred, "source": res.source})

    def _trial(self, number: int):
        """A live handle on trial `number` of this study (Optuna has no public lookup by number)."""
        import optuna

        tid = self.study._storage.get_trial_id_from_study_id_trial_number(self.study._study_id, number)
        return optuna.trial.Trial(self.study, tid)

    def _learn(self, lay: Layout, attrs: dict) -> None:
        """Measured trials refit the calibration; the candidates are then re-predicted and re-ranked."""
        if attrs.get("source") != "measured" or attrs.get("status") != "ok" or not attrs.get("measured"):
            return
        from ..cost.calibrate import fit
        from ..cost.measurements import Measurement

        w, c = self.workload, self.cluster
        self.measurements.append(Measurement(
            model=self.model.source.removeprefix("catalog:") or self.model.name, gpu=c.gpu.name, count=c.count,
            layout=lay, tokens_per_s_per_gpu=float(attrs["measured"]), gpus_per_node=c.gpus_per_node,
            seq_len=w.seq_len, global_batch=w.global_batch, load_balancing_loss=w.load_balancing_loss,
            grads_fp32=w.grads_fp32, source=f"trial of study {self.sd.name}"))
        self.calibration = fit(self.measurements, base=load_calibration(c.gpu.name))
        self._repredict()

    def best(self) -> TrialRecord | None:
        ok = [r for r in self.records if r.status == "ok" and r.value]
        return max(ok, key=lambda r: r.value) if ok else None


def _jsonable(d: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
