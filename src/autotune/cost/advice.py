"""What to change when a layout is slow or does not fit: the step terms a layout or workload setting controls, and the
memory terms a setting frees, each with the setting that shrinks it. Read by `autotune estimate` (bottleneck and
"to fit" lines) and by the search's outcome (the best layout's bottleneck). Given the layout and workload, a setting
already in effect is not offered again. Plain tables; no torch, no ray.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["LEVER_OPTIONS", "LEVER_SHARE", "MEMORY_LEVER_OPTIONS", "levers", "memory_lever", "step_shares", "lever_text",
           "shares_text"]


# What shrinks a step term a layout or workload setting controls, said where the term takes LEVER_SHARE of the step.
# Each term has options, each with the condition under which it is news: an option whose setting is already in
# effect (--ep-overlap on, a hybridep dispatcher, --tp-comm-overlap, full CUDA graphs, a balancing loss) is not said;
# the options without a condition always apply, so every term keeps at least one. The cluster, when given, says whether an
# EP group leaves its NVLink domain (Megatron's expert ranks: EP x ETP consecutive ones).
_ALWAYS = None
# (what to say, when it is news: f(layout, workload, cluster or None) -> bool)
_Options = tuple[tuple[str, Callable | None], ...]


def _cluster_only(cond: Callable) -> Callable:
    """Mark a condition that is news only on a known cluster (said only then)."""
    cond.cluster_only = True
    return cond


LEVER_OPTIONS: dict[str, _Options] = {
    "dp_comm": (("more micro-batches per step (--global-batch) amortise it", _ALWAYS),
                ("PP or a wider EP shards the gradients it moves", _ALWAYS)),
    "bubble": (("more micro-batches per step (--global-batch) shrink it", _ALWAYS),
               ("VPP shrinks it", lambda lay, wl, cl: lay.vpp == 1),
               ("a larger VPP shrinks it", lambda lay, wl, cl: lay.vpp > 1)),
    "imbalance": (("a smaller EP gives each rank more experts to average over", _ALWAYS),
                  ("--routing aux-loss if the run balances them",
                   lambda lay, wl, cl: not (wl.load_balancing_loss or wl.force_balance))),
    "ep_comm": (("--ep-overlap hides it behind compute", lambda lay, wl, cl: not lay.ep_overlap),
                ("the flex or hybridep dispatcher sends a token once per node",
                 lambda lay, wl, cl: lay.dispatcher not in ("flex", "hybridep")
                 and (cl is None or lay.ep * lay.etp > cl.nvlink_size)),
                ("a smaller EP (inside one NVLink domain it stays off the network)",
                 lambda lay, wl, cl: cl is None or lay.ep * lay.etp > cl.nvlink_size),
                ("a smaller EP keeps more of each token's experts on its own GPU",
                 _cluster_only(lambda lay, wl, cl: cl is not None and lay.ep * lay.etp <= cl.nvlink_size))),
    "host_bound": (("--cuda-graphs replays the launches", lambda lay, wl, cl: lay.cuda_graphs != "full"),
                   ("more tokens per micro-batch give the GPU longer kernels", _ALWAYS)),
    "recompute": (("lighter recompute (selective modules, fewer full-recompute layers) where memory allows", _ALWAYS),),
    "tp_comm": (("--tp-comm-overlap hides it", lambda lay, wl, cl: not lay.tp_comm_overlap),
                ("a smaller TP moves less", _ALWAYS)),
    "cp_comm": (("a smaller CP where memory allows", _ALWAYS),),
    "pp_p2p": (("fewer pipeline stages", _ALWAYS),),
    "step_overhead": (("a larger --global-batch amortises it (a fixed cost per optimizer step)", _ALWAYS),),
    "offload": (("less --optimizer-offload where memory allows", _ALWAYS),),
    "act_offload": (("fewer --activation-offload-layers where memory allows", _ALWAYS),),
}
LEVER_SHARE = 0.2
# what frees a memory term, said for the peak stage's largest term when a layout does not fit; conditions as above
MEMORY_LEVER_OPTIONS: dict[str, _Options] = {
    # (not PP: under 1F1B the first stage holds PP micro-batches of 1/PP of the layers)
    "activations": (("--recompute (selective modules first, then full)",
                     lambda lay, wl, cl: lay.recompute.granularity != "full"),
                    ("--offload-modules (their inputs wait in host memory)", _ALWAYS),
                    ("fewer --max-tokens-per-gpu", _ALWAYS),
                    ("more TP / CP", _ALWAYS)),
    "optimizer": (("the distributed optimizer", lambda lay, wl, cl: not lay.distributed_optimizer),
                  ("--optimizer-offload", lambda lay, wl, cl: lay.optimizer_offload < 1.0),
                  ("more DP to shard it over", _ALWAYS)),
    "grads": (("more PP, or EP for an MoE's experts, to hold fewer parameters per GPU", _ALWAYS),
              ("--fsdp shards them at PP 1", lambda lay, wl, cl: not lay.fsdp)),
    "weights": (("more PP / TP, or EP for an MoE's experts", _ALWAYS),
                ("--fsdp shards them at PP 1", lambda lay, wl, cl: not lay.fsdp)),
    "logits": (("TP (the vocabulary splits over it)", _ALWAYS), ("fewer --max-tokens-per-gpu", _ALWAYS)),
    "recompute": (("smaller recompute groups (full:block:N with a smaller N)", _ALWAYS),),
    "dispatcher": (("a smaller EP", _ALWAYS), ("fewer --max-tokens-per-gpu", _ALWAYS)),
}


def _said(options: _Options, lay, wl, cl=None) -> str:
    """The options that are news for this layout, workload and cluster, joined. Without the layout and workload every
    option is said but those that only a known cluster makes news (_cluster_only)."""
    if lay is None or wl is None:
        return "; ".join(text for text, cond in options if not getattr(cond, "cluster_only", False))
    return "; ".join(text for text, cond in options if cond is None or cond(lay, wl, cl))


def memory_lever(stage: dict, layout=None, workload=None, cluster=None) -> dict | None:
    """The peak stage's largest memory term a setting frees (MEMORY_LEVER_OPTIONS), with what frees it: only the
    options not already in effect when the layout and workload are given."""
    term = max((k for k in MEMORY_LEVER_OPTIONS if stage.get(k)), key=lambda k: stage[k], default=None)
    return None if term is None else {"term": term, "bytes": int(stage[term]),
                                      "lever": _said(MEMORY_LEVER_OPTIONS[term], layout, workload, cluster)}


def levers(breakdown: dict, step_s: float, layout=None, workload=None, cluster=None) -> list[dict]:
    """The step terms a setting controls that take LEVER_SHARE or more of the step, largest first, with what shrinks
    each (LEVER_OPTIONS): only the options not already in effect when the layout and workload are given (and, with
    the cluster, only the EP advice that fits where its expert group sits)."""
    out = [{"term": k, "share": round(v / step_s, 3), "lever": _said(LEVER_OPTIONS[k], layout, workload, cluster)}
           for k, v in breakdown.items() if k in LEVER_OPTIONS and step_s > 0 and v / step_s >= LEVER_SHARE]
    return sorted(out, key=lambda d: -d["share"])


def step_shares(breakdown: dict, step_s: float, top: int = 4) -> list[tuple[str, float]]:
    """The `top` largest step terms with their share of the step, largest first."""
    if step_s <= 0:
        return []
    return sorted(((k, v / step_s) for k, v in breakdown.items() if v > 0), key=lambda kv: -kv[1])[:top]


def lever_text(lever: dict) -> str:
    """'dp_comm takes 54% of the step: more micro-batches ...' (one of `levers`), as every report words it."""
    return f"{lever['term']} takes {lever['share']:.0%} of the step: {lever['lever']}"


def shares_text(shares: list[dict]) -> str:
    """'compute_experts 23%, recompute 20%, ...' for [{term, share}] (step_shares as the search records them)."""
    return ", ".join(f"{d['term']} {d['share']:.0%}" for d in shares)
