"""Recipes: the OpenRecipes recipe format (schema), its files (io), the checks that recompute its derived
numbers, the leaderboard (rank), emission from search candidates (emit) and export (recipe YAML, slime
command, Megatron-core arguments, launch script).

Pure Python: no torch, no ray. The search driver calls `recipe_from_candidate` and `write_recipe`.
"""

from .checks import Problem, check_recipe
from .convert import cluster_of, layout_of, run_layout, workload_of
from .emit import SEED_ENV, build_run_block, recipe_from_candidate, recipe_name
from .export import FORMATS, launch_script, megatron_args, resolve_source, slime_command
from .io import (
    RecipeInvalid,
    dump_recipe,
    find_recipes,
    load_recipe,
    parse_recipe,
    recipe_dirs,
    recipe_relpath,
    write_recipe,
    write_text_atomic,
)
from .rank import Entry, leaderboard, load_all, recipe_stem
from .schema import Recipe, schema_dict, schema_yaml
from .summary import highlights, summarize

__all__ = [
    "Problem",
    "check_recipe",
    "cluster_of",
    "layout_of",
    "run_layout",
    "workload_of",
    "SEED_ENV",
    "build_run_block",
    "recipe_from_candidate",
    "recipe_name",
    "FORMATS",
    "launch_script",
    "megatron_args",
    "resolve_source",
    "slime_command",
    "RecipeInvalid",
    "dump_recipe",
    "find_recipes",
    "load_recipe",
    "parse_recipe",
    "recipe_dirs",
    "recipe_relpath",
    "write_recipe",
    "write_text_atomic",
    "Entry",
    "leaderboard",
    "load_all",
    "recipe_stem",
    "Recipe",
    "schema_dict",
    "schema_yaml",
    "highlights",
    "summarize",
]
