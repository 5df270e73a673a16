"""A recipe's layout, workload and cluster as autotune's own objects (Layout, Workload, ClusterSpec).

Two readings of a recipe's layout exist and the checks compare them:
- `layout_of(recipe)`: the degrees, recompute, dispatcher, batching and offload from the `layout:` section's
  fields (the uneven layer split too); the options the section has no field for (precision-aware / distributed
  optimizer, Megatron FSDP, shared-expert overlap, TE cross-entropy fusion) from the `run:` block's flags, never
  from the summary's words.
  Sequence parallelism: the section records the *effective* value (false at TP 1); at TP 1 the requested
  flag is kept on, as the seed's `run:` blocks pass `--sequence-parallel` there.
- `run_layout(recipe)`: parsed from the `run:` command line with `layout_from_args`.

`workload_of` reads the section fields, and the optimizer hyperparameters from the run block (the only place
a recipe states them). Nothing here multiplies degrees: Layout does.
"""

from __future__ import annotations

import shlex
from dataclasses import fields
from pathlib import Path

from ..catalog import ClusterSpec, ModelSpec, Workload, load_model, precision_of_class
from ..errors import AutotuneError, BadInput
from ..layout import Layout, Recompute, layout_from_args
from ..layout.args import precision_from_args
from .schema import Recipe

__all__ = ["PHRASE", "layout_of", "run_layout", "workload_of", "cluster_of", "model_of", "model_args_of", "run_flags",
           "is_moe"]

# Summary phrases (written by recipes/summary.py); only the load-balancing one is read, and only when the
# run block does not set the loss itself (see load_balancing_of).
PHRASE = {
    "distributed_optimizer": "distributed optimizer",
    "precision_aware_optimizer": "precision-aware",
    "moe_shared_expert_overlap": "shared-expert overlap",
    "cross_entropy_fusion": "cross-entropy fusion",
    "load_balancing_on": "load-balancing loss on",
}

# Run-block flag -> Workload field, for the optimizer hyperparameters.
_WORKLOAD_FLAGS = {
    "--optimizer": "optimizer",
    "--lr": "lr",
    "--min-lr": "min_lr",
    "--lr-warmup-fraction": "warmup_fraction",
    "--weight-decay": "weight_decay",
    "--adam-beta1": "adam_beta1",
    "--adam-beta2": "adam_beta2",
}


def run_flags(run: str) -> dict[str, str | None]:
    """Every `--flag [value]` in a run block; the last occurrence wins, as with argparse."""
    tokens = shlex.split(run.replace("\\\n", " "), comments=True)
    out: dict[str, str | None] = {}
    for i, tok in enumerate(tokens):
        if tok.startswith("--"):
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            out[tok] = nxt if nxt is not None and not nxt.startswith("--") else None
    return out


def model_of(recipe: Recipe) -> ModelSpec | None:
    """The recipe's ModelSpec: the catalog's, else the config.json its active parameters were counted from (when that
    file is still there and describes the model the recipe names), else None."""
    try:
        return load_model(recipe.model)
    except AutotuneError:
        pass
    source = recipe.result.active_params.source
    if not source or source.startswith("catalog:") or not Path(source).exists():
        return None
    try:
        spec = load_model(source)
    except AutotuneError:
        return None
    return spec if spec.name == recipe.model else None


def is_moe(recipe: Recipe) -> bool:
    m = model_of(recipe)
    return m.is_moe if m is not None else recipe.layout.ep > 1


def layout_of(recipe: Recipe) -> Layout:
    """The Layout the `layout:` section describes, with the optimizer flags of the run block. Raises
    BadInput if it is not a layout."""
    s = recipe.layout
    flags = run_flags(recipe.run)
    rc = s.recompute
    return Layout(
        world=recipe.gpu.count,
        tp=s.tp, pp=s.pp, vpp=s.vpp, cp=s.cp, ep=s.ep, etp=s.etp,
        sequence_parallel=s.sequence_parallel or s.tp == 1,
        recompute=Recompute(rc.granularity, rc.method, rc.num_layers, tuple(rc.modules or ())),
        dispatcher=s.dispatcher,
        max_tokens_per_gpu=s.max_tokens_per_gpu,
        micro_batch_size=None if s.max_tokens_per_gpu is not None else s.rows_per_microbatch,
        distributed_optimizer="--use-distributed-optimizer" in flags,
        precision_aware_optimizer="--use-precision-aware-optimizer" in flags,
        optimizer_offload=s.offload.optimizer_fraction if s.offload else 0.0,
        moe_shared_expert_overlap="--moe-shared-expert-overlap" in flags,
        cross_entropy_fusion="--cross-entropy-loss-fusion" in flags,
        fsdp="--use-megatron-fsdp" in flags,
        # an uneven split of the wrong length is reported by the checks against PP x VPP, not raised here
        layer_split=tuple(s.layer_split) if s.layer_split and len(s.layer_split) == s.pp * s.vpp else (),
    )


def load_balancing_of(recipe: Recipe) -> bool:
    """Whether the MoE load-balancing loss is on: the run's --moe-aux-loss-coeff / load-balancing type
    when the run block sets them; the seed's run blocks take them from MODEL_ARGS, which the recipe does
    not spell out, and state the choice in the layout summary instead, so that is read last."""
    flags = run_flags(recipe.run)
    coeff, kind = flags.get("--moe-aux-loss-coeff"), flags.get("--moe-router-load-balancing-type")
    if kind == "none" or coeff is not None:
        try:
            return kind != "none" and float(coeff or 0) > 0
        except ValueError:
            raise BadInput(f"run: --moe-aux-loss-coeff {coeff!r} is not a number") from None
    return PHRASE["load_balancing_on"] in recipe.layout.summary


def model_args_of(recipe: Recipe) -> tuple[ModelSpec, list[str]] | None:
    """The recipe's model and slime's MODEL_ARGS for it, with the load-balancing loss the recipe states
    (launch.AUX_LOSS_ON when on); None for a model the catalog cannot load."""
    from ..launch import AUX_LOSS_ON, slime_model_args

    model = model_of(recipe)
    if model is None:
        return None
    return model, slime_model_args(model, aux_loss_coeff=AUX_LOSS_ON if load_balancing_of(recipe) else 0.0)


def run_layout(recipe: Recipe) -> Layout:
    """The Layout the `run:` command line sets (world from --actor-num-nodes x --actor-num-gpus-per-node)."""
    m = model_of(recipe)
    return layout_from_args(recipe.run, num_layers=m.num_layers if m is not None else None)


def workload_of(recipe: Recipe) -> Workload:
    """The Workload a recipe trains: rows, batch, steps and window from the sections, optimizer from the run."""
    w, r = recipe.workload, recipe.result
    kw: dict = dict(
        seq_len=w.row_tokens,
        global_batch=w.global_batch,
        precision=precision_of_class(w.precision),
        steps=r.steps_per_run,
        window=(r.window[0], r.window[1]),
        load_balancing_loss=load_balancing_of(recipe),
    )
    types = {f.name: f.type for f in fields(Workload)}
    flags = run_flags(recipe.run)
    kw["grads_fp32"] = "--accumulate-allreduce-grads-in-fp32" in flags
    if "--fp8-format" in flags or "--fp4-format" in flags:  # what Megatron runs; the section agrees or is stale
        kw["precision"], kw["fp8_param_gather"] = precision_from_args(flags)
        kw["fp8_attention"] = "--fp8-dot-product-attention" in flags
        kw["fp8_output_proj"] = "--fp8-output-proj" in flags
    for flag, value in flags.items():
        name = _WORKLOAD_FLAGS.get(flag)
        if name and value is not None:
            try:
                kw[name] = value if types[name] in (str, "str") else float(value)
            except ValueError:
                raise BadInput(f"run: {flag} {value!r} is not a number") from None
    return Workload(**kw)


def cluster_of(recipe: Recipe) -> ClusterSpec:
    """The cluster the recipe ran on (the GPU must be in the catalog)."""
    return ClusterSpec.of(recipe.gpu.type, recipe.gpu.count, recipe.gpu.per_node)
