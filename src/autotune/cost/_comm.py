"""Communication physics of the time model: link bandwidths, collectives, the MoE all-to-all and routing load.

Shapes and why:
  - a ring collective (all-gather, reduce-scatter, all-reduce) over n ranks moves (n - 1) / n of its data per GPU
    over NVLink; when the group spans NVLink domains, each domain needs the other domains' shards only once: they
    enter through the NICs of the group's G members in that domain, (n - G) / n of the data over G NICs, while
    NVLink forwards them inside (NCCL's rings cross each node once per channel, one channel per NIC). The slower
    of the two paces it: a data-parallel group with 8 members per node runs at ~8 NICs' bandwidth, not one's;
  - an all-to-all over an EP group splits its bytes by the share of peers off the NVLink domain. NCCL's alltoall
    sends every routed copy (top-k per token) to its rank, so off-domain bytes are k x the off-domain share; the
    flex dispatcher (DeepEP / HybridEP) sends a token once to each remote domain that holds one of its experts and
    forwards it over NVLink there, so its network bytes are the expected number of distinct remote domains among
    the k experts (k picks over D domains reach D (1 - (1 - 1/D)^k) distinct ones) instead of k x the off share,
    near the network's line rate (`flex_net`, DeepEP's RDMA kernels) where NCCL gets `net_eff`;
  - group-limited routing (DeepSeek-V3: n_group 8, topk_group 4; Megatron's --moe-router-num-groups / -group-topk,
    kept under forced balance: random logits, then the same group-limited top-k) puts a token's k experts in T of G
    groups of consecutive experts; where the groups nest in the NVLink domains a token reaches
    D (1 - C(G - G / D, T) / C(G, T)) of them (`routing_spread`): on 8 H100 nodes (EP64) 4, not the 5.25 of 8 free
    picks, so the flex dispatcher's network copies fall by a quarter. Its NVLink copies stay k, as for every model:
    DeepEP and HybridEP send a token once per rank, but the seed's EP8 pair (the flex dispatcher measured 3% slower
    than NCCL's alltoall over the whole step) holds the k copies at `flex_nvl` x NVLink's bandwidth as one calibrated
    pair, which a per-rank count would break;
  - NeMo AutoModel's forced balance (FakeBalancedGate, nemo_automodel/components/moe/layers.py, noise 0) routes
    token i to the k consecutive experts (k i + j) mod E, and its EP ranks hold E / EP consecutive experts
    (apply_ep's Shard(0)): a token's k experts sit on one or two ranks of one NVLink domain, not k scattered ones.
    DeepEP sends a token once to each rank that holds one of its experts (get_dispatch_layout's is_token_in_rank,
    nemo_automodel/components/moe/megatron/fused_a2a.py), so its copies are those distinct ranks and domains
    (`contiguous_spread`), not k;
  - routing load: a rank's tokens are the sum over its E / EP experts; with natural routing the hottest of EP ranks
    carries 1 + cv z(EP) / sqrt(E / EP) times the mean, z(N) the expected maximum of N standard normals (Blom's
    approximation: the normal quantile at (N - 0.375) / (N + 0.25)), cv the expert loads' coefficient of variation;
    `MemoryCoefficients.imbalance_on / _off` give that maximum at the reference shape (the seed's: EP 8, 256 experts,
    top-8), forced balancing gives 1, token drop with padding gives exactly the capacity factor (every expert
    computes and sends its padded capacity). cv is not one number across models: a micro-batch's tokens come in a
    few documents whose tokens route alike, so an expert's share of it fluctuates like a count of D documents each
    landing in it with probability k / E, cv = sqrt((1 - k / E) / (D k / E)) = sqrt((E / k - 1) / D). With D fixed
    (one anchor cannot say more) cv scales with sqrt(E / k - 1) from the reference's: a coarse-expert model (Mixtral,
    8 experts top-2: E / k = 4) routes more evenly than a fine-grained one (256 top-8: 32).
No torch, no ray.
"""

from __future__ import annotations

from functools import lru_cache
from math import comb, gcd

import numpy as np

from ..catalog import ClusterSpec, ModelSpec, Workload
from ..layout import LayoutTable
from ..layout.core import CUDA_GRAPHS

__all__ = ["link_bandwidths", "ring_bw", "group_bw", "a2a_time", "routing_load", "expected_max", "REF_EP",
           "REF_EXPERTS", "REF_TOP_K", "contiguous_spread",
           "routing_spread", "routing_summary", "flex_spread"]

REF_EP, REF_EXPERTS, REF_TOP_K = 8, 256, 8  # the shape at which imbalance_on / _off are given (the seed's MoE)


def link_bandwidths(cluster: ClusterSpec, c) -> tuple[float, float]:
    """Achieved per-GPU bytes/s over (NVLink, the network): the network is the node's NICs shared by its GPUs."""
    nvl = cluster.gpu.nvlink_gbps * 1e9 * c.nvlink_eff
    net = cluster.network_gbps * 1e9 / cluster.gpus_per_node * c.net_eff
    return nvl, net


def ring_bw(cluster: ClusterSpec, span, c):
    """Per-GPU bandwidth (bytes/s) of a ring over `span` consecutive ranks: NVLink inside a domain, otherwise the
    node's network share per GPU."""
    nvl, net = link_bandwidths(cluster, c)
    return np.where(span <= cluster.nvlink_size, nvl, net)


def group_bw(cluster: ClusterSpec, n, stride, c):
    """Per-GPU bandwidth (bytes/s, for (n - 1) / n of the data) of a ring collective over n ranks `stride` apart
    in rank order (TP: 1; DP x CP: TP; expert-DP: EP x ETP), see the module docstring."""
    nvl, net = link_bandwidths(cluster, c)
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    G = np.clip(cluster.nvlink_size // np.maximum(np.asarray(stride), 1), 1, None).astype(float)
    G = np.minimum(G, n)
    cross = (n - G) / (np.maximum(n - 1, 1) * G * net)  # seconds per byte of the (n - 1) / n share
    return 1.0 / np.maximum(1.0 / nvl, cross)


@lru_cache(maxsize=256)
def contiguous_spread(num_experts: int, k: int, ep: int, nvlink_size: int) -> tuple[float, float]:
    """(distinct EP ranks, distinct NVLink domains) a token reaches under NeMo AutoModel's FakeBalancedGate: token i
    takes experts (k i + j) mod E, j < k; rank r holds experts [r E / EP, (r + 1) E / EP); a domain holds
    min(nvlink_size, EP) consecutive ranks. Averaged over the gate's period E / gcd(k, E) of starting experts."""
    E, k, ep = int(num_experts), int(k), max(int(ep), 1)
    per_rank = max(E // ep, 1)
    per_dom = per_rank * max(min(int(nvlink_size), ep), 1)
    starts = [(k * i) % E for i in range(E // gcd(k, E))]
    ranks = doms = 0.0
    for s in starts:
        experts = [(s + j) % E for j in range(k)]
        ranks += len({e // per_rank for e in experts})
        doms += len({e // per_dom for e in experts})
    return ranks / len(starts), doms / len(starts)


def _reach(units: int, groups: int, chosen: int, k: int) -> float:
    """Expected distinct units (ranks, or NVLink domains: equal blocks of consecutive experts) a token's k experts
    reach when they lie in `chosen` of `groups` equal blocks of consecutive experts, the blocks picked without
    preference (forced-balanced or well-balanced routing); groups == chosen == 1 is k unrestricted picks."""
    if units <= 1:
        return 1.0
    if groups > 1 and groups % units == 0:  # whole groups per unit: reached when one of its groups is chosen
        return units * (1.0 - comb(groups - groups // units, chosen) / comb(groups, chosen))
    if groups > 1 and units % groups == 0:  # a group spans units / groups units; its k / chosen experts fall among them
        u = units // groups
        return chosen * u * (1.0 - (1.0 - 1.0 / u) ** (k / chosen))
    return units * (1.0 - (1.0 - 1.0 / units) ** k)  # k independent picks (or groups that do not align)


def routing_spread(num_experts: int, k: int, groups: int, chosen: int, ep: int, nvlink_size: int) -> tuple[float, float]:
    """(distinct EP ranks, distinct NVLink domains) a token reaches under group-limited routing (DeepSeek-V3: its 8
    experts from 4 of 8 groups of 32) on an EP group of `ep` consecutive ranks, each holding E / EP consecutive
    experts, min(nvlink_size, EP) ranks a domain (see the module docstring)."""
    ep = max(int(ep), 1)
    doms = max(ep // max(min(int(nvlink_size), ep), 1), 1)
    return _reach(ep, groups, chosen, k), _reach(doms, groups, chosen, k)


def flex_spread(model: ModelSpec, workload: Workload, span: int, nvlink_size: int):
    """((distinct EP ranks, distinct NVLink domains) a token's flex dispatch reaches, what fixes them) where the
    routing fixes them, else None (k free picks, a2a_time's own count): NeMo AutoModel's forced-balance gate
    (`contiguous_spread`), or group-limited routing (`routing_spread`'s domains; the NVLink copies stay k, see the
    module docstring)."""
    e = model.moe
    if workload.force_balance and workload.framework == "automodel":
        return contiguous_spread(e.num_experts, e.top_k, span, nvlink_size), "consecutive experts (AutoModel's gate)"
    if e.group_limited:
        domains = routing_spread(e.num_experts, e.top_k, e.router_groups, e.router_group_topk, span, nvlink_size)[1]
        return (float(e.top_k), domains), f"its experts from {e.router_group_topk} of {e.router_groups} groups"
    return None


def routing_summary(model: ModelSpec, workload: Workload, cluster: ClusterSpec, t: LayoutTable, mcoef,
                    row: int = 0) -> dict:
    """What the time model assumes of one layout's expert routing, in numbers a user can check: the hottest EP rank's
    load over the mean (`routing_load`), the NVLink domains the EP group spans, and how many of them one token reaches
    (the flex dispatcher sends it once to each; NCCL's alltoall sends every routed copy): the same quantities
    `_terms` prices the all-to-all with. {} for a dense model."""
    if not model.is_moe:
        return {}
    e = model.moe
    span = int(t.ep[row] * t.etp[row])
    domains = max(span // max(min(cluster.nvlink_size, span), 1), 1)
    fixed = flex_spread(model, workload, span, cluster.nvlink_size)
    reach, how = (fixed[0][1], fixed[1]) if fixed else (_reach(domains, 1, 1, e.top_k), "free picks")
    load = float(routing_load(model, workload, t, mcoef)[row])
    return {"experts": e.num_experts, "top_k": e.top_k, "hottest_rank_load": load, "ep_group_ranks": span,
            "nvlink_domains": domains, "domains_per_token": float(reach), "spread": how}


def a2a_time(tokens, k: int, h_bytes: float, span, cluster: ClusterSpec, c, flex, spread=None, nvl_gain=1.0):
    """Seconds of one dispatch (or combine) of `tokens` tokens per GPU, each routed to k experts, over an EP group
    of `span` consecutive ranks. NVLink carries the in-domain copies (and, for flex, the forwarded ones); the
    network carries k x the off-domain share (alltoall) or one copy per distinct remote domain (flex). `spread`:
    (distinct ranks, distinct domains) per token where the routing fixes them (contiguous_spread), in place of k
    random picks for the flex dispatcher, which sends a token once per rank and domain. `nvl_gain`: the flex
    backend's NVLink throughput over DeepEP's (HybridEP: `hybridep_nvl_gain`)."""
    nvl, net = link_bandwidths(cluster, c)
    span = np.maximum(span, 1)
    dom = np.maximum(span / cluster.nvlink_size, 1.0)  # NVLink domains the group spans
    off = np.clip(1.0 - 1.0 / dom, 0.0, 1.0)
    peers = (span - 1) / span  # the copy kept on the GPU itself does not move
    distinct_remote = dom * (1.0 - (1.0 - 1.0 / dom) ** k) - (1.0 - (1.0 - 1.0 / dom) ** k) * 1.0
    flex_nvl_copies = k
    if spread is not None:  # the token's source rank / domain is uniform over the group: its own share stays home
        ranks, doms = spread
        distinct_remote, flex_nvl_copies = doms * off, ranks
    net_copies = np.where(flex, distinct_remote, k * off)
    nvl_copies = peers * np.where(flex, flex_nvl_copies, k * (1.0 - off))
    nvl_bw = np.where(flex, nvl * c.flex_nvl * nvl_gain, nvl)
    net_bw = np.where(flex, net * (c.flex_net / c.net_eff), net)  # DeepEP's RDMA kernels near line rate
    return tokens * h_bytes * (nvl_copies / nvl_bw + net_copies / net_bw)


def expected_max(n) -> np.ndarray:
    """E[max of n standard normals] (0 for n <= 1): Blom's quantile (n - 0.375) / (n + 0.25), the normal quantile
    by Abramowitz & Stegun 26.2.23 (error < 4.5e-4)."""
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    q = 1.0 - (n - 0.375) / (n + 0.25)  # upper tail
    t = np.sqrt(-2.0 * np.log(q))
    z = t - (2.515517 + 0.802853 * t + 0.010328 * t**2) / (1 + 1.432788 * t + 0.189269 * t**2 + 0.001308 * t**3)
    return np.where(n > 1, z, 0.0)


# the paged stash's GPU pool for the routed experts' saved activations, over their even share
# (--moe-paged-stash-buffer-size-factor-cuda, Megatron-Bridge's full-iteration recipes: 1.2; pages beyond it go to host)
PAGED_STASH_POOL = 1.2


def paged_stash(model: ModelSpec, t: LayoutTable) -> np.ndarray:
    """(n,) rows that run a dropless MoE model under full-iteration CUDA graphs: megatron-core's paged stash path
    (--moe-paged-stash, HybridEP's static per-rank budget --moe-expert-rank-capacity-factor, TE's fused grouped MLP
    --use-transformer-engine-op-fuser): sync-free experts whose saved activations live in a pool of pages."""
    if not model.is_moe:
        return np.zeros(len(t), dtype=bool)
    return (t.cuda_graphs == CUDA_GRAPHS.index("full")) & (t.capacity == 0)


def fused_grouped_mlp(model: ModelSpec, workload: Workload, t: LayoutTable) -> np.ndarray:
    """(n,) paged-stash rows whose experts run Transformer Engine's fused grouped MLP as one kernel per GEMM with the
    activation and the casts in its epilogues: its CuTe-DSL kernels, on Blackwell under MXFP8, the only case measured
    (Megatron-Bridge's full-iteration recipes are all MXFP8 on Blackwell: NVTE_CUTEDSL_FUSED_GROUPED_MLP). Elsewhere
    the paged stash keeps the per-expert kernels and elementwise passes; only its graphs and stash copy count."""
    return paged_stash(model, t) & (workload.precision == "mxfp8")


def routing_load(model: ModelSpec, workload: Workload, t: LayoutTable, mcoef) -> np.ndarray:
    """(n,) the hottest EP rank's routed tokens over the mean (see the module docstring)."""
    n = len(t)
    if not model.is_moe:
        return np.ones(n)
    ep = t.ep.astype(float)
    ref = mcoef.imbalance_on if workload.load_balancing_loss else mcoef.imbalance_off
    spread = lambda e, per: expected_max(e) / np.sqrt(np.maximum(per, 1.0))  # noqa: E731
    e, k = model.moe.num_experts, model.moe.top_k
    granularity = np.sqrt(max(e / k - 1.0, 0.0) / (REF_EXPERTS / REF_TOP_K - 1.0))  # cv's ratio to the reference's
    cv = (ref - 1.0) / spread(REF_EP, REF_EXPERTS / REF_EP) * granularity
    natural = 1.0 + cv * spread(ep, e / ep)
    load = np.ones(n) if workload.force_balance else natural
    return np.where(t.capacity > 0, t.capacity, load)
