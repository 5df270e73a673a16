"""`autotune recipes list|show|validate`: the leaderboard, one recipe, and recipe validation.

Recipes are read from ./recipes, then the repository's recipes/ (or the --dir given). `validate` prints
every problem with its field path and exits 2 when any recipe is invalid (schema errors, or derived
numbers that do not recompute).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich import box
from rich.table import Table

from ..catalog.registry import suggest
from ..errors import BadInput, ConfigError, UnknownName
from ..recipes import check_recipe, leaderboard, load_all, load_recipe, recipe_stem
from ..recipes.io import RecipeInvalid, find_recipes
from ..recipes.rank import caption
from ..recipes.schema import Recipe
from ..report.leaderboard import correctness_line
from ..words import count
from .common import regular_target
from .console import console, err_console, print_json

recipes_app = typer.Typer(
    name="recipes", help="Browse and validate OpenRecipes recipes (recipes/<model>/<gpu>/<name>.yaml).",
    no_args_is_help=True,
)

DIRS = typer.Option(None, "--dir", help="Recipe directory or file to read (repeatable); default ./recipes, then the repository's.")


def _load(dirs: Optional[List[Path]]):
    good, bad = load_all(list(dirs) if dirs else None)
    for exc in bad:
        err_console.print(f"warning: skipped {exc}", markup=False)
    return good


@recipes_app.command("list")
def list_recipes(
    model: Optional[str] = typer.Option(None, "--model", help="Only this model (e.g. Qwen3.5-122B-A10B)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Only this GPU kind (e.g. H200)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write the leaderboard as one offline HTML page "
                                        "in the OpenRecipes style (ranked table, then a block per recipe)."),
    dirs: Optional[List[Path]] = DIRS,
) -> None:
    """The leaderboard: recipes ranked by tokens/s per GPU, with $ / 1M tokens, GPUs, layout, date and author."""
    items = _load(dirs)
    _known_names(items, model, gpu)
    entries = leaderboard(items, model=model, gpu=gpu)
    if html is not None:
        _write_html(entries, html, model, gpu)
    if json_out:
        print_json([e.to_dict() for e in entries])
        return
    if not entries:
        console.print(f"no recipes{_which(model, gpu)}; `autotune recipes list` shows every recipe", markup=False)
        return
    pairs = {(e.recipe.model, e.recipe.gpu.type) for e in entries}
    one = len(pairs) == 1
    title = f"Training {entries[0].recipe.model} on {entries[0].recipe.gpu.type}" if one else "Recipes"
    t = Table(title=title, caption=caption(entries), caption_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("#", justify="right", no_wrap=True)
    if not one:
        t.add_column("Model / GPU")
    for col in ("Tokens/s\nper GPU", "$ / 1M\ntokens", "GPUs"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("Layout", min_width=20)
    t.add_column("Measured", no_wrap=True)
    t.add_column("Author", no_wrap=True)
    t.add_column("Status", no_wrap=True)  # a predicted recipe is not a measurement: say so beside its rank
    for e in entries:
        r = e.recipe
        cells = [f"#{e.rank}"] + ([] if one else [f"{r.model} / {r.gpu.type}"])
        cells += [f"{r.result.tokens_per_s_per_gpu:,.1f}", f"${r.result.usd_per_million_tokens:.2f}", str(r.gpu.count),
                  f"{r.layout.label}\n{r.layout.highlights}", r.result.measured.isoformat(), r.author.name,
                  r.status if r.status != "predicted" else "[yellow]predicted[/]"]
        t.add_row(*cells)
    console.print(t)


def _which(model: Optional[str], gpu: Optional[str]) -> str:
    """' for MODEL on GPU', ' for MODEL', ' for GPU' or '': the filter in words."""
    named = " on ".join(x for x in (model, gpu) if x)
    return f" for {named}" if named else ""


def _known_names(items, model: Optional[str], gpu: Optional[str]) -> None:
    """Refuse a filter that names no model or GPU at all: a typo must not read as 'no recipes yet'. A name a
    recipe uses is known even when the catalog lacks it (recipes may name models the catalog does not ship)."""
    from ..catalog import get_gpu, load_model, model_names

    for option, value, where in (("--model", model, "autotune models"), ("--gpu", gpu, "autotune gpus")):
        if value is not None and not value.strip():
            raise BadInput(f"{option} {value!r}: give a name (see `{where}`) or leave {option} out")
    if model is not None and model.lower() not in {r.model.lower() for _, r in items} | \
            {n.lower() for n in model_names()}:
        load_model(model)  # raises the catalog's UnknownName, with close names
    if gpu is not None and gpu.lower() not in {r.gpu.type.lower() for _, r in items}:
        get_gpu(gpu)  # raises the catalog's UnknownName, with the GPU kinds


def _write_html(entries, html: Path, model: Optional[str], gpu: Optional[str]) -> None:
    from ..report.leaderboard import write_leaderboard

    if html.is_dir():
        raise ConfigError(f"--html {html}: is a folder; pass a file path such as {html / 'leaderboard.html'}")
    regular_target("--html", html)  # not a device, FIFO or socket (the write would replace it); a link: its target
    if not entries:
        raise ConfigError(f"no recipes{_which(model, gpu)}: nothing written to {html}; `autotune recipes list` shows what there is")
    write_leaderboard(entries, html)
    err_console.print(f"wrote {html} ({count(len(entries), 'recipe')})", markup=False)


def _find(name: str, dirs: Optional[List[Path]]) -> tuple[Path, Recipe]:
    p = Path(name)
    if p.is_file():
        return p, load_recipe(p)
    items = _load(dirs)
    for path, recipe in items:
        if recipe_stem(path).lower() == name.lower():
            return path, recipe
    hint = suggest(name, [recipe_stem(p) for p, _ in items])
    raise UnknownName(f"no recipe named {name!r}" + (f" (did you mean {hint}?)" if hint else "") + "; `autotune recipes list` shows them")


def _card(name: str, path: Path, r: Recipe) -> list[str]:
    res, lay = r.result, r.layout
    lines = [f"{name}  {res.tokens_per_s_per_gpu:,.1f} tokens/s/GPU  {lay.label}  {lay.highlights}", f"({path})", ""]
    gpus = f"{r.gpu.count} x {r.gpu.type} {r.gpu.memory_gb} GB ({r.gpu.instance}, {r.gpu.per_node} per node)"
    measured = res.measured.isoformat()
    if (res.steps_per_run, res.window) != (20, [5, 19]):  # the seed notes only a non-standard run
        measured += f", {res.steps_per_run}-step run scored over steps {res.window[0]}–{res.window[1]}"
    rows = [("Author", r.author.name + (f" ({r.author.url})" if r.author.url else "")), ("Status", r.status),
            ("GPUs", gpus), ("Layout", lay.summary), ("Tokens/s per GPU", f"{res.tokens_per_s_per_gpu:,.2f}"),
            ("$ / 1M tokens", f"${res.usd_per_million_tokens:.2f}"),
            ("MFU", f"{res.mfu:.1%} (N = {res.active_params.count:,} active parameters per token)"
             + (f"; {res.mfu_note}" if res.mfu_note else ""))]
    if res.step_time_cv_percent is not None:
        rows.append(("Step-time CV", f"{res.step_time_cv_percent:.2f}%"))
    c = r.correctness.convergence
    rows.append(("Correctness", correctness_line(r.correctness.result, r.correctness.summary)))
    rows.append(("Convergence check", f"correlation {c.correlation}, final loss difference {c.final_loss_difference}, "
                 f"{c.pointwise_failures} pointwise failures over {c.steps} steps" if c else "not run"))
    rows += [("Component test", f"{t.test}: {t.gpu}, {t.date.isoformat()}. Shape: {t.shape}. {t.detail}")
             for t in r.correctness.component_tests]
    rows.append(("Measured", measured))
    if res.gpu_hours is not None:
        rows.append(("GPU-hours", f"{res.gpu_hours:g}"))
    d = r.workload.dataset
    if d is not None:
        rows.append(("Rows", f"{d.build.name} (rows_sha256 {d.rows_sha256})"))
    lines += [f"{k:<18} {v}" for k, v in rows]
    lines += ["", "Stack"] + [f"  {k.replace('_', ' '):<18} {v}" for k, v in r.stack.model_dump().items()]
    lines += ["", "Environment"] + [f"  {k}={v}" for k, v in r.env.items()]
    lines += ["", "Command", r.run.rstrip("\n")]
    if r.notes:  # the search's rationale, and what the model needs beyond its MODEL_ARGS (launch.model_notes)
        lines += ["", "Notes"] + [f"  - {n}" for n in r.notes]
    return lines


@recipes_app.command("show")
def show(
    name: str = typer.Argument(..., help="Recipe name (e.g. attune-tp1-pp4-ep8-rc2) or path to a recipe file."),
    json_out: bool = typer.Option(False, "--json", help="Print the recipe as JSON."),
    dirs: Optional[List[Path]] = DIRS,
) -> None:
    """One recipe: numbers, layout, correctness, stack, environment, the command that runs it and its notes."""
    path, recipe = _find(name, dirs)
    if json_out:
        print_json(recipe.model_dump(mode="json"))
        return
    for line in _card(recipe_stem(path), path, recipe):
        console.print(line, markup=False, soft_wrap=True)


@recipes_app.command("validate")
def validate(
    paths: Optional[List[Path]] = typer.Argument(None, help="Recipe files or directories; default: all recipes."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object: each file's status, its errors and "
                                  "warnings (the exit code is the same: 2 when any recipe is invalid)."),
) -> None:
    """Validate recipes against the schema and recompute their derived numbers; exit 2 if any is invalid."""
    files = find_recipes(list(paths) if paths else None)
    missing = [p for p in (paths or []) if not p.exists()]
    if missing:
        raise ConfigError(f"{missing[0]}: no such recipe file or directory")
    if not files:
        raise ConfigError("no recipe files found: pass recipe files or directories (recipes/<model>/<gpu>/*.yaml)")
    bad, report = 0, []
    for f in files:
        try:
            found = check_recipe(load_recipe(f))
            errors = [str(p) for p in found if p.level == "error"]
            warnings = [str(p) for p in found if p.level != "error"]
            problems = [str(p) if p.level == "error" else f"warning: {p}" for p in found]
        except RecipeInvalid as exc:
            problems, errors, warnings = exc.problems, [str(p) for p in exc.problems], []
        bad += bool(errors)
        report.append({"path": str(f), "status": "invalid" if errors else "ok", "errors": errors, "warnings": warnings})
        if not json_out:
            console.print(f"{'invalid' if errors else 'ok':<8} {f}", markup=False, soft_wrap=True)
            for p in problems:
                console.print(f"  {p}", markup=False, soft_wrap=True)
    if json_out:
        print_json({"recipes": report, "checked": len(files), "invalid": bad})
    if bad:
        raise ConfigError(f"{bad} of {count(len(files), 'recipe')} invalid; fix the fields named above")


def register(app: typer.Typer) -> None:
    app.add_typer(recipes_app, name="recipes")
