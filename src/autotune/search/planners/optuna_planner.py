"""The Optuna planner: a sampler over the layout dimensions (TPE with constraints; GP when scipy and
torch are installed and asked for). OOM trials carry a positive constraint value, so the sampler learns
the memory wall instead of re-proposing it; layouts the model screens out come back as PRUNED trials."""

from __future__ import annotations

import importlib.util

import optuna

from ...layout import Layout, Recompute
from ..study import PARAM_NAMES, constraints_func
from .base import PlanContext, Planner, Proposal

__all__ = ["OptunaPlanner", "make_sampler", "distributions"]


def make_sampler(kind: str = "auto", seed: int | None = None):
    # Optuna >= 5 reads constraints set on the trial (Trial.set_constraint); older ones need constraints_func.
    cons = {} if hasattr(optuna.trial.Trial, "set_constraint") else {"constraints_func": constraints_func}
    have_gp = importlib.util.find_spec("scipy") is not None and importlib.util.find_spec("torch") is not None
    if kind == "gp" or (kind == "auto" and have_gp):
        if not have_gp:
            from ...errors import BadInput

            raise BadInput("the GP sampler needs scipy and torch: pip install 'autotune[dev]', or use TPE")
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=5, **cons)
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=5, **cons)


def distributions(ctx_or_choices) -> dict:
    """Categorical distributions over the values the candidates take (the study's search space)."""
    choices = ctx_or_choices
    return {k: optuna.distributions.CategoricalDistribution(tuple(choices[k])) for k in PARAM_NAMES}


def choices_of(ctx: PlanContext) -> dict:
    t = ctx.table
    rows = [t.row(i) for i in range(len(t))]
    from ..study import layout_params

    vals: dict[str, list] = {k: [] for k in PARAM_NAMES}
    for r in rows:
        for k, v in layout_params(r).items():
            if v not in vals[k]:
                vals[k].append(v)
    return {k: sorted(v, key=str) for k, v in vals.items()}


class OptunaPlanner(Planner):
    name = "optuna"

    def __init__(self, study: "optuna.Study", choices: dict):
        self.study = study
        self.dists = distributions(choices)

    def propose(self, ctx: PlanContext, k: int) -> list[Proposal]:
        out = []
        for _ in range(k):
            trial = self.study.ask(self.dists)
            p = trial.params
            lay = Layout(
                world=ctx.cluster.count, tp=p["tp"], pp=p["pp"], vpp=p["vpp"], cp=p["cp"], ep=p["ep"], etp=p["etp"],
                recompute=Recompute.parse(p["recompute"]), dispatcher=p["dispatcher"],
                max_tokens_per_gpu=p["max_tokens_per_gpu"] or None,
                micro_batch_size=None if p["max_tokens_per_gpu"] else 1,
                precision_aware_optimizer=p["precision_aware_optimizer"],
                moe_shared_expert_overlap=p["moe_shared_expert_overlap"],
                optimizer_offload=p["optimizer_offload"],
            )
            out.append(Proposal(lay, f"{type(self.study.sampler).__name__} sample", trial=trial))
        return out
