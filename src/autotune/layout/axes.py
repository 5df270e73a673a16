"""Which values of a searched dimension a model and cluster allow, and why a cluster narrows them.

Each function takes (space values, model, cluster) as `layout.dimensions.Dimension.axis` / `.narrowed` do:
dense models dispatch nothing and have no router to graph; Transformer Engine carries the precision-aware
optimizer, TP communication overlap (userbuffers) and partial CUDA graphs; without it the space narrows and
`narrowed` says why (the space's notes). Pure Python: no torch, no ray.
"""

from __future__ import annotations

from ..errors import BadInput
from .core import DISPATCHERS, MOE_OFFLOAD_MODULES, OFFLOAD_MODULES, Recompute

__all__ = ["recompute_axis", "moe_dispatcher_axis", "shared_overlap_axis", "precision_aware_axis", "moe_flag_axis", "te_flag_axis",
           "graphs_axis", "graphs_narrowed", "te_narrowed", "capacity_axis", "offload_modules_axis", "offload_modules_narrowed",
           "offload_text", "offload_bits"]


# selective-recompute modules that exist only in some models (layout/_setting_rules.py says the same per layout)
_MOE_MODULES = {"moe_act", "moe", "shared_experts"}


def recompute_axis(vals, model, cluster):
    """The space's recompute choices less the selective ones naming modules this model does not have (a dense
    model's moe_act, a model without MLA's mla_up_proj): they could only be counted as illegal."""
    def fits(v: str) -> bool:
        mods = set(Recompute.parse(v).modules)
        return not ((mods & _MOE_MODULES and not model.is_moe) or ("mla_up_proj" in mods and not model.latent_attention)
                    or ("mhc" in mods and model.hc_streams <= 1))
    return [v for v in vals if fits(v)] or vals


def moe_dispatcher_axis(vals, model, cluster):
    return vals if model.is_moe else [DISPATCHERS[0]]  # dense models dispatch nothing


def shared_overlap_axis(vals, model, cluster):
    return vals if model.is_moe and model.moe.shared_ffn_hidden_size else [False]


def precision_aware_axis(vals, model, cluster):
    # without Transformer Engine the precision-aware optimizer falls back to the plain distributed one
    return vals if cluster.has_te else [False]


def moe_flag_axis(vals, model, cluster):
    return vals if model.is_moe else [False]


def te_flag_axis(vals, model, cluster):
    return vals if cluster.has_te else [False]  # TE userbuffers carry the TP overlap


def graphs_axis(vals, model, cluster):
    # the router scopes exist only in MoE layers; partial scopes are Transformer Engine graphs (full-iteration
    # graphs are megatron-core's own, --cuda-graph-impl local)
    out = [v for v in vals if (model.is_moe or v != "router") and (cluster.has_te or v in ("none", "full"))]
    return out or ["none"]


def graphs_narrowed(vals, model, cluster):
    if not cluster.has_te and any(v in ("router", "attn") for v in vals):
        return "partial CUDA graphs (router, attn) dropped: they are Transformer Engine graphs, not available here"
    return None


def te_narrowed(what):
    return lambda vals, model, cluster: (f"{what} dropped: it needs Transformer Engine, not available on this "
                                         "cluster" if not cluster.has_te and True in vals else None)


def capacity_axis(vals, model, cluster):
    return vals if model.is_moe else [0.0]


def offload_bits(text: str) -> int:
    """The OFFLOAD_MODULES bitmask of a search-space value: "none", or modules joined by commas."""
    mods = [] if text in ("none", "") else text.split(",")
    bad = [m for m in mods if m not in OFFLOAD_MODULES]
    if bad:
        raise BadInput(f"offload_modules {text!r}: unknown module(s) {', '.join(bad)}; choose among "
                       f"{', '.join(OFFLOAD_MODULES)}, joined by commas, or none")
    return sum(1 << OFFLOAD_MODULES.index(m) for m in mods)


def offload_text(bits: int) -> str:
    """The search-space value of an OFFLOAD_MODULES bitmask (modules in Megatron's order, or "none")."""
    mods = [m for b, m in enumerate(OFFLOAD_MODULES) if int(bits) >> b & 1]
    return ",".join(mods) or "none"


def offload_modules_axis(vals, model, cluster):
    """The space's fine-grained offload choices less those this model or cluster cannot run: expert modules in a
    dense model, and any without Transformer Engine (megatron-core asserts transformer_impl TE for it)."""
    moe_bits = sum(1 << OFFLOAD_MODULES.index(m) for m in MOE_OFFLOAD_MODULES)
    keep = []
    for v in vals:
        bits = offload_bits(v)
        if (bits and not cluster.has_te) or (bits & moe_bits and not model.is_moe):
            continue
        keep.append(offload_text(bits))
    return list(dict.fromkeys(keep)) or ["none"]


def offload_modules_narrowed(vals, model, cluster):
    if not cluster.has_te and any(v not in ("none", "") for v in vals):
        return "fine-grained activation offloading dropped: it needs Transformer Engine, not available on this cluster"
    return None
