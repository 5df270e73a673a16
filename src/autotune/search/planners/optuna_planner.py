"""The Optuna planner: a sampler over the searched dimensions (TPE with constraints; GP when scipy and
torch are installed and asked for).

The sampler runs on a private in-memory study that mirrors what the search learnt: every finished trial
is added to it with its value (an OOM as a positive constraint, so the sampler learns the memory wall; a
layout the model screened out as PRUNED). Only the driver asks and tells the persistent study in
runs/<study>/study.db. A sample that names a layout already tried is answered from the mirror at once
(its known value) and the sampler is asked again, so no trial is spent on a layout twice; a sample that
breaks Megatron's rules is told PRUNED in the mirror and asked again (the driver still screens the rest:
predicted OOM, unsupported, cannot win).
"""

from __future__ import annotations

import importlib.util

import optuna

from ...errors import BadInput
from ...layout import violations
from ...layout.dimensions import PARAM_NAMES, layout_from_params, layout_key, layout_params, table_params
from ..study import CONSTRAINT_ATTR, constraints_func, set_constraint
from .base import PlanContext, Planner, PlannerOptions, Proposal, TrialRecord

__all__ = ["OptunaPlanner", "make_sampler", "distributions", "choices_of"]

MAX_DUPLICATE_ASKS = 200  # samples answered from the mirror before one proposal gives up


def make_sampler(kind: str = "auto", seed: int | None = None):
    # Optuna >= 5 reads constraints set on the trial (Trial.set_constraint); older ones need constraints_func.
    cons = {} if hasattr(optuna.trial.Trial, "set_constraint") else {"constraints_func": constraints_func}
    have_gp = importlib.util.find_spec("scipy") is not None and importlib.util.find_spec("torch") is not None
    if kind == "gp" or (kind == "auto" and have_gp):
        if not have_gp:
            raise BadInput("the GP sampler needs scipy and torch: pip install 'autotune[dev]', or use TPE")
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=5, **cons)
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=5, **cons)


def choices_of(ctx: PlanContext) -> dict[str, list]:
    """The values each dimension takes among the candidates (the sampler's search space)."""
    return {k: sorted({_py(v) for v in col.tolist()}, key=str) for k, col in table_params(ctx.table).items()}


def distributions(choices: dict[str, list]) -> dict:
    """Categorical distributions over `choices`, one per study parameter."""
    return {k: optuna.distributions.CategoricalDistribution(tuple(choices[k])) for k in PARAM_NAMES}


def _py(v):
    return v.item() if hasattr(v, "item") else v


class OptunaPlanner(Planner):
    name = "optuna"

    def __init__(self, options: PlannerOptions | None = None):
        opts = options or PlannerOptions()
        self.sampler = make_sampler(opts.sampler, opts.seed)
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created in memory" on stderr
        self.mirror = optuna.create_study(direction="maximize", sampler=self.sampler)
        self.dists: dict | None = None
        self.splits: dict[tuple, list[str]] = {}  # (PP, VPP) -> the candidates' layer splits there, even first
        self.pending: dict[str, optuna.Trial] = {}  # layout key -> mirror trial asked, not yet told
        self.backlog: list[TrialRecord] = []  # observed before the first proposal (resume)

    def _start(self, ctx: PlanContext) -> None:
        # A layer split fits one PP x VPP only: sampled on its own it would name another PP x VPP's split almost
        # always. The mirror samples its position among the candidates' splits for the sampled PP and VPP instead
        # (0: the even split, where there is one).
        cols = table_params(ctx.table)
        opts: dict[tuple, set] = {}
        for pp, vpp, sp in zip(cols["pp"].tolist(), cols["vpp"].tolist(), cols["layer_split"].tolist()):
            opts.setdefault((pp, vpp), set()).add(sp)
        self.splits = {k: sorted(v, key=lambda x: (x != "even", x)) for k, v in opts.items()}
        choices = choices_of(ctx)
        choices["layer_split"] = list(range(max((len(v) for v in self.splits.values()), default=1)))
        self.dists = distributions(choices)
        for rec in self.backlog:
            self._add(rec)
        self.backlog = []

    def _to_mirror(self, params: dict) -> dict | None:
        """A layout's parameters as the mirror samples them (its split as a position), or None if it cannot."""
        opts = self.splits.get((params["pp"], params["vpp"]), [])
        if params["layer_split"] not in opts:
            return None
        return {**params, "layer_split": opts.index(params["layer_split"])}

    def _from_mirror(self, params: dict) -> dict | None:
        """The mirror's sample as a layout's parameters, or None when the sampled PP x VPP has no split there."""
        opts = self.splits.get((params["pp"], params["vpp"]), [])
        k = params["layer_split"]
        return {**params, "layer_split": opts[k]} if k < len(opts) else None

    def _layout(self, ctx: PlanContext, mirror_params: dict):
        """The layout a mirror sample names, or None when it names none."""
        params = self._from_mirror(mirror_params)
        if params is None:
            return None
        try:
            return layout_from_params(ctx.cluster.count, params)
        except BadInput:
            return None

    def _add(self, rec: TrialRecord) -> None:
        """A trial the mirror did not ask for (resume, another planner's, a re-queued layout)."""
        params = self._to_mirror(layout_params(rec.layout))
        if params is None or any(params[k] not in self.dists[k].choices for k in PARAM_NAMES):
            return  # outside the candidates' values: the sampler cannot represent it
        state, value, over = _outcome(rec)
        self.mirror.add_trial(optuna.trial.create_trial(
            params=params, distributions=self.dists, state=state, value=value,
            user_attrs={CONSTRAINT_ATTR: [over]},
            **({"constraints": {"memory_over_gib": over}} if _HAS_CONSTRAINTS else {})))

    def observe(self, record: TrialRecord) -> None:
        if self.dists is None:
            self.backlog.append(record)
            return
        key = layout_key(record.layout)
        trial = self.pending.pop(key, None)
        if trial is None:
            self._add(record)
        else:
            self._tell(trial, record)

    def _tell(self, trial: optuna.Trial, rec: TrialRecord) -> None:
        state, value, over = _outcome(rec)
        set_constraint(trial, over)
        self.mirror.tell(trial, value if state == optuna.trial.TrialState.COMPLETE else None, state=state)

    def propose(self, ctx: PlanContext, k: int) -> list[Proposal]:
        if self.dists is None:
            self._start(ctx)
        known = {layout_key(r.layout): r for r in ctx.history}
        ctx_index = set(ctx.keys)
        out: list[Proposal] = []
        for _ in range(k):
            for _attempt in range(MAX_DUPLICATE_ASKS):
                trial = self.mirror.ask(self.dists)
                lay = self._layout(ctx, trial.params)
                if lay is None:  # values that make no layout (a split position its PP x VPP lacks): as illegal
                    self.mirror.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    continue
                key = layout_key(lay)
                if key not in ctx_index and violations(ctx.model, ctx.workload, lay):
                    # Megatron would refuse it: the sampler learns that here, no trial is spent on it
                    self.mirror.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    continue
                if (key in known or key in ctx.tried or key in self.pending
                        or any(layout_key(p.layout) == key for p in out)):
                    # already tried (or proposed): answer from what is known, ask again
                    rec = known.get(key)
                    if rec is not None:
                        self._tell(trial, rec)
                    else:
                        self.mirror.tell(trial, state=optuna.trial.TrialState.FAIL)
                    continue
                self.pending[key] = trial
                out.append(Proposal(lay, f"{type(self.sampler).__name__} sample"))
                break
            else:
                break  # the sampler keeps naming known layouts: nothing new to propose
        return out


_HAS_CONSTRAINTS = "constraints" in optuna.trial.create_trial.__code__.co_varnames


def _outcome(rec: TrialRecord):
    """(state, value, constraint) of a finished trial as the mirror records it."""
    TS = optuna.trial.TrialState
    if rec.status == "ok" and rec.value:
        return TS.COMPLETE, float(rec.value), 0.0
    if rec.status == "oom":
        return TS.COMPLETE, 0.0, 1.0
    if rec.status == "screened":
        return TS.PRUNED, None, 0.0
    return TS.FAIL, None, 0.0
