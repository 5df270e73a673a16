"""Exact parameter counts: per layer, per layer type, total and active per token.

Each layer is a list of `ParamItem`s that say how the tensor shards under Megatron-core: `tp` (split
over tensor parallel), `rep` (replicated on every TP rank), `expert` (split over EP x ETP), `expert_ep`
(split over EP, replicated on the ETP ranks: the experts' row-parallel fc2 biases), `buffer` (in the
checkpoint but no parameter of megatron's: no gradient, no optimizer state). The memory model sums
these per pipeline stage; the MFU convention uses `ParamCounts.active`. tests/parity/test_params.py
checks the per-rank sums against megatron-core GPTModels built at the same layouts.

The seed's active rule (Qwen3.5-122B-A10B: 9,008,136,192): every weight matrix used for one token, plus
ONE vocabulary matrix; 1-D tensors (norms, biases, A_log, dt_bias, sinks) and MTP are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import CSA, FULL, LINEAR, MAMBA, NONE, SLIDING, ModelSpec

__all__ = ["ParamItem", "ParamCounts", "layer_items", "mtp_items", "param_counts", "padded_vocab"]


@dataclass(frozen=True)
class ParamItem:
    name: str
    count: int
    shard: str  # "tp" | "rep" | "expert" | "expert_ep" | "buffer"
    matrix: bool  # a weight matrix (counted by the active rule) or a 1-D tensor
    active: float = 1.0  # fraction used per token (top_k / num_experts for routed experts)


def _mamba_items(m: ModelSpec) -> list[ParamItem]:
    """Megatron's MambaMixer: in_proj column-parallel (z, x, B, C, dt split per TP rank), the depthwise conv,
    dt_bias, A_log, D and the gated norm's weight all `tensor_model_parallel` (each rank holds its heads' and
    groups' share: mamba_mixer.py asserts heads and groups divide by TP), out_proj row-parallel."""
    mb, h = m.mamba, m.hidden_size
    assert mb is not None
    return [
        ParamItem("mamba.in_proj", h * mb.in_proj_dim, "tp", True),
        ParamItem("mamba.conv1d", mb.conv_dim * mb.conv_kernel, "tp", True),
        ParamItem("mamba.conv1d_bias", mb.conv_dim, "tp", False),
        ParamItem("mamba.dt_bias", mb.num_heads, "tp", False),
        ParamItem("mamba.A_log", mb.num_heads, "tp", False),
        ParamItem("mamba.D", mb.num_heads, "tp", False),
        ParamItem("mamba.norm", mb.d_inner, "tp", False),
        ParamItem("mamba.out_proj", mb.d_inner * h, "tp", True),
    ]


def _csa_items(m: ModelSpec, ratio: int) -> list[ParamItem]:
    """DeepSeek-V4's hybrid attention at one compress ratio (megatron-core DSv4HybridAttention, Megatron-Bridge's
    DeepSeekV4Bridge mapping: wq_a / wq_b, wkv, wo_a / wo_b, attn_sink, compressor.*, indexer.*). The main compressor
    (ratio > 0) projects hidden -> coff x head_dim twice (KV and gate; coff 2 at ratio 4, whose windows overlap, else
    1) and adds a per-position bias `ape` (ratio x coff x head_dim); ratio-4 layers add the indexer: its query
    projection from the q latent, its per-head weights from the hidden state, and a compressor of its own at
    index_head_dim. Megatron builds this attention at TP 1 only; "rep" says so."""
    a, h, nh = m.csa, m.hidden_size, m.num_heads
    assert a is not None
    items = [
        ParamItem("csa.q_down", h * a.q_lora_rank, "rep", True),
        ParamItem("csa.q_norm", a.q_lora_rank, "rep", False),
        ParamItem("csa.q_up", a.q_lora_rank * nh * a.head_dim, "tp", True),
        ParamItem("csa.kv_proj", h * a.head_dim, "rep", True),
        ParamItem("csa.kv_norm", a.head_dim, "rep", False),
        ParamItem("csa.o_group_proj", nh * a.head_dim * a.o_lora_rank, "tp", True),
        ParamItem("csa.o_proj", a.o_groups * a.o_lora_rank * h, "tp", True),
        ParamItem("csa.sinks", nh, "tp", False),
    ]
    if ratio:
        coff = 2 if ratio == 4 else 1
        items += [ParamItem("csa.compressor", 2 * h * coff * a.head_dim, "rep", True),
                  ParamItem("csa.compressor_ape_norm", (ratio * coff + 1) * a.head_dim, "rep", False)]
    if ratio == 4:
        d = a.index_head_dim
        items += [ParamItem("csa.indexer_q", a.q_lora_rank * a.index_heads * d, "rep", True),
                  ParamItem("csa.indexer_weights", h * a.index_heads, "rep", True),
                  ParamItem("csa.indexer_compressor", 2 * h * 2 * d, "rep", True),
                  ParamItem("csa.indexer_ape_norm", (4 * 2 + 1) * d, "rep", False)]
    return items


def _hc_items(m: ModelSpec, sublayers: int) -> list[ParamItem]:
    """Hyper-connections (megatron-core HyperConnectionModule, one per sublayer): a projection of the n streams
    (n x hidden) to the n pre-mix, n post-mix and n x n residual-mix logits, their bias and three scales."""
    n = m.hc_streams
    if n <= 1:
        return []
    mix = 2 * n + n * n
    return [ParamItem("hc.mapping_proj", sublayers * n * m.hidden_size * mix, "rep", True),
            ParamItem("hc.bias_scales", sublayers * (mix + 3), "rep", False)]


def _attention_items(m: ModelSpec, kind: str, i: int = 0) -> list[ParamItem]:
    """Layer i's token mixer of `kind` (i picks a DeepSeek-V4 layer's compress ratio: decoder layers, then MTP)."""
    h = m.hidden_size
    if kind == NONE:
        return []
    if kind == CSA:
        return _csa_items(m, m.csa.ratio(i))
    if kind == MAMBA:
        return _mamba_items(m)
    if kind == LINEAR:
        la = m.linear
        assert la is not None
        kd, vd, nv = la.key_dim, la.value_dim, la.num_value_heads
        return [
            ParamItem("gdn.in_proj_qkvz", h * (2 * kd + 2 * vd), "tp", True),
            ParamItem("gdn.in_proj_ba", h * 2 * nv, "tp", True),
            ParamItem("gdn.conv1d", (2 * kd + vd) * la.conv_kernel, "tp", True),
            ParamItem("gdn.out_proj", vd * h, "tp", True),
            ParamItem("gdn.A_log", nv, "tp", False),
            ParamItem("gdn.dt_bias", nv, "tp", False),
            ParamItem("gdn.norm", la.value_head_dim, "rep", False),
        ]
    if m.mla is not None:
        a, nh = m.mla, m.num_heads
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        items = []
        if a.q_lora_rank:
            items += [
                ParamItem("mla.q_down", h * a.q_lora_rank, "rep", True),
                ParamItem("mla.q_norm", a.q_lora_rank, "rep", False),
                ParamItem("mla.q_up", a.q_lora_rank * nh * qk, "tp", True),
            ]
        else:
            items.append(ParamItem("mla.q_proj", h * nh * qk, "tp", True))
        return items + [
            ParamItem("mla.kv_down", h * (a.kv_lora_rank + a.qk_rope_head_dim), "rep", True),
            ParamItem("mla.kv_norm", a.kv_lora_rank, "rep", False),
            ParamItem("mla.kv_up", a.kv_lora_rank * nh * (a.qk_nope_head_dim + a.v_head_dim), "tp", True),
            ParamItem("mla.o_proj", nh * a.v_head_dim * h, "tp", True),
        ]
    q = m.num_heads * m.head_dim
    kv = m.num_kv_heads * m.head_dim
    q_out = 2 * q if m.attn_output_gate else q
    items = [
        ParamItem("attn.q_proj", h * q_out, "tp", True),
        ParamItem("attn.k_proj", h * kv, "tp", True),
        ParamItem("attn.v_proj", h * kv, "tp", True),
        ParamItem("attn.o_proj", q * h, "tp", True),
    ]
    if m.attention_bias:
        items.append(ParamItem("attn.qkv_bias", q_out + 2 * kv, "tp", False))
        if not m.qkv_bias_only:
            items.append(ParamItem("attn.o_bias", h, "rep", False))
    if m.qk_norm:
        items.append(ParamItem("attn.qk_norm", 2 * m.head_dim, "rep", False))
    if m.attention_sinks:
        items.append(ParamItem("attn.sinks", m.num_heads, "tp", False))
    return items


def _ffn_items(m: ModelSpec, kind: str) -> list[ParamItem]:
    """kind: "none", "dense" or "moe". A gated MLP's fc1 holds gate and up (3 matrices in all), else 2."""
    h, mats = m.hidden_size, 3 if m.gated_mlp else 2
    if kind == "none":
        return []
    if kind == "dense":
        f = m.ffn_hidden_size
        items = [ParamItem("mlp.dense", mats * h * f, "tp", True)]
        if m.mlp_bias:  # fc1 column-parallel (its bias split), fc2 row-parallel (its bias whole on every rank)
            items += [ParamItem("mlp.fc1_bias", (mats - 1) * f, "tp", False), ParamItem("mlp.fc2_bias", h, "rep", False)]
        return items
    e = m.moe
    assert e is not None
    frac = e.top_k / e.num_experts
    items = [
        ParamItem("moe.router", h * e.num_experts, "rep", True),
        ParamItem("moe.experts", e.num_experts * mats * e.width(h) * e.ffn_hidden_size, "expert", True, frac),
    ]
    if e.latent_size:  # fc1/fc2_latent_proj: TELinear(parallel_mode="duplicated"), whole on every TP rank
        items.append(ParamItem("moe.latent_proj", 2 * h * e.latent_size, "rep", True))
    if e.router_bias:
        # gpt-oss: the router linear's learned bias (megatron Router.bias, add_bias_linear). DeepSeek's
        # e_score_correction_bias is moved by load statistics, not gradients: megatron keeps it as the
        # router's `expert_bias` buffer (moe/router.py register_buffer), a parameter of no rank.
        shard = "rep" if e.expert_bias else "buffer"
        items.append(ParamItem("moe.router_bias", e.num_experts, shard, False))
    if e.expert_bias:
        # fc1 (column-parallel) biases split over ETP; fc2 (row-parallel) biases are whole on every ETP
        # rank (tensor_parallel/layers.py RowParallelLinear: bias of output_size)
        items += [
            ParamItem("moe.expert_bias_fc1", e.num_experts * 2 * e.ffn_hidden_size, "expert", False, frac),
            ParamItem("moe.expert_bias_fc2", e.num_experts * h, "expert_ep", False, frac),
        ]
    if e.shared_ffn_hidden_size:
        items.append(ParamItem("moe.shared", mats * h * e.shared_ffn_hidden_size, "tp", True))
        if e.shared_expert_gate:
            items.append(ParamItem("moe.shared_gate", h, "rep", True))
    return items


def _ffn_kind(m: ModelSpec, i: int) -> str:
    return "moe" if m.is_moe_layer(i) else ("dense" if m.has_ffn(i) else "none")


def layer_items(m: ModelSpec, i: int, at: int | None = None) -> list[ParamItem]:
    """Every parameter tensor of decoder layer i (0-based), with its sharding; `at`: the stack position whose
    DeepSeek-V4 compress ratio its attention takes (default i; an MTP layer's is after the decoder's)."""
    norms = ParamItem("norms", m.norms_per_layer * m.norm_size, "rep", False)
    return (_attention_items(m, m.layer_types[i], i if at is None else at) + _ffn_items(m, _ffn_kind(m, i)) + [norms]
            + _hc_items(m, m.norms_per_layer))


_SYMBOL = {"M": (MAMBA, "none"), "*": (FULL, "none"), "-": (NONE, "dense"), "E": (NONE, "moe")}


def mtp_items(m: ModelSpec) -> list[tuple[str, str, list[ParamItem]]]:
    """One MTP block as (mixer kind, FFN kind, items) sublayers: the input part (two norms and the 2h -> h
    projection), one decoder layer per symbol of a hybrid MTP pattern (else one layer like the last), its
    final norm. Megatron builds the block on the last pipeline stage."""
    h = m.hidden_size
    head = [ParamItem("mtp.norms", 2 * m.norm_size, "rep", False), ParamItem("mtp.eh_proj", 2 * h * h, "tp", True)]
    if m.mtp_pattern:
        norm = ParamItem("norms", m.norm_size, "rep", False)
        body = [(_SYMBOL[c][0], _SYMBOL[c][1], _attention_items(m, _SYMBOL[c][0]) + _ffn_items(m, _SYMBOL[c][1])
                 + [norm]) for c in m.mtp_pattern]
    else:  # a layer like the last, at the MTP's position (DeepSeek-V4 lists the MTP layer's compress ratio there)
        last = m.num_layers - 1
        body = [(m.layer_types[last], _ffn_kind(m, last), layer_items(m, last, at=m.num_layers))]
    tail = [ParamItem("mtp.final_norm", m.norm_size, "rep", False)]
    return [(NONE, "none", head), *body, (NONE, "none", tail)]


def padded_vocab(m: ModelSpec, tp: int = 1, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of divisible_by x TP."""
    unit = divisible_by * tp
    return -(-m.vocab_size // unit) * unit


@dataclass(frozen=True)
class ParamCounts:
    """Exact counts (unpadded vocabulary). `active` follows the seed's rule (see module docstring)."""

    total: int
    active: int
    vectors: int
    vocab_matrix: int
    mtp: int
    per_layer_type: dict[str, int]
    active_per_layer_type: dict[str, int]

    @property
    def active_with_vectors(self) -> int:
        return self.active + self.vectors_active

    vectors_active: int = 0


def _kind_key(m: ModelSpec, i: int) -> str:
    kind = m.layer_types[i]
    attn = {LINEAR: "gdn", SLIDING: "sliding_attention", FULL: "mla" if m.mla else "attention", MAMBA: "mamba",
            NONE: "none", CSA: f"csa{m.csa.ratio(i) if m.csa else 0}"}[kind]
    return f"{attn}+{_ffn_kind(m, i)}"


def param_counts(m: ModelSpec) -> ParamCounts:
    total = active = vectors = vectors_active = 0
    per_type: dict[str, int] = {}
    active_type: dict[str, int] = {}
    for i in range(m.num_layers):
        key = _kind_key(m, i)
        for it in layer_items(m, i):
            total += it.count
            per_type[key] = per_type.get(key, 0) + it.count
            used = round(it.count * it.active)
            if it.matrix:
                active += used
                active_type[key] = active_type.get(key, 0) + used
            else:
                vectors += it.count
                vectors_active += used
    vocab = m.vocab_size * m.hidden_size
    n_vocab = 1 if m.tie_embeddings else 2
    # embeddings (+ output layer), learned positions (GPT-3; an embedding lookup, not in the active rule), final norm
    total += n_vocab * vocab + m.learned_positions * m.hidden_size + m.norm_size
    vectors += m.norm_size
    vectors_active += m.norm_size
    active += vocab
    mtp = m.mtp_layers * sum(it.count for _, _, sub in mtp_items(m) for it in sub) if m.mtp_layers else 0
    return ParamCounts(
        total=total,
        active=active,
        vectors=vectors,
        vocab_matrix=vocab,
        mtp=mtp,
        per_layer_type=per_type,
        active_per_layer_type=active_type,
        vectors_active=vectors_active,
    )
