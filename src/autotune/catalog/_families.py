"""Config.json keys of families whose vocabulary differs, normalised before `from_hf_config` reads them.

`normalise(cfg, model_type, where)` returns the config with the common keys (hidden_size, num_hidden_layers,
intermediate_size, ...) and the ModelSpec fields the family fixes by construction. Families and why:
  - gpt2 (GPT-3-style stacks as Megatron-LM and NeMo define GPT models): n_embd / n_layer / n_head / n_inner /
    n_positions; LayerNorm with a bias, biases on every linear, learned absolute positions, a GeLU MLP without
    a gate (HF GPT2MLP is c_fc -> gelu -> c_proj), embeddings tied unless the config says otherwise.
  - nemotron (Nemotron-3/-4, HF NemotronForCausalLM): squared-ReLU MLP without a gate (NemotronMLP is
    up_proj -> relu2 -> down_proj) and LayerNorm1P, a LayerNorm with weight and bias.
  - nemotron_h (Nemotron-H, Nemotron 3 Nano/Super/Ultra): `hybrid_override_pattern`, one symbol per layer: M a Mamba2
    mixer, * attention, - a dense MLP, E an MoE; each layer is one pre-norm and one of those. Experts and the
    dense MLP use squared ReLU without a gate; MoE routing keeps an e_score_correction_bias (HF registers it as
    a buffer, Megatron as the router's expert_bias buffer); `moe_latent_size` runs the experts at a narrower
    width between two projections (LatentMoE); `mtp_hybrid_override_pattern` (or `mtp_layers_block_type`) is the MTP
    block's stack.
  - deepseek_v4 (DeepSeek-V4 Flash and Pro; Megatron-Bridge's DeepSeekV4Bridge reads the same keys): every layer is
    DeepSeek-V4's hybrid attention (`CsaSpec`) with its compress ratio from `compress_ratios` (decoder layers, then
    MTP layers; newer configs: `layer_types` sliding_attention / compressed_sparse_attention /
    heavily_compressed_attention with `compress_rates`), an MoE FFN whose first `num_hash_layers` layers route by
    token id (the same expert work), `hc_mult` residual streams mixed by hyper-connections around each sublayer,
    and the router's expert bias (aux-loss-free balancing, a buffer).
  - llama4 / llama4_text (Llama 4 Scout, Maverick; HF Llama4TextConfig): `intermediate_size` is the routed
    experts' and the shared expert's FFN (every Llama4TextMoe has one ungated shared expert of that size), the
    dense layers' FFN is `intermediate_size_mlp` (HF default 16384); MoE layers are `moe_layers` or, without
    it, every `interleave_moe_layer_step`-th layer (HF default 1: range(step - 1, n, step)). The RoPE layers'
    chunked attention (`attention_chunk_size`, "chunked_attention" in a `layer_types` list) is read as full
    causal attention: the same cost while the sequence is no longer than the chunk (8192 in both models);
    the NoPE layers are full attention anyway. `use_qk_norm` is a weightless L2 norm (Llama4TextL2Norm): no
    parameters, so not the qk_norm (RMSNorm with weights) ModelSpec counts.
Everything else passes through unchanged. Errors are one-line ConfigErrors naming the field and the fix.
"""

from __future__ import annotations

from ..errors import ConfigError

__all__ = ["normalise", "PATTERN_SYMBOLS", "FULL", "SLIDING", "LINEAR", "MAMBA", "NONE", "CSA"]

# token-mixer kinds of a layer (ModelSpec.layer_types); model.py re-exports them
FULL, SLIDING, LINEAR = "full_attention", "sliding_attention", "linear_attention"
MAMBA, NONE = "mamba", "none"  # a Mamba2 mixer; no token mixer (an FFN-only layer of a hybrid pattern)
CSA = "dsv4_attention"  # DeepSeek-V4's hybrid attention: a window plus compressed KV, per the layer's compress ratio

# Megatron's mamba_hybrid_layer_allocation.Symbols that a checkpoint's pattern uses, as HF NemotronH reads them
PATTERN_SYMBOLS = {"M": "Mamba2 mixer", "*": "attention", "-": "MLP", "E": "MoE"}
_BLOCK_NAMES = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-",
                "moe": "E"}  # transformers 5 writes layers_block_type (with linear/full_attention) for the pattern


def _pattern(cfg: dict, key: str, where: str, length: int | None) -> str:
    value = cfg.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: field {key!r} must be a non-empty string of {', '.join(PATTERN_SYMBOLS)}, "
                          f"got {value!r}; copy it from the model's config.json")
    bad = sorted({c for c in value if c not in PATTERN_SYMBOLS})
    if bad:
        names = ", ".join(f"{k} ({v})" for k, v in PATTERN_SYMBOLS.items())
        raise ConfigError(f"{where}: field {key!r} has unknown symbol(s) {bad}; allowed: {names} "
                          "(pipeline separators '|' are not part of a checkpoint's pattern)")
    if length is not None and len(value) != length:
        raise ConfigError(f"{where}: field {key!r} has {len(value)} layers but num_hidden_layers is {length}; "
                          "make them agree")
    return value


def _block_types(cfg: dict, where: str, key: str = "layers_block_type") -> str:
    types = cfg.get(key)
    if not isinstance(types, list) or not types or any(t not in _BLOCK_NAMES for t in types):
        pattern = "mtp_hybrid_override_pattern" if key.startswith("mtp") else "hybrid_override_pattern"
        raise ConfigError(f"{where}: a nemotron_h config needs {pattern!r} (or {key!r} "
                          f"with {', '.join(sorted(_BLOCK_NAMES))}); add it from the model's config.json")
    return "".join(_BLOCK_NAMES[t] for t in types)


def _positive(cfg: dict, key: str, where: str, default: int | None = None, kind: str = "a Mamba2 layer") -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{where}: field {key!r} must be a positive integer for {kind}, got {value!r}; "
                          "add it from the model's config.json")
    return value


def _nemotron_h(cfg: dict, where: str) -> tuple[dict, dict]:
    n = cfg.get("num_hidden_layers")
    if cfg.get("hybrid_override_pattern") is not None:
        pattern = _pattern(cfg, "hybrid_override_pattern", where, n if isinstance(n, int) else None)
    else:
        pattern = _block_types(cfg, where)
    cfg = {**cfg, "num_hidden_layers": len(pattern)}
    kinds = {"M": MAMBA, "*": FULL, "-": NONE, "E": NONE}
    out: dict = {
        "layer_types": tuple(kinds[c] for c in pattern),
        "ffn_free": tuple(i for i, c in enumerate(pattern) if c in "M*"),
        "hybrid_pattern": pattern,
        "gated_mlp": False,
        "dense_layers": tuple(i for i, c in enumerate(pattern) if c == "-"),
        "router_bias": True,
        "sigmoid_router": True,  # Nemotron-H's config names no scoring_func; Megatron-Bridge's recipes route by sigmoid
    }
    if "M" in pattern:
        heads, groups = _positive(cfg, "mamba_num_heads", where), _positive(cfg, "n_groups", where)
        if heads % groups:
            raise ConfigError(f"{where}: mamba_num_heads {heads} is not a multiple of n_groups {groups}; "
                              "check the config.json")
        out["mamba"] = dict(num_heads=heads, head_dim=_positive(cfg, "mamba_head_dim", where),
                            state_dim=_positive(cfg, "ssm_state_size", where), num_groups=groups,
                            conv_kernel=_positive(cfg, "conv_kernel", where),
                            chunk_size=_positive(cfg, "chunk_size", where, 128))
    if "E" not in pattern:  # routed-expert keys of a dense Nemotron-H describe no layer
        cfg = {k: v for k, v in cfg.items() if k not in ("n_routed_experts", "num_experts", "num_local_experts")}
    elif cfg.get("moe_shared_expert_intermediate_size"):
        cfg = {**cfg, "shared_expert_intermediate_size": cfg["moe_shared_expert_intermediate_size"],
               "n_shared_experts": None}
    if not cfg.get("head_dim") and cfg.get("attention_head_dim"):
        cfg["head_dim"] = cfg["attention_head_dim"]
    if cfg.get("num_nextn_predict_layers") and cfg.get("mtp_hybrid_override_pattern"):
        out["mtp_pattern"] = _pattern(cfg, "mtp_hybrid_override_pattern", where, None)
    elif cfg.get("num_nextn_predict_layers") and cfg.get("mtp_layers_block_type") is not None:
        out["mtp_pattern"] = _block_types(cfg, where, "mtp_layers_block_type")  # transformers 5's spelling
    if cfg.get("moe_latent_size"):
        out["latent_size"] = cfg["moe_latent_size"]
    return cfg, out


def _gpt2(cfg: dict) -> tuple[dict, dict]:
    renamed = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
               "n_inner": "intermediate_size"}
    cfg = {renamed.get(k, k): v for k, v in cfg.items()}
    if cfg.get("intermediate_size") is None and isinstance(cfg.get("hidden_size"), int):
        cfg["intermediate_size"] = 4 * cfg["hidden_size"]  # HF GPT2MLP: n_inner None means 4 x n_embd
    cfg.setdefault("tie_word_embeddings", True)  # PretrainedConfig's default, which GPT-2 checkpoints keep
    cfg["attention_bias"] = True
    return cfg, {"gated_mlp": False, "mlp_bias": True, "norm_bias": True,
                 "learned_positions": int(cfg.get("n_positions") or 1024)}


def _llama4(cfg: dict, where: str) -> tuple[dict, dict]:
    n = cfg.get("num_hidden_layers")
    if not cfg.get("num_local_experts"):
        raise ConfigError(f"{where}: a llama4 config needs 'num_local_experts' (16 Scout, 128 Maverick); add it "
                          "from the model's config.json")
    expert = cfg.get("intermediate_size")
    if expert is None:
        raise ConfigError(f"{where}: a llama4 config needs 'intermediate_size' (the experts' FFN, 8192 in Scout and "
                          "Maverick); add it from the model's config.json")
    moe_layers, step = cfg.get("moe_layers"), cfg.get("interleave_moe_layer_step")
    if isinstance(n, int) and n > 0:
        if moe_layers is not None:
            bad = sorted(i for i in moe_layers if i >= n)
            if bad:
                raise ConfigError(f"{where}: field 'moe_layers' names layer(s) {bad[:3]} but num_hidden_layers is {n}; "
                                  "make them agree")
            moe = set(moe_layers)
        else:  # hf_schema has checked the step is a positive integer
            moe = set(range((step or 1) - 1, n, step or 1))
        dense = tuple(i for i in range(n) if i not in moe)
    else:
        dense = ()  # from_hf_config reports the missing num_hidden_layers
    cfg = {**cfg, "moe_intermediate_size": expert, "shared_expert_intermediate_size": expert,
           "intermediate_size": cfg.get("intermediate_size_mlp") or 16384}
    if isinstance(cfg.get("layer_types"), list):  # newer transformers: chunked_attention / full_attention
        cfg["layer_types"] = [FULL if t == "chunked_attention" else t for t in cfg["layer_types"]]
    return cfg, {"dense_layers": dense}


_DSV4_RATIOS = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
_DSV4_KEYS = ("q_lora_rank", "head_dim", "qk_rope_head_dim", "o_groups", "o_lora_rank", "sliding_window",
              "index_n_heads", "index_head_dim", "index_topk")


def _deepseek_v4(cfg: dict, where: str) -> tuple[dict, dict]:
    n = cfg.get("num_hidden_layers")
    n = n if isinstance(n, int) and n > 0 else 0  # from_hf_config reports a missing num_hidden_layers
    mtp = cfg.get("num_nextn_predict_layers") or 0
    for key in _DSV4_KEYS:
        _positive(cfg, key, where, kind="a deepseek_v4 attention layer")
    ratios = cfg.get("compress_ratios")
    if ratios is None and isinstance(cfg.get("layer_types"), list):
        rates = {**_DSV4_RATIOS, **(cfg.get("compress_rates") or {})}
        unknown = sorted({t for t in cfg["layer_types"] if t not in rates})
        if unknown:
            raise ConfigError(f"{where}: field 'layer_types' has unknown DeepSeek-V4 type(s) {unknown}; allowed: "
                              f"{', '.join(_DSV4_RATIOS)}")
        ratios = [rates[t] for t in cfg["layer_types"]]
    if not isinstance(ratios, list) or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ratios):
        raise ConfigError(f"{where}: a deepseek_v4 config needs 'compress_ratios' (one non-negative integer per layer: "
                          f"0 window only, 4 CSA, 128 HCA), got {ratios!r}; add it from the model's config.json")
    if len(ratios) < n:
        raise ConfigError(f"{where}: field 'compress_ratios' lists {len(ratios)} layers but num_hidden_layers is {n}; "
                          "make them agree")
    if 1 in ratios:
        raise ConfigError(f"{where}: field 'compress_ratios' has a ratio of 1; a ratio is 0 (window only) or >= 2")
    ratios = list(ratios) + [0] * max(0, n + mtp - len(ratios))  # MTP layers unlisted: window only (Megatron-Bridge)
    hash_layers = cfg.get("num_hash_layers")
    if hash_layers is None:
        kinds = cfg.get("mlp_layer_types") or []
        hash_layers = next((i for i, k in enumerate(kinds) if k != "hash_moe"), len(kinds))
    heads = cfg["num_attention_heads"] if isinstance(cfg.get("num_attention_heads"), int) else 0
    head_dim = cfg["head_dim"]
    if heads and (heads * head_dim) % cfg["o_groups"]:
        raise ConfigError(f"{where}: o_groups {cfg['o_groups']} does not divide num_attention_heads x head_dim "
                          f"({heads * head_dim}); check the config.json")
    csa = dict(q_lora_rank=cfg["q_lora_rank"], head_dim=head_dim, rope_dim=cfg["qk_rope_head_dim"],
               o_groups=cfg["o_groups"], o_lora_rank=cfg["o_lora_rank"], window=cfg["sliding_window"],
               ratios=tuple(int(r) for r in ratios[:n + mtp]), index_heads=cfg["index_n_heads"],
               index_head_dim=cfg["index_head_dim"], index_topk=cfg["index_topk"])
    # the layer kinds and the window are the CSA's (not sliding layers'); one KV head of head_dim serves every head
    cfg = {**{k: v for k, v in cfg.items() if k not in ("layer_types", "kv_lora_rank", "sliding_window")},
           "num_key_value_heads": 1}
    return cfg, {"layer_types": (CSA,) * n, "csa": csa, "hc_streams": int(cfg.get("hc_mult") or 1),
                 "hash_layers": int(hash_layers), "router_bias": True}


def normalise(cfg: dict, model_type: str, where: str) -> tuple[dict, dict]:
    """(config with common keys, ModelSpec/MoeSpec fields this family fixes; "mamba" as MambaSpec kwargs)."""
    if model_type == "nemotron_h":
        return _nemotron_h(cfg, where)
    if model_type == "gpt2":
        return _gpt2(cfg)
    if model_type == "nemotron":
        return cfg, {"gated_mlp": False, "norm_bias": True}
    if model_type in ("llama4", "llama4_text"):
        return _llama4(cfg, where)
    if model_type == "deepseek_v4":
        return _deepseek_v4(cfg, where)
    return cfg, {}
