"""Which values of a searched dimension a model and cluster allow, and why a cluster narrows them.

Each function takes (space values, model, cluster) as `layout.dimensions.Dimension.axis` / `.narrowed` do:
dense models dispatch nothing and have no router to graph; Transformer Engine carries the precision-aware
optimizer, TP communication overlap (userbuffers) and partial CUDA graphs; without it the space narrows and
`narrowed` says why (the space's notes). Pure Python: no torch, no ray.
"""

from __future__ import annotations

from .core import DISPATCHERS, Recompute

__all__ = ["recompute_axis", "moe_dispatcher_axis", "shared_overlap_axis", "precision_aware_axis", "moe_flag_axis", "te_flag_axis",
           "graphs_axis", "graphs_narrowed", "te_narrowed", "capacity_axis"]


# selective-recompute modules that exist only in some models (layout/_setting_rules.py says the same per layout)
_MOE_MODULES = {"moe_act", "moe", "shared_experts"}


def recompute_axis(vals, model, cluster):
    """The space's recompute choices less the selective ones naming modules this model does not have (a dense
    model's moe_act, a model without MLA's mla_up_proj): they could only be counted as illegal."""
    def fits(v: str) -> bool:
        mods = set(Recompute.parse(v).modules)
        return not ((mods & _MOE_MODULES and not model.is_moe) or ("mla_up_proj" in mods and model.mla is None))
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
