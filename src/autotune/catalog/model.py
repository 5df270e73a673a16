"""ModelSpec: the architecture of one model, read from a Hugging Face config.json.

What lives here: the spec dataclasses and the translation from HF config keys (Qwen3.5/Qwen3-Next hybrid
stacks, Qwen3 MoE, DeepSeek MLA, Mixtral, Llama, gpt-oss sliding windows) into one vocabulary. Families
whose keys differ (Nemotron-H's hybrid_override_pattern, GPT-2-style n_embd, Nemotron-4, Llama 4's
expert / dense FFN split) are normalised first in `_families.py`; the sub-specs (GDN, Mamba2, MLA, MoE)
live in `_specs.py`. Parameter counting is in `params.py`; the catalog and name lookup in `registry.py`.

A layer is a token mixer (`layer_types`: full / sliding / linear (GDN) attention, a Mamba2 mixer, or none)
plus an FFN (dense or MoE) unless the layer is in `ffn_free`. Uniform stacks have both in every layer;
hybrid-pattern stacks (Megatron's --hybrid-override-pattern, Nemotron-H) have exactly one per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ._families import CSA, FULL, LINEAR, MAMBA, NONE, SLIDING, normalise
from ._specs import CsaSpec, LinearAttentionSpec, MambaSpec, MlaSpec, MoeSpec
from .hf_schema import check_hf_config

__all__ = ["ModelSpec", "LinearAttentionSpec", "MambaSpec", "MlaSpec", "MoeSpec", "CsaSpec", "from_hf_config", "FULL",
           "SLIDING", "LINEAR", "MAMBA", "NONE", "CSA"]

QK_NORM_TYPES = {"qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"}
GATED_ATTENTION_TYPES = {"qwen3_next"}  # gated by construction, no config key
SHARED_GATE_TYPES = {"qwen2_moe", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text"}
# GLM-4.5 (glm4_moe) reads three keys its own way: attention_bias means Q, K and V biases only (HF Glm4MoeAttention
# builds o_proj with bias=False; Megatron-Bridge GLMMoEModelProvider: add_qkv_bias True, add_bias_linear False; elsewhere,
# Llama, gpt-oss, GPT-2, o_proj has one too); its router scores by sigmoid with a correction bias though the config names
# neither (HF Glm4MoeTopkRouter); use_qk_norm switches a weighted QK norm (HF q_norm / k_norm; Bridge qk_layernorm)
QKV_BIAS_ONLY_TYPES = {"glm4_moe"}
# Nemotron-H's attention has no positional embedding (HF NemotronHAttention applies none; Megatron-Bridge's NemotronH
# bridge sets position_embedding_type "none"), though its config.json carries rope_theta and partial_rotary_factor
NO_ROPE_TYPES = {"nemotron_h"}
ROUTER_BIAS_TYPES = {"gpt_oss", "glm4_moe"}  # beside DeepSeek's noaux_tc (gpt-oss: a learned linear bias)
QK_NORM_SWITCH_TYPES = {"glm4_moe"}
# routers that score by sigmoid though their config names no scoring_func: GLM-4.5's, and Llama 4's (HF Llama4TextMoe
# takes the sigmoid of the top-k logits; Megatron-Bridge Llama4ModelProvider: moe_router_score_function "sigmoid")
SIGMOID_ROUTER_TYPES = {"glm4_moe", "llama4", "llama4_text"}


@dataclass(frozen=True)
class ModelSpec:
    """One decoder-only text model. Vision towers are not part of the spec (text training only)."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    layer_types: tuple[str, ...]
    tie_embeddings: bool = False
    attn_output_gate: bool = False
    qk_norm: bool = False
    attention_bias: bool = False
    qkv_bias_only: bool = False  # attention_bias on Q, K and V but not the output projection (GLM-4.5's o_proj)
    attention_sinks: bool = False
    sliding_window: int | None = None
    rotary_fraction: float = 1.0  # 0: no positional embedding in attention (NO_ROPE_TYPES)
    linear: LinearAttentionSpec | None = None
    mla: MlaSpec | None = None
    moe: MoeSpec | None = None
    mtp_layers: int = 0
    mamba: MambaSpec | None = None
    ffn_free: tuple[int, ...] = ()  # layers without an FFN (a hybrid pattern's mixer-only layers)
    hybrid_pattern: str = ""  # Megatron's --hybrid-override-pattern (M, *, -, E); "" for uniform stacks
    mtp_pattern: str = ""  # a hybrid MTP block's pattern ("*E"); "" = one layer like the last
    gated_mlp: bool = True  # fc1 is gate + up (SwiGLU); False: one up projection (squared ReLU, GeLU)
    mlp_bias: bool = False  # biases on the dense MLP's fc1 and fc2 (GPT-3)
    norm_bias: bool = False  # LayerNorm with a bias (GPT-3, Nemotron-4) rather than RMSNorm
    learned_positions: int = 0  # rows of a learned absolute position embedding (0: rotary)
    csa: CsaSpec | None = None  # DeepSeek-V4's hybrid attention (every layer's mixer is CSA)
    hc_streams: int = 1  # residual streams hyper-connections mix around each sublayer (DeepSeek-V4's hc_mult); 1: none
    hash_layers: int = 0  # leading MoE layers that route by token id (DeepSeek-V4): the same expert work
    source: str = field(default="", compare=False)

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def latent_attention(self) -> bool:
        """Megatron's multi-latent-attention path: MLA, or DeepSeek-V4's attention built on it (its q up projection is
        what selective recompute's mla_up_proj re-runs; its heads need no KV-group split)."""
        return self.mla is not None or self.csa is not None

    @property
    def bias_linear(self) -> bool:
        """Biases on every linear (Megatron's add_bias_linear, on unless --disable-bias-linear): GPT-3's (mlp_bias)
        and gpt-oss's (QKV, router and experts). A QKV bias alone (Qwen2) is --disable-bias-linear --add-qkv-bias."""
        return self.mlp_bias or (self.attention_bias and self.moe is not None and self.moe.expert_bias)

    @property
    def is_hybrid(self) -> bool:
        """Gated DeltaNet linear attention in the stack (the Qwen3-Next / Qwen3.5 path)."""
        return self.linear is not None

    def has_ffn(self, i: int) -> bool:
        return i not in self.ffn_free

    def is_moe_layer(self, i: int) -> bool:
        return self.moe is not None and i not in self.moe.dense_layers and i not in self.ffn_free

    @property
    def norms_per_layer(self) -> int:
        """Pre-norms per decoder layer: one per sublayer (a hybrid pattern's layers have one sublayer)."""
        return 1 if self.hybrid_pattern else 2

    @property
    def norm_size(self) -> int:
        return self.hidden_size * (2 if self.norm_bias else 1)

    def count(self, kind: str) -> int:
        return sum(1 for t in self.layer_types if t == kind)

    def describe(self) -> str:
        parts = [f"{self.num_layers} layers", f"hidden {self.hidden_size}"]
        if self.linear:
            parts.append(f"{self.count(LINEAR)} Gated DeltaNet + {self.count(FULL)} full attention")
        if self.mamba:
            parts.append(f"{self.count(MAMBA)} Mamba2 + {self.count(FULL)} attention + "
                         f"{self.num_layers - len(self.ffn_free)} FFN layers")
        if self.count(SLIDING):
            parts.append(f"{self.count(SLIDING)} sliding-window ({self.sliding_window}) + {self.count(FULL)} full")
        if self.csa:
            r = self.csa.ratios[:self.num_layers]
            parts.append(f"DeepSeek-V4 attention: {r.count(4)} CSA + {r.count(128)} HCA + {r.count(0)} window-only, "
                         f"{self.num_heads} heads x {self.csa.head_dim}")
            if self.hc_streams > 1:
                parts.append(f"{self.hc_streams} hyper-connection streams")
        elif self.mla:
            parts.append("MLA")
        else:
            parts.append(f"{self.num_heads} heads / {self.num_kv_heads} KV")
        if self.moe:
            m = self.moe
            s = f"MoE {m.num_experts} experts top-{m.top_k} ffn {m.ffn_hidden_size}"
            if m.shared_ffn_hidden_size:
                s += f" + shared {m.shared_ffn_hidden_size}"
            if m.dense_layers:
                s += f", {len(m.dense_layers)} dense layers"
            parts.append(s)
        else:
            parts.append(f"dense ffn {self.ffn_hidden_size}")
        return ", ".join(parts)


def _get(cfg: dict, key: str, where: str, kind: type = int) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"{where}: missing required field '{key}'; add it to the config.json")
    value = cfg[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ConfigError(f"{where}: field '{key}' must be a positive integer, got {value!r}")
    return value


def _opt_int(cfg: dict, key: str, where: str, default: int | None = None) -> int | None:
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: field '{key}' must be a non-negative integer, got {value!r}")
    return value


def _layer_types(cfg: dict, n_layers: int, model_type: str, where: str) -> tuple[str, ...]:
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            raise ConfigError(
                f"{where}: field 'layer_types' must list {n_layers} entries (num_hidden_layers), "
                f"got {len(types) if isinstance(types, list) else type(types).__name__}"
            )
        bad = sorted({t for t in types if t not in (FULL, SLIDING, LINEAR)})
        if bad:
            raise ConfigError(
                f"{where}: field 'layer_types' has unknown type(s) {bad}; "
                f"allowed: {FULL}, {SLIDING}, {LINEAR}"
            )
        return tuple(types)
    interval = cfg.get("full_attention_interval")
    if interval:
        return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers))
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", model_type == "gpt_oss"):
        return tuple(SLIDING if i % 2 == 0 else FULL for i in range(n_layers))
    return (FULL,) * n_layers


def from_hf_config(cfg: dict, name: str, source: str = "") -> ModelSpec:
    """Translate an HF config dict (top level or with a nested text_config) into a ModelSpec."""
    where = f"config.json of {name}" + (f" ({source})" if source and not source.startswith("catalog:") else "")
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    top_type = cfg.get("model_type", "")
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", top_type)}
    if not isinstance(top_type, str):
        raise ConfigError(f"{where}: field 'model_type' must be a string, got {type(top_type).__name__}")
    check_hf_config(cfg, where)
    model_type = str(cfg.get("model_type") or top_type or "unknown")
    cfg, fam = normalise(cfg, model_type, where)
    moe_fam = {k: fam.pop(k) for k in ("dense_layers", "router_bias", "sigmoid_router", "latent_size") if k in fam}
    if "mamba" in fam:
        fam["mamba"] = MambaSpec(**fam["mamba"])
    if "csa" in fam:
        fam["csa"] = CsaSpec(**fam["csa"])

    hidden = _get(cfg, "hidden_size", where)
    n_layers = _get(cfg, "num_hidden_layers", where)
    vocab = _get(cfg, "vocab_size", where)
    heads = _get(cfg, "num_attention_heads", where)
    kv_heads = _opt_int(cfg, "num_key_value_heads", where, heads) or heads
    head_dim = _opt_int(cfg, "head_dim", where) or hidden // heads
    layer_types = fam.pop("layer_types", None) or _layer_types(cfg, n_layers, model_type, where)

    linear = None
    if LINEAR in layer_types:
        linear = LinearAttentionSpec(
            num_key_heads=_get(cfg, "linear_num_key_heads", where),
            num_value_heads=_get(cfg, "linear_num_value_heads", where),
            key_head_dim=_get(cfg, "linear_key_head_dim", where),
            value_head_dim=_get(cfg, "linear_value_head_dim", where),
            conv_kernel=_get(cfg, "linear_conv_kernel_dim", where),
        )

    mla = None
    if cfg.get("kv_lora_rank"):
        mla = MlaSpec(
            q_lora_rank=_opt_int(cfg, "q_lora_rank", where),
            kv_lora_rank=_get(cfg, "kv_lora_rank", where),
            qk_nope_head_dim=_get(cfg, "qk_nope_head_dim", where),
            qk_rope_head_dim=_get(cfg, "qk_rope_head_dim", where),
            v_head_dim=_get(cfg, "v_head_dim", where),
        )

    n_experts = cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts")
    moe = None
    ffn = _opt_int(cfg, "intermediate_size", where)
    if n_experts:
        top_k = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token")
        if not top_k:
            raise ConfigError(f"{where}: MoE model is missing 'num_experts_per_tok'; add it")
        moe_ffn = _opt_int(cfg, "moe_intermediate_size", where) or ffn
        if not moe_ffn:
            raise ConfigError(f"{where}: MoE model is missing 'moe_intermediate_size'; add it")
        shared = _opt_int(cfg, "shared_expert_intermediate_size", where) or 0
        if not shared and cfg.get("n_shared_experts"):
            shared = int(cfg["n_shared_experts"]) * moe_ffn
        dense = set(cfg.get("mlp_only_layers") or []) | set(moe_fam.get("dense_layers", ()))
        dense |= set(range(int(cfg.get("first_k_dense_replace") or 0)))
        step = int(cfg.get("decoder_sparse_step") or cfg.get("moe_layer_freq") or 1)
        if step > 1:
            dense |= {i for i in range(n_layers) if (i + 1) % step != 0}
        moe = MoeSpec(
            num_experts=int(n_experts),
            top_k=int(top_k),
            ffn_hidden_size=moe_ffn,
            shared_ffn_hidden_size=shared,
            shared_expert_gate=bool(shared) and model_type in SHARED_GATE_TYPES,
            expert_bias=model_type == "gpt_oss",
            router_bias=(model_type in ROUTER_BIAS_TYPES or cfg.get("topk_method") == "noaux_tc"  # DeepSeek's
                         or bool(moe_fam.get("router_bias"))),  # e_score_correction_bias; Nemotron-H's
            # the config's scoring_func where it names one (DeepSeek-V3 and Kimi-K2 sigmoid, DeepSeek-V2 softmax)
            sigmoid_router=(str(cfg["scoring_func"]).lower() == "sigmoid" if cfg.get("scoring_func")
                            else model_type.startswith("deepseek") or model_type in SIGMOID_ROUTER_TYPES
                            or bool(moe_fam.get("sigmoid_router"))),
            dense_layers=tuple(sorted(dense)),
            latent_size=int(moe_fam.get("latent_size") or 0),
            router_groups=int(cfg.get("n_group") or 1),
            router_group_topk=int(cfg.get("topk_group") or 0),
            activation_clamp=float(cfg.get("swiglu_limit") or 0.0),
        )
        if moe.top_k > moe.num_experts:
            raise ConfigError(f"{where}: num_experts_per_tok {moe.top_k} exceeds num_experts {moe.num_experts}")
        groups, chosen = moe.router_groups, moe.router_group_topk
        if groups < 1 or moe.num_experts % groups or chosen > groups:
            raise ConfigError(f"{where}: n_group {groups} / topk_group {chosen} do not split {moe.num_experts} "
                              "experts into groups (n_group must divide them, topk_group <= n_group)")
    if ffn is None:
        if moe is None or moe.dense_layers:
            raise ConfigError(f"{where}: missing required field 'intermediate_size'; add it")
        ffn = moe.ffn_hidden_size
    rope = cfg.get("rope_parameters") or {}
    rotary = 0.0 if model_type in NO_ROPE_TYPES else float(cfg.get("partial_rotary_factor")
                                                           or rope.get("partial_rotary_factor") or 1.0)
    return ModelSpec(
        name=name,
        model_type=model_type,
        hidden_size=hidden,
        num_layers=n_layers,
        vocab_size=vocab,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden_size=ffn,
        layer_types=layer_types,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attn_output_gate=bool(cfg.get("attn_output_gate", model_type in GATED_ATTENTION_TYPES)),
        qk_norm=model_type in QK_NORM_TYPES or (model_type in QK_NORM_SWITCH_TYPES and bool(cfg.get("use_qk_norm"))),
        attention_bias=bool(cfg.get("attention_bias", False)),
        qkv_bias_only=model_type in QKV_BIAS_ONLY_TYPES,
        attention_sinks=model_type == "gpt_oss",
        sliding_window=cfg.get("sliding_window") if SLIDING in layer_types else None,
        rotary_fraction=rotary,
        linear=linear,
        mla=mla,
        moe=moe,
        mtp_layers=int(cfg.get("mtp_num_hidden_layers") or cfg.get("num_nextn_predict_layers") or 0),
        source=source,
        **fam,
    )
