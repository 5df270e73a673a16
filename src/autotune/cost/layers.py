"""Per-layer tables of a model, the raw material of the vectorised cost model.

For each decoder layer: parameter counts by sharding kind (tp / rep / expert), activation bytes saved
for backward per token split into named *parts* (so selective recompute can drop parts), and forward
FLOPs per token by kind. `stage_sums` folds any per-layer column into per-pipeline-stage totals for
every (PP, VPP) pair at once. No torch, no ray.

Activation parts (bytes per token of the micro-batch, before any parallel division), each with a
*divisor class*:
  seq   hidden-size tensors on the sequence-parallel path (LayerNorm inputs, linear inputs): / (CP x TP if SP)
  tp    head- or FFN-sharded tensors inside attention and dense MLPs: / (CP x TP)
  rep   router tensors (sequence-sharded with SP, never head-sharded): / (CP x TP if SP)
  exph  expert hidden-size tensors per routed copy (top-k copies): x ETP / (CP x TP if SP) x imbalance
  expf  expert FFN tensors per routed copy: / (CP x TP if SP) x imbalance
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..catalog import ModelSpec, padded_vocab
from ..catalog.model import CSA, FULL, LINEAR, MAMBA, NONE, SLIDING
from ..catalog.params import layer_items
from ..layout.table import split_of

__all__ = ["LayerTables", "layer_tables", "PARTS", "PART_CLASS", "stage_sums", "stage_sums_by_pair", "fold_activations",
           "vocab_per_row", "attention_flops", "csa_context"]

BF16 = 2
FP32 = 4

# part name -> divisor class
PART_CLASS = {
    "ln": "seq",  # RMSNorm inputs (2 per layer)
    "hc": "seq",  # hyper-connections' saves: each sublayer's residual streams and its output (DeepSeek-V4)
    "attn_in": "seq",  # input of the QKV / in_proj linear (saved by column-parallel linear)
    "attn_core": "tp",  # attention kernel: q, k, v (flash; its output is the o_proj input); GDN, Mamba2: kernel in/out
    "attn_other": "tp",  # qk-norm inputs, output gate, projections' inputs inside attention
    "mlp": "tp",  # dense MLP: fc1 output, activation output
    "mlp_in": "seq",  # dense MLP / shared expert input
    "router": "rep",  # router logits and probabilities (fp32)
    "moe_perm": "exph",  # permuted tokens (expert fc1 input), per routed copy
    "moe_fc1": "expf",  # expert fc1 output (gate and up), per routed copy
    "moe_act": "expf",  # expert activation output (fc2 input), per routed copy
    "moe_clamp": "expf",  # a clamped GLU's input (gpt-oss): the fc1 output kept again, per routed copy
    "shared": "tp",  # shared expert fc1 and activation outputs
}
PARTS = tuple(PART_CLASS)


@dataclass(frozen=True)
class LayerTables:
    n_layers: int
    params_tp: np.ndarray  # (L,) parameters split over TP
    params_rep: np.ndarray  # (L,) replicated on every TP rank
    params_exp: np.ndarray  # (L,) expert parameters split over EP x ETP
    params_exp_ep: np.ndarray  # (L,) expert parameters split over EP only (row-parallel fc2 biases)
    act: np.ndarray  # (L, P) activation bytes per token by part
    is_moe: np.ndarray  # (L,) bool
    kind: np.ndarray  # (L,) 0 full attention, 1 sliding, 2 linear (GDN), 3 MLA, 4 Mamba2, 5 no mixer (FFN only),
    #                   6 DeepSeek-V4's hybrid attention (CSA; its compress ratio in `ratio`)
    flops_dense: np.ndarray  # (L,) forward matmul FLOPs per token outside attention scores/experts
    flops_attn_quadratic: np.ndarray  # (L,) forward FLOPs per token per token of context (scores + AV)
    flops_expert: np.ndarray  # (L,) forward FLOPs per token for the k routed experts
    flops_linear_attn: np.ndarray  # (L,) forward FLOPs per token of the GDN / Mamba2 (SSD) chunked scans
    ratio: np.ndarray  # (L,) a CSA layer's compress ratio (0 elsewhere)

    @property
    def is_attention(self) -> np.ndarray:
        """(L,) layers with softmax attention (the ones context parallelism exchanges K and V for)."""
        return np.isin(self.kind, KIND_ATTENTION)


KIND = {FULL: 0, SLIDING: 1, LINEAR: 2, MAMBA: 4, NONE: 5, CSA: 6}  # MLA (3) is full attention of an MLA model
KIND_ATTENTION = (0, 1, 3, 6)
KIND_MIXER = (0, 1, 2, 3, 6)  # the token mixers a TransformerLayer builds (softmax, sliding, GDN, MLA, CSA)


def csa_context(m: ModelSpec, ratio: int, span: float) -> tuple[float, float]:
    """(keys each query attends on average, forward FLOPs per token of the indexer's scores) of a DeepSeek-V4
    attention layer at rows of `span` tokens, as megatron-core counts them (training.py
    _dsv4_hybrid_self_attention_flops, whose TFLOP/s Megatron's recipes print). Each query attends over the window
    and the compressed entries its layer keeps: at ratio 4 the indexer's top k of the span / 4 (k x (1 - 4k / 2 span)
    on average over a causal row), at ratio 128 all span / 128 of them, causally half; ratio-4 layers also score
    every query against the span / 4 compressed keys with the indexer's heads. The attention's FLOPs are the keys
    times the layer's FLOPs per context token (LayerTables.flops_attn_quadratic)."""
    a = m.csa
    keys = min(a.window, span)
    indexer = 0.0
    if ratio == 4:
        k = min(a.index_topk, span // 4)
        keys += k * (1.0 - 4.0 * k / (2.0 * span)) if span else 0.0
        indexer = 2.0 * a.index_heads * a.index_head_dim * span / 4.0
    elif ratio:
        keys += span / (2.0 * ratio)
    return keys, indexer


def attention_flops(m: ModelSpec, lt: "LayerTables", span: float, causal: bool = True) -> np.ndarray:
    """(L,) forward FLOPs per token of each layer's attention scores and values at rows of `span` tokens: half the
    span on average under a causal mask (`causal=False`: the whole row, Megatron-LM's older count), sliding windows
    capped, DeepSeek-V4's layers per their compress ratio with their indexer's scores (csa_context)."""
    full = span / 2 if causal else span
    ctx = np.where(lt.kind == 1, min(m.sliding_window or span, full), full)
    extra = 0.0
    if m.csa is not None:
        keys, index = (np.array(v) for v in zip(*(csa_context(m, int(r), span) for r in lt.ratio)))
        csa = lt.kind == KIND[CSA]
        ctx, extra = np.where(csa, keys, ctx), np.where(csa, index, 0.0)
    return lt.flops_attn_quadratic * ctx + extra


GDN_CHUNK = 64  # FLA's chunk length: the WY matrix A the delta-rule kernel saves has one row of 64 per token and head


def _gdn_parts(m: ModelSpec) -> dict[str, float]:
    """Bytes saved for backward by megatron-core's GatedDeltaNet (ssm/gated_delta_net.py) on its GPU kernels. The
    in_proj output is split and every piece copied (.contiguous() of a transposed slice), so the output itself is
    freed. Then:
    - causal_conv1d saves its input, the q, k, v channels (it recomputes the activation);
    - FLA's l2norm saves its output and an fp32 rstd per head, for q and for k;
    - the gates save two fp32 values per value head (softplus' input and output);
    - FLA's chunked delta rule (ChunkGatedDeltaRuleFunction, FLA 0.4) saves q and k as it gets them (repeated
      over the value heads when there are more: new tensors; otherwise the l2norm outputs again), v, the chunk-
      local cumulative g (fp32), beta and A (64 per token and head, in q's dtype);
    - the gated norm: TE's RMSNorm saves its input (the kernel's output) and an fp32 rstd; torch.compile cannot
      trace into it, so @jit_fuser's gate product is compiled apart and saves the norm's output and the gate;
      out_proj saves its input.
    Measured on megatron's own module with the kernels' saves (bench/activation_parity.py, gdn-* cases)."""
    la = m.linear
    kd, vd, nk, nv = la.key_dim, la.value_dim, la.num_key_heads, la.num_value_heads
    repeated = 2 * nv * la.key_head_dim if nv > nk else 0
    return {
        "attn_in": BF16 * m.hidden_size,
        "attn_other": BF16 * (2 * kd + vd)  # the conv's input
        + BF16 * 2 * kd + FP32 * 2 * nk  # l2-normed q, k and their rstd
        + FP32 * 2 * nv  # the decay gate's softplus input and output
        + BF16 * 4 * vd + FP32 * nv,  # norm input, rstd, norm output, gate, out_proj input
        "attn_core": BF16 * (repeated + vd + nv + GDN_CHUNK * nv) + FP32 * nv,  # the delta-rule kernel's saves
    }


def _mamba_parts(m: ModelSpec) -> dict[str, float]:
    """Bytes saved for backward by Megatron's MambaMixer training path (use_mem_eff_path): in_proj saves its
    input; mamba_ssm's MambaSplitConv1dScanCombinedFn (mamba_split_conv1d_scan_combined, no fused norm or
    out_proj) saves zxbcdt (the whole in_proj output) and out_x (the scan output); the gated RMSNorm saves its
    input and an fp32 rstd per group; out_proj saves its input."""
    mb = m.mamba
    return {
        "attn_in": BF16 * m.hidden_size,
        "attn_core": BF16 * (mb.in_proj_dim + mb.d_inner),
        "attn_other": BF16 * 2 * mb.d_inner + FP32 * mb.num_groups,
    }


def _csa_parts(m: ModelSpec, ratio: int) -> dict[str, float]:
    """Bytes DeepSeek-V4's hybrid attention saves for backward: the input of its projections (q down, KV, the
    compressors); the q latent (its norm's output, the q up projection's and the indexer's input), q, the shared KV
    head and fp32 softmax statistics per head (the up projections' outputs: what mla_up_proj recomputes); the KV
    norm's input, the core's output (the grouped output projection's input) and that projection's output (the
    output linear's input); on ratio-4 layers the indexer's queries and weights and its top-k indices (int32)."""
    a, nh = m.csa, m.num_heads
    other = BF16 * (a.head_dim + nh * a.head_dim + a.o_groups * a.o_lora_rank)
    if ratio == 4:
        other += BF16 * (a.index_heads * a.index_head_dim + a.index_heads) + 4 * a.index_topk
    return {"attn_in": BF16 * m.hidden_size, "attn_other": other,
            "attn_core": BF16 * (a.q_lora_rank + nh * a.head_dim + a.head_dim) + FP32 * nh}


def layer_norm_parts(m: ModelSpec) -> dict[str, float]:
    """Bytes per token a layer's norms keep (`ln`): each sublayer's norm input; with hyper-connections (n residual
    streams, `hc`) also the n streams each sublayer's mixing reads and the sublayer's output the post-mix adds back
    (megatron-core HyperConnectionModule: the aggregate and the post-mix save their inputs; selective recompute's
    `mhc` re-runs them instead, an output-discarding checkpoint)."""
    ln = BF16 * m.norms_per_layer * m.hidden_size
    if m.hc_streams <= 1:
        return {"ln": ln}
    return {"ln": ln, "hc": ln * (m.hc_streams + 1)}


def attention_parts(m: ModelSpec, kind: str, i: int = 0) -> dict[str, float]:
    h = m.hidden_size
    if kind == NONE:
        return {}
    if kind == CSA:
        return _csa_parts(m, m.csa.ratio(i))
    if kind == MAMBA:
        return _mamba_parts(m)
    if kind == LINEAR:
        return _gdn_parts(m)
    if m.mla is not None:
        a, nh = m.mla, m.num_heads
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        q_lat = a.q_lora_rank or 0
        return {
            "attn_in": BF16 * h,
            "attn_other": BF16 * (q_lat + a.kv_lora_rank + a.qk_rope_head_dim)  # latent norms' inputs
            + BF16 * nh * a.v_head_dim,  # o_proj input
            # q, k, v (the kernel's output: o_proj input), and the normalized latents the up projections save
            # (TE's fused norm-linear keeps both its input and its output; recompute_up_proj re-runs both)
            "attn_core": BF16 * nh * (2 * qk + a.v_head_dim) + BF16 * (q_lat + a.kv_lora_rank),
        }
    q = m.num_heads * m.head_dim
    kv = m.num_kv_heads * m.head_dim
    other = BF16 * q  # o_proj input
    if m.qk_norm:
        other += BF16 * (q + kv)
    if m.attn_output_gate:
        other += BF16 * 2 * q  # the gate and the ungated output (torch.compile'd _apply_output_gate keeps both)
    # TE's fused/flash attention saves q, k, v, its output and fp32 softmax statistics (FusedAttnFunc
    # save_for_backward); the output is the same buffer linear_proj saves as its input, counted once
    # above (tests/parity/test_activations.py)
    return {"attn_in": BF16 * h, "attn_other": other, "attn_core": BF16 * (q + 2 * kv)}


def ffn_kind(m: ModelSpec, i: int) -> str:
    return "moe" if m.is_moe_layer(i) else ("dense" if m.has_ffn(i) else "none")


def ffn_parts(m: ModelSpec, kind: str) -> dict[str, float]:
    """Activation parts of an FFN of `kind` ("none", "dense", "moe")."""
    h = m.hidden_size
    up = 2 if m.gated_mlp else 1  # fc1 outputs (gate and up, or up alone), saved by the activation
    if kind == "none":
        return {}
    if kind == "dense":
        f = m.ffn_hidden_size
        return {"mlp_in": BF16 * h, "mlp": BF16 * (up * f + f)}
    e = m.moe
    parts = {
        # the MoE input; with LatentMoE also fc2_latent_proj's input (the combined latent-width output)
        "mlp_in": BF16 * (h + e.latent_size),
        "router": FP32 * 2 * e.num_experts,
        # permuted tokens (the experts' fc1 input). Not the experts' fc2 output: the routing probs are
        # applied in the experts' activation (per_token_scale; the weighted SwiGLU saves fc1's output and
        # the probs) and unpermute's scatter-add (or TE's fused moe_unpermute) keeps only indices
        "moe_perm": e.top_k * BF16 * e.width(h),
        "moe_fc1": e.top_k * BF16 * up * e.ffn_hidden_size,
        "moe_act": e.top_k * BF16 * e.ffn_hidden_size,
    }
    if e.activation_clamp:
        # gpt-oss clamps both GLU halves before its fused activation (weighted_bias_quick_geglu_impl, megatron-core
        # 0.16-0.19): the clamps keep their input (views of the fc1 output) and the fused function the cat of the
        # clamped halves, a second fc1-sized copy (bench/activation_parity.py, gpt-oss-moe)
        parts["moe_clamp"] = e.top_k * BF16 * up * e.ffn_hidden_size
    if e.shared_ffn_hidden_size:
        parts["shared"] = BF16 * (up + 1) * e.shared_ffn_hidden_size
        if e.shared_expert_gate:  # `output * sigmoid(gate)` (shared_experts.py) keeps the shared output (h)
            parts["shared"] += BF16 * h
    return parts


def flops_of(m: ModelSpec, items, kind: str) -> tuple[float, float, float, float]:
    """Forward FLOPs per token of a layer's `items` with token mixer `kind`: (dense matmuls, attention per
    context token, routed experts, GDN / Mamba2 scan)."""
    dense = expert = 0.0
    for it in items:
        if not it.matrix or it.name in ("gdn.conv1d", "mamba.conv1d"):  # depthwise convs: added below
            continue
        if it.shard == "expert":
            expert += 2 * it.count * it.active
        else:
            dense += 2 * it.count
    quad = lin = 0.0
    if kind == LINEAR:
        la = m.linear
        # chunked delta rule (chunk 64): intra-chunk attention + state updates, ~ 4 x chunk x (dk + dv) per head
        lin = 2 * la.num_value_heads * (64 * (la.key_head_dim + la.value_head_dim) + 2 * la.key_head_dim * la.value_head_dim)
        dense += 2 * (2 * la.key_dim + la.value_dim) * la.conv_kernel
    elif kind == MAMBA:
        mb = m.mamba
        Q, P, N = mb.chunk_size, mb.head_dim, mb.state_dim
        # chunked SSD (Mamba-2, arXiv:2405.21060 sec. 6): per head, the intra-chunk (L o C B^T) X product
        # (Q x P per token) and the chunk states in and out (N x P each); C B^T once per group (Q x N)
        lin = 2 * mb.num_heads * (Q * P + 2 * N * P) + 2 * mb.num_groups * Q * N
        dense += 2 * mb.conv_dim * mb.conv_kernel
    elif kind == NONE:
        pass
    elif kind == CSA:  # per context token: QK and PV over the shared head's width (csa_context: how many tokens)
        quad = 2 * m.num_heads * 2 * m.csa.head_dim
    elif m.mla is not None:
        a = m.mla
        quad = 2 * m.num_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim)
    else:
        quad = 2 * m.num_heads * 2 * m.head_dim
    return dense, quad, expert, lin


@lru_cache(maxsize=32)
def layer_tables(m: ModelSpec) -> LayerTables:
    L = m.num_layers
    ptp, prep, pexp, pexp_ep = np.zeros(L), np.zeros(L), np.zeros(L), np.zeros(L)
    act = np.zeros((L, len(PARTS)))
    kind = np.zeros(L, dtype=np.int8)
    fl = np.zeros((L, 4))
    ratio = np.zeros(L, dtype=np.int64)
    for i in range(L):
        for it in layer_items(m, i):
            if it.shard != "buffer":  # buffers are no parameters of megatron's (params.py)
                {"tp": ptp, "rep": prep, "expert": pexp, "expert_ep": pexp_ep}[it.shard][i] += it.count
        parts = {**layer_norm_parts(m), **attention_parts(m, m.layer_types[i], i), **ffn_parts(m, ffn_kind(m, i))}
        for name, v in parts.items():
            act[i, PARTS.index(name)] += v
        t = m.layer_types[i]
        kind[i] = 3 if (t == FULL and m.mla) else KIND[t]
        ratio[i] = m.csa.ratio(i) if t == CSA else 0
        fl[i] = flops_of(m, layer_items(m, i), t)
    return LayerTables(
        n_layers=L, params_tp=ptp, params_rep=prep, params_exp=pexp, params_exp_ep=pexp_ep, act=act,
        is_moe=np.array([m.is_moe_layer(i) for i in range(L)]), kind=kind,
        flops_dense=fl[:, 0], flops_attn_quadratic=fl[:, 1], flops_expert=fl[:, 2], flops_linear_attn=fl[:, 3],
        ratio=ratio,
    )


def stage_sums(values: np.ndarray, pp: np.ndarray, vpp: np.ndarray, n_stages: int,
               split: np.ndarray | None = None) -> np.ndarray:
    """Sum a per-layer column (L,) or table (L, K) into per-stage totals for each row's (PP, VPP, split).

    Returns (n, n_stages[, K]); stages beyond a row's PP are zero. Layers fill the PP x VPP virtual stages
    in order (virtual stage k sits on pipeline stage k % PP): evenly, or as the row's layer split (a code
    of LayoutTable.split). Work is done once per distinct (PP, VPP, split), then gathered (a 1-D unique on
    one int64 key: sorting row tuples is the slow part at 10^5 rows).
    """
    per, inverse = stage_sums_by_pair(values, pp, vpp, n_stages, split)
    return per[inverse]


def stage_sums_by_pair(values: np.ndarray, pp: np.ndarray, vpp: np.ndarray, n_stages: int,
                       split: np.ndarray | None = None):
    """`stage_sums` before the gather: (per-pair totals (n_pairs, n_stages[, K]), row -> pair index)."""
    values = np.asarray(values, dtype=float)
    L = values.shape[0]
    extra = values.shape[1:]
    pairs, inverse = _pairs(np.asarray(pp), np.asarray(vpp), split)
    per = np.zeros((len(pairs), n_stages) + extra)
    for k, (p, v, code) in enumerate(pairs):
        counts = split_of(code)
        if counts and len(counts) == p * v and sum(counts) == L:
            stage = np.repeat(np.arange(p * v), counts) % p
        else:  # the even split (rows whose split does not fit are illegal and dropped by the rules)
            chunk = max(1, L // (p * v))
            stage = (np.arange(L) // chunk) % p
        np.add.at(per[k], np.minimum(stage, n_stages - 1), values)
    return per, inverse


_LAST_PAIRS: list = []  # [(pp, vpp, split), result]: one evaluation asks ~15 times for the same table's pairs


def _pairs(pp: np.ndarray, vpp: np.ndarray, split: np.ndarray | None = None):
    if _LAST_PAIRS and all(a is b for a, b in zip(_LAST_PAIRS[0], (pp, vpp, split))):
        return _LAST_PAIRS[1]  # the same column objects (held here, so their ids cannot be reused)
    out = _pairs_of(pp, vpp, split)
    _LAST_PAIRS[:] = [(pp, vpp, split), out]
    return out


def _pairs_of(pp: np.ndarray, vpp: np.ndarray, split: np.ndarray | None):
    key = pp.astype(np.int64) * (1 << 20) + vpp.astype(np.int64)
    if split is not None:
        key = key * (1 << 24) + np.asarray(split, dtype=np.int64)
    if len(key) and (key == key[0]).all():  # one (PP, VPP, split) for the whole table: no sort at all
        return [_unkey(int(key[0]), split is not None)], np.zeros(len(key), dtype=np.intp)
    uniq, inverse = np.unique(key, return_inverse=True)
    return [_unkey(int(u), split is not None) for u in uniq], inverse.reshape(-1)


def _unkey(u: int, has_split: bool) -> tuple[int, int, int]:
    code = u & ((1 << 24) - 1) if has_split else 0
    u = u >> 24 if has_split else u
    return u >> 20, u & ((1 << 20) - 1), code


_CLASS_COLS = {cls: [j for j, part in enumerate(PARTS) if PART_CLASS[part] == cls]
               for cls in dict.fromkeys(PART_CLASS.values())}  # divisor class -> its parts' columns


def fold_activations(per_pair: np.ndarray, pair_of: np.ndarray, div: dict) -> np.ndarray:
    """Activation bytes per token per stage (n, S): each divisor class's parts summed per (PP, VPP) pair,
    gathered to rows and divided by that class's per-GPU share `div[class]` (scalar or (n, 1))."""
    out = None
    for cls, cols in _CLASS_COLS.items():
        d = div[cls]
        if np.ndim(d) == 0 and d == 0.0:
            continue  # a class this fold leaves out (the expert parts apart, or all but them): no gather
        per = per_pair[:, :, cols].sum(axis=2)
        if not per.any():
            continue  # no layer of this model has the class's parts
        term = per[pair_of] * d
        if out is None:
            out = term
        else:
            out += term
    return np.zeros((len(pair_of), per_pair.shape[1])) if out is None else out


def vocab_per_row(model: ModelSpec, tp: np.ndarray) -> np.ndarray:
    """Megatron's padded vocabulary for each row's TP (computed once per distinct TP), as int64."""
    tp = np.asarray(tp)
    vals, inv = np.unique(tp, return_inverse=True)
    return np.array([padded_vocab(model, int(v)) for v in vals], dtype=np.int64)[inv.reshape(-1)]
