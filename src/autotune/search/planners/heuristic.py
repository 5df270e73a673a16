"""The skill's rules alone (skill/SKILL.md), as a deterministic planner: no LLM, no randomness.

It reads the cost model's candidates the way an expert reads a calculator: start from the optimistic
score the model-guided planner uses (predicted tokens/s x (1 + uncertainty)), then apply the rules of
thumb SKILL.md gives with their evidence, static ones (EP x ETP inside the NVLink domain, TP only when
the hidden size pays, CP only for long rows) and reactive ones that read the trials (after an OOM pull
the memory lever and distrust layouts at least as tight; after a slow trial with a large exposed
all-to-all or bubble, move away from the term that hurt; after a crash avoid the same degrees; near a
layout that beat its prediction, look closer). `assess` returns the per-candidate factors and the
findings in words; the LLM planner sends those findings as hints and uses this planner to fill an LLM
slot the model left without a valid proposal. It is also a benchmark arm of its own.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ...cost import evaluate
from ...layout import DISPATCHERS
from ...layout.core import GRANULARITIES
from ...layout.dimensions import layout_key
from ...trials.spec import Prediction
from .base import PlanContext, Planner, PlannerOptions, Proposal, TrialRecord, similarity

__all__ = ["HeuristicPlanner", "Assessment", "assess"]

FAILED = ("crash", "nccl", "timeout", "nan", "infra")


class Assessment:
    def __init__(self, n: int):
        self.factor = np.ones(n)
        self.rules: list[tuple[np.ndarray, str]] = []  # (mask, rule) in the order applied
        self.findings: list[str] = []  # what the rules read from the trials, in words

    def apply(self, mask: np.ndarray, factor: float, rule: str) -> None:
        mask = np.asarray(mask, dtype=bool)
        if mask.any():
            self.factor = np.where(mask, self.factor * factor, self.factor)
            self.rules.append((mask, rule))

    def notes(self, i: int) -> list[str]:
        """The rules that moved candidate i."""
        return list(dict.fromkeys(rule for mask, rule in self.rules if mask[i]))


def _share(terms: dict[str, float], *names: str) -> float:
    total = sum(terms.values()) or 1.0
    return sum(terms.get(n, 0.0) for n in names) / total


_TIGHT: dict[int, tuple[object, np.ndarray]] = {}


def _tightness(ctx: PlanContext) -> np.ndarray:
    """Predicted peak memory / usable HBM per candidate (one vectorised memory evaluation per table)."""
    hit = _TIGHT.get(id(ctx.table))
    if hit is None or hit[0] is not ctx.table:
        ev = evaluate(ctx.model, ctx.workload, ctx.cluster, ctx.table)
        if len(_TIGHT) > 4:
            _TIGHT.clear()
        hit = _TIGHT[id(ctx.table)] = (ctx.table, ev.memory.peak / ev.memory.capacity_bytes)
    return hit[1]


def assess(ctx: PlanContext, predict: Callable[[int], Prediction] | None = None) -> Assessment:
    """Per-candidate rule factors and the findings behind them; `predict` (default ctx.prediction) gives a
    candidate's breakdowns."""
    predict = predict or ctx.prediction
    t, m, c, w = ctx.table, ctx.model, ctx.cluster, ctx.workload
    a = Assessment(len(t))
    node = c.node_size
    if m.is_moe:
        a.apply(t.ep * t.etp > node, 0.85, "EP x ETP beyond the NVLink domain")
    if m.hidden_size < 8192:
        a.apply(t.tp > 1, 0.95, f"TP on hidden {m.hidden_size}")
    if w.seq_len < 16384:
        a.apply(t.cp > 1, 0.9, f"CP on {w.seq_len}-token rows")
    index = {k: i for i, k in enumerate(ctx.keys)}
    have_breakdown = ctx.breakdown is not None
    for r in ctx.history[-30:]:
        i = index.get(layout_key(r.layout))
        same_degrees = (t.tp == r.layout.tp) & (t.pp == r.layout.pp) & (t.ep == r.layout.ep) & (t.cp == r.layout.cp)
        label = f"trial {r.number} ({r.layout.label(m.is_moe)})"
        if r.status == "oom":
            a.findings.append(f"{label} ran out of memory: pull the memory lever (recompute, PP, offload) and "
                              "distrust layouts predicted at least as tight")
            if i is not None:
                tight = _tightness(ctx)
                a.apply(tight >= tight[i] - 0.02, 0.3, f"as tight as OOM trial {r.number}")
            a.apply(same_degrees & (t.rc_gran <= GRANULARITIES.index(r.layout.recompute.granularity)),
                    0.5, f"same degrees as OOM trial {r.number}, no more recompute")
        elif r.status in FAILED:
            a.findings.append(f"{label} failed ({r.status}): avoid the same TP/PP/EP/CP")
            a.apply(same_degrees, 0.6, f"same degrees as failed trial {r.number}")
        elif r.status == "ok" and r.value and r.predicted:
            gap = r.value / r.predicted
            if gap >= 1.10:
                a.findings.append(f"{label} beat its prediction by {gap - 1:.0%}: look around it")
                a.apply(similarity(t, r.layout) >= 0.8, 1.05, f"near trial {r.number}, which beat its prediction")
            elif gap <= 0.85 and have_breakdown and i is not None:
                terms = predict(i).time_terms
                if m.is_moe and _share(terms, "ep_comm", "imbalance") >= 0.2:
                    a.findings.append(f"{label} ran {1 - gap:.0%} below its prediction with a large all-to-all share: "
                                      "try smaller EP, EP inside the node, or another dispatcher")
                    a.apply((t.ep >= r.layout.ep) & (t.dispatcher == DISPATCHERS.index(r.layout.dispatcher)), 0.85,
                            f"same all-to-all as slow trial {r.number}")
                if r.layout.pp > 1 and _share(terms, "bubble") >= 0.15:
                    a.findings.append(f"{label} ran {1 - gap:.0%} below its prediction with a large pipeline bubble: "
                                      "try more VPP, fewer PP stages or more micro-batches")
                    a.apply((t.pp == r.layout.pp) & (t.vpp <= r.layout.vpp), 0.85,
                            f"same bubble as slow trial {r.number}")
    return a


class HeuristicPlanner(Planner):
    name = "heuristic"

    def __init__(self, options: PlannerOptions | None = None):
        self._predictions: dict[tuple[int, float], Prediction] = {}

    def predict(self, ctx: PlanContext) -> Callable[[int], Prediction]:
        """ctx.prediction, kept while a candidate's predicted tokens/s stays the same (breakdowns are slow)."""
        def one(i: int) -> Prediction:
            key = (i, float(ctx.predicted[i]))
            if key not in self._predictions:
                if len(self._predictions) > 4096:
                    self._predictions.clear()
                self._predictions[key] = ctx.prediction(i)
            return self._predictions[key]
        return one

    def propose(self, ctx: PlanContext, k: int) -> list[Proposal]:
        open_ = ctx.untried()
        if not open_.any():
            return []
        a = assess(ctx, self.predict(ctx))
        sigma = ctx.uncertainty()
        score = np.where(open_, ctx.predicted * (1 + sigma) * a.factor, -np.inf)
        out = []
        for _ in range(k):
            i = int(np.argmax(score))
            if not np.isfinite(score[i]):
                break
            lay = ctx.table.row(i)
            rules = "; ".join(a.notes(i)) or "no rule against it"
            out.append(Proposal(lay, f"skill rules: predicted {ctx.predicted[i]:,.0f} tokens/s/GPU, x{a.factor[i]:.2f} "
                                     f"({rules})"))
            score[i] = -np.inf
            score = np.where(similarity(ctx.table, lay) >= 0.8, score * (1 - 0.5 * sigma), score)
        return out

    def observe(self, record: TrialRecord) -> None:
        pass  # the context's history carries every trial; the rules read it each round
