"""The search loop: planners propose, the candidates screen, a backend runs trials, the study learns.

Keeps up to `parallel` trials running. Every proposal is screened (legal, supported, predicted to fit)
before dispatch; a screened-out proposal is a PRUNED trial with its reason; a proposal naming a layout
already tried is answered from the study, never dispatched. Each finished trial is told to the study;
measured trials refit the calibration and re-rank the candidates (candidates.py). Stops on the trial
budget, the GPU-hour budget, when no untried candidate can beat the best by more than the noise, or when
nothing is left. Resumable: `prepare()` repairs whatever a killed driver left (study.py).

Only the driver asks and tells the study and talks to the backend; planners only propose.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

from ..catalog import ClusterSpec, ModelSpec, Workload
from ..catalog.hardware import custom_gpu
from ..errors import BadInput
from ..killpoints import kill_point
from ..launch import run_env
from ..layout import Layout
from ..layout.describe import settings_label
from ..layout.dimensions import layout_key
from ..space import SearchSpace
from ..trials.backends import Backend, Handle
from ..trials.spec import EarlyStop, TrialResult, TrialSpec, read_model, write_json_atomic
from ..words import count, hours
from .acquisition import chance_any_beats, stop_reason, trial_gpu_hours
from .candidates import Candidates
from .planners import Planner, PlannerOptions, Proposal, TrialRecord, get_planner
from .planners.optuna_planner import choices_of
from .study import StudyDir, TrialAttrs

__all__ = ["SearchConfig", "SearchDriver", "LoopResult"]

GiB = 1024**3
MIN_TRIALS_TO_CONVERGE = 3
MAX_SCREENED_IN_A_ROW = 300  # proposals the model rejects (or repeats) before the planner is called stalled


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
    llm_base_url: str | None = None
    llm_model: str | None = None
    llm_timeout_s: float = 60.0


@dataclass
class LoopResult:
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
                 on_event: Callable[[str, dict], None] | None = None, hold_lock: bool = False):
        self.model, self.cluster, self.workload, self.space = model, cluster, workload, space
        self.backend, self.sd, self.cfg = backend, study_dir, config
        self.emit = on_event or (lambda kind, data: None)
        self.hold_lock = hold_lock  # the session keeps the study locked until its outputs are published
        self.records: list[TrialRecord] = []
        self.gpu_hours = 0.0
        self.notes: list[str] = []
        self.candidates: Candidates | None = None
        self.study = None
        self.planner: Planner | None = None
        self.requeue: list[Layout] | None = None  # set by prepare()
        self._screened_in_a_row = 0  # proposals rejected or repeated since the last dispatch
        self._chance: tuple | None = None  # (belief key, the stop rule's chance at it): chance()
        self._why: dict[int, str] = {}  # running trial -> the planner's rationale
        self._cost: dict[int, float] = {}  # running trial -> its predicted GPU-hours (with --budget-gpu-hours)

    # --- setup ---------------------------------------------------------------------------------------
    def _study_attrs(self) -> dict:
        return {"model": self.model.name, "gpu": self.cluster.gpu.name, "count": self.cluster.count,
                "gpus_per_node": self.cluster.gpus_per_node, "workload": _jsonable(dataclasses.asdict(self.workload)),
                "space": self.space.source, "backend": self.backend.name, "planner": self.cfg.planner}

    def _check_study(self) -> None:
        have, mine = self.study.user_attrs, self._study_attrs()
        for key in ("model", "gpu", "count"):
            if key in have and have[key] != mine[key]:
                raise BadInput(f"study {self.sd.name!r} was created for {key} {have[key]!r}, not {mine[key]!r}; "
                               f"use another --study")
        theirs, ours = have.get("workload") or {}, mine["workload"]
        # settings a study predates keep their defaults; every setting that differs is named at once
        diff = [k for k in sorted(set(theirs) & set(ours)) if theirs[k] != ours[k]]
        if diff:
            raise BadInput(f"study {self.sd.name!r} was created for workload "
                           + ", ".join(f"{k}={theirs[k]!r}" for k in diff) + ", not "
                           + ", ".join(f"{k}={ours[k]!r}" for k in diff)
                           + "; resume with the study's settings or use another --study")
        for k, v in mine.items():
            if k not in have:
                self.study.set_attr(k, v)
        stored_all = self.study.stored_choices()
        if stored_all and "layer_split" not in stored_all and any(v != "even" for v in self.choices.get("layer_split", [])):
            # a study from before uneven splits were searched tried even splits only: it resumes over those
            self.space = self.space.model_copy(deep=True)
            self.space.dimensions.layer_split = ["even"]
            self.candidates = Candidates(self.model, self.cluster, self.workload, self.space, self.cfg.noise)
            self.choices = choices_of(self.candidates.context([], 0))
            self.notes.append(f"study {self.sd.name!r} predates the search over uneven layer splits: it resumes over "
                              "even splits only (a new --study searches them)")
        # Optuna keeps a parameter's choices as its first trial set them: a resumed study searches within those
        for k, stored in stored_all.items():
            new = [v for v in self.choices.get(k, []) if v not in stored]
            if new:
                raise BadInput(f"study {self.sd.name!r} searched {k} over {list(stored)}; this space adds {new}: "
                               f"resume with a --space that keeps {k} to those values, or use another --study")
            if k in self.choices:
                self.choices[k] = list(stored)

    def prepare(self) -> None:
        """Everything that can fail on bad input, before any output: lock the study (a study another driver holds, or
        a link planted in its folder, is refused at once, not after the screen), screen the space, open the study,
        repair what a killed run left; on any failure the lock is released and a folder this call created removed.
        Idempotent; run() calls it if the caller did not."""
        if self.requeue is not None:
            return
        self.sd.lock()
        try:
            self.candidates = Candidates(self.model, self.cluster, self.workload, self.space, self.cfg.noise)
            self.choices = choices_of(self.candidates.context([], 0))
            self.planner = get_planner(self.cfg.planner, PlannerOptions(
                seed=self.cfg.seed, sampler=self.cfg.sampler, out_dir=self.sd.root / "planner",
                llm_base_url=self.cfg.llm_base_url, llm_model=self.cfg.llm_model,
                llm_timeout_s=self.cfg.llm_timeout_s))
            self.study = self.sd.open()
            self._check_study()
            self.requeue = self._resume()
        except BaseException:
            self.backend.close()
            self.sd.unlock()
            self.sd.remove_if_created()  # leave nothing half-written behind a failed start
            raise

    def result_on_disk(self, number: int) -> TrialResult | None:
        """Trial `number`'s result as its backend wrote it, or None."""
        p = self.sd.trial_dir(number) / "trial_result.json"
        return read_model(TrialResult, p) if p.exists() else None

    def _resume(self) -> list[Layout]:
        repair, on_disk = self.study.repair(self.result_on_disk)
        for number, a in self.study.finished():
            lay = Layout.from_dict(a.layout)
            rec = TrialRecord(number, lay, a.status, a.source or "measured", a.tokens_per_s_per_gpu, a.predicted, a.why,
                              a.stderr)
            self.records.append(rec)
            self.planner.observe(rec)
            if a.status != "screened":
                self.gpu_hours += float(a.gpu_hours or 0.0)
                self._learn(rec)
        for number, a in on_disk:
            self._why[number] = a.why
            self._tell(number, Layout.from_dict(a.layout), self.result_on_disk(number), a.predicted)
        done = {layout_key(r.layout) for r in self.records}
        requeue = [lay for lay in repair.requeued if layout_key(lay) not in done]
        if self.records or requeue or repair.note():
            self.notes.append(f"resumed: {count(self.n_dispatched(), 'finished trial')} kept, {len(requeue)} re-queued")
            best = self.best()
            self.emit("resumed", {"finished": self.n_dispatched(), "gpu_hours": self.gpu_hours,
                                  "best": None if best is None else {
                                      "number": best.number, "layout": best.layout.label(self.model.is_moe),
                                      "value": best.value, "source": best.source}})
        if repair.note():
            self.notes.append(repair.note())
        return requeue

    def resume_line(self) -> str | None:
        """After prepare(): one line saying that an existing study was resumed, what it keeps and what is left to
        run ('resuming study t1: 3 trials kept, running up to 7 more'), or that its budget is already spent;
        None for a new study."""
        if self.sd.created and not self.records and not self.requeue:
            return None
        kept = self.n_dispatched()
        name, trials = self.sd.name, self.cfg.trials
        head = f"resuming study {name}: {count(kept, 'trial')} kept"
        if self.requeue:
            head += f" ({len(self.requeue)} interrupted, re-queued)"
        if kept >= trials:
            return (f"{head}, which is already the --trials {trials} budget: nothing more to run; raise --trials "
                    f"(e.g. --trials {kept + max(trials, 10)}) to search further")
        budget = self.cfg.budget_gpu_hours
        if budget is not None and self.gpu_hours >= budget:
            return (f"{head} and {hours(self.gpu_hours)} GPU-hours spent, already the --budget-gpu-hours {budget:g}: "
                    "nothing more to run; raise --budget-gpu-hours to search further")
        return f"{head}, running up to {count(trials - kept, 'more', 'more')} (--trials {trials})"

    # --- the loop --------------------------------------------------------------------------------------
    def n_dispatched(self) -> int:
        return sum(1 for r in self.records if r.status != "screened")

    def run(self) -> LoopResult:
        self.prepare()
        try:
            stop = self._loop(self.requeue)
            self.study.set_attr("stop_reason", stop)
            self.emit("done", {"stop_reason": stop})
            return LoopResult(self.sd.name, str(self.sd.root.parent), self.backend.name, stop, self.records,
                              self.best(), self.gpu_hours, self.notes)
        finally:
            if not self.hold_lock:  # the session closes both once its outputs are published
                self.close()

    def _next(self, requeue: list[Layout], running: dict, free: int) -> list[Proposal]:
        """Proposals for the `free` slots: re-queued layouts first, then one batch from the planner, which sees
        the running trials as taken (and, with a batch rule, believed: --parallel trials test different
        hypotheses); a repeat of a tried or running layout is dropped here (counted as a stalled proposal)."""
        if requeue:
            return [Proposal(requeue.pop(0), "re-queued after the driver stopped")]
        busy = {layout_key(lay) for _, lay, _ in running.values()}
        props = self.planner.propose(self._context(busy), free)
        tried = {layout_key(r.layout) for r in self.records}
        out = []
        for prop in props:
            key = layout_key(prop.layout)
            if key in tried or key in busy:
                self._screened_in_a_row += 1
                out.append(_REPEAT)
            else:
                busy.add(key)
                out.append(prop)
        return out

    def _loop(self, requeue: list[Layout]) -> str:
        running: dict[int, tuple[Handle, Layout, float | None]] = {}
        stop = None
        while True:
            if stop is None:
                stop = self._stop_reason(len(running))
            while stop is None and len(running) < self.cfg.parallel:
                props = self._next(requeue, running, self.cfg.parallel - len(running))
                if not props:
                    stop = None if running else self._exhausted()
                    break
                for prop in props:
                    if prop is not _REPEAT:
                        self._dispatch(prop, running)
                    stop = self._stop_reason(len(running))
                    if stop is not None:  # e.g. the trial budget filled: the rest of the batch is not dispatched
                        break
                if stop is None and self._screened_in_a_row >= MAX_SCREENED_IN_A_ROW:
                    stop = (f"planner stalled: its last {MAX_SCREENED_IN_A_ROW} proposals were all screened out "
                            "or already tried; try --planner model")
            if not running:
                return stop or self._exhausted()
            finished = False
            for number, (h, lay, pred) in list(running.items()):
                res = self.backend.poll(h)
                if res is not None:
                    kill_point("result_on_disk")
                    del running[number]
                    self._tell(number, lay, res, pred)
                    kill_point("told")
                    finished = True
            if not finished:
                time.sleep(self.cfg.poll_s)

    def _exhausted(self) -> str:
        wall = self.candidates.wall
        return "exhausted: every candidate was tried" + (
            f" or needs as much memory as trial {wall[1]}, which ran out" if wall else "")

    def _stop_reason(self, n_running: int) -> str | None:
        done = self.n_dispatched() + n_running
        if done >= self.cfg.trials:
            return f"trial budget reached ({count(self.cfg.trials, 'trial')})"
        if self.cfg.budget_gpu_hours is not None and self.gpu_hours >= self.cfg.budget_gpu_hours:
            return f"GPU-hour budget reached ({hours(self.gpu_hours)} of {self.cfg.budget_gpu_hours:g})"
        best = self.best()
        if n_running == 0 and best is not None and best.value:
            ctx = self._context()
            return stop_reason(ctx.predicted, ctx.uncertainty(), ctx.untried(), best.value, self.cfg.noise,
                               self.n_dispatched(), min_trials=MIN_TRIALS_TO_CONVERGE, residual=ctx.residual,
                               known=self.chance())
        return None

    def chance(self) -> float | None:
        """The stop rule's number at the current belief: the chance that some untried candidate beats the best trial
        by more than the noise (acquisition.chance_any_beats; the search converges below STOP_CHANCE). None before a
        trial succeeded or when nothing is left untried. Computed once per belief (a trial told, a wall moved)."""
        best = self.best()
        key = (len(self.records), self.candidates.wall)
        if self._chance is None or self._chance[0] != key:
            value = None
            if best is not None and best.value:
                ctx = self._context()
                open_ = ctx.untried()
                if open_.any():
                    value = chance_any_beats(ctx.predicted, ctx.uncertainty(), open_, best.value, self.cfg.noise,
                                             ctx.residual)
            self._chance = (key, value)
        return self._chance[1]

    def _context(self, pending: set[str] | None = None):
        return self.candidates.context(self.records, self.cfg.seed, self.cfg.steps or self.workload.steps, pending)

    def _dispatch(self, prop: Proposal, running: dict) -> None:
        lay, c = prop.layout, self.candidates
        idx, reason = c.screen(lay)
        attrs = TrialAttrs(label=lay.label(self.model.is_moe), why=_one_line(prop.why))
        if reason is not None:
            number = self.study.start(lay, attrs, self.choices)
            self.study.finish(number, attrs.model_copy(update={"status": "screened", "source": "predicted",
                                                               "reason": reason}))
            rec = TrialRecord(number, lay, "screened", "predicted", None, None, attrs.why)
            self.records.append(rec)
            self.planner.observe(rec)
            self._screened_in_a_row += 1
            self.emit("screened", {"number": number, "layout": attrs.label, "reason": reason, "why": attrs.why})
            return
        self._screened_in_a_row = 0
        prediction = c.prediction(idx)
        pred = prediction.tokens_per_s_per_gpu
        attrs = attrs.model_copy(update={"predicted": pred, "predicted_peak_bytes": prediction.peak_bytes})
        number = self.study.start(lay, attrs, self.choices)
        spec = self._spec(lay, number, prediction)
        if spec.proxy:
            self.study.update(number, {"proxy": spec.proxy})
        d = self.sd.trial_dir(number)
        write_json_atomic(d / "trial_spec.json", spec)
        kill_point("spec_written")
        handle = self.backend.submit(spec, d)
        running[number] = (handle, lay, pred)
        self._why[number] = attrs.why
        kill_point("submitted")
        self.emit("dispatched", {"number": number, "layout": attrs.label, "predicted": pred, "why": attrs.why,
                                 "settings": settings_label(lay, self.model.is_moe),
                                 "peak_memory_bytes": prediction.peak_bytes})
        step_s = prediction.step_time_s or 0.0
        if self.backend.measured and step_s * spec.steps > spec.timeout_s:  # it would end as a timeout: say why now
            note = (f"trial {number} is predicted to take {step_s * spec.steps:,.0f} s for its {spec.steps} steps "
                    f"({step_s:,.1f} s each), more than --trial-timeout {spec.timeout_s:,.0f} s: it will likely be "
                    "stopped as a timeout; use fewer --steps, a smaller --seq-len / --global-batch, or a longer "
                    "--trial-timeout")
            self.notes.append(note)
            self.emit("note", {"text": note})
        budget = self.cfg.budget_gpu_hours
        if budget is not None:  # the budget stops the search after the trial that crosses it: say so up front
            cost = float(trial_gpu_hours([pred], self.workload.tokens_per_step, self.cluster.count, spec.steps)[0])
            left = budget - self.gpu_hours - sum(self._cost.values())
            self._cost[number] = cost
            if cost > left:
                note = (f"trial {number} is predicted to take {hours(cost)} GPU-hours, more than the {hours(max(left, 0.0))} "
                        f"left of --budget-gpu-hours {budget:g}; the search stops once it ends")
                self.notes.append(note)
                self.emit("note", {"text": note})

    def _spec(self, lay: Layout, number: int, prediction) -> TrialSpec:
        steps = self.cfg.steps or self.workload.steps
        warmup = min(self.workload.window[0], max(1, steps // 3))
        # the spec's workload says the steps it runs and the window it scores (--steps shortens both)
        wl = dataclasses.replace(self.workload, steps=steps, window=(warmup, steps - 1))
        spec = TrialSpec(
            study=self.sd.name, number=number, model=self.model.source.removeprefix("catalog:") or self.model.name,
            gpu=self.cluster.gpu.name, gpu_spec=custom_gpu(self.cluster.gpu), count=self.cluster.count,
            gpus_per_node=self.cluster.gpus_per_node, layout=lay.to_dict(), workload=_jsonable(dataclasses.asdict(wl)),
            steps=steps, warmup_steps=warmup, seed=self.cfg.seed,
            timeout_s=self.cfg.timeout_s, predicted=prediction,
        )
        if self.cluster.gpu.is_accelerator:  # a GPU trial runs in the recipe's environment (its allocator, its CUDA
            # connections), which the memory model assumes; a shell expression (NVLS's) is the launch script's to run
            spec.env = {k: v for k, v in run_env(lay, self.cluster.gpu).items() if not v.startswith("$(")}
        if self.backend.measured:  # a real trial may end once its step time is steady, or once clearly losing
            best = self.best()
            spec.early_stop = EarlyStop(incumbent_tokens_per_s_per_gpu=best.value if best and best.source == "measured"
                                        else None)
        if self.cfg.proxy:
            from ..trials.proxy import make_proxy

            _, spec.proxy = make_proxy(self.model, lay, target="gpu" if self.cluster.gpu.is_accelerator else "cpu")
        return spec

    def run_reference(self, lay: Layout, number: int, trial_dir) -> TrialResult:
        """Run `lay` once outside the study (the gates' reference arm: same steps, same rows, same seed) and
        wait for it. The backend stays open for this until the session closes it."""
        spec = self._spec(lay, number, self.candidates.prediction_of_layout(lay))
        spec.early_stop = None  # the reference runs every step, so each candidate's curve is covered
        write_json_atomic(trial_dir / "trial_spec.json", spec)
        self.emit("reference", {"layout": lay.label(self.model.is_moe)})
        handle = self.backend.submit(spec, trial_dir)
        while (res := self.backend.poll(handle)) is None:
            time.sleep(self.cfg.poll_s)
        return res

    def close(self) -> None:
        self.backend.close()
        self.sd.unlock()

    def _tell(self, number: int, lay: Layout, res: TrialResult, pred: float | None) -> None:
        self._cost.pop(number, None)
        extra = {}
        if res.proxy and res.status == "ok":
            # a proxy trial proves the layout runs; its throughput is the shrunk model's, so the ranking
            # keeps the full model's prediction and the measurement is kept beside it, not calibrated on
            extra["proxy_tokens_per_s_per_gpu"] = res.tokens_per_s_per_gpu
            res = res.model_copy(update={"tokens_per_s_per_gpu": pred, "source": "predicted",
                                         "reason": f"proxy trial ran ({res.tokens_per_s_per_gpu or 0:,.1f} tokens/s/GPU "
                                                   f"on the proxy); ranked by the full model's prediction"})
        gpu_h = res.charged_gpu_hours(self.cluster.count)
        value_key = "measured" if res.source == "measured" else "value"
        attrs = TrialAttrs(status=res.status, source=res.source, reason=_one_line(res.reason or ""),
                           gpu_hours=gpu_h, peak_memory_bytes=res.peak_memory_bytes, wall_s=res.wall_s,
                           trial_dir=str(self.sd.trial_dir(number)), stderr=res.stderr,
                           **{value_key: res.tokens_per_s_per_gpu}, **extra)
        over = ((res.peak_memory_bytes or 0) - self.cluster.gpu.memory_bytes) / GiB
        self.study.finish(number, attrs, over_gib=over)
        self.gpu_hours += float(gpu_h or 0.0)
        rec = TrialRecord(number, lay, res.status, res.source, res.tokens_per_s_per_gpu, pred, self._why.pop(number, ""),
                          res.stderr)
        self.records.append(rec)
        self.planner.observe(rec)
        self._learn(rec)
        self.emit("finished", {"number": number, "layout": lay.label(self.model.is_moe), "status": res.status,
                               "value": res.tokens_per_s_per_gpu, "predicted": pred, "source": res.source,
                               "reason": attrs.reason, "peak_memory_bytes": res.peak_memory_bytes,
                               "gpu_hours": gpu_h, "wall_s": res.wall_s, "chance": self.chance(),
                               "noise": self.cfg.noise})

    def _learn(self, rec: TrialRecord) -> None:
        """Measured trials refit the calibration; the candidates are then re-predicted and re-ranked. A trial
        that ran out of memory sets aside every candidate predicted to need as much (Candidates.learn_oom)."""
        if rec.source == "measured" and rec.status == "ok" and rec.value:
            self.candidates.learn(rec.layout, rec.value, self.sd.name, rec.stderr)
        elif rec.status == "ok" and rec.value:  # the simulator's: believed, not learnt (Candidates.simulated)
            self.candidates.simulated(rec.layout)
        elif rec.status == "oom" and not self.cfg.proxy:  # a shrunk proxy model's OOM says little of the full one's
            note = self.candidates.learn_oom(rec.layout, rec.number)
            if note:
                self.notes.append(note)
                self.emit("note", {"text": note})

    def best(self) -> TrialRecord | None:
        ok = [r for r in self.records if r.status == "ok" and r.value]
        return max(ok, key=lambda r: r.value) if ok else None


_REPEAT = Proposal(Layout(world=1), "a layout already tried")  # sentinel: the planner repeated itself


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _jsonable(d: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
