"""The model-guided planner (the default): spend trials where the cost model says they can change the
answer.

Each untried candidate gets an optimistic score, predicted tokens/s x (1 + kappa x uncertainty), where
uncertainty is the model's relative error for layouts unlike anything measured and shrinks near measured
layouts. The highest score goes first; a batch is spread out by damping candidates similar to the ones
already picked, so parallel trials teach different things. As measurements arrive the driver refits the
calibration and the predictions (and so the ranking) move.
"""

from __future__ import annotations

import numpy as np

from .base import PlanContext, Planner, PlannerOptions, Proposal, similarity

__all__ = ["ModelPlanner"]


class ModelPlanner(Planner):
    name = "model"

    def __init__(self, options: PlannerOptions | None = None, kappa: float = 1.0):
        self.kappa = kappa

    def propose(self, ctx: PlanContext, k: int) -> list[Proposal]:
        open_ = ctx.untried()
        if not open_.any():
            return []
        sigma = ctx.uncertainty()
        score = np.where(open_, ctx.predicted * (1 + self.kappa * sigma), -np.inf)
        out = []
        for _ in range(k):
            i = int(np.argmax(score))
            if not np.isfinite(score[i]):
                break
            lay = ctx.table.row(i)
            out.append(Proposal(lay, f"predicted {ctx.predicted[i]:,.0f} tokens/s/GPU (+/-{sigma[i]:.0%}), "
                                     f"the best optimistic score among {int(open_.sum())} untried"))
            score[i] = -np.inf
            near = similarity(ctx.table, lay)
            score = np.where(near >= 0.8, score * (1 - 0.5 * sigma), score)
        return out
