"""The sub-specs of a ModelSpec: Gated DeltaNet linear attention, the Mamba2 mixer, multi-head latent
attention, routed experts. Plain frozen dataclasses; `model.py` reads them from a config.json."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LinearAttentionSpec", "MambaSpec", "MlaSpec", "MoeSpec", "CsaSpec"]


@dataclass(frozen=True)
class LinearAttentionSpec:
    """Gated DeltaNet linear attention (Qwen3-Next / Qwen3.5)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim


@dataclass(frozen=True)
class MambaSpec:
    """Mamba2 mixer (Megatron's MambaMixer; HF NemotronH): SSD with grouped B/C, a gated RMSNorm."""

    num_heads: int
    head_dim: int
    state_dim: int
    num_groups: int
    conv_kernel: int
    chunk_size: int = 128  # the chunked SSD scan's block length (Megatron and HF default 128)

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:  # x, B, C go through the depthwise conv
        return self.d_inner + 2 * self.num_groups * self.state_dim

    @property
    def in_proj_dim(self) -> int:  # z, x, B, C, dt
        return 2 * self.d_inner + 2 * self.num_groups * self.state_dim + self.num_heads


@dataclass(frozen=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V2/V3)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class CsaSpec:
    """DeepSeek-V4's hybrid attention (megatron-core's DSv4HybridAttention, --experimental-attention-variant
    dsv4_hybrid). Queries come through a low-rank path (hidden -> q_lora_rank -> heads x head_dim); one shared KV
    head of `head_dim` (hidden -> head_dim) serves every head as key and value; the output runs a grouped low-rank
    projection (heads x head_dim in `o_groups` groups -> o_groups x o_lora_rank -> hidden). Each layer attends over a
    sliding window of `window` tokens plus compressed KV entries, per its compress ratio (`ratios`, one per decoder
    layer then one per MTP layer): 0 the window alone; 4 (CSA) a learned compressor pools every 4 tokens (two
    overlapping projections) and an indexer (`index_heads` x `index_head_dim`, queries from the q latent) picks the
    top `index_topk` compressed entries; 128 (HCA) every 128 tokens pool into one entry, all of them attended."""

    q_lora_rank: int
    head_dim: int  # query, key and value width per head (the rotary part is rope_dim of it)
    rope_dim: int
    o_groups: int
    o_lora_rank: int
    window: int
    ratios: tuple[int, ...]
    index_heads: int
    index_head_dim: int
    index_topk: int

    def ratio(self, i: int) -> int:
        """Layer i's compress ratio (i >= the decoder's layers: the MTP layers'; past the list: 0)."""
        return self.ratios[i] if i < len(self.ratios) else 0


@dataclass(frozen=True)
class MoeSpec:
    """Routed experts, optional shared experts, and which layers stay dense."""

    num_experts: int
    top_k: int
    ffn_hidden_size: int
    shared_ffn_hidden_size: int = 0
    shared_expert_gate: bool = False
    expert_bias: bool = False
    router_bias: bool = False
    # the router scores experts by sigmoid (DeepSeek-V3, Kimi-K2, GLM-4.5, Nemotron-H); with router_bias, the bias is
    # the aux-loss-free balancing one that pretraining moves (gpt-oss's learned bias sits on a softmax router)
    sigmoid_router: bool = False
    dense_layers: tuple[int, ...] = ()
    latent_size: int = 0  # LatentMoE: experts (and the dispatch) run at this width between two projections
    # group-limited routing (DeepSeek-V3's n_group / topk_group, Megatron's --moe-router-num-groups / -group-topk):
    # the experts split into `router_groups` consecutive groups and a token's top-k come from its best
    # `router_group_topk` of them (1 / 0: unlimited)
    router_groups: int = 1
    router_group_topk: int = 0
    # the routed experts' GLU inputs clamped before the activation (gpt-oss: swiglu_limit 7; Megatron's
    # activation_func_clamp_value); 0: none
    activation_clamp: float = 0.0

    @property
    def group_limited(self) -> bool:
        return self.router_groups > 1 and 0 < self.router_group_topk < self.router_groups

    def width(self, hidden: int) -> int:
        """The width tokens have inside the routed experts and on the EP all-to-all."""
        return self.latent_size or hidden
