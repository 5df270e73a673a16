"""The slime launch command (a recipe's `run:` block): env exports, the fixed SFT flags, the layout's flags
and the workload's optimizer flags, in the seed's exact format and flag order.

Shared by the recipes (recipes/emit.py writes it into a recipe) and the slime trial backend (which runs it
as a Ray Job), so neither imports the other. The layout flags come from `layout_args` (Layout owns the
mapping) and are woven between the fixed slime/SFT flags and the workload's optimizer flags where the seed
places them: parallel degrees, recompute, batching, token drop and activation offload after
`--debug-train-only`; the distributed-optimizer flags after the optimizer; the overlaps (shared expert, EP, TP)
and CUDA graphs after `--attention-backend`; cross-entropy fusion, the
timeout, then a non-default dispatcher last.
"""

from __future__ import annotations

import re
import shlex

from ..catalog import ClusterSpec, Workload
from ..errors import BadInput
from ..layout import Layout, format_args, layout_args
from ..layout.args import fp8_module_args, precision_args

__all__ = ["SEED_ENV", "FSDP_MAX_CONNECTIONS", "MANY_CONNECTIONS", "ENTRY_PLACEHOLDER", "run_env",
           "build_run_block", "workload_args", "num", "loss_mask_for"]

ENTRY_PLACEHOLDER = "<slime entry module>"  # what a launcher replaces with slime's entry point

# The seed's environment: one CUDA connection keeps Megatron's communication/compute overlap ordered;
# expandable segments curb fragmentation; one inductor thread avoids a fork storm per rank; NVLS only
# where NVLink exists.
SEED_ENV = {
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
    "NCCL_NVLS_ENABLE": '$([ "$NVLINK_COUNT" -gt 0 ] && echo 1 || echo 0)',
}

# Megatron FSDP overlaps its parameter gathers and gradient reduce-scatters on their own streams, which one CUDA
# connection would serialise: megatron-core asserts CUDA_DEVICE_MAX_CONNECTIONS != 1 with it, and its guide leaves
# the variable unset. 8 is CUDA's default, written out so that a launcher's own 1 (slime's test launcher sets it)
# does not win.
FSDP_MAX_CONNECTIONS = "8"
# Connections where overlapped work runs on streams of its own. EP overlap (--overlap-moe-expert-parallel-comm) runs
# one micro-batch's all-to-alls beside another's compute, which one connection serialises: Megatron's arguments.py
# says it "requires setting a larger CUDA_DEVICE_MAX_CONNECTIONS", and the recipes that run it set 32 (Megatron-LM
# examples/moe_recipes, TP2 on H100 included; Megatron-Bridge's perf recipes). Blackwell: run_env
MANY_CONNECTIONS = "32"


def run_env(layout: Layout, gpu=None) -> dict[str, str]:
    """The run block's (and the recipe's env:) variables for a layout on `gpu`: the seed's, with more than one CUDA
    connection under EP overlap, Megatron FSDP or on Blackwell, and TE's activation offload path for fine-grained
    offloading. One connection keeps TP and CP communication ordered before Blackwell (Megatron asserts it there);
    from Blackwell on that need is gone (arguments.py: "no longer exists since the Blackwell architecture") and every
    Megatron-Bridge perf recipe on B200, B300, GB200 and GB300 sets 32. Blackwell: the GPU has MXFP8 tensor cores."""
    env = dict(SEED_ENV)
    if layout.ep_overlap or (gpu is not None and gpu.mxfp8):
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = MANY_CONNECTIONS
    elif layout.fsdp:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = FSDP_MAX_CONNECTIONS
    if layout.offload_modules:  # Megatron asserts it for fine-grained offloading under TE >= 2.10 (arguments.py)
        env["NVTE_CPU_OFFLOAD_V1"] = "1"
    return env


# Layout flags placed after the optimizer hyperparameters, in the seed's order.
_OPTIMIZER = ("--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
              "--ckpt-format", "--use-precision-aware-optimizer", "--optimizer-cpu-offload",
              "--optimizer-offload-fraction", "--overlap-cpu-optimizer-d2h-h2d")
_AFTER_BACKEND = ("--moe-shared-expert-overlap", "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute",
                  "--tp-comm-overlap", "--cuda-graph-impl", "--cuda-graph-scope", "--no-check-for-nan-in-loss-and-grad",
                  "--moe-pad-experts-for-cuda-graph-inference", "--moe-paged-stash", "--moe-expert-rank-capacity-factor",
                  "--moe-paged-stash-buffer-size-factor-cuda", "--use-transformer-engine-op-fuser",
                  "--fine-grained-activation-offloading", "--offload-modules")
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
    env = run_env(layout, cluster.gpu) if env is None else env
    lay = layout_args(layout, "slime", workload.seq_len, moe=moe)
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
        *_lines(precision_args(workload.precision, workload.fp8_param_gather) + fp8_module_args(workload),
                together=True),
        *_lines(pick(_AFTER_BACKEND)),
        *_lines(pick(_FUSION), together=True),
        ["--distributed-timeout-minutes", "30"],
        *_lines(pick(_LAST)),
    ]
    text = "".join(f"export {k}={v}\n" for k, v in env.items())
    note = ", with the load-balancing loss off" if moe and not workload.load_balancing_loss else ""
    text += f"\n# MODEL_ARGS: the model script's{note}\n"
    cmd = [f"python3 -m {ENTRY_PLACEHOLDER} --async"] + ["  " + " ".join(_quote(t) for t in line) for line in body]
    return text + " \\\n".join(cmd) + "\n"


def _quote(tok: str) -> str:
    # The seed's literal shell words ("$HF_CKPT", ${MODEL_ARGS[@]}) pass through; values from a layout are quoted.
    return tok if tok.startswith(('"$', "${")) else shlex.quote(tok)



def loss_mask_for(model_name: str) -> str:
    """slime's --loss-mask-type for a model family (chat template of the tokenizer)."""
    name = model_name.lower()
    if name.startswith("qwen3.5"):
        return "qwen3_5"
    if name.startswith("qwen3"):
        return "qwen3"
    return "qwen"
