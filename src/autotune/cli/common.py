"""Options and lookups shared by estimate, space and search: one place that turns flags into specs."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from ..catalog import ClusterSpec, ModelSpec, Workload, load_model
from ..errors import ConfigError
from ..layout import Layout, Recompute, layout_from_args

__all__ = ["ModelOpt", "GpuOpt", "CountOpt", "PerNodeOpt", "SeqOpt", "BatchOpt", "JsonOpt", "resolve", "recipe_inputs"]

ModelOpt = typer.Option(..., "--model", "-m", help="Catalog name (see `autotune models`) or a path to a config.json.")
GpuOpt = typer.Option(..., "--gpu", "-g", help="GPU kind: H100, H200, B200 or cpu (see `autotune gpus`).")
CountOpt = typer.Option(..., "--count", "-n", help="Number of GPUs (the world size).")
PerNodeOpt = typer.Option(None, "--gpus-per-node", help="GPUs per node (default: the GPU kind's, 8 for H100/H200/B200).")
SeqOpt = typer.Option(8192, "--seq-len", help="Tokens per training row (the seed: 8192).")
BatchOpt = typer.Option(128, "--global-batch", help="Rows per optimizer step (the seed: 128).")
JsonOpt = typer.Option(False, "--json", help="Print one JSON object instead of tables.")


def resolve(model: str, gpu: str, count: int, gpus_per_node: int | None, seq_len: int, global_batch: int,
            **cluster_kw) -> tuple[ModelSpec, ClusterSpec, Workload]:
    m = load_model(model)
    cluster = ClusterSpec.of(gpu, count, gpus_per_node, **cluster_kw)
    return m, cluster, Workload(seq_len=seq_len, global_batch=global_batch)


def recipe_inputs(path: str) -> tuple[dict, ModelSpec, ClusterSpec, Workload, Layout]:
    """Model, cluster, workload and layout of a recipe file (layout read from its run: block)."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"recipe {path!r}: cannot read ({exc.strerror}); check the path") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"recipe {path!r}: not valid YAML ({exc}); run `autotune recipes validate {path}`") from None
    try:
        gpu, wl, res = doc["gpu"], doc["workload"], doc.get("result") or {}
        model = load_model(doc["model"])
        cluster = ClusterSpec.of(gpu["type"], int(gpu["count"]), int(gpu.get("per_node") or 8))
        lo, hi = res.get("window") or (5, 19)
        steps = int(res.get("steps_per_run") or 20)
        workload = Workload(seq_len=int(wl["row_tokens"]), global_batch=int(wl["global_batch"]), steps=steps,
                            window=(int(lo), int(hi)))
        layout = layout_from_args(doc["run"], world=cluster.count)
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"recipe {path!r}: missing or malformed field {exc}; run `autotune recipes validate {path}`") from None
    return doc, model, cluster, workload, layout


def layout_options(layout: str, count: int, recompute: str | None, dispatcher: str, max_tokens: int | None,
                   micro_batch: int | None, seq_len: int, **flags) -> Layout:
    if max_tokens is None and micro_batch is None:
        max_tokens = seq_len  # the seed's dynamic batching: one row per micro-batch
    return Layout.parse(layout, world=count, recompute=Recompute.parse(recompute), dispatcher=dispatcher,
                        max_tokens_per_gpu=max_tokens, micro_batch_size=micro_batch, **flags)
