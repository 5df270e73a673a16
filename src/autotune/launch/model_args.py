"""slime's MODEL_ARGS for a ModelSpec: the model script's arguments, generalised.

The shape follows THUDM/slime `scripts/models/qwen3.5-35B-A3B.sh` (and qwen3-next-80B-A3B.sh): the
plugin spec for the Qwen3-Next/Qwen3.5 families, attention and norm flags, the MoE block, the gated
attention and shared-expert gate, then Gated DeltaNet's sizes for hybrid stacks. For the
Qwen3.5-122B-A10B this gives REFERENCE.md's list (the seed recipes' MODEL_ARGS) followed by the GDN
arguments. Two values ModelSpec does not keep (rope theta, RMSNorm epsilon) are read from the model's
config.json when it can be found, else Megatron-style defaults apply.

Other stacks in the megatron-core 0.16 vocabulary (TransformerConfig fields are arguments there): hybrid
Mamba stacks (Nemotron-H) add --is-hybrid-model, --hybrid-override-pattern and the --mamba-* sizes (and
--moe-latent-size for LatentMoE); squared-ReLU MLPs (Nemotron) --squared-relu, GeLU MLPs (GPT-3) neither it
nor --swiglu; LayerNorm stacks --normalization LayerNorm; GPT-3's learned positions --position-embedding-type
learned_absolute with --max-position-embeddings, and its biases on every linear Megatron's default (no flag).
gpt-oss (Megatron-Bridge's gpt_oss provider): --quick-geglu with --glu-linear-offset 1 and the experts' clamp,
learnable softmax (attention sinks), and its sliding layers as --window-size / --window-attn-skip-freq. Its YaRN
rope scaling has no flag at Megatron-LM 1dcf0daf (slime's pin): `model_notes` says so for the recipe.

Rope scaling (`rope_args`, at Megatron-LM 1dcf0daf): Llama 3.x's (rope_type llama3) is --use-rope-scaling, whose
shape is fixed in code (RotaryEmbedding._apply_scaling: low_freq_factor 1, high_freq_factor 4, 8192 original
positions) and whose factor is GPTModel's default 8 (slime's model provider, like Megatron's gpt_builders.py, passes
`rope_scaling` alone: --rope-scaling-factor never reaches the model); other values get a note, not the flag. MLA takes
YaRN through --rope-type yarn, --rotary-scaling-factor, --mscale and --mscale-all-dim, whose parser defaults (1, 1, 0)
replace MLATransformerConfig's (40, 1, 0); its original positions, beta_fast and beta_slow have no flag (4096, 32, 1
from MLATransformerConfig). An MLA model without rope scaling takes --rope-type rope (with --no-rope-fusion, which
MLATransformerConfig requires beside it).

DeepSeek-V4 (`_csa_args`) is Megatron-LM's dsv4_hybrid attention variant (dev branch, 2026-08:
examples/moe_recipes/deepseek_v4_*), later than slime's pin: MLA with --o-groups / --o-lora-rank, the per-layer
--csa-compress-ratios, the indexer's --dsa-indexer-*, hyper-connections (--enable-hyper-connections
--num-residual-streams), hash routing (--moe-n-hash-layers) and its sqrtsoftplus router; its YaRN (factor, original
positions, the compressed layers' rope base) as those recipes pass it. `model_notes` says which Megatron it needs.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from ..catalog import ModelSpec
from ..catalog.model import FULL, LINEAR, SLIDING

__all__ = ["AUX_LOSS_ON", "Activation", "mlp_activation", "model_notes", "norm_epsilon", "rope_args",
           "slime_model_args"]

AUX_LOSS_ON = 1e-3  # --moe-aux-loss-coeff where a run's load-balancing loss is on (the CPU runner's, the recipes')

# slime_plugins specs: Qwen3-Next/Qwen3.5 need slime's own layer spec (GDN + gated attention).
_PLUGIN_SPECS = {
    "qwen3_5": ("slime_plugins.models.qwen3_5", "get_qwen3_5_spec"),
    "qwen3_next": ("slime_plugins.models.qwen3_next", "get_qwen3_next_spec"),
}


def _num(x: float) -> str:
    """1e-06 -> 1e-6, 10000000.0 -> 10000000, 0.25 -> 0.25 (as slime's scripts write them)."""
    if float(x).is_integer() and abs(x) >= 1:
        return str(int(x))
    text = f"{x:g}"
    if "e" in text:
        mant, exp = text.split("e")
        text = f"{mant}e{int(exp)}"
    return text


def _hf_config(model: ModelSpec) -> dict:
    """The text part of the model's config.json, or {} when its source is not a readable file."""
    src = model.source or ""
    try:
        if src.startswith("catalog:"):
            ref = resources.files("autotune.catalog") / "data" / "models" / f"{src[len('catalog:'):]}.json"
            cfg = json.loads(ref.read_text())
        elif src and Path(src).is_file():
            cfg = json.loads(Path(src).read_text())
        else:
            return {}
    except (OSError, ValueError):
        return {}
    return cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg


def _layer_pattern(flags: list[int]) -> str:
    """A per-layer 0/1 list as the shortest Python expression Megatron evaluates: [1]*48, [0]*3+[1]*58."""
    runs: list[list[int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    return "+".join(f"[{v}]*{n}" for v, n in runs)


def _freq(flags: list[int], every: int) -> str:
    """A Megatron layer-frequency argument for per-layer 0/1 `flags`: N when the layers flagged `every` are exactly
    every N-th (N, 2N, ...), else the per-layer list expression."""
    marked = [i for i, f in enumerate(flags) if f == every]
    if marked:
        n = marked[0] + 1
        if all((f == every) == ((i + 1) % n == 0) for i, f in enumerate(flags)):
            return str(n)
    return _layer_pattern(flags)


def _layer_freq(layer_types: tuple[str, ...], kind: str) -> str:
    """--linear-attention-freq (kind LINEAR) or --window-attn-skip-freq (kind SLIDING): 1 for a `kind` layer; N when
    every N-th layer is full attention and the rest `kind`, as Megatron reads both."""
    flags = [int(t == kind) for t in layer_types]
    if not all(t in (FULL, kind) for t in layer_types):  # a third kind of layer: only the list says it
        return _layer_pattern(flags)
    return _freq(flags, every=0)


class Activation(NamedTuple):
    """The MLP's activation as Megatron-core configures it: `name` (swiglu, quick_geglu, squared_relu, gelu), the
    offset added to a GLU's linear half (glu_linear_offset) and the clamp on its inputs (activation_func_clamp_value,
    0 for none)."""

    name: str
    glu_offset: float = 0.0
    clamp: float = 0.0

    @property
    def gated(self) -> bool:
        """A GLU (fc1 is gate and up): SwiGLU and quick-GeGLU; squared ReLU and GeLU have no gate."""
        return self.name in ("swiglu", "quick_geglu")


def mlp_activation(model: ModelSpec) -> Activation:
    """`model`'s MLP activation, for MODEL_ARGS and the CPU runner's TransformerConfig alike. gpt-oss's experts
    compute (clamp(up) + 1) * quick_gelu(clamp(gate)) (HF GptOssExperts; Megatron-Bridge's gpt_oss provider: quick_gelu,
    glu_linear_offset 1, activation_func_clamp_value = swiglu_limit), though its config.json says silu."""
    clamp = model.moe.activation_clamp if model.moe else 0.0
    if model.model_type == "gpt_oss":
        return Activation("quick_geglu", 1.0, clamp)
    if model.gated_mlp:
        return Activation("swiglu", clamp=clamp)
    return Activation("squared_relu" if model.model_type in ("nemotron", "nemotron_h") else "gelu", clamp=clamp)


# the epsilon a config.json that names none means: its HF config class's default (GPT2Config.layer_norm_epsilon and
# NemotronConfig.norm_eps 1e-5, as Megatron's own --norm-epsilon default; Llama / Qwen-style RMSNorm configs 1e-6)
_EPS_DEFAULT = {"gpt2": 1e-5, "nemotron": 1e-5}


def norm_epsilon(model: ModelSpec) -> float:
    """The norms' epsilon as `model`'s config.json gives it (rms_norm_eps, layer_norm_epsilon, norm_eps or
    layer_norm_eps), else its config class's default (_EPS_DEFAULT, 1e-6 otherwise): MODEL_ARGS' --norm-epsilon and
    the CPU runner's layernorm_epsilon alike."""
    cfg = _hf_config(model)
    return (cfg.get("rms_norm_eps") or cfg.get("layer_norm_epsilon") or cfg.get("norm_eps")
            or cfg.get("layer_norm_eps") or _EPS_DEFAULT.get(model.model_type, 1e-6))


def _value(scaling: dict, key: str, default: float) -> float:
    value = scaling.get(key)
    return default if value is None else float(value)


def _rope_scaling(cfg: dict) -> tuple[str | None, dict]:
    """(the config's rope scaling type, its parameters); (None, {}) without scaling ("default" is none)."""
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    kind = scaling.get("rope_type") or scaling.get("type")
    return (None, {}) if kind in (None, "default") else (str(kind), scaling)


# Llama 3.x rope scaling as --use-rope-scaling applies it at Megatron-LM 1dcf0daf: _apply_scaling's defaults
# (megatron/core/models/common/embeddings/rotary_pos_embedding.py:92-98, called with the factor alone at :84) and
# GPTModel's rope_scaling_factor (megatron/core/models/gpt/gpt_model.py:106), which slime's model provider
# (slime/backends/megatron_utils/model_provider.py:216 at a897e1f) leaves in place, passing `rope_scaling` alone.
_LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# MLA's YaRN fields with no flag at 1dcf0daf: MLATransformerConfig's values (transformer_config.py:2086-2093).
_MLA_YARN_FIXED = {"original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}


def rope_args(model: ModelSpec) -> tuple[list[str], list[str]]:
    """(MODEL_ARGS tokens, recipe notes) for `model`'s rope scaling at Megatron-LM 1dcf0daf. A value the command line
    cannot set is a note rather than a flag that would build another model."""
    kind, scaling = _rope_scaling(_hf_config(model))
    if model.learned_positions or not model.rotary_fraction:  # no rotary embedding to scale
        return [], []
    if model.csa is not None:  # its own YaRN flags (_csa_args), on a later Megatron-LM than the pin
        return [], [f"{model.name}'s attention (DeepSeek-V4's dsv4_hybrid, hyper-connections, hash routing) needs a "
                    "Megatron-LM with --experimental-attention-variant dsv4_hybrid (the dev branch of 2026-08 on), "
                    "not slime's pin 1dcf0daf: run the recipe on such a Megatron-LM"]
    if model.mla:
        # MLA's rope_type defaults to yarn: say rope, which MLATransformerConfig takes only with rope fusion off
        if kind is None:
            return ["--rope-type", "rope", "--no-rope-fusion"], []
        if kind != "yarn":
            return [], [f"{model.name}'s {kind} rope scaling is not settable for MLA on Megatron-LM 1dcf0daf's command "
                        "line (--rope-type takes rope or yarn): the run trains with plain RoPE"]
        # where the config names no mscale / mscale_all_dim, 1 and 0 (DeepSeek's reference, Megatron's parser)
        # rope fusion off: Megatron's fused MLA YaRN kernel is experimental (slime's DeepSeek / Kimi scripts turn it off)
        args = ["--rope-type", "yarn", "--rotary-scaling-factor", _num(_value(scaling, "factor", 1.0)),
                "--mscale", _num(_value(scaling, "mscale", 1.0)),
                "--mscale-all-dim", _num(_value(scaling, "mscale_all_dim", 0.0)), "--no-rope-fusion"]
        off = {k: (_value(scaling, k, v), v) for k, v in _MLA_YARN_FIXED.items() if _value(scaling, k, v) != v}
        if not off:
            return args, []
        ours = ", ".join(f"{k} {_num(x)}" for k, (x, _) in off.items())
        megatron = ", ".join(f"{k} {_num(v)}" for k, (_, v) in off.items())
        return args, [f"{model.name}'s YaRN {ours} {'is' if len(off) == 1 else 'are'} not settable on Megatron-LM "
                      f"1dcf0daf's command line: MLA takes {megatron} (MLATransformerConfig's "
                      f"default{'s' if len(off) > 1 else ''}), another YaRN than the checkpoint's, unless the "
                      "TransformerConfig is set in code"]
    if kind is None:
        return [], []
    if kind == "llama3":
        got = {k: _value(scaling, k, v) for k, v in _LLAMA3.items()}
        if got == _LLAMA3:
            return ["--use-rope-scaling", "--rope-scaling-factor", _num(_LLAMA3["factor"])], []
        return [], [f"{model.name}'s llama3 rope scaling ({', '.join(f'{k} {_num(v)}' for k, v in got.items())}) is "
                    "not settable on Megatron-LM 1dcf0daf's command line: --use-rope-scaling applies factor 8, "
                    "low_freq_factor 1, high_freq_factor 4 from 8192 positions (slime's model provider does not pass "
                    "--rope-scaling-factor on), so the recipe leaves it off and the run trains with plain RoPE"]
    if kind == "yarn":  # outside MLA: --position-embedding-type has no yarn and --rope-type yarn asserts MLA
        return [], [f"{model.name}'s YaRN rope scaling (factor {_num(scaling.get('factor') or 1)} from "
                    f"{scaling.get('original_max_position_embeddings')} positions) is not settable on Megatron-LM "
                    "1dcf0daf's command line: set yarn_* on the TransformerConfig (Megatron-Bridge's gpt-oss provider "
                    "does) or the run trains with plain RoPE"]
    return [], [f"{model.name}'s {kind} rope scaling is not settable on Megatron-LM 1dcf0daf's command line: the run "
                "trains with plain RoPE"]


_LLAMA4 = ("llama4", "llama4_text")


def _llama4_args(model: ModelSpec, cfg: dict) -> tuple[list[str], list[str]]:
    """Llama 4's MODEL_ARGS beyond a Llama's, and what they cannot say (Megatron-LM 1dcf0daf). Its NoPE layers
    (HF `no_rope_layers`, 1 where a layer takes RoPE; else every `no_rope_layer_interval`-th, HF default 4) are
    --no-rope-freq (1 where a layer skips it: N, or the per-layer list); `use_qk_norm` is a weightless L2 norm of q and
    k (--qk-l2-norm); the router's score scales the expert's input (HF Llama4TextMoe: --moe-apply-probs-on-input).
    Chunked attention on the RoPE layers (`attention_chunk_size`) has no flag: a note, for runs longer than a chunk."""
    if model.model_type not in _LLAMA4:
        return [], []
    rope_layers = cfg.get("no_rope_layers")
    if isinstance(rope_layers, list) and len(rope_layers) >= model.num_layers:
        skip = [1 - int(x) for x in rope_layers[:model.num_layers]]
    else:
        n = int(cfg.get("no_rope_layer_interval") or 4)
        skip = [int((i + 1) % n == 0) for i in range(model.num_layers)]
    a = ["--no-rope-freq", _freq(skip, every=1)] if any(skip) else []
    if cfg.get("use_qk_norm"):
        a.append("--qk-l2-norm")
    if model.moe:
        a.append("--moe-apply-probs-on-input")
    notes = []
    chunk = cfg.get("attention_chunk_size")
    if chunk:
        notes.append(f"{model.name}'s chunked attention ({chunk} tokens on its RoPE layers) has no flag on Megatron-LM "
                     f"1dcf0daf's command line: a run with rows longer than {chunk} tokens attends over the whole row")
    return a, notes


def model_notes(model: ModelSpec) -> list[str]:
    """What a recipe for `model` must say because its MODEL_ARGS cannot: rope scaling the command line of Megatron-LM
    1dcf0daf (slime's pin) does not set (`rope_args`): YaRN outside MLA (gpt-oss: --position-embedding-type has no yarn
    there and --rope-type yarn asserts --multi-latent-attention), MLA YaRN fields without a flag, llama3 scaling other
    than Megatron's fixed one; and Llama 4's chunked attention (`_llama4_args`)."""
    return rope_args(model)[1] + _llama4_args(model, _hf_config(model))[1]


def _csa_args(model: ModelSpec, cfg: dict) -> list[str]:
    """DeepSeek-V4's attention, hyper-connections and hash routing as Megatron-LM's dsv4_hybrid recipes pass them."""
    c = model.csa
    _, scaling = _rope_scaling(cfg)
    a = ["--multi-latent-attention", "--experimental-attention-variant", "dsv4_hybrid", "--q-lora-rank",
         str(c.q_lora_rank), "--qk-pos-emb-head-dim", str(c.rope_dim), "--v-head-dim", str(c.head_dim),
         "--o-groups", str(c.o_groups), "--o-lora-rank", str(c.o_lora_rank), "--csa-window-size", str(c.window),
         "--csa-compress-ratios", "[" + ",".join(str(r) for r in c.ratios) + "]",
         "--dsa-indexer-n-heads", str(c.index_heads), "--dsa-indexer-head-dim", str(c.index_head_dim),
         "--dsa-indexer-topk", str(c.index_topk),
         # DSv4's rope is a pure rotation (mscale 1 on both, as Megatron-Bridge's DeepSeekV4Bridge sets them)
         "--rotary-scaling-factor", _num(_value(scaling, "factor", 1.0)), "--original-max-position-embeddings",
         str(int(_value(scaling, "original_max_position_embeddings", 4096))), "--mscale", "1", "--mscale-all-dim", "1"]
    if cfg.get("compress_rope_theta"):
        a += ["--csa-compress-rotary-base", _num(cfg["compress_rope_theta"])]
    if model.hc_streams > 1:
        a += ["--enable-hyper-connections", "--num-residual-streams", str(model.hc_streams),
              "--mhc-sinkhorn-iterations", str(int(cfg.get("hc_sinkhorn_iters") or 20))]
    if model.hash_layers:
        a += ["--moe-n-hash-layers", str(model.hash_layers)]
    return a


def _score_function(model: ModelSpec, cfg: dict) -> str:
    """--moe-router-score-function: the config's sqrtsoftplus (DeepSeek-V4), else sigmoid or softmax."""
    if str(cfg.get("scoring_func", "")).lower() == "sqrtsoftplus":
        return "sqrtsoftplus"
    return "sigmoid" if model.moe.sigmoid_router else "softmax"


def slime_model_args(model: ModelSpec, *, aux_loss_coeff: float = 0.0) -> list[str]:
    """MODEL_ARGS tokens for `model`. `aux_loss_coeff` 0 is the seed's load-balancing loss off."""
    cfg = _hf_config(model)
    rope = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta") or rope.get("rope_theta") or 10000
    eps = norm_epsilon(model)
    rope_scaling = rope_args(model)[0]
    plugin = next((v for k, v in _PLUGIN_SPECS.items() if model.model_type.startswith(k)), None)

    a: list[str] = ["--spec", *plugin] if plugin else []
    if not model.mlp_bias:  # biases on every linear (GPT-3) are Megatron's default (ModelSpec.bias_linear)
        if not model.bias_linear:
            a.append("--disable-bias-linear")
        if model.attention_bias:  # gpt-oss: on with every linear's; Qwen2: on QKV alone
            a.append("--add-qkv-bias")
    if model.qk_norm or model.latent_attention:  # MLA's q_a / kv_a latent norms exist only with it (gpt_layer_specs, slime's scripts)
        a.append("--qk-layernorm")
    gqa = model.num_kv_heads < model.num_heads and model.csa is None  # DSv4's one KV head is MLA's, not GQA's
    if gqa:
        a.append("--group-query-attention")
    a += ["--num-attention-heads", str(model.num_heads)]
    if gqa:
        a += ["--num-query-groups", str(model.num_kv_heads)]
    a += ["--kv-channels", str(model.head_dim), "--num-layers", str(model.num_layers),
          "--hidden-size", str(model.hidden_size), "--ffn-hidden-size", str(model.ffn_hidden_size)]
    if model.attn_output_gate:
        a.append("--use-gated-attention")
    a += ["--normalization", "LayerNorm" if model.norm_bias else "RMSNorm"]
    if plugin or model.model_type == "nemotron":  # Qwen3-Next/3.5 RMSNorm and Nemotron's LayerNorm1P scale by (1 + weight)
        a.append("--apply-layernorm-1p")
    if model.learned_positions:
        a += ["--position-embedding-type", "learned_absolute", "--max-position-embeddings", str(model.learned_positions),
              "--norm-epsilon", _num(eps)]
    elif model.rotary_fraction == 0:  # Nemotron-H: no positional embedding (catalog/model.NO_ROPE_TYPES)
        a += ["--position-embedding-type", "none", "--norm-epsilon", _num(eps)]
    else:
        a += ["--position-embedding-type", "rope", "--norm-epsilon", _num(eps), "--rotary-percent",
              _num(model.rotary_fraction)]
    act = mlp_activation(model)
    a += {"swiglu": ["--swiglu"], "squared_relu": ["--squared-relu"], "gelu": [],  # GeLU: Megatron's default
          "quick_geglu": ["--quick-geglu", "--glu-linear-offset", _num(act.glu_offset)]}[act.name]
    if act.clamp:
        a += ["--activation-func-clamp-value", _num(act.clamp)]
    if not model.tie_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    a += ["--vocab-size", str(model.vocab_size)] + (["--rotary-base", _num(theta)] if model.rotary_fraction else [])
    if not model.mla:
        a += rope_scaling
    a += _llama4_args(model, cfg)[0]
    if model.attention_sinks:
        a += ["--softmax-type", "learnable"]
    if model.sliding_window and SLIDING in model.layer_types:
        # HF's sliding_window counts the query itself; Megatron's (TE's) left window does not
        a += ["--window-size", f"{model.sliding_window - 1},0", "--window-attn-skip-freq",
              _layer_freq(model.layer_types, SLIDING)]
    if model.csa:
        a += _csa_args(model, cfg)
    if model.mla:
        m = model.mla
        a += ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim", str(m.qk_nope_head_dim),
              "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim), "--v-head-dim", str(m.v_head_dim)]
        if m.q_lora_rank:
            a += ["--q-lora-rank", str(m.q_lora_rank)]
        a += rope_scaling
    if model.moe:
        e = model.moe
        a += ["--moe-ffn-hidden-size", str(e.ffn_hidden_size)]
        if e.shared_ffn_hidden_size:
            a += ["--moe-shared-expert-intermediate-size", str(e.shared_ffn_hidden_size)]
        a += ["--moe-router-score-function", _score_function(model, cfg), "--moe-token-dispatcher-type",
              "alltoall", "--moe-router-topk", str(e.top_k)]
        groups, group_topk = int(cfg.get("n_group") or 1), int(cfg.get("topk_group") or 1)
        if groups > 1:  # DeepSeek-V3's node-limited routing: the top-k experts come from the best topk_group groups
            a += ["--moe-router-num-groups", str(groups), "--moe-router-group-topk", str(group_topk)]
        if not model.hybrid_pattern:  # a hybrid pattern places its MoE layers itself (E)
            a += ["--moe-layer-freq", _layer_pattern([int(model.is_moe_layer(i)) for i in range(model.num_layers)])]
        a += ["--num-experts", str(e.num_experts), "--moe-grouped-gemm", "--moe-token-drop-policy", "probs",
              "--moe-router-dtype", "fp32", "--moe-permute-fusion", "--moe-aux-loss-coeff", _num(aux_loss_coeff)]
        if e.router_bias and _score_function(model, cfg) != "softmax":
            a.append("--moe-router-enable-expert-bias")
        if cfg.get("routed_scaling_factor") and float(cfg["routed_scaling_factor"]) != 1.0:  # DeepSeek 2.5, Kimi 2.827
            a += ["--moe-router-topk-scaling-factor", _num(cfg["routed_scaling_factor"])]
        if e.latent_size:
            a += ["--moe-latent-size", str(e.latent_size)]
    if model.attn_output_gate:
        a.append("--attention-output-gate")
    if model.moe and model.moe.shared_expert_gate:
        a.append("--moe-shared-expert-gate")
    if model.hybrid_pattern:
        a += ["--is-hybrid-model", "--hybrid-override-pattern", model.hybrid_pattern]
        if model.mamba:
            mb = model.mamba
            a += ["--mamba-num-heads", str(mb.num_heads), "--mamba-head-dim", str(mb.head_dim),
                  "--mamba-state-dim", str(mb.state_dim), "--mamba-num-groups", str(mb.num_groups)]
    if model.linear:
        g = model.linear
        # gated_delta_net: megatron-core 0.16's name (the seed's stack); newer releases alias it to gdn.
        a += ["--experimental-attention-variant", "gated_delta_net",
              "--linear-attention-freq", _layer_freq(model.layer_types, LINEAR),
              "--linear-conv-kernel-dim", str(g.conv_kernel), "--linear-key-head-dim", str(g.key_head_dim),
              "--linear-value-head-dim", str(g.value_head_dim), "--linear-num-key-heads", str(g.num_key_heads),
              "--linear-num-value-heads", str(g.num_value_heads)]
    return a
