"""Megatron's fine-grained activation offloading (--fine-grained-activation-offloading --offload-modules ...): what each
module's input is, in the cost model's activation parts (layers.PARTS), per layer.

Each module offloads its input to host memory in forward and reloads it before backward (megatron-core
TransformerConfig.offload_modules; docs/user-guide/features/fine_grained_activation_offloading.md):
  attn_norm   the attention's input norm's input: one of a layer's norms (`ln`), on layers with an attention-like
              mixer (softmax, sliding, MLA, Gated DeltaNet: TransformerLayer's input_layernorm)
  mlp_norm    the MLP's (or MoE's) input norm's input: one norm, on layers with an FFN
  qkv_linear  the QKV projection's input (`attn_in`), on the same layers as attn_norm
  core_attn   core attention's inputs, q, k and v (`attn_core`), on softmax attention layers (not a Gated DeltaNet or
              Mamba2 kernel's, which no module offloads)
  attn_proj   the output projection's input, core attention's output (in `attn_other`: heads x value head dim)
  expert_fc1  the routed experts' fc1 input, the permuted tokens (`moe_perm`)
  moe_act     the experts' activation input, their fc1 output (`moe_fc1`, and a clamped GLU's second copy)
Memory (memory.py): a stage keeps the offloaded bytes of the layer in flight only. Time (_terms.py): they cross the
host link down in forward and up in backward, beside compute (the `act_offload` term, overlapped as cpu offloading's).
`min_offloaded_tensor_size` (1M elements by default) is not modelled: at training shapes every such input is larger.
No torch, no ray.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..catalog import ModelSpec
from ..layout.core import OFFLOAD_MODULES
from .layers import BF16, KIND_ATTENTION, KIND_MIXER, PARTS, fold_activations, layer_tables, stage_sums_by_pair

__all__ = ["module_tables", "offloaded_per_token"]

_P = {p: j for j, p in enumerate(PARTS)}


@lru_cache(maxsize=32)
def module_tables(model: ModelSpec) -> np.ndarray:
    """(modules, L, P) activation bytes per token each OFFLOAD_MODULES entry offloads, by layer and part (the
    layer tables' own sizes, before low-precision savings)."""
    lt = layer_tables(model)
    L, P = lt.act.shape
    out = np.zeros((len(OFFLOAD_MODULES), L, P))
    h = model.hidden_size
    mixer = np.isin(lt.kind, KIND_MIXER)  # attention-like mixers of a TransformerLayer (softmax, sliding, GDN, MLA, CSA)
    softmax = np.isin(lt.kind, KIND_ATTENTION)
    ffn = np.array([model.has_ffn(i) for i in range(L)])
    if model.csa is not None:  # DeepSeek-V4: the grouped output projection's input, the core's output
        proj_in = BF16 * model.num_heads * model.csa.head_dim
    elif model.mla is not None:
        proj_in = BF16 * model.num_heads * model.mla.v_head_dim
    else:
        proj_in = BF16 * model.num_heads * model.head_dim
    norm = np.minimum(BF16 * h, lt.act[:, _P["ln"]])  # one norm's input, at most what the layer's norms keep
    for m, mod in enumerate(OFFLOAD_MODULES):
        t = out[m]
        if mod == "attn_norm":
            t[:, _P["ln"]] = np.where(mixer, norm, 0.0)
        elif mod == "mlp_norm":
            t[:, _P["ln"]] = np.where(ffn, norm, 0.0)
        elif mod == "qkv_linear":
            t[:, _P["attn_in"]] = np.where(mixer, lt.act[:, _P["attn_in"]], 0.0)
        elif mod == "core_attn":
            t[:, _P["attn_core"]] = np.where(softmax, lt.act[:, _P["attn_core"]], 0.0)
        elif mod == "attn_proj":
            t[:, _P["attn_other"]] = np.where(softmax, np.minimum(proj_in, lt.act[:, _P["attn_other"]]), 0.0)
        elif mod == "expert_fc1":
            t[:, _P["moe_perm"]] = lt.act[:, _P["moe_perm"]]
        elif mod == "moe_act":
            t[:, _P["moe_fc1"]] = lt.act[:, _P["moe_fc1"]]
            t[:, _P["moe_clamp"]] = lt.act[:, _P["moe_clamp"]]
    return out


def offloaded_per_token(model: ModelSpec, t, S: int, div: dict, scale: np.ndarray | None = None,
                        dropped: np.ndarray | None = None) -> np.ndarray | float:
    """(n, S) activation bytes per token of one micro-batch that each row's --offload-modules sends to the host,
    summed over the stage's layers (0.0 when no row offloads). `div`: the activation folds' per-GPU shares
    (layers.fold_activations); `scale`: (P,) factors on the layer tables' sizes (low-precision saves);
    `dropped`: (n, P) parts a row's selective recompute already frees (nothing of them is left to offload). A row
    under full recompute keeps only each group's input: it offloads nothing (the rules refuse the pair)."""
    mask = np.where(t.rc_gran == 2, 0, t.off_modules)
    if not (mask > 0).any():
        return 0.0
    tables = module_tables(model)
    drop = np.zeros((len(t), tables.shape[2]), dtype=bool) if dropped is None else dropped
    # rows alike in modules and in what their recompute frees share one table: few groups, however many rows
    keys, group = np.unique(np.column_stack([mask, np.packbits(drop, axis=1, bitorder="little")]), axis=0,
                            return_inverse=True)
    out = np.zeros((len(t), S))
    for k, key in enumerate(keys):
        m = int(key[0])
        if m == 0:
            continue
        rows = np.flatnonzero(group.ravel() == k)
        table = sum(tables[b] for b in range(len(OFFLOAD_MODULES)) if m >> b & 1) * ~drop[rows[0]][None, :]
        if scale is not None:
            table = table * scale[None, :]
        per_pair, pair_of = stage_sums_by_pair(table, t.pp[rows], t.vpp[rows], S, t.split[rows])
        out[rows] = fold_activations(per_pair, pair_of, {k2: (v[rows] if np.ndim(v) else v) for k2, v in div.items()})
    return out
