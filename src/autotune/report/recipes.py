"""A study's recipes (runs/<study>/recipes/*.yaml) as RecipeViews, with their correctness section.

A recipe that does not load is a line in the report's "not available" list, not a failure: the trials
are still worth showing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

__all__ = ["RecipeView", "load_recipes"]


@dataclass
class RecipeView:
    name: str
    path: Path
    status: str
    label: str
    tokens_per_s_per_gpu: float
    usd_per_million_tokens: float
    correctness: dict  # the recipe's correctness section as written (gates fill it)


def load_recipes(d: Path, missing: list[str], finished: bool = False) -> list[RecipeView]:
    """The study's recipes; `finished`: the search has ended (its summary is written), so none means none ran."""
    from ..recipes.io import load_recipe
    from ..recipes.rank import recipe_stem

    files = sorted(Path(d).glob("*.yaml")) if Path(d).is_dir() else []
    if not files:
        missing.append("recipes (none: no trial of this search succeeded)" if finished else
                       "recipes (none written yet: the search writes them when it ends)")
        return []
    out = []
    for f in files:
        try:
            r = load_recipe(f)
        except ConfigError as exc:
            missing.append(f"recipe {f.name}: {str(exc).splitlines()[0][:160]}")
            continue
        out.append(RecipeView(name=recipe_stem(f), path=f, status=r.status, label=r.layout.label,
                              tokens_per_s_per_gpu=r.result.tokens_per_s_per_gpu,
                              usd_per_million_tokens=r.result.usd_per_million_tokens,
                              correctness=r.correctness.model_dump(mode="json")))
    return out
