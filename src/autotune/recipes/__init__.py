"""Recipes: the OpenRecipes recipe format (schema), its files (io), the checks that recompute its derived
numbers, the leaderboard (rank), emission from search candidates (emit) and export (recipe YAML, slime
command, Megatron-core arguments, launch script).

Pure Python: no torch, no ray. The search driver calls `recipe_from_candidate` and `write_recipe`.
Public names load lazily from their modules, so `python -m autotune.recipes.schema` (the schema
generator) runs without the package importing that module first.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "checks": ["Problem", "check_recipe"],
    "convert": ["cluster_of", "layout_of", "run_layout", "workload_of"],
    "emit": ["recipe_from_candidate", "recipe_name"],
    "export": ["FORMATS", "launch_script", "megatron_args", "resolve_source", "slime_command"],
    "io": ["RecipeInvalid", "dump_recipe", "find_recipes", "load_recipe", "parse_recipe", "recipe_dirs",
           "recipe_relpath", "write_recipe", "write_text_atomic"],
    "rank": ["Entry", "leaderboard", "load_all", "recipe_stem"],
    "schema": ["Recipe", "schema_dict", "schema_yaml"],
    "summary": ["highlights", "summarize"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
