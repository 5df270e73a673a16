"""Export a recipe: as its YAML, as the slime command, as Megatron-core arguments, or as a launch script.

The source is a search's run directory (`runs/<study>/recipes/rank-NN-<name>.yaml`, the newest directory
under ./runs by default) or a recipe file, so a published recipe exports the same way. The Megatron
arguments and the script are built from the layout the recipe's `run:` block sets (the most complete
reading of it: it carries every option), through `layout_args`, so nothing here maps degrees to flags.

The launch script is the run block made runnable under `set -euo pipefail`: the seed's placeholders
become checked variables (`<slime entry module>` -> $SLIME_ENTRY, `${MODEL_ARGS[@]}` from the sourced
$MODEL_ARGS_SCRIPT, and every "$VAR" the command reads must be set), and NVLINK_COUNT is counted when unset
because the seed's NCCL_NVLS_ENABLE reads it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from ..catalog.hardware import catalog_gpu
from ..errors import BadInput, ConfigError
from ..fsutil import published_dir
from ..launch import ENTRY_PLACEHOLDER, num
from ..launch.run_block import run_env
from ..layout import layout_args
from ..layout.args import MULTI_WORD, fp8_module_args, precision_switches
from .convert import is_moe, run_layout, workload_of
from .run_block import run_block_problems
from .schema import Recipe

__all__ = ["FORMATS", "SLIME_PLACEHOLDER", "resolve_source", "slime_command", "megatron_args", "launch_script",
           "contained_path"]

FORMATS = ("recipe", "slime", "megatron", "script")
SLIME_PLACEHOLDER = ENTRY_PLACEHOLDER


def resolve_source(run_dir: str | Path | None, rank: int = 1, runs_root: Path = Path("runs")) -> Path:
    """The recipe file to export: a recipe file as given, or RUN_DIR/recipes/rank-NN-*.yaml."""
    if rank < 1:
        raise BadInput(f"--rank {rank}: ranks start at 1")
    if run_dir is None:  # the newest study that has written recipes (a failed or running one may be newer)
        dirs = [d for d in runs_root.iterdir() if d.is_dir()] if runs_root.is_dir() else []
        if not dirs:
            raise BadInput(f"no run directory under ./{runs_root}: run `autotune search` first, or pass a run directory or recipe file")
        done = [d for d in dirs if any(((published_dir(d) or d) / "recipes").glob("rank-*.yaml"))]
        if not done:
            newest = max(dirs, key=lambda d: d.stat().st_mtime)
            raise BadInput(f"no study under ./{runs_root} has written recipes yet (the newest, {newest}, has none): "
                           "let a search finish, or pass a run directory or recipe file")
        run_dir = max(done, key=lambda d: d.stat().st_mtime)
    src = Path(run_dir)
    if src.is_file():
        return src
    if not src.is_dir():
        raise BadInput(f"{src}: no such run directory or recipe file")
    pub = published_dir(src) or src  # one output set, even while a search publishes a newer one
    found = sorted((pub / "recipes").glob(f"rank-{rank:02d}-*.yaml"))
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise BadInput(f"{src}/recipes has {len(found)} rank-{rank:02d} recipes; export one by its file path")
    have = sorted({p.name[:7] for p in (pub / "recipes").glob("rank-*.yaml")})
    if not have:
        raise BadInput(f"{src} has no recipes/rank-NN-*.yaml yet: the search writes them when it finishes")
    raise BadInput(f"{src}/recipes has no rank-{rank:02d} recipe; available: {', '.join(have)}")


def contained_path(relpath: str | Path, root: str | Path = ".") -> Path:
    """`root/relpath`, refused unless it stays inside root: a recipe's model or GPU name such as '..'
    (or a name with a separator) must not put the export elsewhere."""
    rel = Path(relpath)
    if rel.is_absolute() or any(part in ("", ".", "..") for part in rel.parts):
        raise ConfigError(f"export path {str(relpath)!r} leaves the target folder (a model or GPU name of '.' or "
                          f"'..'?); fix the recipe's names or pass --out")
    base = Path(root).resolve()
    dest = (base / rel).resolve()
    if base != dest and base not in dest.parents:
        raise ConfigError(f"export path {str(relpath)!r} resolves to {str(dest)!r}, outside {str(base)!r} "
                          f"(a symlink?); pass --out")
    return Path(root) / rel


def slime_command(recipe: Recipe) -> str:
    """The slime command line: the recipe's run block (env exports included), exactly as measured."""
    return recipe.run


def _model_array(recipe: Recipe) -> list[str]:
    """The recipe's model as a MODEL_ARGS=( ... ) bash array (slime's MODEL_ARGS, launch.slime_model_args, with the
    load-balancing loss the recipe states), one flag per line, after what the arguments cannot say (model_notes);
    none for a model the catalog cannot load."""
    from ..launch import model_notes
    from .convert import model_args_of

    found = model_args_of(recipe)
    if found is None:
        return []
    model, tokens = found
    lines = [f"# {model.name}'s architecture (slime's MODEL_ARGS for it)"
             + ("; --spec names slime's layer spec: slime_plugins must be importable" if "--spec" in tokens else "")]
    lines += [f"# note: {n}" for n in model_notes(model)]
    lines.append("MODEL_ARGS=(")
    for tok in tokens:
        if tok.startswith("--") or not lines[-1].startswith("  "):
            lines.append("  " + shlex.quote(tok))
        else:
            lines[-1] += " " + shlex.quote(tok)
    return lines + [")"]


def megatron_args(recipe: Recipe, name: str = "") -> str:
    """Megatron-core arguments for the recipe: the model's (MODEL_ARGS) and the layout's and workload's
    (MEGATRON_ARGS), as bash arrays."""
    lay, work = run_layout(recipe), workload_of(recipe)
    pairs = list(layout_args(lay, "megatron", work.seq_len, moe=is_moe(recipe), global_batch=work.global_batch))
    pairs += [
        ("--seq-length", str(work.seq_len)),
        ("--global-batch-size", str(work.global_batch)),
        ("--train-iters", str(work.steps)),
    ]
    pairs += precision_switches(work.precision, work.fp8_param_gather)  # --bf16 and the run block's FP8/FP4 recipe
    pairs += fp8_module_args(work)
    pairs += [
        ("--optimizer", work.optimizer), ("--lr", num(work.lr)), ("--lr-decay-style", "cosine"),
        ("--min-lr", num(work.min_lr)), ("--lr-warmup-fraction", num(work.warmup_fraction)),
        ("--weight-decay", num(work.weight_decay)), ("--adam-beta1", num(work.adam_beta1)),
        ("--adam-beta2", num(work.adam_beta2)),
        ("--attention-dropout", "0.0"), ("--hidden-dropout", "0.0"),
        *([("--accumulate-allreduce-grads-in-fp32", None)] if work.grads_fp32 else []),
        ("--attention-softmax-in-fp32", None),
        ("--attention-backend", "flash"), ("--calculate-per-token-loss", None),
        ("--distributed-timeout-minutes", "30"),
    ]
    if is_moe(recipe) and not work.load_balancing_loss:
        pairs += [("--moe-router-load-balancing-type", "none"), ("--moe-aux-loss-coeff", "0")]
    model_lines = _model_array(recipe)
    lines = [
        f"# Megatron-core arguments for {name or recipe.model}: {recipe.layout.label} on {recipe.gpu.count} x {recipe.gpu.type}.",
        "# Add checkpoint and data paths; pass both arrays: \"${MODEL_ARGS[@]}\" \"${MEGATRON_ARGS[@]}\"."
        if model_lines else "# Add the model's architecture arguments (slime's MODEL_ARGS), checkpoint and data paths.",
    ]
    lines += model_lines
    # the recipe's own value; one whose env names none gets what the run block sets for its layout and GPU (the
    # catalog's GPU of that name: a recipe's GPU name is never read as a file)
    connections = (recipe.env or {}).get("CUDA_DEVICE_MAX_CONNECTIONS") or \
        run_env(lay, catalog_gpu(recipe.gpu.type))["CUDA_DEVICE_MAX_CONNECTIONS"]
    if lay.ep_overlap:  # its all-to-alls run beside another micro-batch's compute on streams of their own
        lines.append(f"# EP overlap: launch with CUDA_DEVICE_MAX_CONNECTIONS={connections} (the recipe's env; "
                     "Megatron-LM's and Megatron-Bridge's recipes set 32): one connection serialises the overlap.")
    elif lay.fsdp:  # arguments.py asserts it: FSDP overlaps its gathers on more than one CUDA connection
        lines.append(f"# Megatron FSDP: launch with CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 (the recipe's env "
                     f"sets {connections}); Megatron refuses 1.")
    lines.append("MEGATRON_ARGS=(")
    for flag, value in pairs:
        vals = value.split(" ") if value is not None and flag in MULTI_WORD else ([value] if value is not None else [])
        lines.append("  " + " ".join([flag] + [shlex.quote(v) for v in vals]))
    return "\n".join(lines + [")"]) + "\n"


def _required_vars(run: str, env: dict[str, str]) -> list[str]:
    names = re.findall(r'"\$([A-Z_][A-Z0-9_]*)"', run)
    skip = set(env) | {"NVLINK_COUNT", "SLIME_ENTRY"}
    return [n for i, n in enumerate(names) if n not in skip and n not in names[:i]]


def launch_script(recipe: Recipe, name: str) -> str:
    """An executable bash script that runs the recipe (passes `bash -n`)."""
    bad = run_block_problems(recipe.run)
    if bad:  # never turn foreign commands into a script someone will run
        n, msg = bad[0]
        raise ConfigError(f"run block line {n}: {msg}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
    run = recipe.run.replace(SLIME_PLACEHOLDER, '"$SLIME_ENTRY"')
    need = _required_vars(run, recipe.env)
    head = [
        "#!/usr/bin/env bash",
        f"# {name}: {recipe.layout.label} ({recipe.layout.highlights}) on {recipe.gpu.count} x {recipe.gpu.type};",
        f"# {recipe.result.tokens_per_s_per_gpu:,} tokens/s/GPU, status {recipe.status}. Generated by `autotune export --format script`.",
        "# Set before running: SLIME_ENTRY (slime's training entry module, the recipe's <slime entry module>),",
        f"# MODEL_ARGS_SCRIPT (slime's model script for {recipe.model}, which defines the MODEL_ARGS array)"
        + (f", {', '.join(need)}." if need else "."),
        "set -euo pipefail",
        "",
        # No apostrophes in these messages: bash parses quotes inside "${VAR:?word}".
        ': "${SLIME_ENTRY:?set SLIME_ENTRY to the slime training entry module}"',
        ': "${MODEL_ARGS_SCRIPT:?set MODEL_ARGS_SCRIPT to the slime model script that defines MODEL_ARGS}"',
    ]
    head += [f': "${{{v}:?set {v} (see the recipe)}}"' for v in need]
    if "NVLINK_COUNT" in run:
        # The seed's NCCL_NVLS_ENABLE reads NVLINK_COUNT; count NVLink links when the caller has not.
        head.append("NVLINK_COUNT=\"${NVLINK_COUNT:-$(nvidia-smi topo -m 2>/dev/null | grep -o 'NV[0-9][0-9]*' | wc -l || true)}\"")
    head += ["# shellcheck source=/dev/null", 'source "$MODEL_ARGS_SCRIPT"', ""]
    return "\n".join(head) + "\n" + run

