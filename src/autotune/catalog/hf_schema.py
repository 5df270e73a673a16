"""Typed validation of the config.json fields ModelSpec reads (pydantic), before any arithmetic.

A config.json is the user's file: a count given as text ("eight"), a dict given as a string, a list
given as a number, an integer too large for any real model, NaN or infinity all fail here with one
line naming the file, the field and the value. Fields autotune does not read pass through unchecked.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigError

__all__ = ["check_hf_config", "HFConfig"]

# Bounds far above any real model, low enough that products of them stay exact in float64.
_Dim = Annotated[int, Field(strict=True, gt=0, le=2**20)]  # widths, heads, head dims, ranks
_Count = Annotated[int, Field(strict=True, ge=0, le=100_000)]  # layers, experts, MTP layers
_Vocab = Annotated[int, Field(strict=True, gt=0, le=2**24)]
_Flag = Annotated[bool, Field(strict=True)]
_Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]


class RopeParameters(BaseModel):
    model_config = ConfigDict(extra="allow")
    partial_rotary_factor: _Fraction | None = None


class HFConfig(BaseModel):
    """The config.json keys from_hf_config reads, typed and bounded; others are allowed and ignored."""

    model_config = ConfigDict(extra="allow")

    model_type: Annotated[str, Field(strict=True, max_length=200)] | None = None
    hidden_size: _Dim | None = None
    num_hidden_layers: Annotated[int, Field(strict=True, gt=0, le=100_000)] | None = None
    vocab_size: _Vocab | None = None
    num_attention_heads: _Dim | None = None
    num_key_value_heads: _Dim | None = None
    head_dim: _Dim | None = None
    intermediate_size: _Dim | None = None
    layer_types: list[Annotated[str, Field(strict=True, max_length=100)]] | None = None
    full_attention_interval: _Count | None = None
    sliding_window: _Dim | None = None
    use_sliding_window: _Flag | None = None
    linear_num_key_heads: _Dim | None = None
    linear_num_value_heads: _Dim | None = None
    linear_key_head_dim: _Dim | None = None
    linear_value_head_dim: _Dim | None = None
    linear_conv_kernel_dim: _Dim | None = None
    kv_lora_rank: _Dim | None = None
    q_lora_rank: _Dim | None = None
    qk_nope_head_dim: _Dim | None = None
    qk_rope_head_dim: _Dim | None = None
    v_head_dim: _Dim | None = None
    num_experts: _Count | None = None
    n_routed_experts: _Count | None = None
    num_local_experts: _Count | None = None
    num_experts_per_tok: _Count | None = None
    experts_per_token: _Count | None = None
    moe_intermediate_size: _Dim | None = None
    shared_expert_intermediate_size: Annotated[int, Field(strict=True, ge=0, le=2**20)] | None = None
    n_shared_experts: _Count | None = None
    mlp_only_layers: list[Annotated[int, Field(strict=True, ge=0, le=100_000)]] | None = None
    first_k_dense_replace: _Count | None = None
    decoder_sparse_step: _Count | None = None
    moe_layer_freq: _Count | None = None
    topk_method: Annotated[str, Field(strict=True, max_length=100)] | None = None
    n_group: _Count | None = None  # group-limited routing (DeepSeek-V3): expert groups
    topk_group: _Count | None = None  # ... and how many of them a token's experts come from
    swiglu_limit: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)] | None = None  # gpt-oss's GLU clamp
    rope_parameters: RopeParameters | None = None
    partial_rotary_factor: _Fraction | None = None
    tie_word_embeddings: _Flag | None = None
    attn_output_gate: _Flag | None = None
    attention_bias: _Flag | None = None
    # DeepSeek-V4 (deepseek_v4)
    compress_ratios: list[Annotated[int, Field(strict=True, ge=0, le=2**20)]] | None = None
    o_groups: _Dim | None = None
    o_lora_rank: _Dim | None = None
    index_n_heads: _Dim | None = None
    index_head_dim: _Dim | None = None
    index_topk: _Dim | None = None
    hc_mult: _Dim | None = None
    num_hash_layers: _Count | None = None
    mtp_num_hidden_layers: _Count | None = None
    num_nextn_predict_layers: _Count | None = None
    # Nemotron-H (see _families.py): the hybrid pattern, Mamba2 sizes, LatentMoE, the MTP block's pattern
    hybrid_override_pattern: Annotated[str, Field(strict=True, max_length=100_000)] | None = None
    mtp_hybrid_override_pattern: Annotated[str, Field(strict=True, max_length=1000)] | None = None
    layers_block_type: list[Annotated[str, Field(strict=True, max_length=100)]] | None = None
    mtp_layers_block_type: list[Annotated[str, Field(strict=True, max_length=100)]] | None = None
    mamba_num_heads: _Dim | None = None
    mamba_head_dim: _Dim | None = None
    ssm_state_size: _Dim | None = None
    n_groups: _Dim | None = None
    conv_kernel: _Dim | None = None
    chunk_size: _Dim | None = None
    moe_latent_size: _Dim | None = None
    moe_shared_expert_intermediate_size: Annotated[int, Field(strict=True, ge=0, le=2**20)] | None = None
    attention_head_dim: _Dim | None = None
    # Llama 4 (see _families.py): the dense layers' FFN, which layers are MoE, per-layer RoPE, chunked attention
    intermediate_size_mlp: _Dim | None = None
    interleave_moe_layer_step: _Dim | None = None
    moe_layers: list[Annotated[int, Field(strict=True, ge=0, le=100_000)]] | None = None
    no_rope_layers: list[Annotated[int, Field(strict=True, ge=0, le=1)]] | None = None
    no_rope_layer_interval: _Dim | None = None
    attention_chunk_size: _Dim | None = None
    use_qk_norm: _Flag | None = None
    # GPT-2-style keys (GPT-3 stacks)
    n_embd: _Dim | None = None
    n_layer: Annotated[int, Field(strict=True, gt=0, le=100_000)] | None = None
    n_head: _Dim | None = None
    n_inner: _Dim | None = None
    n_positions: _Dim | None = None
    mlp_bias: _Flag | None = None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_hf_config(cfg: dict, where: str) -> None:
    """Raise a one-line ConfigError for the first wrong field of `cfg` (the merged text config)."""
    try:
        HFConfig.model_validate(cfg)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        err = errors[0]
        field = ".".join(str(p) for p in err["loc"]) or "(root)"
        more = f" ({len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(f"{where}: field {field!r} = {_short(err.get('input'))}: {err['msg']}{more}; "
                          f"fix the config.json") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to check; fix the config.json") from None
