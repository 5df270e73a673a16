"""The physics of the throughput model: unscaled time terms for every layout of a LayoutTable.

`microbatch_terms` gives seconds per micro-batch per pipeline stage for each MB term; _raw.py adds the host (CPU)
time per micro-batch, the overlap shares and the per-step pieces (DP traffic, optimizer, overhead); time.py
composes them into step times under calibrated factors. Every term is a closed form
over numpy columns: no per-layout Python loops. Shapes and why:
  - GEMMs run at gemm x width/(width + gemm_width) x rows/(rows + gemm_rows) of peak: narrow sides (TP-split
    hidden sizes, thin experts) and few rows (tokens per expert) waste tiles and waves. The routed experts use the
    same curve at their own shape (per-expert rows, and `expert_side`: both of an expert's sides cost, not only the
    narrowest, since each is a GEMM's output or depth in one of its passes), and every GEMM computes its output's
    last tile whole (`linear_pad`, GEMM_TILE: a hidden size of 2880 costs 1.044x); a grouped GEMM over G local experts
    loses `grouped` of one dense GEMM's speed when G is large (per-group tails), nothing when G = 1: it is one GEMM;
    and every local expert's GEMM is a kernel of its own that pays a fixed `expert_gemm_s` (launch gap, last-wave
    tail) that does not shrink on a faster GPU: small experts with few tokens each run far below peak.
  - a low-precision recipe runs the large-shape GEMM at its format's peak, but of what the shape loses only the
    operand traffic (`lowp_overhead_share`) shrinks, with the format's bytes (results stay BF16, weight gradients
    accumulate in FP32); besides its casts' bytes it pays one cast kernel per local expert (`quant_kernel_s`; three
    under current scaling, none under delayed scaling or NVFP4, whose grouped casts Transformer Engine fuses:
    GROUPED_CASTS): FP8 gains little on small-expert MoE models, as measured.
  - backward is 2x forward for GEMMs (1x, the data gradient only, for LoRA's frozen base), ~2.5x for flash
    attention (over each packed document, not the row, when rows are packed); full recompute re-runs the forward of
    every layer of a recompute region, with its TP and EP collectives; Megatron's selective recompute re-runs the
    forward of the modules it names (_selective.py); torchtitan's per-op "selective" re-runs what _sac.py says.
  - elementwise traffic: the saved activations' bytes, `mem_touch` times per pass at the HBM bandwidth; the routed
    experts' FFN-width share apart (`expert_memory`: its own calibrated factor, never below 1, _fit.WIDE_PRIOR).
  - collectives and the MoE all-to-all: _comm.py (NVLink inside a domain, the node's network share across, flex's
    one copy per remote domain, the hottest rank's routed load).
  - the host: PyTorch launches every kernel from Python; a layer's launches take `host_layer_s` (+ `host_moe_s`
    for an MoE block) per forward + backward whatever the GPU does. When the host is slower than the GPU the GPU
    waits (time.py takes the larger per micro-batch). CUDA graphs replay the captured scopes with one launch.
No torch, no ray.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..catalog import ClusterSpec, ModelSpec, Workload, recipe_precision
from ..catalog.model import FULL, SLIDING
from ..layout import LayoutTable
from ..layout.core import SELECTIVE_MODULES
from ._comm import (a2a_time, flex_spread, fused_grouped_mlp, group_bw, link_bandwidths, paged_stash, ring_bw,
                    routing_load)
from ._quant import linear_time_scale, lowp_copies
from ._sac import op_sac_recompute
from ._selective import selective_recompute
from .flops import stage_flops
from .layers import PARTS, fold_activations, layer_tables, stage_sums, stage_sums_by_pair, vocab_per_row
from ._offload import offloaded_per_token
from .memory import FP8_SAVED, MemoryCoefficients, saved_parts

__all__ = ["microbatch_terms", "GROUPED_CASTS", "cast_bytes", "weight_cast_bytes", "gemm_efficiency", "expert_side",
           "linear_pad", "attention_efficiency", "MB_TERMS", "STEP_TERMS", "TERM_MEANINGS", "DERIVED", "DEPS",
           "link_bandwidths", "OVERLAPS", "WINDOW"]

MB_TERMS = ("compute_dense", "compute_attention", "compute_linear_attention", "compute_experts", "compute_output",
            "recompute", "memory_bound", "expert_memory", "quantize", "tp_comm", "cp_comm", "ep_comm", "pp_p2p", "layer_overhead",
            "imbalance", "act_offload")
STEP_TERMS = MB_TERMS + ("host_bound", "bubble", "dp_comm", "optimizer", "step_overhead", "offload")
DERIVED = ("recompute", "imbalance")  # linear in other MB terms: they follow those terms' factors
# what each step term is, in a line (the estimate's breakdown shows it)
TERM_MEANINGS = {
    "compute_dense": "dense GEMMs: projections, MLPs, shared experts (forward + backward)",
    "compute_attention": "attention kernels (flash, sliding-window, MLA core)",
    "compute_linear_attention": "linear-attention and Mamba kernels",
    "compute_experts": "routed experts' GEMMs",
    "compute_output": "output layer and loss",
    "recompute": "forward work re-run for recomputation",
    "memory_bound": "HBM-bound elementwise work: norms, activations, rotary, permutes",
    "expert_memory": "routed experts' per-expert elementwise traffic",
    "quantize": "casts of linear inputs and gradients to the low-precision format (per expert where TE splits them)",
    "tp_comm": "tensor-parallel all-gathers / reduce-scatters left exposed",
    "cp_comm": "context-parallel attention exchange left exposed",
    "ep_comm": "expert dispatch and combine (all-to-all) left exposed",
    "pp_p2p": "pipeline sends and receives between stages",
    "layer_overhead": "kernel launch gaps and syncs per layer",
    "imbalance": "the busiest expert rank's extra tokens",
    "act_offload": "activation offload copies left exposed",
    "host_bound": "GPU waiting for the host to launch kernels",
    "bubble": "pipeline bubble: stages idle while the pipeline fills and drains",
    "dp_comm": "data-parallel gradient reduction and parameter gather left exposed",
    "optimizer": "optimizer step, and the step's weight cast to a low-precision format",
    "step_overhead": "fixed cost per step",
    "offload": "host optimizer step and PCIe copies of an offloaded optimizer",
}
assert set(TERM_MEANINGS) == set(STEP_TERMS)
DEPS = tuple(("recompute", k) for k in ("compute_dense", "compute_attention", "compute_linear_attention",
                                        "compute_experts", "memory_bound", "expert_memory", "quantize")) \
    + (("imbalance", "compute_experts"), ("imbalance", "ep_comm"))  # (derived, primary) pairs with a coefficient
# terms another micro-batch's (or the same layer's) compute can hide: the EP all-to-all (1F1B A2A overlap), the TP
# collectives (userbuffers under their GEMMs), the activation offload copies (copy engines beside compute)
OVERLAPS = ("ep_comm", "tp_comm", "act_offload")
WINDOW = {"ep_comm": ("compute_dense", "compute_attention", "compute_linear_attention", "compute_experts",
                      "memory_bound", "expert_memory", "quantize"),
          "tp_comm": ("compute_dense",),
          "act_offload": ("compute_dense", "compute_attention", "compute_linear_attention", "compute_experts")}

# share of each activation part that is a TE linear's input (quantised under FP8): the QKV / MLP / expert
# inputs whole; the activation output inside the MLP and shared-expert parts (half of those parts); the
# attention output (o_proj input) ~ a quarter of the q, k, v, o part
_QUANT_SHARE = {"attn_in": 1.0, "mlp_in": 1.0, "moe_perm": 1.0, "moe_act": 1.0, "mlp": 0.5, "shared": 0.5,
                "attn_core": 0.25}
QUANT_PARTS = np.array([_QUANT_SHARE.get(p, 0.0) for p in PARTS])
_CLAMP_UNTIMED = np.array([p != "moe_clamp" for p in PARTS], dtype=float)

# HBM bytes per element of a biased expert's fc2 output for the unfused `t + b * p` (BF16; the probs keep the
# router logits' dtype, BF16 unless --moe-router-dtype): forward b * p (write 2), the add (read 2 + 2, write 2),
# torch.cat (read 2, write 2); backward split's cat of t's gradient (read 2, write 2) and the mul's two
# broadcast gradients, grad * p and grad * b, each a product (read 2, write 2) and its reduction (read 2)
EXPERT_BIAS_BYTES = 12.0 + 16.0
# HBM bytes per element of a routed copy's fc1 output (the GLU's two halves, BF16) that Megatron's clamped quick-GeGLU
# (gpt-oss: activation_func_clamp_value 7) moves outside its fused kernel on the unfused expert path
# (fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl, core 0.16 to 0.19): forward, each half's clamp (read 2,
# write 2) and the torch.cat that joins them for the fused activation (read 2, write 2); backward, each clamp's
# gradient where(mask, grad, 0) (read the gradient and the input, write: 6) and the chunk's gradient joined by a cat
# (read 2, write 2). A recomputed moe_act (or moe) runs the forward's 8 again
CLAMP_BYTES = 8.0 + 10.0
_ACT_RECOMPUTED = (1 << SELECTIVE_MODULES.index("moe_act")) | (1 << SELECTIVE_MODULES.index("moe"))

# torchtitan without torch.compile (Workload.eager): HBM bytes per element, forward + backward, that its Llama's
# elementwise code moves op by op beyond a fused kernel's (torchtitan 9dec370; compile=false in llama3_8b.toml).
#  - RMSNorm (models/norms.py: `self._norm(x.float()).type_as(x) * self.weight`, _norm = x * rsqrt(x.pow(2).mean(-1)
#    + eps)): forward x.float() r2 w4, pow r4 w4, mean r4, x * rsqrt r4 w4, type_as r4 w2, * weight r2 w2 = 36 against
#    a fused norm's 4; backward through the same ops (the weight's grad product and sum 8, * weight 4, type_as 6, the
#    * rsqrt product and its row sum 24, mean's expand 4, pow_backward's self.pow(1), * 2 and * grad 28, the two x
#    paths' add 12, .float()'s 6) = 92 against 6. Per norm, on the hidden width: 32 + 86.
#  - rotary embedding (models/llama/model.py apply_rotary_emb: view_as_complex(x.float()) * freqs_cis,
#    view_as_real(...).type_as(x)): x.float() r2 w4, the complex product r4 w4, type_as r4 w2 = 20 against 4 each way.
#    On the q and k widths: 16 + 16.
#  - SwiGLU (FeedForward: w2(F.silu(w1(x)) * w3(x))): forward silu r2 w2, * r2 r2 w2 = 10 against 6; backward the
#    product's two grads 6 + 6 and silu_backward 6 = 18 against 10. On the FFN width: 4 + 8.
# The residual adds are single kernels either way; a recompute re-runs the forward share (the recompute term).
EAGER_NORM_BYTES, EAGER_ROPE_BYTES, EAGER_SWIGLU_BYTES = 32.0 + 86.0, 16.0 + 16.0, 4.0 + 8.0

# Attention on PyTorch's kernels (Workload.attention_kernel "sdpa": torchtitan, NeMo AutoModel's TorchSDPA /
# FlexAttn runs) against TE's fused attention: scaled_dot_product_attention's flash backend is FlashAttention-2, and
# TE runs cuDNN's Hopper kernels, which FlashAttention-3 matches. FlashAttention-3 (Shah et al. 2024, abstract)
# is "1.5-2.0x" faster than FlashAttention-2 on H100 in BF16/FP16: the midpoint. (FlexAttention runs at about
# FlashAttention-2's speed: PyTorch's FlexAttention post, ~90% forward and ~85% backward.) Measured against the
# calibration: fitted without the torchtitan rows, H100's attention factor was 0.75; with them, 1.67 (2.2x): one
# factor per GPU was absorbing two kernels. Blackwell's cuDNN kernels leave FlashAttention-2 further behind; the
# Hopper ratio is used there too (two torchtitan rows, GB200), an understatement.
SDPA_SLOWDOWN = 1.75


@lru_cache(maxsize=32)
def eager_tables(model: ModelSpec) -> np.ndarray:
    """Per layer (L, 2) extra HBM bytes per token that eager PyTorch moves (see EAGER_*_BYTES), as [sequence-sharded
    (the norms), head/FFN-sharded (rotary embedding, SwiGLU)]: for RMSNorm models with rotary softmax attention (not
    MLA) and dense gated MLPs, the layers torchtitan's Llama has; nothing elsewhere."""
    L, h = layer_tables(model).n_layers, model.hidden_size
    out = np.zeros((L, 2))
    if model.norm_bias or model.learned_positions or model.mla is not None:
        return out
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    for i in range(min(L, len(model.layer_types))):
        if model.layer_types[i] not in (FULL, SLIDING):
            continue
        out[i, 0] = EAGER_NORM_BYTES * model.norms_per_layer * h
        out[i, 1] = EAGER_ROPE_BYTES * (q + kv) * model.rotary_fraction
        if model.has_ffn(i) and not model.is_moe_layer(i) and model.gated_mlp:
            out[i, 1] += EAGER_SWIGLU_BYTES * model.ffn_hidden_size
    return out


def gemm_passes(workload: Workload) -> float:
    """GEMMs per linear per micro-batch, in forward's units: forward, data gradient and weight gradient (3); LoRA's
    frozen base weights need no weight gradient (2)."""
    return 2.0 if workload.lora else 3.0


def cast_bytes(workload: Workload, gpu, c) -> float:
    """HBM bytes per element of one cast to the recipe's format: the BF16 read and the low-precision copies'
    writes (`quant_bytes` counts two, `lowp_copies` says how many), plus per-tensor current scaling's amax read.
    NVFP4 stays at two copies' bytes: its two 4-bit copies with scales write ~1.1 B, but its casts also run the
    random Hadamard transform on the column-wise copy's input, which this byte count does not model apart."""
    copies = 2 if workload.fp4 else lowp_copies(workload, gpu)
    return c.quant_bytes - (2 - copies) + (c.amax_bytes if workload.amax_pass else 0.0)


def weight_cast_bytes(workload: Workload, gpu, c) -> float:
    """HBM bytes per linear weight a rank spends once per step putting its weights in the recipe's format (0 for
    BF16). MXFP8 parameters are gathered in BF16 and cast after the gather (fp8_utils.copy_tensors_to_quantized_params
    in the forward pre-hook); without --fp8-param-gather Transformer Engine casts the BF16 weights on the first
    micro-batch and keeps them for the rest of the step. Both are a full cast (`cast_bytes`). FP8 parameters
    gathered as FP8 only need their column-wise copy made from the row-wise one after the gather (read and write
    1 B each, fp8_utils.post_all_gather_processing): per-tensor recipes on Hopper and blockwise; per-tensor FP8 on
    Blackwell needs none."""
    if not workload.quantized:
        return 0.0
    if workload.precision == "mxfp8" or not workload.fp8_param_gather:
        return cast_bytes(workload, gpu, c)
    return 2.0 if lowp_copies(workload, gpu) == 2 else 0.0


def gemm_efficiency(c, width, rows):
    """Fraction of peak of a GEMM whose narrowest side is `width` and that has `rows` rows."""
    return c.gemm * width / (width + c.gemm_width) * rows / (rows + c.gemm_rows)


def expert_side(width, ffn, gated: bool = True):
    """The width an expert's GEMMs run at on gemm_efficiency's curve. Per FLOP a GEMM of sides M x N x K moves
    operand and result bytes in proportion to 1/M + 1/N + 1/K, and over forward, data and weight gradient each of an
    expert's two sides (the token width and the FFN width per ETP rank) is in turn the output's width and the depth:
    so both cost, the narrower more. fc1's FFN side is doubled by the GLU and holds 2/3 of the FLOPs (1/2 without a
    GLU), so the sides add as 1/width + (2/3)/ffn (1/width + 1/ffn); a width of 1/(that sum) lands on the curve where
    a dense GEMM's narrowest side would."""
    return 1.0 / (1.0 / width + (2.0 / 3.0 if gated else 1.0) / ffn)


# the output tile side of the large-GEMM kernels cuBLAS and CUTLASS run for these shapes (Hopper's warp-specialized
# 128 x 256 tiles, Blackwell's 2-SM 256-wide MMA) on a side of 4 such tiles or more; a narrower side (an ETP-split
# expert's FFN) takes whichever of 128 and 256 wastes less; a side under 128 is the width curve's (gemm_efficiency)
GEMM_TILE = 256


def tile_pad(dim):
    """Work a GEMM output side of `dim` costs over its useful work, the last tile being computed whole (1 where the
    side tiles evenly)."""
    d = np.asarray(dim, dtype=float)
    large = np.ceil(d / GEMM_TILE) * GEMM_TILE / d
    small = np.minimum(large, np.ceil(d / 128) * 128 / d)
    return np.where(d >= 4 * GEMM_TILE, large, np.where(d >= 128, small, 1.0))


def linear_pad(d_in, d_out=None):
    """A linear's three GEMMs, equal in FLOPs, each paying tile_pad on its output sides: forward tokens x d_out, data
    gradient tokens x d_in, weight gradient d_out x d_in (the token side is long: nothing lost there). `d_out` None:
    a side that tiles evenly (the dense layers' TP-split sides: heads x head dim, FFN / TP)."""
    a = tile_pad(d_in)
    b = 1.0 if d_out is None else tile_pad(d_out)
    return (a + b + a * b) / 3.0


def attention_efficiency(c, model: ModelSpec, mma_speedup: float = 1.0) -> float:
    """Flash attention's fraction of the BF16 peak at the model's head dimension. Per score the kernel runs 2 d (QK)
    + 2 d (PV) FLOPs on the tensor cores and one exp on the much slower special-function units, so the exp share
    shrinks as d grows: eff(d) = attention x (1 + x) / (1 + x 128 / d). FlashAttention-3's forward BF16 throughput on
    H100 (Shah et al. 2024, fig. 5, 16k tokens: ~497 / ~648 / ~756 TFLOP/s at d = 64 / 128 / 256) gives x = 0.42 from
    either ratio; `attention` is the d = 128 value. MLA's kernel runs at its query-key dimension. FP8 attention
    (`mma_speedup` > 1, fp8_attention_speedup) runs the matrix products faster and the exponentials as before:
    eff = attention x (1 + x) / (1 / mma_speedup + x 128 / d)."""
    d = (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim) if model.mla is not None else model.head_dim
    x = c.attention_exp
    return c.attention * (1 + x) / (1.0 / mma_speedup + x * 128.0 / max(d, 1))


def fp8_attention_speedup(workload, gpu, c) -> float:
    """How much faster attention's matrix products run under --fp8-dot-product-attention: the GPU's FP8 peak over its
    BF16 peak at an FP8 GEMM's achieved share (`fp8_gemm`); 1 without it."""
    if not workload.fp8_attention or gpu.fp8_tflops <= 0:  # (a GPU without FP8 is refused by Workload.check_gpu)
        return 1.0
    return gpu.fp8_tflops / gpu.bf16_tflops * c.fp8_gemm


# recipes whose grouped linears cast every expert's split in one fused kernel set, in the Transformer Engine releases
# the published rows ran: delayed scaling (multi_cast_transpose, TE 2.x) and NVFP4 (split_quantize_nvfp4_impl's group
# amax and cast, from TE 2.11, December 2025; NVFP4 recipes reached Megatron-Bridge in 26.x). Current scaling,
# blockwise FP8 and MXFP8 quantize one split at a time until TE 2.17's group_quantize (July 2026)
GROUPED_CASTS = ("fp8-delayed", "nvfp4")


# HBM bytes per element of a GEMM operand in each format, scales included (MXFP8: an E8M0 byte per 32; NVFP4: an
# E4M3 byte per 16), against BF16's 2: how much faster a shape-bound GEMM's operand traffic gets
OPERAND_BYTES = {"bf16": 2.0, "fp8": 1.0 + 1 / 32, "fp4": 0.5 + 1 / 16}


def _linear_s(passes, lin_peak, peak, c, eff, mix, fmt):
    """Seconds per FLOP of TE linears at efficiency `eff` (passes included): the large-shape GEMM at the recipe's
    peak (`mix`: linears it keeps in another format), plus what the shape loses. Of that loss (operand and result
    traffic) the operands, `lowp_overhead_share` of it, shrink with the format's bytes (OPERAND_BYTES); the BF16
    results and FP32 gradient accumulation stay (_coefficients.py)."""
    if lin_peak == peak:
        return passes / (peak * eff) * mix
    ideal = passes / (lin_peak * c.gemm)
    lost = passes / (peak * eff) - passes / (peak * c.gemm)
    r = lin_peak / peak  # the format's GEMM speed over BF16's; mix = q + (1 - q) r with q the FLOPs in the format
    q = np.clip((r - mix) / (r - 1.0), 0.0, 1.0) if r > 1 else 1.0
    ops = 1.0 - q * (1.0 - OPERAND_BYTES[fmt] / 2.0)
    share = c.lowp_overhead_share
    return ideal * mix + lost * (1.0 - share + share * ops)


def _compute(model, workload, cluster, t, c, fl, tokens, tok_share, lin_peak, peak, S, moe_stage):
    """Forward x 3 (forward + 2x backward) of each kind of work, per micro-batch per stage; the frozen linears of
    LoRA x 2 (forward + data gradient: no weight gradient, `gemm_passes`)."""
    h = model.hidden_size
    passes = gemm_passes(workload)
    n = len(t)
    tp, cp, ep, etp = (a[:, None].astype(float) for a in (t.tp, t.cp, t.ep, t.etp))
    rows = tokens / cp  # with SP the GEMMs see the gathered sequence of the CP shard
    # (the (n, 1) and scalar factors are multiplied first: one pass over each (n, S) array)
    mix = linear_time_scale(model, workload, t, S, cluster.gpu, c, lin_peak)  # linears the recipe keeps in BF16 / MXFP8
    fmt = recipe_precision(workload.precision)  # the GEMM format: bf16, fp8 or fp4
    dense_eff = gemm_efficiency(c, h / tp, rows)
    # every dense linear has the hidden size on one side (linear_pad): gpt-oss's 2880 and Nemotron 3 Nano's 2688
    # tile unevenly, every other catalog model's hidden size evenly
    mb = {"compute_dense": fl.dense * _linear_s(passes, lin_peak, peak, c, dense_eff, mix[0], fmt) * linear_pad(h),
          "compute_attention": fl.attention * (3.5 * (SDPA_SLOWDOWN if workload.attention_kernel == "sdpa" else 1.0)
                                               / (peak * attention_efficiency(c, model, fp8_attention_speedup(
                                                   workload, cluster.gpu, c)))),
          "compute_linear_attention": fl.linear_attention * (3 / (peak * c.linear_attention))
          if layer_tables(model).flops_linear_attn.any() else 0.0}
    if model.is_moe:
        e = model.moe
        copies = tokens * tok_share * e.top_k * etp  # routed token copies per GPU (ETP ranks share tokens)
        local = np.maximum(1.0, e.num_experts / ep)
        grouped = c.grouped + (1.0 - c.grouped) / local  # one local expert is one plain GEMM
        # fc1 (width -> GLU x FFN / ETP) holds GLU / (GLU + 1) of the FLOPs, fc2 (FFN / ETP -> width) the rest
        glu, f_rank, w = (2.0 if model.gated_mlp else 1.0), e.ffn_hidden_size / etp, e.width(h)
        exp_eff = grouped * gemm_efficiency(c, expert_side(w, f_rank, model.gated_mlp), copies / local)
        # each local expert's GEMMs are kernels of their own (fc1, fc2 forward, their dgrad and wgrad: 6 per MoE
        # layer per micro-batch; 4 without wgrad), each paying a fixed `expert_gemm_s` whatever the GPU's speed
        # (the fused grouped MLP is one kernel per GEMM for every local expert: no per-expert cost)
        per_expert = np.where(fused_grouped_mlp(model, workload, t)[:, None], 0.0, 2 * passes * c.expert_gemm_s * local)
        pad = (glu * linear_pad(w, glu * f_rank) + linear_pad(f_rank, w)) / (glu + 1.0)
        mb["compute_experts"] = (fl.experts * _linear_s(passes, lin_peak, peak, c, exp_eff, mix[1], fmt) * pad
                                 + moe_stage * per_expert)
    else:
        mb["compute_experts"] = 0.0
    # output layer GEMMs plus the loss: the logits cross HBM ~4 times in bf16 when TE fuses the
    # cross-entropy (write, softmax read, gradient write, gradient read), ~10 x 4 B unfused (fp32 copies)
    last = np.arange(S)[None, :] == (t.pp - 1)[:, None]
    vocab = vocab_per_row(model, t.tp).astype(float)[:, None]
    logit_bytes = np.where(t.ce_fusion, 8.0, 40.0)[:, None] * vocab / tp * rows
    loss = np.where(last, logit_bytes / (cluster.gpu.hbm_gbps * 1e9), 0.0)
    out_eff = gemm_efficiency(c, h, rows)
    mb["compute_output"] = loss + fl.output * (_linear_s(passes, lin_peak, peak, c, out_eff, 1.0, fmt)
                                               if workload.fp8_output_proj else passes / (peak * out_eff))
    return mb


def microbatch_terms(model: ModelSpec, workload: Workload, cluster: ClusterSpec, t: LayoutTable, c,
                     mcoef: MemoryCoefficients) -> tuple[dict[str, np.ndarray], dict[str, dict], np.ndarray]:
    """Seconds per micro-batch per stage of every primary MB term, the derived terms' recipes {derived term:
    {primary term: coefficient (n, S)}} (recompute, imbalance), and the share of the forward's launches re-run in backward (n, S)."""
    g = cluster.gpu
    peak = g.bf16_tflops * 1e12
    # TE linears (projections, MLPs, experts) run FP8 (or NVFP4) GEMMs under a low-precision recipe; attention's
    # core and the output layer stay BF16. `fp8_gemm` is the low-precision GEMM's achieved share of its peak
    # relative to BF16's; the peak is the recipe's format's (catalog.workload.QUANT).
    fp8 = workload.quantized
    scaled = {"fp8-blockwise": c.fp8_blockwise, "mxfp8": c.mxfp8_gemm}.get(workload.precision, 1.0)  # finer scales
    lin_peak = workload.linear_peak_tflops(g) * 1e12 * c.fp8_gemm * scaled if fp8 else peak
    lt = layer_tables(model)
    n, S = len(t), int(t.pp.max())
    h = model.hidden_size
    fl = stage_flops(model, workload, t)
    tokens = fl.tokens[:, None]
    tp, cp, ep, etp = (a[:, None].astype(float) for a in (t.tp, t.cp, t.ep, t.etp))
    sp = t.sp_eff[:, None]
    tok_share = 1.0 / (cp * np.where(sp, tp, 1.0))  # tokens on one GPU's sequence-parallel path
    L_stage = stage_sums(np.ones(lt.n_layers), t.pp, t.vpp, S, t.split)
    moe_stage = stage_sums(lt.is_moe.astype(float), t.pp, t.vpp, S, t.split)
    mb = _compute(model, workload, cluster, t, c, fl, tokens, tok_share, lin_peak, peak, S, moe_stage)

    # --- memory-bound traffic: norms, activations, rope, permutes, router softmax ---------------------
    # (a term no row of the table has is the scalar 0: 10^5 x 16 zeros cost as much as a real term)
    div = {"seq": tok_share, "tp": 1.0 / (cp * tp), "rep": tok_share, "exph": tok_share * etp, "expf": tok_share}
    # (a clamped GLU's second fc1-sized copy is memory, not traffic of its own: CLAMP_BYTES below prices its kernels)
    act = lt.act * _CLAMP_UNTIMED[None, :] if model.is_moe and model.moe.activation_clamp else lt.act
    per_pair, pair_of = stage_sums_by_pair(act, t.pp, t.vpp, S, t.split)  # per pair: no (n, S, P) table
    touch = 3 * c.mem_touch / (g.hbm_gbps * 1e9)
    act_bytes = fold_activations(per_pair, pair_of, {**div, "expf": 0.0}) * tokens
    mb["memory_bound"] = act_bytes * touch
    # the routed experts' FFN-width activations (fc1 output, activation output, per routed copy) apart: the work
    # around them (the weighted activation and its backward, the probs, FP8 padding per expert, the recomputed
    # moe_act) runs in many small per-expert kernels, and the calibration gives this term its own factor
    # (measured: one factor shared with the norms' and attention's traffic left small-hidden MoE models -- gpt-oss,
    # Qwen3-30B-A3B, Nemotron 3 -- over-predicted and large-hidden ones under-predicted)
    only_experts = dict.fromkeys(div, 0.0) | {"expf": div["expf"]}
    mb["expert_memory"] = fold_activations(per_pair, pair_of, only_experts) * tokens * touch if model.is_moe else 0.0
    stash = paged_stash(model, t)[:, None]
    if stash.any():
        # the paged stash: the saved expert activations are copied into the page pool in the forward and back in the
        # backward, one write and one read of them, plain HBM traffic; where TE's fused grouped MLP runs the
        # activation, its probs and its backward in the GEMMs' epilogues, no per-expert elementwise kernels remain
        copy = mb["expert_memory"] * (2.0 / (3 * c.mem_touch))
        mb["memory_bound"] = mb["memory_bound"] + np.where(stash, copy, 0.0)
        mb["expert_memory"] = np.where(fused_grouped_mlp(model, workload, t)[:, None], 0.0, mb["expert_memory"])
    if model.is_moe and model.moe.expert_bias:
        # biased routed experts (gpt-oss): Megatron's TEGroupedMLP builds fc2 with skip_bias_add=True and adds the
        # returned bias, weighted by each copy's routing prob, outside the GEMM in eager PyTorch, one local expert
        # at a time: torch.cat([t + b * p for t, b, p in zip(split(out), biases, split(probs))])
        # (moe/experts.py TEGroupedMLP._apply_bias, core_v0.15 to v0.17). Over every routed copy's fc2 output
        # that is EXPERT_BIAS_BYTES of HBM traffic per element, none of it a saved activation
        copies = tokens * tok_share * model.moe.top_k * etp
        mb["memory_bound"] = mb["memory_bound"] + moe_stage * copies * (
            EXPERT_BIAS_BYTES * model.moe.width(h) / (g.hbm_gbps * 1e9))
    if model.is_moe and model.moe.activation_clamp:
        # the clamp runs outside the activation's fused kernel on the unfused expert path; TE's fused grouped MLP
        # (the paged stash's) clamps inside its own op (experts.py _make_fused_ops: limit=clamp)
        copies = tokens * tok_share * model.moe.top_k * etp
        act_rc = ((t.rc_gran == 1) & ((t.rc_modules & _ACT_RECOMPUTED) > 0))[:, None]  # the forward's clamps again
        per_elem = CLAMP_BYTES + np.where(act_rc, 8.0, 0.0)
        unfused = ~fused_grouped_mlp(model, workload, t)[:, None]
        mb["memory_bound"] = mb["memory_bound"] + np.where(unfused, moe_stage * copies * per_elem * (
            2.0 * model.moe.ffn_hidden_size / etp) / (g.hbm_gbps * 1e9), 0.0)
    if workload.eager:  # torchtitan without torch.compile: its norms, rotary embedding and SwiGLU op by op
        e_pair, e_of = stage_sums_by_pair(eager_tables(model), t.pp, t.vpp, S, t.split)
        e_bytes = e_pair[e_of, :, 0] * div["seq"] + e_pair[e_of, :, 1] * div["tp"]
        mb["memory_bound"] = mb["memory_bound"] + e_bytes * (tokens / (g.hbm_gbps * 1e9))
    # FP8 casts: every TE linear's input (forward) and output gradient (backward) read in BF16 and written
    # in FP8 (`cast_bytes` per element). Elements per token ~ the saved linear inputs' BF16 bytes / 2, twice
    # (two passes).
    mb["quantize"] = 0.0
    if fp8:
        q_pair, q_of = stage_sums_by_pair(lt.act * QUANT_PARTS[None, :], t.pp, t.vpp, S, t.split)
        q_bytes = cast_bytes(workload, g, c)
        mb["quantize"] = fold_activations(q_pair, q_of, div) * (tokens * q_bytes / (g.hbm_gbps * 1e9))
        if model.is_moe and workload.precision not in GROUPED_CASTS:  # per-expert cast kernels (quant_kernel_s)
            local = np.maximum(1.0, model.moe.num_experts / t.ep[:, None])
            kernels = 3.0 if workload.amax_pass else 1.0  # amax, scale, cast under per-tensor current scaling
            fused = fused_grouped_mlp(model, workload, t)[:, None]  # it quantizes every expert's split at once
            mb["quantize"] = mb["quantize"] + moe_stage * np.where(fused, 0.0, 4 * kernels * c.quant_kernel_s * local)

    # --- recompute: a re-run forward, so it is expressed in the (scaled) forward terms it repeats ------
    full = (t.rc_gran == 2)[:, None]
    block = (t.rc_method == 1)[:, None]
    frac, regions = 0.0, 0.0
    if full.any():
        chunk_layers = np.maximum(1.0, L_stage / t.vpp[:, None])
        N = np.maximum(1, t.rc_layers)[:, None].astype(float)
        frac = np.where(full, np.where(block, np.minimum(N, chunk_layers) / chunk_layers, 1.0), 0.0)
        regions = np.where(full, np.where(block, 1.0, np.ceil(chunk_layers / N)) * t.vpp[:, None], 0.0)
    third = frac / 3
    gemm_share = frac / gemm_passes(workload)  # the re-run forward's share of a GEMM term
    deps = {"recompute": {"compute_dense": gemm_share, "compute_linear_attention": third, "compute_experts": gemm_share},
            "imbalance": {}}
    # torchtitan's "selective" is per-op SAC (_sac.py): a share of the matmuls and most elementwise work re-run, the
    # attention kernel's output kept; its forward all-gathers (not saved) and launches are re-run too
    sac = (workload.framework == "torchtitan") & (t.rc_gran == 1)[:, None]
    sac_mm = sac_mem = relaunch = 0.0
    if sac.any():
        r, m = op_sac_recompute(model, t, S)
        sac_mm, sac_mem, relaunch = np.where(sac, r, 0.0), np.where(sac, m, 0.0), sac.astype(float)
    # Megatron's selective recompute re-runs what its modules cover, no more (_selective.py)
    sr = selective_recompute(model, t, S, per_pair, pair_of, div, gemm_passes(workload),
                             np.full(n, workload.framework != "torchtitan"))
    deps["recompute"]["compute_dense"] = gemm_share + sac_mm / gemm_passes(workload) + sr.dense
    deps["recompute"]["compute_experts"] = gemm_share + sr.experts
    deps["recompute"]["compute_attention"] = frac / 3.5 + sr.attention
    if sac.any():
        deps["recompute"]["memory_bound"] = np.where(sac, sac_mem / 3, third + sr.memory)
        deps["recompute"]["expert_memory"] = np.where(sac, sac_mem / 3, third + sr.expert_memory)
    else:  # Megatron's tables (no per-op SAC row): the mask would only copy
        deps["recompute"]["memory_bound"] = third + sr.memory
        deps["recompute"]["expert_memory"] = third + sr.expert_memory
    deps["recompute"]["quantize"] = (frac + sac_mm) / 2 + sr.quantize  # the re-run forward quantises its inputs again

    # --- communication -----------------------------------------------------------------------------------
    seq_bytes = tokens / cp * h * 2.0
    mb["tp_comm"] = mb["cp_comm"] = 0.0
    if (t.tp > 1).any():  # AG + RS around attention and MLP, forward and backward; recompute re-runs the forward half
        per_layer = np.where(tp > 1, 8 * seq_bytes * (tp - 1) / tp / group_bw(cluster, tp, 1, c), 0.0)
        mb["tp_comm"] = per_layer * (L_stage * (1.0 + frac * 0.5 + relaunch * 0.25) + 0.25 * sr.tp_layers)
    if (t.cp > 1).any():
        # ring attention passes K/V chunks hop by hop: a hop off the NVLink domain paces the ring (no dedupe); the
        # forward's pass (1 of 3 with the backward's 2) runs again when full recompute re-runs the forward
        kv_bytes = tokens / cp * 2 * model.num_kv_heads * model.head_dim * 2.0 / tp
        attn_layers = stage_sums(lt.is_attention.astype(float), t.pp, t.vpp, S, t.split)
        mb["cp_comm"] = np.where(cp > 1, (3 + frac + sr.core) * (cp - 1) * kv_bytes * (1 - c.cp_hidden)
                                 / ring_bw(cluster, tp * cp, c), 0.0) * attn_layers
    mb["ep_comm"] = 0.0
    if model.is_moe:
        k = model.moe.top_k
        span = ep * etp  # Megatron's expert ranks run etp-ep-edp-pp: an EP group is ep x etp consecutive ranks
        flex = (t.dispatcher >= 2)[:, None]  # the flex dispatcher on DeepEP (2) or HybridEP (3)
        gain = np.where((t.dispatcher == 3)[:, None], c.hybridep_nvl_gain, 1.0)
        w = model.moe.width(h) * 2.0  # bytes a token carries to the experts (LatentMoE: its latent width)
        spread = None
        sizes, at = np.unique(span, return_inverse=True)  # a handful of EP group sizes, not one call a layout
        per = [flex_spread(model, workload, int(s), cluster.nvlink_size) for s in sizes]
        if per[0] is not None:  # the routing fixes the ranks and domains a token reaches (AutoModel's gate, groups)
            arr = np.array([p[0] for p in per])
            spread = (arr[:, 0][at].reshape(span.shape), arr[:, 1][at].reshape(span.shape))
        a2a = a2a_time(tokens * tok_share, k, w, span, cluster, c, flex, spread, gain)
        ag = tokens / cp * w * (ep * tp - 1) / group_bw(cluster, ep * tp, 1, c)  # allgather over TP x EP
        one = np.where(span > 1, np.where((t.dispatcher == 1)[:, None], ag, a2a), 0.0)
        # dispatch + combine, forward and backward (+ the recompute's forward)
        mb["ep_comm"] = one * (4 + 2 * frac + 2 * sr.moe) * moe_stage
        if model.moe.shared_ffn_hidden_size and t.shared_overlap.any():  # shared GEMMs run while dispatching
            shared_frac = 3 * h * model.moe.shared_ffn_hidden_size * 2 / np.maximum(lt.flops_dense.mean(), 1)
            shared = mb["compute_dense"] * (min(1.0, shared_frac) * c.shared_overlap_gain)
            mb["ep_comm"] = mb["ep_comm"] - np.where(t.shared_overlap[:, None], np.minimum(shared, mb["ep_comm"]), 0.0)
        # the hottest rank's extra routed tokens (EP > 1), or every expert padded to its capacity (token drop)
        uneven = (ep > 1) | (t.capacity > 0)[:, None]
        extra = np.where(uneven, routing_load(model, workload, t, mcoef)[:, None] - 1.0, 0.0)
        deps["imbalance"] = {"compute_experts": extra, "ep_comm": extra}
    stages_per_node = np.maximum(1.0, cluster.nvlink_size / (t.world / t.pp))[:, None]
    pp_span = np.where(stages_per_node > 1, 1.0, 2 * cluster.nvlink_size)
    p2p = 2 * seq_bytes * tok_share * cp * t.vpp[:, None] / ring_bw(cluster, pp_span, c)
    p2p = p2p * np.where((t.vpp > 1)[:, None], 1.0 - c.p2p_hidden_vpp, 1.0)
    mb["pp_p2p"] = np.where((t.pp > 1)[:, None], p2p, 0.0)
    # launches are per layer per pass; the MoE host sync (token counts -> split sizes) per forward pass drains the
    # launch queue (a full-iteration graph has no host in the loop). Token drop pads every expert to its capacity:
    # the split sizes are known without asking the GPU (megatron-core's alltoall dispatcher: cuda_sync_point
    # "no_sync" under drop_and_pad), so no sync
    eager = (t.cuda_graphs != 3)[:, None]
    overhead = L_stage * (np.where(eager, c.launch_s, 0.0) * (3 + frac + relaunch))
    if lt.is_moe.any():
        synced = eager & (t.capacity == 0)[:, None]
        overhead += moe_stage * (np.where(synced, c.moe_sync_s, 0.0) * (1 + frac + sr.moe))
    if full.any():
        overhead += regions * c.recompute_group_s
    mb["layer_overhead"] = overhead
    # activation offload: the offloaded layers' saved activations cross PCIe down in forward and up in backward
    mb["act_offload"] = 0.0
    if (t.act_offload > 0).any():
        off = np.minimum(t.act_offload[:, None], L_stage) / np.maximum(L_stage, 1)
        mb["act_offload"] = 2 * off * act_bytes / (g.host_link_gbps * 1e9 * c.host_link_eff)
    if (t.off_modules > 0).any():  # fine-grained offloading (_offload.py): the modules' inputs, down and up
        fine = offloaded_per_token(model, t, S, div, FP8_SAVED if workload.quantized else None,
                                   dropped=~saved_parts(model, workload, t)) * tokens
        mb["act_offload"] = mb["act_offload"] + 2 * fine / (g.host_link_gbps * 1e9 * c.host_link_eff)
    return mb, deps, frac + relaunch  # the derived terms (DERIVED) are built from the scaled primaries when composed


