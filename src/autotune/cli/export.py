"""`autotune export [RUN_DIR] [--rank N] [--out PATH] [--format recipe|slime|megatron|script]`.

Without --format, an --out ending in .sh gets the launch script and anything else the recipe.

Exports one recipe of a search (RUN_DIR/recipes/rank-NN-*.yaml; RUN_DIR defaults to the newest directory
under ./runs) or a recipe file: as recipe YAML, the slime command, Megatron-core arguments or a launch script.
Without --out it is printed (nothing is written outside runs/<study>/ unless --out says where); stderr then
names the place the recipe catalogue would keep it (recipes/<model>/<gpu>/<name>.yaml). A launch script
written with --out is executable. A recipe whose derived numbers do not recompute is refused (exit 2), as
`autotune recipes validate` would.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..errors import BadInput, ConfigError
from ..recipes import check_recipe, dump_recipe, load_recipe, recipe_relpath, recipe_stem, write_recipe
from ..recipes.export import FORMATS, contained_path, launch_script, megatron_args, resolve_source, slime_command
from ..recipes.io import write_text_atomic
from .common import output_file
from .console import err_console


def export(
    run_dir: Optional[str] = typer.Argument(
        None, help="Run directory of a search (default: the newest under ./runs), or a recipe file."
    ),
    rank: Optional[int] = typer.Option(None, "--rank", help="Which recipe of the run: 1 (the default) is the "
                                       "best. Only for a run directory, not a recipe file."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write it to this file (a launch script is made "
                                       "executable); without --out it is printed on stdout."),
    fmt: Optional[str] = typer.Option(
        None, "--format", help="recipe (YAML), slime (command), megatron (arguments), script (launch script). "
        "Default: script when --out ends in .sh, else recipe."),
) -> None:
    """Export the best (or --rank N) recipe of a search as a recipe, a command line or a launch script.

    Examples (the best recipe of the newest search as a launch script; the second of one study as YAML):
      autotune export --out launch.sh
      autotune export runs/my-study --rank 2 > second.yaml
    """
    if fmt is None:
        fmt = "script" if out is not None and out.suffix == ".sh" else "recipe"
    if fmt not in FORMATS:
        raise BadInput(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if rank is not None and run_dir is not None and Path(run_dir).is_file():
        raise BadInput(f"--rank {rank}: --rank picks a recipe of a study (a run directory such as runs/<study>), "
                       f"and {run_dir} is a recipe file; export it without --rank")
    src = resolve_source(run_dir, 1 if rank is None else rank)
    shown = _stable(src)  # runs/<study>/recipes/..., not the versioned folder it links to
    recipe = load_recipe(src)
    errors = [str(p) for p in check_recipe(recipe) if p.level == "error"]
    if errors:
        raise ConfigError(f"{shown}: not exported, the recipe is inconsistent: " + "; ".join(errors))
    name = recipe_stem(src)
    home = contained_path(recipe_relpath(recipe, name)) if fmt == "recipe" else None  # the catalogue's place
    # its folders may be new (stderr suggests that path); any other --out must name an existing folder
    new_folders = home is not None and out is not None and Path(out).resolve() == home.resolve()
    if out is not None:
        output_file("--out", out, new_folders=new_folders)
    if fmt == "recipe":
        if out is not None:
            write_recipe(recipe, out, name, make_parents=new_folders)
            err_console.print(f"wrote {out} (from {shown}); check it with `autotune recipes validate {out}`",
                              markup=False)
            return
        text = dump_recipe(recipe, name)
        hint = f"to keep it: --out {home} (the recipe catalogue's place for it)"
    elif fmt == "script":
        text = launch_script(recipe, name)
        if out is not None:
            write_text_atomic(out, text, mode=0o755, make_parents=False)
            err_console.print(f"wrote {out} (from {shown}); set the variables it names, then run it", markup=False)
            return
        hint = f"to keep it: --out {name}.sh (made executable)"
    else:
        text = slime_command(recipe) if fmt == "slime" else megatron_args(recipe, name)
        if out is not None:
            write_text_atomic(out, text, make_parents=False)
            err_console.print(f"wrote {out} (from {shown})", markup=False)
            return
        hint = None
    # Plain stdout, not rich: the text must come out byte for byte (no wrapping, no markup).
    sys.stdout.write(text)
    sys.stdout.flush()
    if hint:
        err_console.print(f"printed {fmt} from {shown}; {hint}", markup=False, soft_wrap=True)


def _stable(src: Path) -> Path:
    """The path to name for a search's recipe: runs/<study>/recipes/<file> (a link through runs/<study>/published)
    when it is the same file as `src` in the versioned .outputs-<n>/ folder a search publishes into (which the next
    publication replaces), else `src` as it is."""
    gen = src.parent.parent
    if src.parent.name != "recipes" or not gen.name.startswith(".outputs-"):
        return src
    stable = gen.parent / "recipes" / src.name
    try:
        return stable if stable.is_file() and stable.samefile(src) else src
    except OSError:
        return src


def register(app: typer.Typer) -> None:
    app.command("export")(export)
