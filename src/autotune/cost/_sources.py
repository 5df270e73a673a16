"""What each published source's runs kept in memory beyond their layout, read from the source's own scripts.

`source_settings(row, source, model, precision)` returns the Measurement keywords a published row implies about its
training stack (gradient reduction dtype, FP8 parameter all-gather, optimizer state bytes, the framework whose
weights, gradients and "selective" recompute apply: catalog.FRAMEWORKS) and the readings, for the row's provenance:

  - Megatron-Bridge perf: bf16 gradient reduction (`ddp.grad_reduce_in_fp32 = False` in every model's perf config,
    v0.2.0 to v0.4.2); FP8 parameter all-gather with current scaling and MXFP8 (scripts/performance/utils:
    fp8_param_gather=True).
  - Megatron-LM examples/llama (FP8 table): its script examples/llama/train_llama3_8b_h100_fp8.sh runs
    --grad-reduce-in-bf16 and --fp8-param-gather, and the README says its configuration follows NeMo's perf scripts.
  - NeMo 24.07 (FP8 rows): bf16 gradient sync, as NeMo-Framework-Launcher 24.07's FP8 performance config
    (launcher_scripts/conf/training/gpt3/175b_fp8.yaml: distributed_fused_adam grad_sync_dtype: bf16) and the
    Megatron-LM scripts that follow NeMo's; Nemotron-4 340B's optimizer state in BF16 with no master copy (the
    release's nemotron/nemotron_340b.yaml: distributed_fused_adam dtype: bf16; NeMo's MegatronBaseModel stores no
    master parameters when the optimizer dtype is the model's): 4 B per owned parameter (m, v).
  - NeMo Framework 25.07 rows: bf16 gradient reduction (NeMo v2.4.0, the 25.07 container's, scripts/performance/
    helpers.py set_precision_configs sets `grad_reduce_in_fp32 = False` for every perf run). The 25.04 rows (NeMo
    v2.3.0, whose helpers were not read) keep fp32.
  - Megatron-Bridge's Kimi-K2 perf recipes: Muon's optimizer state (fp32 master + one momentum, 8 B per parameter).
  - Megatron-Bridge's Nemotron 3 Super NVFP4 recipe keeps linears out of NVFP4 (Workload.bf16_layers_end,
    quant_overrides; cost/_quant.py).
  - torchtitan, NeMo AutoModel, the Llama 3 paper: their frameworks (cost/_state.py, cost/_sac.py); torchtitan rows
    that say "fp8 FSDP all-gather" gather parameters in FP8; torchtitan rows whose techniques do not name torch.compile
    ran eager (Workload.eager; the 2024-12 H100 page's "FSDP" rows beside "FSDP + torch.compile"); torchtitan's
    attention, and NeMo AutoModel's where its kernels say TorchSDPA or FlexAttn, runs on PyTorch's kernels
    (Workload.attention_kernel "sdpa": torchtitan's Llama calls F.scaled_dot_product_attention, whose flash backend
    is FlashAttention-2), not TE's fused attention.
Other sources: fp32 gradients (the seed's setting), Megatron's optimizer state.

`known_regression(source, model, gpu)` names a published row its publisher has itself filed as a performance
regression of that release (an issue in the publisher's tracker naming the model, the GPUs and the release), with
the issue: such rows are kept and predicted, but calibrate.fit_kinds leaves them out of the fit and
bench/throughput_accuracy.py reports them apart, beside the same source's other releases (_REGRESSIONS).
No torch, no ray.
"""

from __future__ import annotations

import re

__all__ = ["source_settings", "known_regression", "unpriced", "unpriced_note"]

_LAUNCHER = "NeMo-Framework-Launcher 24.07 launcher_scripts/conf/training"
# (source prefix, precision filter: "fp8" = any FP8/FP4 recipe, None = any; catalog model or None, settings, reading)
_RULES = (
    ("Megatron-Bridge perf", None, None, {"grads_fp32": False}, "bf16 gradient reduction (Megatron-Bridge perf recipes)"),
    ("Megatron-Bridge perf", "fp8-tensorwise mxfp8", None, {"fp8_param_gather": True},
     "FP8 parameter all-gather (Megatron-Bridge perf recipes)"),
    ("Megatron-LM examples/llama", "fp8", None, {"grads_fp32": False, "fp8_param_gather": True},
     "bf16 gradient reduction and FP8 parameter all-gather (examples/llama/train_llama3_8b_h100_fp8.sh: "
     "--grad-reduce-in-bf16 --fp8-param-gather)"),
    ("NeMo 24.07", "fp8", None, {"grads_fp32": False},
     f"bf16 gradient sync (NeMo's FP8 perf configs: {_LAUNCHER}/gpt3/175b_fp8.yaml grad_sync_dtype bf16, "
     "as Megatron-LM examples/llama, which follow NeMo's perf scripts)"),
    ("NeMo 24.07", None, "Nemotron-4-340B", {"optimizer_state_bytes": 4.0},
     f"BF16 Adam state without a master copy ({_LAUNCHER}/nemotron/nemotron_340b.yaml: distributed_fused_adam "
     "dtype bf16)"),
    ("Megatron-Bridge perf", "nvfp4", "NVIDIA-Nemotron-3-Super-120B-A12B",
     {"bf16_layers_end": 14, "quant_overrides": (("attention", "bf16"), ("latent_proj", "bf16"),
                                                 ("mamba_out_proj", "mxfp8"))},
     "the Super NVFP4 recipe's last 14 layers, attention and latent projections in BF16 and Mamba out_proj in MXFP8 "
     "(nemotron_3_super_bf16_with_nvfp4_mixed; scripts/performance/configs/nemotronh/te_quant.cfg); its MTP block "
     "in BF16 is not modelled"),
    # Kimi-K2's perf recipes train with Muon (scripts/performance argument_parser --optimizer_type, default "muon", v0.4.0
    # on; v0.6.0 perf_recipes/kimi build on recipes/kimi/kimi_k2.py kimi_k2_pretrain_config(optimizer_type="muon"):
    # dist_muon, Megatron's layer-wise distributed optimizer): an fp32 master copy and one momentum, 8 B per owned
    # parameter. Its Newton-Schulz iterations (about 5 x 3 GEMMs per weight matrix per step: ~2% of a step at these
    # batches) are not timed
    ("Megatron-Bridge perf", None, "Kimi-K2-Instruct", {"optimizer_state_bytes": 8.0},
     "Muon's state (the Kimi-K2 perf recipes' dist_muon): fp32 master + one momentum, 8 B per owned parameter; its "
     "Newton-Schulz work not timed"),
    ("NeMo Framework 25.07", None, None, {"grads_fp32": False},
     "bf16 gradient reduction (NeMo v2.4.0, the 25.07 container's: scripts/performance/helpers.py "
     "set_precision_configs sets grad_reduce_in_fp32 = False for every perf run)"),
    ("torchtitan", None, None, {"framework": "torchtitan"}, "torchtitan's FSDP2 state and per-op selective AC"),
    ("NeMo AutoModel", None, None, {"framework": "automodel"}, "NeMo AutoModel's FSDP2 state on a BF16 model"),
    ("Llama 3 Herd", None, None, {"framework": "llama3"},
     "Llama 3's FSDP: gradients and optimizer state sharded, parameters kept gathered"),
)


def source_settings(row: dict, source: str, model: str, precision: str) -> tuple[dict, list[str]]:
    """Measurement keywords (grads_fp32, fp8_param_gather, optimizer_state_bytes, framework, bf16_layers_end,
    quant_overrides) and readings."""
    out: dict = {"grads_fp32": True, "fp8_param_gather": False}
    read: list[str] = []
    for prefix, prec, name, settings, why in _RULES:
        if not source.startswith(prefix) or (name and name != model):
            continue
        if prec == "fp8" and precision == "bf16" or prec not in (None, "fp8") and precision not in prec.split():
            continue
        out.update(settings)
        read.append(why)
    notes = row.get("notes") or ""
    if source.startswith("torchtitan") and not re.search(r"torch\.compile", notes):
        out["eager"] = True  # the page's row names torch.compile where it was on (llama3_8b.toml at 9dec370: off)
        read.append("eager PyTorch: no torch.compile (the row's techniques do not name it)")
    if source.startswith("torchtitan") or (source.startswith("NeMo AutoModel")
                                           and re.search(r"TorchSDPA|FlexAttn", notes)):
        out["attention_kernel"] = "sdpa"
        read.append("attention on PyTorch's kernels (SDPA's flash backend, FlashAttention-2; FlexAttention runs at "
                    "about its speed), not TE's fused attention")
    if precision != "bf16" and re.search(r"fp8 fsdp all-gather", (row.get("precision") or "").lower()):
        out["fp8_param_gather"] = True
        read.append("FP8 parameter all-gather (the row says so)")
    return out, read


# (source prefix, releases, catalog model, GPU kinds, the publisher's own record of the regression). Qwen3-30B-A3B on
# H100 and B200 in containers 25.11 and 26.02: NVIDIA-NeMo/Megatron-Bridge#1998 "[Regression] Low QWEN3 30B B200 and
# H100 performance with dropless" (2026-01-20: "the perf in 25.11 is 2X slower than 25.09 ... We need to fix this in
# 26.02"); the 26.02 recipes (v0.3.0) still run it (H100: DeepEP + A2A overlap, B200: alltoall), the 26.02.01 ones
# (v0.3.1) switch both to HybridEP (#2477, #2499). The page's own rows agree: H100 10,494 (25.09), 5,275 (25.11),
# 5,113 (26.02), 9,058 (26.02.01); B200 18,066, 9,299, 9,691, 26,695. The settings that differ (token drop, EP
# overlap, dispatcher) are read (cost/_presets.py), but the model predicts them within a few % of each other.
_REGRESSIONS = (
    ("Megatron-Bridge perf", ("25.11", "26.02"), "Qwen3-30B-A3B", ("H100", "B200"),
     "known regression: NVIDIA-NeMo/Megatron-Bridge#1998 (dropless Qwen3 30B on H100 and B200 2x slower than "
     "25.09's token-dropping runs; fixed in 26.02.01 by the HybridEP recipes, #2477 H100, #2499 B200)"),
    # gpt-oss in container 26.06.01: NVIDIA-NeMo/Megatron-Bridge#5028 "[bug] 26.06.01 GPT-OSS 50% Performance Drop"
    # (2026-07-22: the container upgrade from 26.06.00, no other config change, 421.1 -> 627.3 ms per iteration on the
    # GPT-OSS 20B MXFP8 GB200 script). The page's 120B rows of the same printed layout agree: GB300 33,166 (26.06),
    # 20,288 (26.06.01), 33,024 (26.08); GB200 28,947, 18,304, 28,672. Only GB200 and GB300 ran it in 26.06.01.
    ("Megatron-Bridge perf", ("26.06.01",), "gpt-oss-120b", ("GB200", "GB300"),
     "known regression: NVIDIA-NeMo/Megatron-Bridge#5028 (GPT-OSS about 1.5x slower in container 26.06.01 than "
     "26.06.00 with no config change; 26.08 measures the 26.06 speed again)"),
)


# catalog models whose rows the time model reads but cannot yet price: predicted, reported and kept out of the fit,
# which would otherwise bend the factors every other model of their GPUs shares. DeepSeek-V4: its sparse attention
# (the compressor, the indexer, its top-k and its KL loss) and its hyper-connections are priced by their FLOPs (which
# agree with Megatron-Bridge's count: 90.8 GFLOP per token on its GB200 row, ours 91.2 with the MTP block) and saved
# bytes alone, and its three published rows run 24-36% slower than that; GB300 measures 6% over GB200 where the
# model, as for DeepSeek-V3 (measured +28%, predicted +26%), says 29%: the missing cost is not compute.
_UNPRICED = {
    name: "kept out of the fit: DeepSeek-V4's sparse attention (compressor, indexer, top-k, its KL loss) and "
          "hyper-connections are priced by their FLOPs and saved bytes alone, and its measured rows run well below "
          "that (a cost that is not compute: GB300 gains 6% over GB200 where the model says 29%)"
    for name in ("DeepSeek-V4-Flash", "DeepSeek-V4-Pro")}


# what a user of estimate / space / search is told about such a model's predictions
_UNPRICED_NOTE = {
    name: f"{name}: part of its step (DeepSeek-V4's sparse attention and hyper-connections) is priced by FLOPs and "
          "bytes alone; its published runs (128 GB200 / GB300) measured 24-36% below the model's tokens/s: read "
          "the predictions as an upper bound (their ranking of layouts is still the model's best)"
    for name in _UNPRICED}


def unpriced(model: str) -> str:
    """Why `model`'s rows stay out of the calibration fit (the time model lacks a cost they show), or ""."""
    return _UNPRICED.get(model, "")


def unpriced_note(model: str) -> str:
    """The note estimate, space and search print for such a model's predictions, or ""."""
    return _UNPRICED_NOTE.get(model, "")


def known_regression(source: str, model: str, gpu: str) -> str:
    """The publisher's record that this row measured a performance regression of its release, or ""."""
    m = re.match(r"Megatron-Bridge perf (?:archive|summary):(\S+)", source)
    release = m.group(1) if m else ""
    for prefix, releases, name, gpus, why in _REGRESSIONS:
        if source.startswith(prefix) and release in releases and model == name and gpu in gpus:
            return why
    return ""
