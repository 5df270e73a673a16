"""Megatron's selective recompute (--recompute-granularity selective --recompute-modules ...): the forward work
each module re-runs in backward, per pipeline stage.

megatron-core's TransformerConfig.recompute_modules (default ["core_attn"]) and where each takes effect
(megatron/core/transformer: transformer_layer.py, multi_latent_attention.py, moe/moe_layer.py, moe/experts.py,
moe/shared_experts.py, core_v0.15 to v0.17):
  core_attn       the attention kernel: one more forward of flash attention (and, under CP, its ring pass)
  layernorm       input_layernorm and pre_mlp_layernorm (output-discarding checkpoint): the norms' forward
  moe_act         the routed experts' activation (output-discarding): its elementwise forward
  mla_up_proj     MLA's q / kv up projections and RoPE (output-discarding): their GEMMs and RoPE (DeepSeek-V4: q up)
  mhc             hyper-connections' mixing (output-discarding; DeepSeek-V4): their small projections and traffic
  mlp             the dense MLP, only in layers that are not MoE layers (TransformerLayer: `not is_moe_layer`)
  moe             the whole MoE layer: router, dispatch, routed experts, combine, shared experts
  shared_experts  the shared experts' MLP
A module re-runs its own forward once: the forward of its GEMMs (1 of the GEMM passes), the forward of its
elementwise traffic (the activation parts it frees, memory.SELECTIVE_DROPS, at 1 of the 3 touches), and for `moe`
the dispatch and combine (2 of the 4 all-to-alls per layer) and the routing's host sync; `mlp` and `moe` re-run the
MLP's TP all-gather and reduce-scatter (2 of the layer's 8). Before this, every selective row was charged core
attention's re-run and a tenth of the forward's elementwise traffic whatever its modules: 50 of the 54 published
Megatron rows with selective recompute do not recompute core attention. No torch, no ray.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

from ..catalog import ModelSpec
from ..catalog.params import layer_items
from ..layout import LayoutTable
from ..layout import SELECTIVE_MODULES
from .layers import PARTS, fold_activations, layer_tables, stage_sums
from .memory import SELECTIVE_DROPS, selected_modules

__all__ = ["SelectiveRecompute", "selective_recompute", "module_gemm_flops"]

# module -> the catalog's parameter items whose GEMMs it re-runs (catalog/params.py names; routed experts apart)
_GEMMS = {"mla_up_proj": ("mla.q_up", "mla.kv_up", "csa.q_up"), "mhc": ("hc.",), "mlp": ("mlp.",), "moe": ("moe.",),
          "shared_experts": ("moe.shared",)}
_BIT = {m: 1 << b for b, m in enumerate(SELECTIVE_MODULES)}


@lru_cache(maxsize=32)
def module_gemm_flops(model: ModelSpec) -> np.ndarray:
    """(L, modules) forward FLOPs per token of the dense (non-routed-expert) GEMMs each module re-runs, in
    SELECTIVE_MODULES order."""
    out = np.zeros((model.num_layers, len(SELECTIVE_MODULES)))
    for i in range(model.num_layers):
        for it in layer_items(model, i):
            if not it.matrix or it.shard == "expert" or it.name.endswith("conv1d"):
                continue
            for mod, prefixes in _GEMMS.items():
                if it.name.startswith(prefixes):
                    out[i, SELECTIVE_MODULES.index(mod)] += 2.0 * it.count
    return out


@dataclass(frozen=True)
class SelectiveRecompute:
    """Per stage (n, S) shares of each scaled time term that the selected modules' re-run forward adds (0 for rows
    without Megatron's selective recompute; the scalar 0 where no row has the share), and what the primary
    communication terms re-run."""

    attention: np.ndarray  # share of compute_attention (forward-equivalents of 3.5)
    dense: np.ndarray  # share of compute_dense
    experts: np.ndarray  # share of compute_experts
    memory: np.ndarray  # share of memory_bound
    expert_memory: np.ndarray  # share of expert_memory
    quantize: np.ndarray  # share of quantize (the re-run linears quantise their inputs again)
    core: np.ndarray  # (n, 1) 1 where core attention re-runs (its CP ring pass too)
    moe: np.ndarray  # (n, 1) 1 where the MoE layer re-runs (its dispatch, combine and host sync)
    tp_layers: np.ndarray  # (n, S) layers whose MLP (and its TP collectives) re-runs


def selective_recompute(model: ModelSpec, t: LayoutTable, S: int, per_pair: np.ndarray, pair_of: np.ndarray,
                        div: dict, passes: float, megatron: np.ndarray) -> SelectiveRecompute:
    """The re-run shares of every row whose recompute is Megatron's selective one (`megatron`: (n,) bool; torchtitan's
    per-op SAC is _sac.py's). `per_pair` / `pair_of` / `div`: the saved activations per (PP, VPP) pair and the
    memory model's divisor classes, as _terms folds them. Only the selective rows are worked out (a space's none /
    full rows add nothing), and their elementwise shares once per distinct module set."""
    n = len(t)
    on_row = megatron & (t.rc_gran == 1)
    rows = np.flatnonzero(on_row)
    if len(rows) == n:
        return _selective_rows(model, t, S, per_pair, pair_of, div, passes, selected_modules(model, t))
    out: dict = dict.fromkeys((f.name for f in fields(SelectiveRecompute)), 0.0)  # a share no row has: the scalar 0
    if len(rows):
        sub = _selective_rows(model, t.take(rows), S, per_pair, pair_of[rows], _rows_of(div, rows), passes,
                              selected_modules(model, t)[rows])
        for name in out:
            part = getattr(sub, name)
            if part.any():
                out[name] = np.zeros((n, part.shape[1]))
                out[name][rows] = part
    return SelectiveRecompute(**out)


def _rows_of(div: dict, rows: np.ndarray) -> dict:
    """The divisor classes of `rows` (a class is a scalar or an (n, 1) column)."""
    return {k: (v[rows] if np.ndim(v) else v) for k, v in div.items()}


def _selective_rows(model: ModelSpec, t: LayoutTable, S: int, per_pair: np.ndarray, pair_of: np.ndarray,
                    div: dict, passes: float, mods: np.ndarray) -> SelectiveRecompute:
    """`selective_recompute` for a table whose every row recomputes the modules `mods` (bitmasks)."""
    n = len(t)
    lt = layer_tables(model)

    def has(mod: str) -> np.ndarray:
        return ((mods & _BIT[mod]) > 0)[:, None].astype(float)

    zero = np.zeros((n, S))
    gem = module_gemm_flops(model)
    dense_all = np.maximum(stage_sums(lt.flops_dense, t.pp, t.vpp, S, t.split), 1.0)
    dense = zero.copy()
    for mod in ("mla_up_proj", "mhc", "mlp", "shared_experts"):
        if has(mod).any():
            dense += has(mod) * stage_sums(gem[:, SELECTIVE_MODULES.index(mod)], t.pp, t.vpp, S, t.split)
    moe = has("moe")
    if moe.any():  # the MoE layer's own dense GEMMs (router, shared experts, latent projections), not twice
        shared = has("shared_experts") * stage_sums(gem[:, SELECTIVE_MODULES.index("shared_experts")], t.pp, t.vpp, S,
                                                    t.split)
        dense += moe * stage_sums(gem[:, SELECTIVE_MODULES.index("moe")], t.pp, t.vpp, S, t.split) - moe * shared
    dense_share = dense / dense_all
    experts = moe * np.ones((1, S))  # every routed-expert FLOP is in an MoE layer
    # elementwise traffic: the parts the selected modules free are the ones their forward writes again; a part two
    # of them free (moe and moe_act both free moe_act) is written again once: the union of their parts, folded once
    # per distinct module set
    memory, expert_memory = zero.copy(), zero.copy()
    mem_div = {**div, "expf": 0.0}
    exp_div = dict.fromkeys(div, 0.0) | {"expf": div["expf"]}
    all_mem = np.maximum(fold_activations(per_pair, pair_of, mem_div), 1e-30)
    all_exp = np.maximum(fold_activations(per_pair, pair_of, exp_div), 1e-30)
    for code in np.unique(mods):
        freed = {p for b, mod in enumerate(SELECTIVE_MODULES) if int(code) >> b & 1 for p in SELECTIVE_DROPS[mod]}
        if not freed:
            continue
        r = np.flatnonzero(mods == code)
        part = per_pair * np.array([p in freed for p in PARTS], dtype=float)[None, None, :]
        memory[r] = fold_activations(part, pair_of[r], _rows_of(mem_div, r))
        expert_memory[r] = fold_activations(part, pair_of[r], _rows_of(exp_div, r))
    linear_all = dense_all + stage_sums(lt.flops_expert, t.pp, t.vpp, S, t.split)
    quantize = (dense + experts * stage_sums(lt.flops_expert, t.pp, t.vpp, S, t.split)) / linear_all / 2
    ffn_dense = stage_sums((gem[:, SELECTIVE_MODULES.index("mlp")] > 0).astype(float), t.pp, t.vpp, S, t.split)
    ffn_moe = stage_sums(lt.is_moe.astype(float), t.pp, t.vpp, S, t.split)
    return SelectiveRecompute(
        attention=has("core_attn") / 3.5 * np.ones((1, S)), dense=dense_share / passes, experts=experts / passes,
        memory=memory / all_mem / 3, expert_memory=expert_memory / all_exp / 3, quantize=quantize,
        core=has("core_attn"), moe=moe, tp_layers=has("mlp") * ffn_dense + moe * ffn_moe)
