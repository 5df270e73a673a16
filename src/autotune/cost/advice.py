"""What to change when a layout is slow or does not fit: the step terms a layout or workload setting controls, and the
memory terms a setting frees, each with the setting that shrinks it. Read by `autotune estimate` (bottleneck and
"to fit" lines) and by the search's outcome (the best layout's bottleneck). Plain tables; no torch, no ray.
"""

from __future__ import annotations

__all__ = ["LEVERS", "LEVER_SHARE", "MEMORY_LEVERS", "levers", "memory_lever", "step_shares", "lever_text",
           "shares_text"]


# what shrinks a step term a layout or workload setting controls, said where the term takes LEVER_SHARE of the step
LEVERS = {
    "dp_comm": "more micro-batches per step (--global-batch) amortise it; PP or a wider EP shards the gradients it moves",
    "bubble": "more micro-batches per step (--global-batch) or VPP shrink it",
    "imbalance": "a smaller EP gives each rank more experts to average over; --routing aux-loss if the run balances them",
    "ep_comm": "--ep-overlap hides it behind compute; the flex or hybridep dispatcher sends a token once per node",
    "host_bound": "--cuda-graphs replays the launches; more tokens per micro-batch give the GPU longer kernels",
    "recompute": "lighter recompute (selective modules, fewer full-recompute layers) where memory allows",
    "tp_comm": "--tp-comm-overlap hides it; a smaller TP moves less",
    "cp_comm": "a smaller CP where memory allows",
    "pp_p2p": "fewer pipeline stages",
    "step_overhead": "a larger --global-batch amortises it (a fixed cost per optimizer step)",
    "offload": "less --optimizer-offload where memory allows",
    "act_offload": "fewer --activation-offload-layers where memory allows",
}
LEVER_SHARE = 0.2
# what frees a memory term, said for the peak stage's largest term when a layout does not fit
MEMORY_LEVERS = {
    # (not PP: under 1F1B the first stage holds PP micro-batches of 1/PP of the layers)
    "activations": "--recompute (selective modules first, then full), --offload-modules (their inputs wait in host "
                   "memory), fewer --max-tokens-per-gpu, or more TP / CP",
    "optimizer": "the distributed optimizer (the default), --optimizer-offload, or more DP to shard it over",
    "grads": "more PP, or EP for an MoE's experts, to hold fewer parameters per GPU (--fsdp shards them at PP 1)",
    "weights": "more PP / TP, or EP for an MoE's experts (--fsdp shards them at PP 1)",
    "logits": "TP (the vocabulary splits over it) or fewer --max-tokens-per-gpu",
    "recompute": "smaller recompute groups (full:block:N with a smaller N)",
    "dispatcher": "a smaller EP or fewer --max-tokens-per-gpu",
}


def memory_lever(stage: dict) -> dict | None:
    """The peak stage's largest memory term a setting frees (MEMORY_LEVERS), with what frees it."""
    term = max((k for k in MEMORY_LEVERS if stage.get(k)), key=lambda k: stage[k], default=None)
    return None if term is None else {"term": term, "bytes": int(stage[term]), "lever": MEMORY_LEVERS[term]}


def levers(breakdown: dict, step_s: float) -> list[dict]:
    """The step terms a setting controls that take LEVER_SHARE or more of the step, largest first, with what shrinks
    each (LEVERS)."""
    out = [{"term": k, "share": round(v / step_s, 3), "lever": LEVERS[k]}
           for k, v in breakdown.items() if k in LEVERS and step_s > 0 and v / step_s >= LEVER_SHARE]
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
