"""Proxy models: a model shrunk so that a real trial of a layout fits on this CPU or on one GPU.

`make_proxy(model, layout, target)` cuts depth to a few layers per pipeline chunk and experts to a few
per EP rank, and (for the CPU) widths to toy sizes, keeping every degree of the layout legal (heads,
query groups, Gated DeltaNet heads, FFN widths over TP/ETP, experts over EP, layers over PP x VPP,
recompute chunks). On a GPU target widths stay real: what a layout costs per layer is what a proxy
trial measures. The returned dict `{"of": name, "overrides": {...}}` goes into TrialSpec.proxy and
TrialResult.proxy; `proxy_model(model, proxy)` rebuilds the same ModelSpec from it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, fields, is_dataclass, replace

from ..catalog import ModelSpec, Workload
from ..catalog.model import FULL, CsaSpec, LinearAttentionSpec, MlaSpec, MoeSpec
from ..errors import ConfigError, IllegalLayout
from ..layout import Layout, violations

__all__ = ["make_proxy", "proxy_model"]

# Rules that depend only on the workload (batch, sequence) and not on the model's shape.
_WORKLOAD_RULES = {"dp_batch", "interleaved_microbatches", "cp_seq", "row_fits_tokens", "microbatch_divides"}
_CPU_LAYERS_PER_CHUNK = 2  # enough for a layer-to-layer boundary inside each chunk
_GPU_EXPERTS_PER_RANK = 4
_CPU_TOP_K = 4  # routing work on a CPU is toy-sized anyway
_NESTED = {"moe": MoeSpec, "linear": LinearAttentionSpec, "mla": MlaSpec, "csa": CsaSpec}


def _round_up(x: int, unit: int) -> int:
    return max(unit, -(-x // unit) * unit)


def _query_groups(heads: int, ratio: int, tp: int, groups: int) -> int:
    """The largest divisor of `heads` at most heads/ratio (the model's GQA ratio) that is a multiple or
    divisor of TP, and at least min(groups, TP): query groups below TP take another code path in
    megatron (KV replication), so the proxy has them only where the real model does."""
    want = max(1, heads // max(1, ratio), min(groups, tp))
    for g in range(want, 0, -1):
        if heads % g == 0 and (g % tp == 0 or tp % g == 0):
            return g
    return heads


def _layer_pattern(model: ModelSpec, n: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The first n layer types (with at least one full-attention layer if the model has any) and the
    dense layers among them (the last layer stays MoE so that a MoE model's proxy routes tokens)."""
    types = list(model.layer_types[:n])
    if FULL in model.layer_types and FULL not in types:
        types[-1] = FULL
    dense: tuple[int, ...] = ()
    if model.moe:
        dense = tuple(d for d in model.moe.dense_layers if d < n - 1)
    return tuple(types), dense


def _shrunk(model: ModelSpec, layout: Layout, target: str) -> dict:
    tp, etp, ep, chunks = layout.tp, layout.etp, layout.ep, layout.pp * layout.vpp
    cpu = target.lower() == "cpu"
    per_chunk = max(1, model.num_layers // chunks)
    keep = max(layout.recompute.num_layers or 1, _CPU_LAYERS_PER_CHUNK if cpu else 1)
    n_layers = chunks * min(per_chunk, keep)
    types, dense = _layer_pattern(model, n_layers)
    o: dict = {"num_layers": n_layers, "layer_types": types}

    if cpu:
        heads = _round_up(4, tp)
        ratio = model.num_heads // max(1, model.num_kv_heads)
        o.update(hidden_size=64, num_heads=heads, num_kv_heads=_query_groups(heads, ratio, tp, model.num_kv_heads),
                 head_dim=16, ffn_hidden_size=_round_up(128, tp), vocab_size=min(model.vocab_size, 512))
        if model.sliding_window:
            o["sliding_window"] = min(model.sliding_window, 64)
        if model.linear:
            la = model.linear
            kh = _round_up(2, tp)
            vh = kh * max(1, min(2, la.num_value_heads // max(1, la.num_key_heads)))
            o["linear"] = {"num_key_heads": kh, "num_value_heads": vh, "key_head_dim": 16, "value_head_dim": 16}
        if model.mla:
            o["mla"] = {"q_lora_rank": 32 if model.mla.q_lora_rank else None, "kv_lora_rank": 32,
                        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}
        if model.csa:  # DeepSeek-V4's attention at the proxy's widths (the CPU runner builds a stand-in of it)
            o["csa"] = {"q_lora_rank": 32, "head_dim": 16, "rope_dim": 8, "o_groups": 2, "o_lora_rank": 16,
                        "window": 16, "index_heads": 2, "index_head_dim": 16, "index_topk": 16}
    if model.moe:
        m = model.moe
        top_k = min(m.top_k, _CPU_TOP_K) if cpu else m.top_k
        # Twice top-k experts so routing still chooses; a few per EP rank so every rank has work.
        experts = max(ep * (2 if cpu else _GPU_EXPERTS_PER_RANK), 2 * top_k)
        experts = _round_up(min(m.num_experts, experts), ep)
        moe: dict = {"num_experts": experts, "top_k": top_k, "dense_layers": dense}
        if cpu:
            moe["ffn_hidden_size"] = _round_up(32, etp)
            if m.shared_ffn_hidden_size:
                moe["shared_ffn_hidden_size"] = _round_up(32, tp)
        o["moe"] = moe
    return o


def _diff(model: ModelSpec, overrides: dict) -> dict:
    """Only the fields that change (nested specs: only their changed fields)."""
    out = {}
    for key, value in overrides.items():
        current = getattr(model, key)
        if is_dataclass(current):
            sub = {k: v for k, v in value.items() if getattr(current, k) != v}
            if sub:
                out[key] = sub
        elif (list(current) if isinstance(current, tuple) else current) != (list(value) if isinstance(value, tuple) else value):
            out[key] = value
    return out


def proxy_model(model: ModelSpec, proxy: dict) -> ModelSpec:
    """The ModelSpec that `proxy` (from make_proxy, or a TrialSpec.proxy) describes."""
    if not isinstance(proxy, dict) or "overrides" not in proxy:
        raise ConfigError(f"proxy {proxy!r}: expected {{'of': model name, 'overrides': {{...}}}}")
    if proxy.get("of") not in (None, model.name):
        raise ConfigError(f"proxy is of {proxy.get('of')!r} but the trial's model is {model.name!r}")
    names = {f.name for f in fields(ModelSpec)}
    changes = {}
    for key, value in proxy["overrides"].items():
        if key not in names:
            raise ConfigError(f"proxy override {key!r}: not a ModelSpec field")
        current = getattr(model, key)
        if key in _NESTED and isinstance(value, dict):
            cls = _NESTED[key]
            base = asdict(current) if current is not None else {}
            value = {**base, **value}
            if "dense_layers" in value:
                value["dense_layers"] = tuple(value["dense_layers"])
            try:
                changes[key] = cls(**value)
            except TypeError as exc:
                raise ConfigError(f"proxy override {key}: {exc}") from None
        else:
            changes[key] = tuple(value) if isinstance(current, tuple) else value
    changes.setdefault("name", f"{model.name}-proxy")
    return replace(model, **changes)


def make_proxy(model: ModelSpec, layout: Layout, target: str = "cpu") -> tuple[ModelSpec, dict]:
    """Shrink `model` for a trial of `layout` on `target` ("cpu" or a GPU kind). Raises IllegalLayout
    if the layout cannot be legal for any proxy (e.g. its degrees do not divide the world size)."""
    overrides = _diff(model, _shrunk(model, layout, target))
    overrides["name"] = f"{model.name}-proxy"
    proxy = {"of": model.name, "target": target, "overrides": _jsonable(overrides)}
    small = proxy_model(model, proxy)
    # Workload-only rules are the trial's business, not the proxy's; check the shape rules.
    bad = [v for v in violations(small, Workload(), layout) if v.code not in _WORKLOAD_RULES]
    if bad:
        raise IllegalLayout(
            f"no proxy of {model.name} makes layout {layout.label(model.is_moe)} legal: "
            + "; ".join(v.message for v in bad), bad)
    return small, proxy


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
