"""Megatron-core's rules for the overlap, CUDA-graph, token-drop and activation-offload settings.

Each entry is (code, mask function over a LayoutTable, message over a Layout), as `rules.Rule` takes them.
Sources (megatron-core 0.16.1): transformer_config.py `__post_init__` (overlap_moe_expert_parallel_comm: EP > 1,
alltoall or flex dispatcher, no full recompute, no shared-expert overlap, VPP when PP > 1, only
Transformer-Engine partial graphs beside it; cpu_offloading: no pipeline parallelism, no recompute, fewer layers
than the model, no CUDA graphs; moe_pad_expert_input_to_capacity not on the flex dispatcher's deepep backend), and
arguments.py (full-iteration graphs are --cuda-graph-impl local); selective recompute's modules
(recompute_modules: moe_act needs grouped GEMM, which autotune sets for every MoE model and no dense one;
mla_up_proj needs multi-latent attention; shared_experts not beside --moe-shared-expert-overlap; moe_act and
layernorm not under delayed FP8 scaling). A dropless MoE layer has data-dependent
shapes (tokens per expert), which a graph of the whole step cannot capture: full graphs of an MoE model need
token drop with padding. Pure numpy: no torch, no ray.
"""

from __future__ import annotations

import numpy as np

from .core import SELECTIVE_MODULES

__all__ = ["SETTING_RULES"]

_MOE_BIT = 1 << SELECTIVE_MODULES.index("moe")
_BIT = {name: 1 << b for b, name in enumerate(SELECTIVE_MODULES)}
_FULL_GRAPHS = 3  # index of "full" in core.CUDA_GRAPHS


def _no(flag, ok):
    return ~flag | ok


def _module(t, name: str) -> np.ndarray:
    """Rows whose selective recompute names `name`."""
    return (t.rc_gran == 1) & ((t.rc_modules & _BIT[name]) > 0)


SETTING_RULES = [
    ("recompute_moe_act", lambda m, w, t: _no(_module(t, "moe_act"), np.full(len(t), m.is_moe)),
     lambda m, w, l: f"selective recompute of moe_act needs routed experts (grouped GEMM); {m.name} has none: "
                     "drop moe_act from the modules"),
    ("recompute_moe", lambda m, w, t: _no(_module(t, "moe") | _module(t, "shared_experts"), np.full(len(t), m.is_moe)),
     lambda m, w, l: f"selective recompute of moe / shared_experts needs an MoE model; {m.name} has no experts: "
                     "drop them from the modules"),
    ("recompute_mla_up_proj", lambda m, w, t: _no(_module(t, "mla_up_proj"), np.full(len(t), m.mla is not None)),
     lambda m, w, l: f"selective recompute of mla_up_proj needs multi-latent attention; {m.name} has none: drop "
                     "mla_up_proj from the modules"),
    ("recompute_shared_experts_overlap",
     lambda m, w, t: _no(_module(t, "shared_experts"),
                         ~t.shared_overlap | np.full(len(t), not (m.moe and m.moe.shared_ffn_hidden_size))),
     lambda m, w, l: "selective recompute of shared_experts cannot run with --moe-shared-expert-overlap; drop one "
                     "of them"),
    ("recompute_fp8_delayed",
     lambda m, w, t: _no(_module(t, "moe_act") | _module(t, "layernorm"), np.full(len(t), w.precision != "fp8-delayed")),
     lambda m, w, l: "selective recompute of moe_act or layernorm does not run under delayed FP8 scaling; use "
                     "--precision fp8-tensorwise or drop them from the modules"),
    ("ep_overlap_needs_ep", lambda m, w, t: _no(t.ep_overlap, (t.ep > 1) & m.is_moe),
     lambda m, w, l: f"EP communication overlap needs expert parallelism (EP > 1), got EP {l.ep}"),
    ("ep_overlap_dispatcher", lambda m, w, t: _no(t.ep_overlap, t.dispatcher != 1),
     lambda m, w, l: "EP communication overlap works with the alltoall and flex (DeepEP, HybridEP) dispatchers, "
                     "not allgather"),
    ("ep_overlap_recompute",
     lambda m, w, t: _no(t.ep_overlap, (t.rc_gran != 2) & ~((t.rc_gran == 1) & (t.rc_modules & _MOE_BIT > 0))),
     lambda m, w, l: f"EP communication overlap cannot run with {l.recompute.describe()}; use selective recompute "
                     "without the moe module, or none"),
    ("ep_overlap_shared", lambda m, w, t: _no(t.ep_overlap, ~t.shared_overlap),
     lambda m, w, l: "EP communication overlap replaces --moe-shared-expert-overlap; drop the shared-expert overlap"),
    ("ep_overlap_vpp", lambda m, w, t: _no(t.ep_overlap, (t.pp == 1) | (t.vpp > 1)),
     lambda m, w, l: f"EP communication overlap with PP {l.pp} needs the interleaved schedule (VPP > 1)"),
    ("ep_overlap_graphs", lambda m, w, t: _no(t.ep_overlap, t.cuda_graphs != _FULL_GRAPHS),
     lambda m, w, l: "EP communication overlap runs beside partial (Transformer Engine) CUDA graphs only, not full"),
    ("full_graphs_static_shapes",
     lambda m, w, t: (t.cuda_graphs != _FULL_GRAPHS) | (not m.is_moe) | (t.capacity > 0),
     lambda m, w, l: "full-iteration CUDA graphs of a dropless MoE model cannot capture its data-dependent expert "
                     "shapes; set a capacity factor (token drop) or use partial graphs (attn, router)"),
    ("graphs_no_offload", lambda m, w, t: (t.cuda_graphs == 0) | (t.act_offload == 0),
     lambda m, w, l: "CUDA graphs do not run with activation offloading; drop one of them"),
    ("capacity_needs_moe", lambda m, w, t: (t.capacity == 0) | m.is_moe,
     lambda m, w, l: f"{m.name} has no experts: a capacity factor means nothing; use 0"),
    ("capacity_dispatcher", lambda m, w, t: (t.capacity == 0) | (t.dispatcher != 2),
     lambda m, w, l: "token drop (capacity factor) does not run on the flex dispatcher's DeepEP backend "
                     "(megatron-core: no moe_pad_expert_input_to_capacity with deepep); use hybridep, alltoall or "
                     "allgather"),
    ("offload_no_pp", lambda m, w, t: (t.act_offload == 0) | (t.pp == 1),
     lambda m, w, l: f"activation offloading does not run with pipeline parallelism (PP {l.pp}); use PP 1"),
    ("offload_no_recompute", lambda m, w, t: (t.act_offload == 0) | (t.rc_gran == 0),
     lambda m, w, l: f"activation offloading does not run with {l.recompute.describe()}; use recompute none"),
    ("offload_layers", lambda m, w, t: t.act_offload < np.maximum(m.num_layers, 1),
     lambda m, w, l: f"activation offloading of {l.activation_offload_layers} layers: the model has "
                     f"{m.num_layers}; offload fewer"),
]
