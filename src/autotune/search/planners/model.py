"""The model-guided planner (the default): spend trials where they can change the answer.

Each untried candidate's throughput is uncertain: the calibrated cost model, corrected by the residual
model, with the residual model's per-candidate uncertainty (ctx.uncertainty(); wide for layouts unlike
anything measured, narrow near measured ones, and as wide as the trials say the model is wrong on this
cluster: the residual model learns its own width scale). The planner ranks candidates by the expected amount by
which they beat the incumbent per GPU-hour their trial costs (search/acquisition.py); a batch for
`--parallel` is picked with the believer rule, so parallel trials test different hypotheses. Before any
measurement the "incumbent" is the best prediction: the first trial goes where the model, widened by its
uncertainty, expects the most. As measurements arrive the driver refits the residual model (time-term
factors and layout features in one posterior, search/candidates.believe), and the predictions,
uncertainties and so the ranking move.
"""

from __future__ import annotations

import numpy as np

from ...words import hours
from ..acquisition import expected_improvement, prob_improvement, select_batch
from .base import PlanContext, Planner, PlannerOptions, Proposal

__all__ = ["ModelPlanner"]


class ModelPlanner(Planner):
    name = "model"

    def __init__(self, options: PlannerOptions | None = None):
        self.options = options or PlannerOptions()

    @staticmethod
    def incumbent(ctx: PlanContext) -> float | None:
        vals = [r.value for r in ctx.history if r.status == "ok" and r.value]
        return max(vals) if vals else None

    def propose(self, ctx: PlanContext, k: int) -> list[Proposal]:
        open_ = ctx.untried()
        if not open_.any():
            return []
        sigma = np.asarray(ctx.uncertainty(), dtype=float)
        best = self.incumbent(ctx)
        cost = ctx.trial_cost()
        measured = any(r.status == "ok" and r.source == "measured" for r in ctx.history)
        # the simulator's trials are predictions, so nothing is learnt from them; the candidates believe them
        # (Candidates.simulated), so `sigma` has already lost what they resolved and the next simulated trial
        # tests another hypothesis, not a near-copy
        picks = select_batch(ctx.predicted, sigma, best, cost, open_, k, ctx.correlation, ctx.pending_indices())
        ref = best if best is not None else float(np.max(ctx.predicted[open_]))
        ei = expected_improvement(ctx.predicted[picks], sigma[picks], ref)
        pi = prob_improvement(ctx.predicted[picks], sigma[picks], ref, ctx.noise)
        what = ("the best measured" if measured else "the best simulated trial") if best is not None else "the best prediction"
        scale = getattr(ctx.residual, "width_scale", None)
        # the simulator's trials are predictions: nothing is learnt from them, so the scale is only news when measured
        learnt = f"; model error x{scale():.2f} the calibration's, learnt from the trials" if scale and measured else ""
        out = []
        for n, i in enumerate(picks):
            if best is None:  # nothing measured or simulated yet: no incumbent to beat (the pick is the reference)
                out.append(Proposal(ctx.table.row(i), (
                    f"predicted {ctx.predicted[i]:,.0f} tokens/s/GPU (the planner's 1-sd uncertainty "
                    f"+/-{sigma[i]:.0%}); no trial yet, so nothing to beat: expected gain over the best prediction "
                    f"for {hours(cost[i])} GPU-h, the most per GPU-hour among {int(open_.sum()):,} untried")))
                continue
            out.append(Proposal(ctx.table.row(i), (
                f"predicted {ctx.predicted[i]:,.0f} tokens/s/GPU (the planner's 1-sd uncertainty +/-{sigma[i]:.0%}); "
                f"{pi[n]:.0%} chance to beat "
                f"{what} ({ref:,.0f}) by > {ctx.noise:.0%}, expected gain {ei[n]:.1%} for {hours(cost[i])} GPU-h: "
                f"the most per GPU-hour among {int(open_.sum()):,} untried{learnt}")))
        return out
