"""Argument lists the configuration gate compares: from a command line, a run block or a recipe.

`parse_arguments(cmd)` reads `--flag [values...]` and `export NAME=value` lines into an ordered
{argument: value} mapping (a switch's value is None; the last occurrence wins, as with argparse, so a
dispatcher set after MODEL_ARGS overrides the model script's). `recipe_arguments(recipe)` is a recipe's
full argument list: its env, its run block with slime's MODEL_ARGS for the model spliced in where the run
block expands them (with the load-balancing loss the recipe states), and the precision flag its workload
implies. Positional words (the entry module, shell placeholders) are not arguments and are skipped.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Iterable, Mapping

from ..errors import ConfigError
from ..layout.args import format_args, precision_switches

__all__ = ["MODEL_ARGS", "parse_arguments", "recipe_arguments", "candidate_arguments", "precision_arguments"]

MODEL_ARGS = "${MODEL_ARGS[@]}"


def precision_arguments(precision: str) -> list[str]:
    """Megatron's precision switches (slime passes them through) for a recipe's precision class or a workload
    precision (layout/args.precision_switches): filled in where the run block names none of its own."""
    return format_args(precision_switches(precision))


def _split(cmd: str) -> tuple[dict[str, str], list[str]]:
    """Export lines (kept raw: their values are shell expressions) and the command's tokens."""
    env: dict[str, str] = {}
    rest: list[str] = []
    for line in cmd.replace("\\\n", " ").splitlines():
        s = line.strip()
        if s.startswith("export ") and "=" in s:
            name, _, value = s[len("export "):].partition("=")
            env[name.strip()] = value.strip()
        else:
            rest.append(line)
    try:
        tokens = shlex.split("\n".join(rest), comments=True)
    except ValueError as exc:
        raise ConfigError(f"command line: {exc}; check its quotes") from None
    return env, tokens


def parse_arguments(cmd: str | Iterable[str] | Mapping[str, str | None],
                    model_args: list[str] | None = None) -> dict[str, str | None]:
    """{argument: value} of a command (a run block / command string, a token list, or a mapping as is).
    `model_args`, when given, replaces the run block's ${MODEL_ARGS[@]}."""
    if isinstance(cmd, Mapping):
        return dict(cmd)
    if isinstance(cmd, str):
        env, tokens = _split(cmd)
    else:
        env, tokens = {}, [str(t) for t in cmd]
    out: dict[str, str | None] = dict(env)
    expanded: list[str] = []
    for tok in tokens:
        if tok == MODEL_ARGS and model_args is not None:
            expanded.extend(model_args)
        else:
            expanded.append(tok)
    flag: str | None = None
    values: list[str] = []

    def close():
        if flag is not None:
            out.pop(flag, None)  # re-insert: the last occurrence decides the value and the order
            out[flag] = " ".join(values) if values else None

    for tok in expanded:
        if tok.startswith("--"):
            close()
            flag, values = tok, []
        elif tok == MODEL_ARGS or flag is None:
            close()  # an unexpanded MODEL_ARGS or a positional word ends the current flag's values
            flag, values = None, []
        else:
            values.append(tok)
    close()
    return out


def recipe_arguments(recipe, *, model_args: list[str] | None = None) -> dict[str, str | None]:
    """The full argument list of a Recipe (or a recipe file path)."""
    from ..recipes.convert import model_args_of
    from ..recipes.io import load_recipe

    if isinstance(recipe, (str, Path)):
        recipe = load_recipe(recipe)
    if model_args is None:
        found = model_args_of(recipe)
        model_args = found[1] if found else None
    out: dict[str, str | None] = {k: str(v) for k, v in recipe.env.items()}
    out.update(parse_arguments(recipe.run, model_args))
    for tok_flag, value in parse_arguments(precision_arguments(recipe.workload.precision)).items():
        out.setdefault(tok_flag, value)
    return out


def candidate_arguments(model, cluster, layout, workload) -> dict[str, str | None]:
    """The full argument list a search candidate's recipe would carry (its env, its run block with slime's
    MODEL_ARGS spliced in, the precision flag), without building the recipe: what the search passes to
    run_gates for a candidate and for its reference layout."""
    from ..launch import AUX_LOSS_ON, build_run_block, loss_mask_for, run_env, slime_model_args

    run = build_run_block(layout, workload, cluster, loss_mask=loss_mask_for(model.name), moe=model.is_moe)
    margs = slime_model_args(model, aux_loss_coeff=AUX_LOSS_ON if workload.load_balancing_loss else 0.0)
    out: dict[str, str | None] = dict(run_env(layout, cluster.gpu))
    out.update(parse_arguments(run, margs))
    for flag, value in parse_arguments(precision_arguments(workload.precision)).items():
        out.setdefault(flag, value)
    return out
