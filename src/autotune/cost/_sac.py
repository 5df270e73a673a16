"""torchtitan's per-op selective activation checkpointing: what it keeps for backward and what it recomputes.

torchtitan's "selective" AC with selective_ac_option "op" (its Llama configs' default; torchtitan/parallelisms/
parallelize_llama.py `_apply_ac_to_transformer_block`, today torchtitan/distributed/activation_checkpoint.py) wraps
each decoder block in torch.utils.checkpoint with a policy over the block's ops: the outputs of ops in its save list
(aten.mm, the SDPA flash / efficient kernels, reduce_scatter, abs and max) are saved, every other op is recomputed
in backward, and of the matmuls only every other one is saved (the 2nd, 4th, ... mm of the block are recomputed).
A Llama block runs its matmuls in the order wq, wk, wv, wo, w1, w3, w2: it keeps the block's input, the q and v
projections, the attention output (and its fp32 log-sum-exp per head), w1's and w2's outputs; it recomputes wk, wo
and w3, the norms, rotary embedding and SwiGLU's elementwise work. That is not Megatron's "selective" (core attention
only): it saves less than Megatron's no-recompute set and re-runs about a third of the block's matmul FLOPs.

Modelled for layers with softmax attention (not MLA) and a dense MLP, the layers torchtitan's dense models have;
other layers keep everything (Megatron's no-recompute set) and recompute nothing. Under TP the row-parallel outputs
are counted at their reduce-scattered size. No torch, no ray.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..catalog import ModelSpec
from ..catalog.model import FULL, SLIDING
from ..layout import LayoutTable
from .layers import layer_tables, stage_sums, stage_sums_by_pair

__all__ = ["op_sac_tables", "op_sac_kept", "op_sac_recompute"]

BF16, FP32 = 2.0, 4.0


@lru_cache(maxsize=32)
def op_sac_tables(model: ModelSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per layer: bytes per token kept under per-op SAC (L, 2) as [sequence-sharded, head/FFN-sharded], the share of
    the layer's dense matmul FLOPs recomputed (L,), and the kept share of the layer's full saved bytes (L,)."""
    lt = layer_tables(model)
    L, h = lt.n_layers, model.hidden_size
    kept = np.zeros((L, 2))
    rc, share = np.zeros(L), np.ones(L)
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    for i in range(L):
        if model.layer_types[i] not in (FULL, SLIDING) or model.mla is not None or model.is_moe_layer(i) \
                or not model.has_ffn(i):
            kept[i] = (lt.act[i].sum(), 0.0)  # everything, counted sequence-sharded (see the module docstring)
            continue
        f = model.ffn_hidden_size
        # matmuls in call order, (FLOPs per token / 2, output width); odd-numbered ones (1st, 3rd, ...) are saved
        mms = [(h * q, q), (h * kv, kv), (h * kv, kv), (q * h, h)]
        mms += [(h * f, f), (h * f, f), (f * h, h)] if model.gated_mlp else [(h * f, f), (f * h, h)]
        saved = [w for n, (_, w) in enumerate(mms) if n % 2 == 0]
        recomputed = sum(fl for n, (fl, _) in enumerate(mms) if n % 2 == 1)
        last_out = mms[-1][1] if (len(mms) - 1) % 2 == 0 else 0  # the MLP's output projection, when it is saved
        kept[i, 0] = BF16 * (h + last_out)  # the block's input; the down projection's output (reduce-scattered)
        kept[i, 1] = BF16 * (sum(saved) - last_out + q) + FP32 * model.num_heads  # q, v, up; attention out and lse
        rc[i] = recomputed / sum(fl for fl, _ in mms)
        share[i] = min(1.0, kept[i].sum() / max(lt.act[i].sum(), 1.0))
    return kept, rc, share


def op_sac_kept(model: ModelSpec, t: LayoutTable, S: int, div: dict) -> np.ndarray:
    """Bytes per token of one micro-batch a stage keeps under per-op SAC (n, S), divided as the memory model's
    activation classes (`div`: "seq" sequence-parallel share, "tp" head/FFN share)."""
    per, of = stage_sums_by_pair(op_sac_tables(model)[0], t.pp, t.vpp, S, t.split)
    return per[of, :, 0] * div["seq"] + per[of, :, 1] * div["tp"]


def op_sac_recompute(model: ModelSpec, t: LayoutTable, S: int) -> tuple[np.ndarray, np.ndarray]:
    """Per stage (n, S): the share of its dense matmul FLOPs and the share of its elementwise (saved-tensor) traffic
    that per-op SAC re-runs in backward."""
    lt = layer_tables(model)
    _, rc, share = op_sac_tables(model)
    dense = np.maximum(stage_sums(lt.flops_dense, t.pp, t.vpp, S, t.split), 1.0)
    act = np.maximum(stage_sums(lt.act.sum(axis=1), t.pp, t.vpp, S, t.split), 1.0)
    return (stage_sums(lt.flops_dense * rc, t.pp, t.vpp, S, t.split) / dense,
            stage_sums(lt.act.sum(axis=1) * (1.0 - share), t.pp, t.vpp, S, t.split) / act)
