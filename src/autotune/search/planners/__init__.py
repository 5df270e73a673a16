"""Planners behind one interface, chosen by name from a registry (like the trial backends).

To add a planner, add one line to `PLANNERS` ("name": "module:Class", module relative to this package);
the class takes a `PlannerOptions`. Modules import lazily, so an optional dependency (optuna samplers,
the openai client) loads only when its planner is asked for.
"""

from __future__ import annotations

import importlib

from ...errors import BadInput
from .base import PlanContext, Planner, PlannerOptions, Proposal, TrialRecord

__all__ = ["Planner", "PlanContext", "PlannerOptions", "Proposal", "TrialRecord", "PLANNERS", "PLANNER_CHOICES",
           "get_planner", "planner_class", "resolve_planner", "check_llm_url"]

# name -> "module:Class". Extend here; nothing else needs to change.
PLANNERS: dict[str, str] = {
    "model": "model:ModelPlanner",
    "optuna": "optuna_planner:OptunaPlanner",
    "random": "random:RandomPlanner",
    "heuristic": "heuristic:HeuristicPlanner",  # the skill's rules alone (skill/SKILL.md)
    "llm": "llm:LLMPlanner",  # mixed with the model-guided planner; see llm.choose_planner for --planner auto
}
PLANNER_CHOICES = ("auto", *PLANNERS)


def planner_class(name: str) -> type[Planner]:
    if name not in PLANNERS:
        raise BadInput(f"--planner {name!r}: choose one of {', '.join(PLANNER_CHOICES)}")
    module, _, cls = PLANNERS[name].partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def get_planner(name: str, options: PlannerOptions | None = None) -> Planner:
    """A ready planner: `get_planner("optuna", PlannerOptions(seed=1))`."""
    return planner_class(name)(options or PlannerOptions())


def check_llm_url(url: str) -> str:
    """BadInput (one line) unless `url` is a usable http(s) endpoint without user:password; the message names
    AUTOTUNE_LLM_BASE_URL when the URL came from it, else --llm-base-url."""
    import os

    from ._llm_client import check_url

    env = "AUTOTUNE_LLM_BASE_URL"
    return check_url(url, env if os.environ.get(env) == url else "--llm-base-url")


def resolve_planner(name: str, options: PlannerOptions | None = None) -> tuple[str, str | None]:
    """The planner to run for a --planner value, and a note to print when it differs. `auto` and `llm`
    look at the LLM endpoint in `options` (llm.choose_planner: auto falls back to model-guided, llm
    without a usable endpoint is BadInput)."""
    if name not in PLANNER_CHOICES:
        raise BadInput(f"--planner {name!r}: choose one of {', '.join(PLANNER_CHOICES)}")
    if name in ("auto", "llm"):
        opts = options or PlannerOptions()
        if not opts.llm_base_url:  # decided without importing the client
            if name == "llm":
                raise BadInput("--planner llm: no LLM endpoint configured; pass --llm-base-url "
                               "(e.g. http://127.0.0.1:8080/v1) or use --planner model")
            return "model", "planner: model-guided (the LLM planner is not configured: --llm-base-url sets one)"
        check_llm_url(opts.llm_base_url)  # a malformed URL (or one with a password) is refused, even for auto
        from .llm import choose_planner

        return choose_planner(name, opts)
    return name, None
