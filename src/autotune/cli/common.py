"""Options and lookups shared by estimate, space and search: one place that turns flags into specs."""

from __future__ import annotations

import typer

from ..catalog import ClusterSpec, ModelSpec, Workload, load_model
from ..errors import BadInput
from ..layout import Layout, Recompute

__all__ = ["ModelOpt", "GpuOpt", "CountOpt", "PerNodeOpt", "SeqOpt", "BatchOpt", "GradsOpt", "PrecisionOpt", "JsonOpt",
           "resolve",
           "recipe_inputs"]

ModelOpt = typer.Option(..., "--model", "-m", help="Catalog name (see `autotune models`) or a path to a config.json.")
GpuOpt = typer.Option(..., "--gpu", "-g", help="GPU kind (H100, H200, H800, B200, B300, GB200, GB300, cpu; see "
                      "`autotune gpus`) or a GPU file path.yaml/.json.")
CountOpt = typer.Option(..., "--count", "-n", help="Number of GPUs (the world size).")
PerNodeOpt = typer.Option(None, "--gpus-per-node", help="GPUs per node (default: the GPU kind's, 8 for H100/H200/B200).")
SeqOpt = typer.Option(8192, "--seq-len", help="Tokens per training row (the seed: 8192).")
BatchOpt = typer.Option(128, "--global-batch", help="Rows per optimizer step (the seed: 128).")
GradsOpt = typer.Option("fp32", "--grads", help="Gradient buffers and their DP reduction: fp32 "
                        "(--accumulate-allreduce-grads-in-fp32, the seed) or bf16 (Megatron's default: half the "
                        "gradient memory and DP traffic).")
PrecisionOpt = typer.Option("bf16", "--precision", help="bf16, or a Transformer Engine FP8 recipe: fp8-delayed, "
                            "fp8-tensorwise (per-tensor current scaling), fp8-blockwise, mxfp8 (Blackwell).")
JsonOpt = typer.Option(False, "--json", help="Print one JSON object instead of tables.")


def resolve(model: str, gpu: str, count: int, gpus_per_node: int | None, seq_len: int, global_batch: int,
            grads: str = "fp32", precision: str = "bf16", fp8_param_gather: bool = False,
            **cluster_kw) -> tuple[ModelSpec, ClusterSpec, Workload]:
    if grads not in ("fp32", "bf16"):
        raise BadInput(f"--grads {grads!r}: choose fp32 (the seed) or bf16")
    m = load_model(model)
    cluster = ClusterSpec.of(gpu, count, gpus_per_node, **cluster_kw)
    workload = Workload(seq_len=seq_len, global_batch=global_batch, grads_fp32=grads == "fp32", precision=precision,
                        fp8_param_gather=fp8_param_gather)
    workload.check_gpu(cluster.gpu)
    return m, cluster, workload


def recipe_inputs(path: str) -> tuple[dict, ModelSpec, ClusterSpec, Workload, Layout]:
    """Model, cluster, workload and layout of a recipe file (validated; layout read from its run: block)."""
    from ..errors import UnknownName
    from ..recipes.convert import cluster_of, model_of, run_layout, workload_of
    from ..recipes.io import load_recipe

    recipe = load_recipe(path)
    model = model_of(recipe)
    if model is None:
        raise UnknownName(f"recipe {path!r}: model {recipe.model!r} is not in the catalog; see `autotune models`")
    doc = recipe.model_dump(mode="json")
    return doc, model, cluster_of(recipe), workload_of(recipe), run_layout(recipe)


def layout_options(layout: str, count: int, recompute: str | None, dispatcher: str, max_tokens: int | None,
                   micro_batch: int | None, seq_len: int, **flags) -> Layout:
    if max_tokens is None and micro_batch is None:
        max_tokens = seq_len  # the seed's dynamic batching: one row per micro-batch
    return Layout.parse(layout, world=count, recompute=Recompute.parse(recompute), dispatcher=dispatcher,
                        max_tokens_per_gpu=max_tokens, micro_batch_size=micro_batch, **flags)
