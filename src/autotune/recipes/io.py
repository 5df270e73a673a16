"""Reading, writing and finding recipe files.

A recipe file is YAML in the seed's exact style: keys in schema order, 116-column folding, `run: |` as a
literal block, and two header comment lines naming the file's place in the repository. `dump_recipe`
reproduces a seed recipe byte for byte from its parsed model, so parse-then-dump never changes a file.
Writes are atomic (temp file in the same directory + os.replace): an interrupted write leaves the old
file whole. Validation errors name each field path (`result.tokens_per_s_per_gpu: ...`).

Recipes are looked up in `./recipes` (the working directory) and then in the repository's `recipes/`
next to this source tree (an editable install); `AUTOTUNE_RECIPES` (os.pathsep-separated) overrides both.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from ..errors import ConfigError
from ..fsutil import write_text_atomic
from .schema import Recipe

__all__ = [
    "RecipeInvalid",
    "parse_recipe",
    "load_recipe",
    "dump_recipe",
    "write_recipe",
    "write_text_atomic",
    "recipe_relpath",
    "recipe_header",
    "recipe_dirs",
    "find_recipes",
    "error_lines",
]

# The column at which the seed's recipes fold long strings (found by reproducing them byte for byte).
YAML_WIDTH = 116


class RecipeInvalid(ConfigError):
    """A recipe file that does not parse or validate; `.problems` holds 'field.path: message' lines."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid recipe: " + "; ".join(problems))


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(recipe)"


def error_lines(exc: ValidationError) -> list[str]:
    """One 'field.path: message' line per pydantic error."""
    lines = []
    for e in exc.errors(include_url=False):
        msg = e["msg"]
        if e["type"] not in ("missing", "extra_forbidden") and "input" in e and not isinstance(e["input"], (dict, list)):
            msg += f" (got {e['input']!r})"
        if e["type"] == "extra_forbidden":
            msg = "unknown field (not in schema/recipe.schema.yaml; check the spelling)"
        lines.append(f"{_loc(tuple(e['loc']))}: {msg}")
    return lines


def parse_recipe(text: str, source: str = "<recipe>") -> Recipe:
    """Parse and validate recipe YAML text; RecipeInvalid lists every problem with its field path."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RecipeInvalid(source, ["(yaml): " + " ".join(str(exc).split())]) from None
    if not isinstance(data, dict):
        raise RecipeInvalid(source, [f"(recipe): expected a mapping of fields, got {type(data).__name__}"])
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeInvalid(source, error_lines(exc)) from None


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such recipe file; `autotune recipes list` shows the recipes") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text (a binary file?); pass a recipe YAML") from None
    return parse_recipe(text, str(path))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-")


def recipe_relpath(recipe: Recipe, name: str) -> str:
    """Where a recipe lives in a recipes repository: recipes/<model lower>/<gpu lower>/<name>.yaml."""
    return f"recipes/{_slug(recipe.model)}/{_slug(recipe.gpu.type)}/{name}.yaml"


def recipe_header(recipe: Recipe, name: str) -> str:
    return (
        f"# {recipe_relpath(recipe, name)}\n"
        "# An OpenRecipes recipe; the fields are documented in schema/recipe.schema.yaml.\n"
    )


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings (the run block) as literal blocks, like the seed."""


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_recipe(recipe: Recipe, name: str | None = None) -> str:
    """The recipe as YAML in the seed's style; with `name`, preceded by the two header comment lines."""
    body = yaml.dump(
        recipe.model_dump(mode="python"),
        Dumper=_Dumper,
        sort_keys=False,
        width=YAML_WIDTH,
        allow_unicode=True,
        default_flow_style=False,
    )
    return (recipe_header(recipe, name) if name else "") + body


def write_recipe(recipe: Recipe, path: str | Path, name: str | None = None, make_parents: bool = True) -> Path:
    """Write a recipe atomically. `name` (default: the file name without a `rank-NN-` prefix) sets the header."""
    path = Path(path)
    name = name or re.sub(r"^rank-\d+-", "", path.stem)
    return write_text_atomic(path, dump_recipe(recipe, name), make_parents=make_parents)


def shipped_recipes() -> Path:
    """The recipes that ship with autotune (package data: src/autotune/data/recipes, linked from the
    repository's top-level recipes/), found the same way from a checkout or a wheel."""
    from importlib import resources

    return Path(str(resources.files("autotune") / "data" / "recipes"))


def recipe_dirs() -> list[Path]:
    """Directories searched for recipes, in order; only those that exist."""
    env = os.environ.get("AUTOTUNE_RECIPES")
    candidates = [Path(p) for p in env.split(os.pathsep) if p] if env else [Path.cwd() / "recipes", shipped_recipes()]
    seen: list[Path] = []
    for d in candidates:
        if d.is_dir() and d.resolve() not in [s.resolve() for s in seen]:
            seen.append(d)
    return seen


def find_recipes(paths: list[Path] | None = None) -> list[Path]:
    """Recipe files (*.yaml) under the given files/directories (default: recipe_dirs()), sorted, no duplicates."""
    out: list[Path] = []
    seen: set[Path] = set()
    for p in paths if paths is not None else recipe_dirs():
        p = Path(p)
        files = sorted(p.rglob("*.yaml")) if p.is_dir() else [p]
        for f in files:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out
