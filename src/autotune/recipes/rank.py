"""The leaderboard: recipes ranked by tokens/s per GPU, as the seed page ranks them.

Ties (equal tokens/s/GPU) go to the cheaper recipe, then by name, so the order is total and stable.
Loading collects invalid files instead of stopping, so one bad recipe does not hide the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..errors import ConfigError
from .io import find_recipes, load_recipe
from .schema import Recipe

__all__ = ["Entry", "leaderboard", "load_all", "caption", "recipe_stem"]


def recipe_stem(path: Path) -> str:
    """A recipe's name: its file name without `.yaml` and without a search's `rank-NN-` prefix."""
    stem = Path(path).stem
    head, _, rest = stem.partition("-")
    if head == "rank" and rest[:2].isdigit() and rest[2:3] == "-":
        return rest[3:]
    return stem


@dataclass(frozen=True)
class Entry:
    """One leaderboard row."""

    rank: int
    name: str
    path: Path
    recipe: Recipe

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.recipe.result.tokens_per_s_per_gpu

    def to_dict(self) -> dict:
        r = self.recipe
        return {
            "rank": self.rank,
            "name": self.name,
            "model": r.model,
            "gpu": r.gpu.type,
            "gpus": r.gpu.count,
            "tokens_per_s_per_gpu": r.result.tokens_per_s_per_gpu,
            "usd_per_million_tokens": r.result.usd_per_million_tokens,
            "mfu": r.result.mfu,
            "label": r.layout.label,
            "highlights": r.layout.highlights,
            "measured": r.result.measured.isoformat(),
            "author": r.author.name,
            "status": r.status,
            "path": str(self.path),
        }


def load_all(paths: list[Path] | None = None) -> tuple[list[tuple[Path, Recipe]], list[ConfigError]]:
    """Every recipe under `paths` (default: the recipe directories), and the errors of those that failed."""
    good: list[tuple[Path, Recipe]] = []
    bad: list[ConfigError] = []
    for f in find_recipes(paths):
        try:
            good.append((f, load_recipe(f)))
        except ConfigError as exc:
            bad.append(exc)
    return good, bad


def _matches(value: str, wanted: str | None) -> bool:
    return wanted is None or value.lower() == wanted.lower()


def leaderboard(
    items: Iterable[tuple[Path, Recipe]], model: str | None = None, gpu: str | None = None
) -> list[Entry]:
    """Recipes for `model` on `gpu` (case-insensitive; None: any), best tokens/s/GPU first."""
    chosen = [(p, r) for p, r in items if _matches(r.model, model) and _matches(r.gpu.type, gpu)]
    chosen.sort(key=lambda pr: (-pr[1].result.tokens_per_s_per_gpu, pr[1].result.usd_per_million_tokens, recipe_stem(pr[0])))
    return [Entry(i + 1, recipe_stem(p), p, r) for i, (p, r) in enumerate(chosen)]


def caption(entries: list[Entry]) -> str:
    """The seed's line under the title, when all entries share the workload; else just the ranking rule."""
    text = "Ranked by tokens/s per GPU"
    shapes = {(e.recipe.workload.row_tokens, e.recipe.workload.global_batch, e.recipe.workload.precision) for e in entries}
    if len(shapes) == 1:
        rows, batch, precision = shapes.pop()
        text += f" · {rows:,}-token rows · global batch {batch} · {precision.upper()}"
    return text
