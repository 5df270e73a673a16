"""Random search over the screened candidates: the baseline the benchmarks compare against."""

from __future__ import annotations

import numpy as np

from .base import PlanContext, Planner, PlannerOptions, Proposal

__all__ = ["RandomPlanner"]


class RandomPlanner(Planner):
    name = "random"

    def __init__(self, options: PlannerOptions | None = None):
        pass

    def propose(self, ctx: PlanContext, k: int) -> list[Proposal]:
        idx = np.flatnonzero(ctx.untried())
        if len(idx) == 0:
            return []
        pick = ctx.rng.choice(idx, size=min(k, len(idx)), replace=False)
        return [Proposal(ctx.table.row(int(i)), "uniformly random among untried candidates") for i in pick]
