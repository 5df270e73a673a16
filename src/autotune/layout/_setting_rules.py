"""Megatron-core's rules for the overlap, CUDA-graph, token-drop and activation-offload settings.

Each entry is (code, mask function over a LayoutTable, message over a Layout), as `rules.Rule` takes them.
Sources (megatron-core 0.16.1): transformer_config.py `__post_init__` (overlap_moe_expert_parallel_comm: EP > 1,
alltoall or flex dispatcher, no full recompute, no shared-expert overlap, VPP when PP > 1, only
Transformer-Engine partial graphs beside it there; the megatron-core that has the paged stash (0.18 at Megatron-Bridge
v0.5.0's pin d0b3b775, 0.19 at v0.6.0's cd4afffa) refuses only TE graphs of the moe or mlp scope, so full-iteration
graphs with HybridEP's paged stash take the overlap: both Bridge releases' full-iteration recipes set it);
cpu_offloading: no pipeline parallelism, no recompute, fewer layers than the model, no CUDA graphs;
moe_pad_expert_input_to_capacity not on the flex dispatcher's deepep backend), and
arguments.py (full-iteration graphs are --cuda-graph-impl local); selective recompute's modules
(recompute_modules: moe_act needs grouped GEMM, which autotune sets for every MoE model and no dense one;
mla_up_proj needs multi-latent attention; shared_experts not beside --moe-shared-expert-overlap; moe_act and
layernorm not under delayed FP8 scaling; mhc, in the later megatron-core that has hyper-connections, needs them, not
beside mlp, and not beside offloading attn_norm or mlp_norm). A dropless MoE layer has data-dependent
shapes (tokens per expert), which a graph of the whole step cannot capture: full graphs of an MoE model need
token drop with padding, or (megatron-core after 0.16, Megatron-LM PR #4247) the paged stash: HybridEP receives into
a static per-rank budget (--moe-expert-rank-capacity-factor, which needs --use-transformer-engine-op-fuser's fused
grouped MLP) and the experts' saved activations go to a pool of pages (--moe-paged-stash). The CUDA-graph scopes
(transformer_config.py at Megatron-LM 1dcf0daf): the router scopes
(moe_router, moe_preprocess: the router setting, and the attn setting of an MoE model) only in an MoE model; full
recompute only beside full-iteration graphs; no selective recompute of `moe` beside Transformer Engine router
graphs. Optimizer offload (arguments.py): --optimizer-cpu-offload runs on the precision-aware optimizer's code path,
and with --fp8-param-gather only under delayed FP8 scaling. Fine-grained activation offloading (transformer_config.py
at 1dcf0daf and later): not with --cpu-offloading-num-layers; attn_proj only with core_attn (its input is core
attention's output, which core attention's backward needs); the expert modules only in an MoE model, not inside a
selectively recomputed `moe` (the checkpoint keeps nothing to offload) and not beside the paged stash (which stashes
those activations itself). With full recompute a layer keeps only its input: autotune refuses the pair rather than
price an offload of nothing. Pure numpy: no torch, no ray.
"""

from __future__ import annotations

import numpy as np

from ..catalog.workload import FP8_RECIPES
from .core import CUDA_GRAPHS, DISPATCHERS, MOE_OFFLOAD_MODULES, OFFLOAD_MODULES, SELECTIVE_MODULES

__all__ = ["SETTING_RULES"]

_MOE_BIT = 1 << SELECTIVE_MODULES.index("moe")
_BIT = {name: 1 << b for b, name in enumerate(SELECTIVE_MODULES)}
_ROUTER_GRAPHS, _ATTN_GRAPHS, _FULL_GRAPHS = (CUDA_GRAPHS.index(g) for g in ("router", "attn", "full"))
_HYBRIDEP = DISPATCHERS.index("hybridep")
_OFF = {name: 1 << b for b, name in enumerate(OFFLOAD_MODULES)}
_MOE_OFF = sum(_OFF[m] for m in MOE_OFFLOAD_MODULES)


def _no(flag, ok):
    return ~flag | ok


def _module(t, name: str) -> np.ndarray:
    """Rows whose selective recompute names `name`."""
    return (t.rc_gran == 1) & ((t.rc_modules & _BIT[name]) > 0)


def _router_graphs(m, t) -> np.ndarray:
    """Rows whose CUDA graphs capture the router (--cuda-graph-scope moe_router moe_preprocess): the router
    setting, and the attn setting of an MoE model (setting_args adds the router scopes there)."""
    return (t.cuda_graphs == _ROUTER_GRAPHS) | ((t.cuda_graphs == _ATTN_GRAPHS) & m.is_moe)


def _fp8_param_gather_undelayed(w) -> bool:
    """The workload runs --fp8-param-gather under an FP8 recipe other than delayed scaling."""
    recipe = FP8_RECIPES.get(w.precision)
    return bool(w.fp8_param_gather) and recipe is not None and recipe[1] != "delayed"


SETTING_RULES = [
    ("recompute_moe_act", lambda m, w, t: _no(_module(t, "moe_act"), np.full(len(t), m.is_moe)),
     lambda m, w, l: f"selective recompute of moe_act needs routed experts (grouped GEMM); {m.name} has none: "
                     "drop moe_act from the modules"),
    ("recompute_moe", lambda m, w, t: _no(_module(t, "moe") | _module(t, "shared_experts"), np.full(len(t), m.is_moe)),
     lambda m, w, l: f"selective recompute of moe / shared_experts needs an MoE model; {m.name} has no experts: "
                     "drop them from the modules"),
    ("recompute_mla_up_proj", lambda m, w, t: _no(_module(t, "mla_up_proj"), np.full(len(t), m.latent_attention)),
     lambda m, w, l: f"selective recompute of mla_up_proj needs multi-latent attention; {m.name} has none: drop "
                     "mla_up_proj from the modules"),
    ("recompute_mhc", lambda m, w, t: _no(_module(t, "mhc"), np.full(len(t), m.hc_streams > 1)),
     lambda m, w, l: f"selective recompute of mhc needs hyper-connections (residual streams); {m.name} has none: drop "
                     "mhc from the modules"),
    ("recompute_mhc_mlp", lambda m, w, t: ~(_module(t, "mhc") & _module(t, "mlp")),
     lambda m, w, l: "selective recompute of mhc and mlp cannot run together (megatron-core: their checkpoints "
                     "conflict); drop one of them"),
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
    ("ep_overlap_graphs",
     lambda m, w, t: _no(t.ep_overlap, (t.cuda_graphs != _FULL_GRAPHS) | (t.dispatcher == _HYBRIDEP)),
     lambda m, w, l: "EP communication overlap beside full-iteration CUDA graphs needs the paged stash's megatron-core "
                     "(--dispatcher hybridep); use partial graphs (attn, router) or none"),
    ("full_graphs_static_shapes",
     lambda m, w, t: (t.cuda_graphs != _FULL_GRAPHS) | (not m.is_moe) | (t.capacity > 0) | (t.dispatcher == _HYBRIDEP),
     lambda m, w, l: "full-iteration CUDA graphs of a dropless MoE model need static expert shapes: HybridEP's "
                     "per-rank token budget with the paged stash (--dispatcher hybridep) or a capacity factor (token "
                     "drop); else use partial graphs (attn, router)"),
    ("graphs_router_dense", lambda m, w, t: (t.cuda_graphs != _ROUTER_GRAPHS) | m.is_moe,
     lambda m, w, l: f"{m.name} has no experts: router CUDA graphs (--cuda-graph-scope moe_router) have no router "
                     "to capture and megatron-core refuses them; use --cuda-graphs attn or none"),
    ("graphs_full_recompute",
     lambda m, w, t: _no(t.rc_gran == 2, (t.cuda_graphs == 0) | (t.cuda_graphs == _FULL_GRAPHS)),
     lambda m, w, l: f"{l.recompute.describe()} runs only beside full-iteration CUDA graphs, not {l.cuda_graphs} "
                     "graphs; use --cuda-graphs full or none, or selective recompute"),
    ("graphs_router_moe_recompute", lambda m, w, t: _no(_module(t, "moe"), ~_router_graphs(m, t)),
     lambda m, w, l: f"selective recompute of moe cannot run beside {l.cuda_graphs} CUDA graphs, which capture the "
                     "router; drop moe from the modules (e.g. selective:layernorm,moe_act) or use --cuda-graphs "
                     "none or full"),
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
    ("offload_precision_aware", lambda m, w, t: (t.offload == 0) | t.precision_aware,
     lambda m, w, l: f"optimizer offload {l.optimizer_offload:.0%} needs the precision-aware optimizer (Megatron's "
                     "CPU optimizer runs on its code path); add --precision-aware-optimizer or drop the offload"),
    ("offload_fp8_param_gather",
     lambda m, w, t: (t.offload == 0) | np.full(len(t), not _fp8_param_gather_undelayed(w)),
     lambda m, w, l: f"--fp8-param-gather with optimizer offload {l.optimizer_offload:.0%} needs delayed FP8 "
                     f"scaling, not {w.precision}; use --precision fp8-delayed, or drop --fp8-param-gather or the "
                     "offload"),
    ("fine_offload_not_layers", lambda m, w, t: (t.off_modules == 0) | (t.act_offload == 0),
     lambda m, w, l: "fine-grained activation offloading (--offload-modules) does not run beside "
                     "--cpu-offloading-num-layers; keep one of them"),
    ("fine_offload_moe", lambda m, w, t: ((t.off_modules & _MOE_OFF) == 0) | m.is_moe,
     lambda m, w, l: f"{m.name} has no experts: --offload-modules {', '.join(x for x in l.offload_modules if x in MOE_OFFLOAD_MODULES)} "
                     "offloads expert activations; choose among attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm"),
    ("fine_offload_attn_proj", lambda m, w, t: ((t.off_modules & _OFF["attn_proj"]) == 0) | ((t.off_modules & _OFF["core_attn"]) > 0),
     lambda m, w, l: "--offload-modules attn_proj needs core_attn too (attn_proj's input is core attention's output, "
                     "which its backward needs); add core_attn"),
    ("fine_offload_moe_recompute", lambda m, w, t: ((t.off_modules & _MOE_OFF) == 0) | ~_module(t, "moe"),
     lambda m, w, l: "selective recompute of moe keeps nothing inside the MoE layer to offload; drop moe from the "
                     "recompute modules or the expert modules from --offload-modules"),
    ("fine_offload_paged_stash",
     lambda m, w, t: ((t.off_modules & _MOE_OFF) == 0) | ~((t.cuda_graphs == _FULL_GRAPHS) & (t.capacity == 0) & m.is_moe),
     lambda m, w, l: "the paged stash of full-iteration CUDA graphs keeps the experts' activations itself; drop "
                     "expert_fc1 / moe_act from --offload-modules or use partial graphs"),
    ("fine_offload_mhc", lambda m, w, t: ((t.off_modules & (_OFF["attn_norm"] | _OFF["mlp_norm"])) == 0)
     | ~_module(t, "mhc"),
     lambda m, w, l: "offloading attn_norm or mlp_norm cannot run with selective recompute of mhc (megatron-core: "
                     "the mHC replay starts before their reload); drop those modules or mhc"),
    ("fine_offload_full_recompute", lambda m, w, t: (t.off_modules == 0) | (t.rc_gran != 2),
     lambda m, w, l: f"{l.recompute.describe()} keeps only each group's input: there is nothing left for "
                     "--offload-modules to offload; use selective recompute or none"),
]
