"""Linears a low-precision recipe keeps in another format, and what that does to the TE linears' GEMM time.

A recipe may run most TE linears in FP8 or NVFP4 but keep some in BF16 or MXFP8: Megatron's
--first-last-layers-bf16 with --num-layers-at-end-in-bf16 N (every linear of the last N decoder layers, experts
included), and Transformer Engine quantization matchers by module (Megatron-Bridge's Nemotron 3 Super NVFP4 recipe,
scripts/performance/configs/nemotronh/te_quant.cfg: linear_qkv and linear_proj in BF16, the LatentMoE fc1/fc2 latent
projections in BF16, Mamba's out_proj in MXFP8). `linear_time_scale` turns the Workload's `bf16_layers_end` and
`quant_overrides` into per-stage factors on the dense and the expert GEMM time at the recipe's own peak: the FLOP
shares of each format, each weighted by the recipe's peak over that format's (BF16 at the BF16 peak, MXFP8 at the FP8
peak with `mxfp8_gemm`). 1 when the workload has none (no cost to the search). The MTP block and the memory model's
saved activations and weight copies still count every linear in the recipe's format. No torch, no ray.
"""

from __future__ import annotations

import numpy as np

from ..catalog import ModelSpec, Workload
from ..catalog.params import layer_items
from ..catalog.workload import QUANT_MODULES
from ..layout import LayoutTable
from .layers import stage_sums

__all__ = ["linear_time_scale", "lowp_copies"]

# module name -> the catalog's parameter items it covers (catalog/params.py)
_ITEMS = {"attention": ("attn.", "mla.", "csa."), "latent_proj": ("moe.latent_proj",),
          "mamba_out_proj": ("mamba.out_proj",)}
assert set(_ITEMS) == set(QUANT_MODULES)


def lowp_copies(workload: Workload, gpu) -> int:
    """Low-precision copies a cast writes of each tensor (0 for BF16): the row-wise one, and a column-wise one where
    the GEMMs need it. Per-tensor FP8 on Blackwell writes the row-wise copy alone: its FP8 GEMMs take any operand
    layout, so Transformer Engine's quantizer makes no transpose (csrc/quantizer.cpp: with_transpose =
    columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported(), true from sm100: GpuSpec.fp8_any_layout). On Hopper
    it writes the transpose too; MXFP8 needs both (its column-wise blocks run along the other axis), and blockwise
    FP8 on Blackwell is emulated through MXFP8. NVFP4's two 4-bit copies with their scales count as one."""
    if not workload.quantized:
        return 0
    if workload.fp4 or (gpu.fp8_any_layout and workload.precision in ("fp8-delayed", "fp8-tensorwise")):
        return 1
    return 2


def _layer_flops(model: ModelSpec, workload: Workload) -> np.ndarray:
    """(L, 2 kinds [dense, expert], 3 formats [recipe, bf16, mxfp8]) forward matmul FLOPs per token."""
    L = model.num_layers
    out = np.zeros((L, 2, 3))
    fmt = {"bf16": 1, "mxfp8": 2}
    over = dict(workload.quant_overrides)
    for i in range(L):
        end = i >= L - workload.bf16_layers_end
        for it in layer_items(model, i):
            if not it.matrix or it.name.endswith("conv1d") or it.name == "moe.router":
                continue  # convolutions and the router are no TE linears
            kind = 1 if it.shard == "expert" else 0
            flops = 2.0 * it.count * (it.active if kind else 1.0)
            mod = next((m for m, pre in _ITEMS.items() if it.name.startswith(pre)), None)
            out[i, kind, 1 if end else fmt.get(over.get(mod, ""), 0)] += flops
    return out


def linear_time_scale(model: ModelSpec, workload: Workload, t: LayoutTable, S: int, gpu, c, lin_peak: float):
    """(dense, expert) factors on the GEMM time at `lin_peak` (each (n, S), or 1.0 when no linear is exempt)."""
    if not workload.quantized or not (workload.bf16_layers_end or workload.quant_overrides):
        return 1.0, 1.0
    fl = _layer_flops(model, workload)
    rel = np.array([1.0, lin_peak / (gpu.bf16_tflops * 1e12),
                    lin_peak / (gpu.fp8_tflops * 1e12 * c.fp8_gemm * c.mxfp8_gemm)])
    out = []
    for kind in (0, 1):
        total = stage_sums(fl[:, kind].sum(axis=1), t.pp, t.vpp, S, t.split)
        timed = stage_sums(fl[:, kind] @ rel, t.pp, t.vpp, S, t.split)
        out.append(np.where(total > 0, timed / np.maximum(total, 1e-30), 1.0))
    return out[0], out[1]
