"""The planner interface: propose layouts to try next, observe what trials taught.

A planner sees a PlanContext (the candidates that survived the model's screen, their current predicted
throughput, what was tried and what it gave) and returns Proposals. It never runs anything; the driver
screens every proposal again before dispatch, so a planner (an LLM included) cannot send an illegal or
predicted-OOM layout to a cluster.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...catalog import ClusterSpec, ModelSpec, Workload
from ...layout import Layout, LayoutTable
from ...layout.dimensions import feature_columns
from ...trials.spec import Prediction

__all__ = ["Planner", "PlanContext", "PlannerOptions", "Proposal", "TrialRecord", "similarity"]


@dataclass
class TrialRecord:
    number: int
    layout: Layout
    status: str  # ok | oom | timeout | nccl | nan | crash | infra | screened
    source: str  # measured | predicted
    value: float | None  # tokens/s/GPU (measured, or predicted by the simulator)
    predicted: float | None  # the model's prediction at dispatch
    why: str = ""  # the planner's rationale for proposing it (one line)
    stderr: float | None = None  # a measured value's relative standard error, when its trial knows it


@dataclass
class Proposal:
    layout: Layout
    why: str  # one line, shown in the live view, the dashboard and the recipe's notes


@dataclass
class PlannerOptions:
    """What a planner may be configured with; each planner reads the fields it needs."""

    seed: int = 0
    sampler: str = "auto"  # optuna planner: tpe | gp | auto
    out_dir: Path | None = None  # runs/<study>/planner/: where a planner may keep its own files
    llm_base_url: str | None = None
    llm_model: str | None = None
    llm_timeout_s: float = 60.0


@dataclass
class PlanContext:
    model: ModelSpec
    cluster: ClusterSpec
    workload: Workload
    table: LayoutTable  # candidates: legal, supported, predicted to fit
    predicted: np.ndarray  # tokens/s/GPU per candidate under the current calibration
    keys: list[str]  # layout_key per candidate
    tried: set[str]
    history: list[TrialRecord] = field(default_factory=list)
    sigma: np.ndarray | float = 0.10  # per-candidate relative uncertainty of `predicted`
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    breakdown: Callable[[int], Prediction] | None = None  # candidate i's predicted breakdowns
    funnel: list[tuple[str, int]] = field(default_factory=list)  # the space's pruning funnel
    # the residual model behind `predicted` and `sigma` (search/residual.py): posterior correlations
    # between candidates for batch proposals; None when the caller has none
    residual: Any = None
    noise: float = 0.02  # trial-to-trial noise: a gain below it is not a win
    trial_steps: int | None = None  # timed steps per trial (default: the workload's), for GPU-hour costs
    # candidates set aside: predicted to need as much memory as a trial that ran out (search/candidates.py)
    walled: set[str] = field(default_factory=set)
    # trials running now (--parallel): not open, and a planner with a batch rule believes them at their prediction
    pending: set[str] = field(default_factory=set)

    def prediction(self, i: int) -> Prediction:
        """Candidate i's prediction with its memory and step-time terms."""
        if self.breakdown is None:
            raise ValueError("this context carries no breakdowns")
        return self.breakdown(i)

    def untried(self) -> np.ndarray:
        """Candidates neither tried, running, nor set aside by the memory wall."""
        taken = self.tried | self.walled | self.pending
        return np.array([k not in taken for k in self.keys], dtype=bool)

    def pending_indices(self) -> list[int]:
        """Candidate indices of the trials running now."""
        return [i for i, k in enumerate(self.keys) if k in self.pending]

    def uncertainty(self) -> np.ndarray:
        """Per-candidate relative uncertainty: the prior far from measured layouts, smaller near them."""
        return np.broadcast_to(np.asarray(self.sigma, dtype=float), (len(self.keys),))


    def trial_cost(self) -> np.ndarray:
        """GPU-hours one trial of each candidate costs at its predicted speed."""
        from ..acquisition import trial_gpu_hours

        steps = self.trial_steps or self.workload.steps
        return trial_gpu_hours(self.predicted, self.workload.tokens_per_step, self.cluster.count, steps)

    def correlation(self, i: int) -> np.ndarray:
        """Every candidate's posterior correlation with candidate i: the residual model's when there is
        one, else the share of equal layout dimensions (a crude stand-in)."""
        if self.residual is not None and hasattr(self.residual, "correlation"):
            return self.residual.correlation(i)
        return similarity(self.table, self.table.row(i)) ** 2


def similarity(t: LayoutTable, lay: Layout) -> np.ndarray:
    """Share of layout dimensions equal to `lay`, per row of `t` (0..1)."""
    one = feature_columns(LayoutTable.from_layouts([lay]))
    cols = feature_columns(t)
    return np.mean([c == o[0] for c, o in zip(cols, one)], axis=0)


class Planner(ABC):
    name: str = "base"

    @abstractmethod
    def propose(self, ctx: PlanContext, k: int) -> list[Proposal]:
        """Up to k layouts to try next (fewer, or none, when it has nothing worth trying)."""

    def observe(self, record: TrialRecord) -> None:  # noqa: B027 - optional hook
        """Learn from a finished trial (the context also carries the full history)."""
