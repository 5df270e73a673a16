"""Recipes from search candidates: the layout words, the name, the whole Recipe.

The run block comes from `autotune.launch.build_run_block` (shared with the slime trial backend).

`recipe_from_candidate` (called by the search driver) derives MFU and $ / 1M tokens from tokens/s, the
catalog's active-parameter count and the GPU's peak and price, so the checks recompute to the same numbers.
Without gate results the correctness section says "not run" everywhere (result, configuration), has no
component tests and `convergence: null`; such a recipe cannot be `verified`. The notes end with what the model
needs beyond its MODEL_ARGS (`autotune.launch.model_notes`: rope scaling the command line cannot set, such as
gpt-oss's YaRN or Kimi-K2's YaRN beta_fast).
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import replace

from pydantic import ValidationError

from ..catalog import ClusterSpec, ModelSpec, Workload, param_counts, recipe_precision
from ..cost.flops import mfu_of, usd_per_million_tokens
from ..errors import BadInput, ConfigError
from ..launch import SEED_ENV, build_run_block, loss_mask_for, model_notes, num, run_env, workload_args
from ..layout import Layout
from .io import error_lines
from .schema import Recipe
from .summary import highlights, summarize

__all__ = ["SEED_ENV", "NOT_RUN", "build_run_block", "workload_args", "recipe_name", "recipe_from_candidate", "num"]

NOT_RUN = {
    "result": "not run",
    "summary": "not run: autotune's correctness gates did not run for this layout",
    "reference": "None: no reference run.",
    "configuration": "not run",
    "component_tests": [],
    "convergence": None,
    "rules": "none applied",
}

def recipe_name(author: str, layout: Layout, workload: Workload | None = None, *, moe: bool = True) -> str:
    """The seed's names: author, the degrees of the label without DP, then what differs from the reference
    layout (full uniform recompute of 1 layer, alltoall): attune-tp1-pp4-ep8, -rc2, -flex, ..."""
    who = re.sub(r"[^a-z0-9]+", "-", author.lower()).strip("-") or "autotune"
    parts = [who] + [p.lower() for p in layout.label(moe).split() if not p.startswith("DP")]
    rc = layout.recompute
    if rc.granularity == "full" and (rc.method, rc.num_layers) != ("uniform", 1):
        parts.append(("rc" if rc.method == "uniform" else "rcb") + str(rc.num_layers))
    elif rc.granularity != "full":
        parts.append("rcsel" if rc.granularity == "selective" else "norc")
    if layout.dispatcher != "alltoall":
        parts.append(layout.dispatcher)
    if layout.tp > 1 and not layout.sp:
        parts.append("nosp")
    if layout.max_tokens_per_gpu is not None and workload is not None and layout.max_tokens_per_gpu != workload.seq_len:
        mt = layout.max_tokens_per_gpu
        parts.append(f"mt{mt // 1024}k" if mt % 1024 == 0 else f"mt{mt}")
    if layout.micro_batch_size is not None:
        parts.append(f"mbs{layout.micro_batch_size}")
    if layout.optimizer_offload:
        parts.append(f"off{round(layout.optimizer_offload * 100)}")
    if workload is not None and not workload.grads_fp32:
        parts.append("g16")  # bf16 gradient reduction (the seed reduces in fp32)
    return "-".join(parts)


def _layout_section(layout: Layout, workload: Workload, moe: bool) -> dict:
    rc = layout.recompute
    recompute = {"granularity": rc.granularity, "method": rc.method, "num_layers": rc.num_layers}
    if rc.modules:
        recompute["modules"] = list(rc.modules)
    return {
        "label": layout.label(moe), "summary": summarize(layout, workload, moe), "highlights": highlights(layout, workload, moe),
        "tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp, "cp": layout.cp, "ep": layout.ep, "etp": layout.etp,
        "dp": layout.dp, "sequence_parallel": layout.sp, "layer_split": list(layout.layer_split) or None,
        "max_tokens_per_gpu": layout.max_tokens_per_gpu, "rows_per_microbatch": layout.rows_per_microbatch(workload.seq_len),
        "recompute": recompute,
        "offload": {"optimizer_fraction": layout.optimizer_offload} if layout.optimizer_offload else None,
        "dispatcher": layout.dispatcher,
    }


LOW_PRECISION_CLASSES = ("fp8", "fp4")  # recipe precision classes whose GEMMs run above the BF16 peak MFU is taken on


def recipe_from_candidate(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    workload: Workload,
    *,
    status: str,
    tokens_per_s_per_gpu: float,
    step_time_cv_percent: float | None,
    gpu_hours: float | None,
    window: tuple[int, int],
    steps_per_run: int,
    stack: dict[str, str],
    measured: str,
    author: str = "autotune",
    gates: dict | None = None,
    dataset: dict | None = None,
    notes: list[str] | None = None,
    author_url: str | None = None,
    gpu_hours_note: str | None = None,
    mfu_note: str | None = None,
) -> Recipe:
    """A schema-valid Recipe for one candidate layout. `gates` is a correctness section (dict) from the gates;
    `dataset` a workload.dataset section when the rows are published ones (else null); `notes` come before the
    model's own (model_notes)."""
    if status == "verified" and gates is None:
        raise BadInput("status 'verified' needs gate results (gates=...); use 'measured' or 'predicted'")
    workload = replace(workload, steps=steps_per_run, window=(window[0], window[1]))
    moe = model.is_moe
    notes = [str(n) for n in notes or ()] + model_notes(model)
    n_active = param_counts(model).active
    tps = round(float(tokens_per_s_per_gpu), 2)  # as printed: the derived numbers below follow it (checks.py)
    gpu = cluster.gpu
    cls = recipe_precision(workload.precision)
    caveats = [mfu_note] if mfu_note else [
        *(["predicted by autotune's cost model, not measured"] if status == "predicted" else []),
        *([f"against the dense BF16 peak (the seed's definition); {cls.upper()} GEMMs run above that peak"]
          if cls in LOW_PRECISION_CLASSES else [])]
    result = {
        "tokens_per_s_per_gpu": tps,
        "usd_per_million_tokens": round(float(usd_per_million_tokens(gpu.usd_per_hour, tps)), 2) if tps > 0 else 0.0,
        "step_time_cv_percent": None if step_time_cv_percent is None else round(float(step_time_cv_percent), 2),
        "mfu": round(float(mfu_of(tps, n_active, gpu.bf16_tflops)), 4),
        "mfu_note": "; ".join(caveats) or None,
        "active_params": {"count": n_active, "source": model.source or model.name},
        "measured": _dt.date.fromisoformat(measured) if isinstance(measured, str) else measured,
        "steps_per_run": steps_per_run,
        "window": [window[0], window[1]],
        "window_tokens": workload.window_tokens,
        "runs": 0 if status == "predicted" else 1,
        "profiler": False,
        "gpu_hours": None if gpu_hours is None else round(float(gpu_hours), 2),
        "gpu_hours_note": gpu_hours_note or (None if gpu_hours is None else "GPUs x (trial start to end), including startup"),
    }
    data = {
        "schema_version": 1,
        "model": model.name,
        "gpu": {"type": gpu.name, "memory_gb": gpu.memory_gb_nominal, "count": cluster.count,
                "per_node": cluster.gpus_per_node, "instance": gpu.instance},
        "author": {"name": author, **({"url": author_url} if author_url else {})},
        "status": status,
        "stack": dict(stack),
        "workload": {"row_tokens": workload.seq_len, "rows": "SFT conversations", "global_batch": workload.global_batch,
                     "precision": recipe_precision(workload.precision), "dataset": dataset},
        "layout": _layout_section(layout, workload, moe),
        "result": result,
        "correctness": dict(gates) if gates is not None else dict(NOT_RUN),
        "env": run_env(layout, gpu),
        "patches": [],
        "run": build_run_block(layout, workload, cluster, loss_mask=_loss_mask(model, dataset), moe=moe),
        "notes": notes or None,
    }
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"recipe for {layout.label(moe)} is not schema-valid: " + "; ".join(error_lines(exc))) from None


def _loss_mask(model: ModelSpec, dataset: dict | None) -> str:
    build = (dataset or {}).get("build") or {}
    return build.get("loss_mask") or loss_mask_for(model.name)

