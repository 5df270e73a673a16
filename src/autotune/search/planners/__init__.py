"""Planners behind one interface: model (default), optuna, random; llm arrives in a later release."""

from __future__ import annotations

from ...errors import BadInput
from .base import PlanContext, Planner, Proposal, TrialRecord
from .model import ModelPlanner
from .random import RandomPlanner

__all__ = ["Planner", "PlanContext", "Proposal", "TrialRecord", "ModelPlanner", "RandomPlanner", "PLANNERS",
           "resolve_planner"]

PLANNERS = ("auto", "model", "optuna", "random", "llm")


def resolve_planner(name: str) -> tuple[str, str | None]:
    """The planner to run for a --planner value, and a note to print when it differs."""
    if name not in PLANNERS:
        raise BadInput(f"--planner {name!r}: choose one of {', '.join(PLANNERS)}")
    if name == "auto":
        return "model", "planner: model-guided (the LLM planner is not configured)"
    if name == "llm":
        raise BadInput("--planner llm is not available in this release (no LLM endpoint support yet); "
                       "use --planner model (default) or --planner optuna")
    return name, None
