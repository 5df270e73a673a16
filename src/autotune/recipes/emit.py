"""Recipes from search candidates: the run block, the layout words, the name, the whole Recipe.

`build_run_block` writes the slime launch command in the seed's exact format and flag order. The layout
flags come from `layout_args` (Layout owns the mapping) and are woven between the fixed slime/SFT flags
and the workload's optimizer flags where the seed places them: parallel degrees, recompute and batching
after `--debug-train-only`; the distributed-optimizer flags after the optimizer; shared-expert overlap
after `--attention-backend`; cross-entropy fusion, the timeout, then a non-default dispatcher last.

`recipe_from_candidate` (called by the search driver) derives MFU and $ / 1M tokens from tokens/s, the
catalog's active-parameter count and the GPU's peak and price, so the checks recompute to the same numbers.
Without gate results the correctness section says "not run" everywhere (result, configuration), has no
component tests and `convergence: null`; such a recipe cannot be `verified`.
"""

from __future__ import annotations

import datetime as _dt
import re
import shlex
from dataclasses import replace

from pydantic import ValidationError

from ..catalog import ClusterSpec, ModelSpec, Workload, param_counts
from ..cost.flops import mfu_of, usd_per_million_tokens
from ..errors import BadInput, ConfigError
from ..layout import Layout, format_args, layout_args
from ..layout.args import precision_args
from .io import error_lines
from .schema import Recipe
from .summary import highlights, loss_mask_for, summarize

__all__ = ["SEED_ENV", "NOT_RUN", "build_run_block", "workload_args", "recipe_name", "recipe_from_candidate", "num"]

# The seed's environment: one CUDA connection keeps Megatron's communication/compute overlap ordered;
# expandable segments curb fragmentation; one inductor thread avoids a fork storm per rank; NVLS only
# where NVLink exists.
SEED_ENV = {
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
    "NCCL_NVLS_ENABLE": '$([ "$NVLINK_COUNT" -gt 0 ] && echo 1 || echo 0)',
}

NOT_RUN = {
    "result": "not run",
    "summary": "not run: autotune's correctness gates did not run for this layout",
    "reference": "None: no reference run.",
    "configuration": "not run",
    "component_tests": [],
    "convergence": None,
    "rules": "none applied",
}

# Layout flags placed after the optimizer hyperparameters, in the seed's order.
_OPTIMIZER = ("--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
              "--use-precision-aware-optimizer", "--optimizer-cpu-offload", "--optimizer-offload-fraction",
              "--overlap-cpu-optimizer-d2h-h2d")
_AFTER_BACKEND = ("--moe-shared-expert-overlap",)
_FUSION = ("--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl")
_LAST = ("--moe-token-dispatcher-type",)
_PLACED = _OPTIMIZER + _AFTER_BACKEND + _FUSION + _LAST


def num(x: float) -> str:
    """A number as the seed writes it: 1e-5, 0.1, 0.98 (no zero-padded exponent)."""
    return re.sub(r"e([+-])0*(\d)", lambda m: "e" + m.group(1).replace("+", "") + m.group(2), f"{x:g}")


def workload_args(workload: Workload) -> list[list[str]]:
    """The optimizer hyperparameters as the seed's two lines of tokens."""
    w = workload
    return [
        ["--optimizer", w.optimizer, "--lr", num(w.lr), "--lr-decay-style", "cosine", "--min-lr", num(w.min_lr)],
        ["--lr-warmup-fraction", num(w.warmup_fraction), "--weight-decay", num(w.weight_decay),
         "--adam-beta1", num(w.adam_beta1), "--adam-beta2", num(w.adam_beta2)],
    ]


def _lines(pairs: list[tuple[str, str | None]], together: bool = False) -> list[list[str]]:
    toks = [format_args([p]) for p in pairs]
    return ([[t for ts in toks for t in ts]] if toks else []) if together else toks


def build_run_block(
    layout: Layout,
    workload: Workload,
    cluster: ClusterSpec,
    *,
    loss_mask: str = "qwen3_5",
    moe: bool = True,
    env: dict[str, str] | None = None,
) -> str:
    """The recipe's `run:` block: env exports, then the slime command (SFT on pre-tokenized rows)."""
    if workload.task != "sft":
        raise BadInput(f"workload task {workload.task!r}: recipes emit slime SFT run blocks only; use task sft")
    if layout.world != cluster.count:
        raise BadInput(f"layout {layout.label()} is for {layout.world} GPUs but the cluster has {cluster.count}")
    env = SEED_ENV if env is None else env
    lay = layout_args(layout, "slime", workload.seq_len)
    pick = lambda flags: [p for p in lay if p[0] in flags]  # noqa: E731 - keeps layout_args' order
    gb = str(workload.global_batch)
    body: list[list[str]] = [
        ["--actor-num-nodes", str(cluster.nodes)],
        ["--actor-num-gpus-per-node", str(cluster.node_size)],
        ["${MODEL_ARGS[@]}"],
        ["--hf-checkpoint", '"$HF_CKPT"'],
        ["--ref-load", '"$TORCH_DIST"'],
        ["--rollout-function-path", "pretokenized_sft_rollout.generate_rollout"],
        ["--prompt-data", '"$SFT_DATA"'],
        ["--input-key", "messages"],
        ["--metadata-key", "metadata"],
        ["--num-rollout", str(workload.steps)],
        ["--rollout-batch-size", gb],
        ["--global-batch-size", gb],
        ["--loss-type", "sft_loss"],
        ["--loss-mask-type", loss_mask],
        ["--calculate-per-token-loss"],
        ["--disable-compute-advantages-and-returns"],
        ["--debug-train-only"],
        *_lines([p for p in lay if p[0] not in _PLACED]),
        *workload_args(workload),
        *_lines(pick(_OPTIMIZER)),
        ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"],
        ["--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32"] if workload.grads_fp32
        else ["--attention-softmax-in-fp32"],
        ["--attention-backend", "flash"],
        *_lines(precision_args(workload.precision, workload.fp8_param_gather), together=True),
        *_lines(pick(_AFTER_BACKEND)),
        *_lines(pick(_FUSION), together=True),
        ["--distributed-timeout-minutes", "30"],
        *_lines(pick(_LAST)),
    ]
    text = "".join(f"export {k}={v}\n" for k, v in env.items())
    note = ", with the load-balancing loss off" if moe and not workload.load_balancing_loss else ""
    text += f"\n# MODEL_ARGS: the model script's{note}\n"
    cmd = ["python3 -m <slime entry module> --async"] + ["  " + " ".join(_quote(t) for t in line) for line in body]
    return text + " \\\n".join(cmd) + "\n"


def _quote(tok: str) -> str:
    # The seed's literal shell words ("$HF_CKPT", ${MODEL_ARGS[@]}) pass through; values from a layout are quoted.
    return tok if tok.startswith(('"$', "${")) else shlex.quote(tok)


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
    author_url: str | None = None,
    gpu_hours_note: str | None = None,
    mfu_note: str | None = None,
) -> Recipe:
    """A schema-valid Recipe for one candidate layout. `gates` is a correctness section (dict) from the gates;
    `dataset` a workload.dataset section when the rows are published ones (else null)."""
    if status == "verified" and gates is None:
        raise BadInput("status 'verified' needs gate results (gates=...); use 'measured' or 'predicted'")
    workload = replace(workload, steps=steps_per_run, window=(window[0], window[1]))
    moe = model.is_moe
    n_active = param_counts(model).active
    tps = float(tokens_per_s_per_gpu)
    gpu = cluster.gpu
    result = {
        "tokens_per_s_per_gpu": round(tps, 2),
        "usd_per_million_tokens": round(float(usd_per_million_tokens(gpu.usd_per_hour, tps)), 2) if tps > 0 else 0.0,
        "step_time_cv_percent": None if step_time_cv_percent is None else round(float(step_time_cv_percent), 2),
        "mfu": round(float(mfu_of(tps, n_active, gpu.bf16_tflops)), 4),
        "mfu_note": mfu_note if mfu_note or status != "predicted" else "predicted by autotune's cost model, not measured",
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
                     "precision": workload.precision, "dataset": dataset},
        "layout": _layout_section(layout, workload, moe),
        "result": result,
        "correctness": dict(gates) if gates is not None else dict(NOT_RUN),
        "env": dict(SEED_ENV),
        "patches": [],
        "run": build_run_block(layout, workload, cluster, loss_mask=_loss_mask(model, dataset), moe=moe),
    }
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"recipe for {layout.label(moe)} is not schema-valid: " + "; ".join(error_lines(exc))) from None


def _loss_mask(model: ModelSpec, dataset: dict | None) -> str:
    build = (dataset or {}).get("build") or {}
    return build.get("loss_mask") or loss_mask_for(model.name)

