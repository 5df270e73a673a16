"""The Megatron arguments of the overlap, CUDA-graph, token-drop and activation-offload settings, both ways.

`setting_args(layout, moe)` gives the flags (megatron-core 0.16 names: the TransformerConfig fields behind
--overlap-moe-expert-parallel-comm, --delay-wgrad-compute, --tp-comm-overlap, --cuda-graph-impl/-scope (and
--no-check-for-nan-in-loss-and-grad, which full-iteration graphs need),
--moe-expert-capacity-factor, --moe-pad-expert-input-to-capacity, --cpu-offloading-num-layers,
--fine-grained-activation-offloading with --offload-modules; the paged stash's
--moe-paged-stash, --moe-expert-rank-capacity-factor, --moe-paged-stash-buffer-size-factor-cuda and
--use-transformer-engine-op-fuser for a dropless MoE model's full-iteration graphs, megatron-core after 0.16); `graphs_of`
reads a command line's CUDA-graph flags back (`args.layout_from_args` reads the rest). No torch, no ray.
"""

from __future__ import annotations

from .core import Layout

__all__ = ["setting_args", "graphs_of"]

_SCOPES = {"router": "moe_router moe_preprocess", "attn": "attn", "full": "full_iteration"}


def setting_args(layout: Layout, moe: bool = False) -> list[tuple[str, str | None]]:
    """The overlap, CUDA-graph, token-drop and activation-offload flags (megatron-core 0.16 names)."""
    a: list[tuple[str, str | None]] = []
    if layout.ep_overlap:  # Megatron-Bridge pairs the A2A overlap with delayed weight gradients (more to overlap)
        a += [("--overlap-moe-expert-parallel-comm", None), ("--delay-wgrad-compute", None)]
    if layout.tp_overlap:
        a.append(("--tp-comm-overlap", None))
    if layout.cuda_graphs != "none":
        scope = _SCOPES[layout.cuda_graphs]
        if layout.cuda_graphs == "attn" and moe:
            scope += " moe_router moe_preprocess"
        a += [("--cuda-graph-impl", "local" if layout.cuda_graphs == "full" else "transformer_engine"),
              ("--cuda-graph-scope", scope)]
        if layout.cuda_graphs == "full":  # the step's graph cannot hold the NaN check's host sync (arguments.py)
            a.append(("--no-check-for-nan-in-loss-and-grad", None))
        if layout.cuda_graphs == "full" and layout.ep > 1:  # megatron-core asserts it for local graphs with EP
            a.append(("--moe-pad-experts-for-cuda-graph-inference", None))
        if layout.cuda_graphs == "full" and moe and not layout.moe_capacity_factor:
            # dropless experts in a whole-step graph: the paged stash (Megatron-Bridge's full-iteration recipes'
            # settings: HybridEP's per-rank budget 1.5x the even share, a page pool of 1.2x on the GPU)
            a += [("--moe-paged-stash", None), ("--moe-expert-rank-capacity-factor", "1.5"),
                  ("--moe-paged-stash-buffer-size-factor-cuda", "1.2"), ("--use-transformer-engine-op-fuser", None)]
    if layout.moe_capacity_factor:
        a += [("--moe-expert-capacity-factor", f"{layout.moe_capacity_factor:g}"),
              ("--moe-pad-expert-input-to-capacity", None)]
    if layout.activation_offload_layers:
        a.append(("--cpu-offloading-num-layers", str(layout.activation_offload_layers)))
    if layout.offload_modules:  # the run also needs NVTE_CPU_OFFLOAD_V1=1 under TE >= 2.10 (launch/run_block.run_env)
        a += [("--fine-grained-activation-offloading", None), ("--offload-modules", " ".join(layout.offload_modules))]
    return a


def graphs_of(g: dict) -> str:
    """CUDA_GRAPHS name of --cuda-graph-impl / --cuda-graph-scope (megatron-core's default scope is the layer)."""
    impl, scope = g.get("impl", "none"), g.get("scope", [])
    if impl == "none":
        return "none"
    if impl == "local" and "full_iteration" in scope:
        return "full"
    return "router" if scope and "attn" not in scope and "full" not in scope else "attn"
