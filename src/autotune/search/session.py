"""A search from start to finish, as stages: candidates -> driver -> gates -> recipes -> report.

`SearchSession` composes them: the driver's loop (driver.py, which builds the candidates), the gates
stage on the top trials (gates.py), one recipe per ranked trial, and the summary; the recipes and the
summary are published as one set (outputs.py) while the study lock is still held, so a second driver
can never interleave its outputs with ours. `SearchOutcome` carries everything the CLI renders and
summary.json holds. The CLI only parses flags and renders.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..catalog import ClusterSpec, ModelSpec, Workload
from ..cost import evaluate, levers, step_shares
from ..killpoints import kill_point
from ..layout import LayoutTable
from ..layout.describe import settings_label
from ..space import SearchSpace
from ..trials.backends import Backend
from ..trials.prediction import prediction_of
from ..trials.spec import TRIAL_STARTUP_S, TrialResult
from ..words import measured_text
from .driver import SearchConfig, SearchDriver
from .gates import GateOutcome, GatesStage, RecipeGates
from .outputs import Publication
from .planners import TrialRecord
from .study import StudyDir, calibration_command

__all__ = ["SearchSession", "SearchOutcome", "RECIPES_PER_STUDY"]

RECIPES_PER_STUDY = 5


@dataclass
class SearchOutcome:
    study: str
    runs_dir: str
    study_dir: str
    backend: str
    planner: str
    stop_reason: str
    records: list[TrialRecord]
    ranked: list[TrialRecord]  # ok trials, best first
    gpu_hours: float
    funnel: list[tuple[str, int]]
    trials: list[dict]  # one row per trial (the JSON shape), in trial order
    recipes: list[str] = field(default_factory=list)
    gates: dict[int, GateOutcome] = field(default_factory=dict)
    reference: dict | None = None
    notes: list[str] = field(default_factory=list)
    model_is_moe: bool = True
    summary: str = ""  # the best layout in words
    workload: dict = field(default_factory=dict)  # Workload.rows(): the rows every trial ran, and their routing
    best_step: dict | None = None  # where the model says the best layout's step goes, and what shrinks its bottleneck
    chance: float | None = None  # the stop rule's chance at the end: some untried candidate beats the best by > noise
    noise: float = 0.0

    @property
    def best(self) -> TrialRecord | None:
        return self.ranked[0] if self.ranked else None

    def to_json(self) -> dict:
        best = None
        if self.best:
            b = self.best
            best = {"number": b.number, "layout": b.layout.label(self.model_is_moe), "tokens_per_s_per_gpu": b.value,
                    "status": self._status(b), "recompute": str(b.layout.recompute),
                    "dispatcher": b.layout.dispatcher, "summary": self.summary}
            if self.reference:
                best["vs_reference"] = b.value / self.reference["tokens_per_s_per_gpu"]
            if self.best_step:
                best["step"] = self.best_step
        return {
            "study": self.study, "runs_dir": self.runs_dir, "study_dir": self.study_dir, "backend": self.backend,
            "planner": self.planner, "workload": self.workload, "stop_reason": self.stop_reason, "best": best,
            # the stop rule's number when the search ended (it converges below acquisition.STOP_CHANCE): how much a
            # larger budget could still find; None before a successful trial or with nothing left untried
            "chance_untried_beats": None if self.chance is None else round(self.chance, 4), "noise": self.noise,
            "trials": self.trials,
            "dispatched": sum(1 for r in self.records if r.status != "screened"), "gpu_hours": self.gpu_hours,
            "funnel": [{"stage": s, "count": c} for s, c in self.funnel], "recipes": self.recipes,
            "gates": {str(k): g.to_json() for k, g in self.gates.items()},
            "reference": self.reference, "notes": self.notes,
            "dashboard": f"autotune dashboard {self.study_dir}   (optuna-dashboard sqlite:///{self.study_dir}/study.db)",
            "export": f"autotune export {self.study_dir} --rank 1",
            # measured trials can calibrate the model for the next search on this cluster (None: nothing measured)
            "calibrate": (calibration_command(self.study_dir)[0]
                          if any(r.status == "ok" and r.source == "measured" and r.value for r in self.records)
                          else None),
        }

    def _status(self, rec: TrialRecord) -> str:
        g = self.gates.get(rec.number)
        if g is not None and g.status == "verified":
            return "verified"
        return "measured" if rec.source == "measured" else "predicted"


class SearchSession:
    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, space: SearchSpace,
                 backend: Backend, study_dir: StudyDir, config: SearchConfig,
                 on_event: Callable[[str, dict], None] | None = None, gates: GatesStage | None = None,
                 notes: list[str] | None = None):
        self.model, self.cluster, self.workload = model, cluster, workload
        self.sd, self.cfg = study_dir, config
        self.driver = SearchDriver(model, cluster, workload, space, backend, study_dir, config, on_event,
                                   hold_lock=True)
        self.gates = gates or RecipeGates()
        self.notes = list(notes or [])

    def prepare(self) -> None:
        """Everything that can fail on bad input, before any output (see SearchDriver.prepare)."""
        self.driver.prepare()

    def run(self) -> SearchOutcome:
        self.prepare()
        try:
            loop = self.driver.run()
            ranked = sorted((r for r in loop.records if r.status == "ok" and r.value), key=lambda r: -r.value)
            outcome = SearchOutcome(
                study=self.sd.name, runs_dir=str(self.sd.root.parent), study_dir=str(self.sd.root),
                backend=loop.backend, planner=self.cfg.planner, stop_reason=loop.stop_reason, records=loop.records,
                ranked=ranked, gpu_hours=loop.gpu_hours, funnel=list(self.driver.candidates.funnel),
                trials=self._rows(loop.records), model_is_moe=self.model.is_moe,
                notes=self.notes + self.driver.candidates.space_notes + loop.notes
                + [n for n in [close_call(ranked, self.cfg.noise, self.model.is_moe)] if n],
                summary=ranked[0].layout.summary(self.workload.seq_len, self.model.is_moe) if ranked else "",
                workload=self.workload.rows(), chance=self.driver.chance(), noise=self.cfg.noise,
            )
            outcome.best_step = self._step_of(ranked[0]) if ranked else None
            outcome.gates = self.gates.run(self, ranked[:RECIPES_PER_STUDY])
            outcome.reference = best_known_recipe(self.model, self.cluster, self.workload)
            self._publish(outcome)
            return outcome
        finally:
            self.driver.close()

    # --- stages ----------------------------------------------------------------------------------------
    def _measured_peak(self, rec: TrialRecord) -> int | None:
        """The peak memory a measured trial recorded (max over ranks), or None."""
        res = self.driver.result_on_disk(rec.number) if rec.source == "measured" else None
        return res.peak_memory_bytes if res else None

    def _step_of(self, rec: TrialRecord) -> dict:
        """The model's step breakdown of one layout at the study's calibration (refit on its trials): the largest
        terms' shares, and the terms a setting controls that take a fifth of the step or more, with what shrinks
        them (cost/advice.py). The model's view, also of a measured trial: a trial measures the step, not its terms."""
        ev = evaluate(self.model, self.workload, self.cluster, LayoutTable.from_layouts([rec.layout]),
                      self.driver.candidates.calibration)
        step, parts = float(ev.time.step_time[0]), ev.time.breakdown(0)
        return {"step_time_s": step, "shares": [{"term": k, "share": round(v, 3)} for k, v in step_shares(parts, step)],
                "levers": levers(parts, step, rec.layout, self.workload, self.cluster)}

    def _rows(self, records: list[TrialRecord]) -> list[dict]:
        """One JSON row per trial, with MFU, $ per 1M tokens from one evaluation, and the peak memory: measured where
        the trial measured it, else predicted (both kept)."""
        if not records:
            return []
        c = self.driver.candidates
        ev = evaluate(self.model, self.workload, self.cluster, LayoutTable.from_layouts([r.layout for r in records]),
                      c.calibration)
        rows = []
        for i, r in enumerate(records):
            tps = r.value or float(ev.time.tokens_per_s_per_gpu[i])
            p = prediction_of(ev, i, self.model, self.cluster, tokens_per_s_per_gpu=tps)
            rows.append({
                "number": r.number, "layout": r.layout.label(self.model.is_moe), "recompute": str(r.layout.recompute),
                "dispatcher": r.layout.dispatcher, "optimizer_offload": r.layout.optimizer_offload,
                "settings": settings_label(r.layout, self.model.is_moe),
                "status": r.status,
                "state": r.status if r.status != "ok" else ("measured" if r.source == "measured" else "predicted"),
                "predicted": r.predicted, "measured": r.value if r.source == "measured" else None, "value": r.value,
                "stderr": r.stderr if r.source == "measured" else None,
                "mfu": p.mfu, "usd_per_million_tokens": p.usd_per_million_tokens,
                "peak_memory_bytes": int(self._measured_peak(r) or p.peak_bytes),
                "predicted_peak_memory_bytes": int(p.peak_bytes),
            })
        return rows

    def _publish(self, outcome: SearchOutcome) -> None:
        """Recipes for the ranked trials and summary.json, written into a new set and swapped in."""
        pub = Publication(self.sd.root)
        try:
            for rank, rec in enumerate(outcome.ranked[:RECIPES_PER_STUDY], 1):
                path = self._write_recipe(pub, rank, rec, outcome.gates.get(rec.number))
                outcome.recipes.append(str(self.sd.root / "recipes" / path.name))
            pub.write_json("summary.json", outcome.to_json())
            kill_point("outputs_staged")
            pub.commit()
            kill_point("outputs_swapped")
        except BaseException:
            pub.abandon()
            raise

    def _notes(self, rec: TrialRecord, res: TrialResult | None) -> list[str] | None:
        notes = []
        if rec.why:
            notes.append(f"why the search tried it (trial {rec.number}, {self.cfg.planner} planner): {rec.why}")
        if res is not None and res.stopped_early:
            notes.append(f"the trial ended before its {self.cfg.steps or self.workload.steps} steps: {res.stopped_early}")
        if res is not None and rec.source == "measured" and res.reason:  # what the runner changed to run it here
            notes.append(f"the trial ran with: {res.reason}")
        return notes or None

    def _write_recipe(self, pub: Publication, rank: int, rec: TrialRecord, gate: GateOutcome | None) -> Path:
        from ..recipes.emit import recipe_from_candidate, recipe_name
        from ..recipes.io import write_recipe

        res = self.driver.result_on_disk(rec.number)
        wl = self.workload
        measured = rec.source == "measured"
        window, steps = tuple(wl.window), wl.steps
        if res and measured and res.window and res.steps and res.window[1] < len(res.steps):
            window, steps = tuple(res.window), len(res.steps)  # the window the trial actually scored
        status = "verified" if gate is not None and gate.status == "verified" else (
            "measured" if measured else "predicted")
        recipe = recipe_from_candidate(
            self.model, self.cluster, rec.layout, wl, status=status, tokens_per_s_per_gpu=rec.value,
            step_time_cv_percent=res.step_time_cv_percent if res and measured else None,
            gpu_hours=(res.charged_gpu_hours(self.cluster.count) or None) if res else None,  # as the search charged it
            window=window, steps_per_run=steps,
            stack=_stack(res, self.cluster), measured=dt.date.today().isoformat(),
            gpu_hours_note=(f"predicted: GPUs x ({self.cfg.steps or wl.steps} steps + {TRIAL_STARTUP_S / 60:.1f} min "
                            "startup)") if not measured else None,
            gates=gate.section if gate is not None and gate.section else None,
            notes=self._notes(rec, res),
        )
        name = recipe_name("autotune", rec.layout, wl, moe=self.model.is_moe)
        return write_recipe(recipe, pub.path(f"recipes/rank-{rank:02d}-{name}.yaml"), name=name)


def close_call(ranked: list[TrialRecord], noise: float, is_moe: bool = True) -> str | None:
    """A note when the two best measured trials are within their own measurement error of each other (apart by less
    than twice the standard error of their difference, each trial's error the larger of its own and --noise) and at
    least one of them scattered more than --noise: which of the two is faster is then not settled, and more steps
    per trial would settle it (the standard error falls with the root of the steps). None otherwise, and when the
    trials report no error of their own (a simulator's, or one as steady as the noise)."""
    top = [r for r in ranked[:2] if r.source == "measured" and r.value and r.stderr is not None]
    if len(top) < 2 or max(r.stderr for r in top) <= noise:
        return None
    (a, b), s = top, [max(r.stderr, noise) for r in top]
    gap = abs(math.log(a.value / b.value))
    if gap >= 2 * math.hypot(*s):
        return None
    return (f"the two best measured layouts are within their trials' error of each other: trial {a.number} "
            f"{a.layout.label(is_moe)} {measured_text(a.value, a.stderr)} and trial {b.number} {b.layout.label(is_moe)} "
            f"{measured_text(b.value, b.stderr)}, {gap:.1%} apart; their steps scattered more than the {noise:.0%} noise, "
            "so which is faster is not settled: more --steps per trial (the error falls with the root of the steps) or "
            "a quieter machine would tell them apart")


def _stack(res: TrialResult | None, cluster: ClusterSpec) -> dict:
    """The recipe's stack section from what the trial detected (or says plainly that nothing ran)."""
    import platform

    from .. import __version__

    got = dict(res.stack) if res and res.source == "measured" else {}
    missing = "not run: predicted by autotune's cost model"
    out = {
        "framework": got.get("framework") or (f"autotune {__version__} runner (megatron-core)" if got else missing),
        "megatron_lm": got.get("megatron_core") or missing,
        "pytorch": got.get("torch") or missing,
        "python": got.get("python") or platform.python_version(),
        "network": f"{cluster.gpus_per_node} GPUs per node, {cluster.network_gbps * 8 / 1000:g} Tb/s per node",
    }
    for key in ("transformer_engine", "cuda", "nccl", "deepep"):
        if got.get(key):
            out[key] = got[key]
    out["source"] = "detected by the trial runner" if got else "nothing ran: no stack to detect"
    return out


def best_known_recipe(model: ModelSpec, cluster: ClusterSpec, workload: Workload) -> dict | None:
    """The best measured or verified recipe already known for this model, GPU kind, count and workload."""
    from ..recipes.rank import leaderboard, load_all

    items, _ = load_all()
    same = [(p, r) for p, r in items if r.gpu.count == cluster.count and r.status != "predicted"
            and r.workload.row_tokens == workload.seq_len and r.workload.global_batch == workload.global_batch]
    board = leaderboard(same, model.name, cluster.gpu.name)
    if not board:
        return None
    e = board[0]
    return {"name": e.name, "layout": e.recipe.layout.label, "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
            "status": e.recipe.status, "author": e.recipe.author.name, "path": str(e.path)}
