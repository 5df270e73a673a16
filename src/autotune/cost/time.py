"""The throughput model: step time for many layouts at once, as a named breakdown.

Per micro-batch and pipeline stage (seconds, forward + backward + recompute):
  compute_dense, compute_attention, compute_linear_attention, compute_experts, compute_output
  recompute      forward work re-run in backward (full: every recomputed layer; selective: the dropped parts)
  memory_bound   elementwise/norm/permute traffic, from the bytes the layer touches and the HBM bandwidth
  tp_comm        SP all-gather/reduce-scatter (or all-reduce without SP) at the TP group's bandwidth
  cp_comm        ring exchange of K/V for context parallelism (partly hidden behind attention)
  ep_comm        token dispatch and combine (alltoall / allgather / flex) over NVLink or the network,
                 by where the EP group lands
  pp_p2p         activations sent between pipeline stages (more boundaries with VPP)
  layer_overhead fixed per-layer launch and synchronisation costs; per recompute-group costs
  imbalance      the hottest EP rank's extra expert work and traffic when routing is not balanced
Per step: the steady state (micro-batches x the slowest stage), the pipeline bubble ((PP - 1) / VPP x the
mean stage), exposed DP gradient reduce-scatter / parameter all-gather, the optimizer step, fixed step
overhead. Calibration (calibrate.py) multiplies each term by one fitted factor (`TimeCoefficients.scale`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..catalog import ClusterSpec, ModelSpec, Workload
from ..layout import LayoutTable
from .flops import mfu, stage_flops
from .layers import PART_CLASS, PARTS, layer_tables, stage_sums
from .memory import MemoryCoefficients, MemoryResult, estimate_memory

__all__ = ["TimeCoefficients", "TimeResult", "estimate_time", "MB_TERMS", "STEP_TERMS"]

MB_TERMS = ("compute_dense", "compute_attention", "compute_linear_attention", "compute_experts", "compute_output",
            "recompute", "memory_bound", "tp_comm", "cp_comm", "ep_comm", "pp_p2p", "layer_overhead", "imbalance")
STEP_TERMS = MB_TERMS + ("bubble", "dp_comm", "optimizer", "step_overhead")


@dataclass(frozen=True)
class TimeCoefficients:
    """Efficiencies of an ideal implementation, and the calibrated per-term factors."""

    gemm: float = 0.70  # dense BF16 GEMM, fraction of peak at large shapes
    attention: float = 0.45  # flash attention forward, fraction of peak
    linear_attention: float = 0.12  # Gated DeltaNet chunked kernels (Triton), fraction of peak
    experts: float = 0.60  # grouped GEMM at large tokens per expert
    gemm_half_tokens: float = 256.0  # tokens per (local) expert at which grouped-GEMM efficiency halves
    mem_touch: float = 3.0  # times each saved activation byte crosses HBM in elementwise kernels per pass
    nvlink_eff: float = 0.55  # achieved fraction of NVLink bandwidth for collectives / all-to-all
    net_eff: float = 0.70  # achieved fraction of network bandwidth
    flex_nvl: float = 0.85  # DeepEP intra-node throughput relative to NCCL all-to-all
    flex_net: float = 1.6  # DeepEP inter-node throughput relative to NCCL all-to-all
    cp_hidden: float = 0.5  # share of the CP ring exchange hidden behind attention
    layer_overhead_s: float = 2.0e-4  # per layer per pass (launches)
    moe_overhead_s: float = 8.0e-4  # extra per MoE layer per pass (routing, permute, host sync of counts)
    recompute_group_s: float = 3.0e-3  # per recompute group per micro-batch (checkpoint boundary, sync)
    dp_exposed: float = 0.25  # share of DP gradient/param traffic not hidden (with overlap)
    optimizer_bytes: float = 40.0  # HBM bytes per locally held parameter in the optimizer step
    step_overhead_s: float = 0.15  # per step: data, logging, loss reduction, schedule setup
    shared_overlap_gain: float = 0.8  # share of shared-expert compute hidden by --moe-shared-expert-overlap
    scale: dict = field(default_factory=dict)  # term -> calibrated factor (missing = 1)


@dataclass
class TimeResult:
    mb_terms: dict[str, np.ndarray]  # per micro-batch per stage (n, S), already scaled
    step_terms: dict[str, np.ndarray]  # per step (n,)
    step_time: np.ndarray
    tokens_per_step: float
    world: int
    tokens_per_s_per_gpu: np.ndarray
    mfu: np.ndarray
    usd_per_million_tokens: np.ndarray

    def breakdown(self, i: int) -> dict[str, float]:
        return {k: float(v[i]) for k, v in self.step_terms.items()}

    def gpu_hours(self, steps: int) -> np.ndarray:
        return self.step_time * steps * self.world / 3600.0


def _bw(cluster: ClusterSpec, span: np.ndarray, c: TimeCoefficients) -> np.ndarray:
    """Per-GPU bandwidth (bytes/s) of a group of `span` consecutive ranks: NVLink inside a node,
    otherwise the node's network share per GPU (the slowest link sets a ring's pace)."""
    g = cluster.gpu
    nvl = g.nvlink_gbps * 1e9 * c.nvlink_eff
    net = cluster.network_gbps * 1e9 / cluster.gpus_per_node * c.net_eff
    return np.where(span <= cluster.node_size, nvl, net)


def _a2a_time(volume, span, cluster: ClusterSpec, c: TimeCoefficients, dispatcher):
    """All-to-all of `volume` bytes per GPU over `span` consecutive ranks: the off-node share goes
    over the network, the rest over NVLink."""
    g = cluster.gpu
    nvl = g.nvlink_gbps * 1e9 * c.nvlink_eff
    net = cluster.network_gbps * 1e9 / cluster.gpus_per_node * c.net_eff
    off = np.clip(1.0 - cluster.node_size / np.maximum(span, 1), 0.0, 1.0)
    flex = dispatcher == 2
    nvl = np.where(flex, nvl * c.flex_nvl, nvl)
    net = np.where(flex, net * c.flex_net, net)
    return volume * ((1 - off) / nvl + off / net)


def estimate_time(
    model: ModelSpec, workload: Workload, cluster: ClusterSpec, t: LayoutTable,
    coef: TimeCoefficients = TimeCoefficients(), mcoef: MemoryCoefficients = MemoryCoefficients(),
    mem: MemoryResult | None = None,
) -> TimeResult:
    g = cluster.gpu
    peak = g.bf16_tflops * 1e12
    lt = layer_tables(model)
    n, S = len(t), int(t.pp.max())
    fl = stage_flops(model, workload, t)
    tokens = fl.tokens[:, None]
    tp, cp, ep, etp = (a[:, None].astype(float) for a in (t.tp, t.cp, t.ep, t.etp))
    sp = t.sp_eff[:, None]
    tok_share = 1.0 / (cp * np.where(sp, tp, 1.0))  # tokens on one GPU's sequence-parallel path
    L_stage = stage_sums(np.ones(lt.n_layers), t.pp, t.vpp, S)
    moe_stage = stage_sums(lt.is_moe.astype(float), t.pp, t.vpp, S)
    imb = np.where(ep > 1, mcoef.imbalance_on if workload.load_balancing_loss else mcoef.imbalance_off, 1.0)
    mb: dict[str, np.ndarray] = {}

    # --- compute: forward x 3 (forward + 2x backward) ------------------------------------------------
    local_tok = tokens / cp
    width_eff = 1.0 / (1.0 + 512.0 / (model.hidden_size / tp))
    gemm = coef.gemm * width_eff * local_tok / (local_tok + 256.0)
    mb["compute_dense"] = 3 * fl.dense / (peak * gemm)
    mb["compute_attention"] = 3.5 * fl.attention / (peak * coef.attention)  # backward ~2.5x forward
    mb["compute_linear_attention"] = 3 * fl.linear_attention / (peak * coef.linear_attention)
    if model.is_moe:
        e = model.moe
        copies = tokens * tok_share * e.top_k * etp  # routed token copies per GPU
        per_expert = copies / np.maximum(1.0, e.num_experts / ep)
        ge = coef.experts * per_expert / (per_expert + coef.gemm_half_tokens) / (1 + 0.0 * etp)
        mb["compute_experts"] = 3 * fl.experts / (peak * ge)
    else:
        mb["compute_experts"] = np.zeros((n, S))
    mb["compute_output"] = 3 * fl.output / (peak * gemm)

    # --- memory-bound traffic ------------------------------------------------------------------------
    div = {"seq": tok_share, "tp": 1.0 / (cp * tp), "rep": tok_share, "exph": tok_share * etp, "expf": tok_share}
    per_part = stage_sums(lt.act, t.pp, t.vpp, S)
    act_bytes = sum(per_part[:, :, j] * div[PART_CLASS[p]] for j, p in enumerate(PARTS)) * tokens
    mb["memory_bound"] = 3 * coef.mem_touch * act_bytes / (g.hbm_gbps * 1e9)

    # --- recompute -----------------------------------------------------------------------------------
    fwd = (mb["compute_dense"] + mb["compute_linear_attention"] + mb["compute_experts"]) / 3 \
        + mb["compute_attention"] / 3.5 + mb["memory_bound"] / 3
    full = (t.rc_gran == 2)[:, None]
    block = (t.rc_method == 1)[:, None]
    chunk_layers = np.maximum(1.0, L_stage / t.vpp[:, None])
    N = np.maximum(1, t.rc_layers)[:, None].astype(float)
    frac = np.where(block, np.minimum(N, chunk_layers) / chunk_layers, 1.0)
    groups = np.where(block, np.minimum(N, chunk_layers), np.ceil(chunk_layers / N)) * t.vpp[:, None]
    sel = (t.rc_gran == 1)[:, None]
    selective = mb["compute_attention"] / 3.5 + 0.1 * mb["memory_bound"] / 3
    mb["recompute"] = np.where(full, fwd * frac, np.where(sel, selective, 0.0))

    # --- communication -------------------------------------------------------------------------------
    h = model.hidden_size
    seq_bytes = tokens / cp * h * 2.0
    tp_span = tp
    tp_vol = np.where(sp, 8 * seq_bytes * (tp - 1) / tp, 8 * seq_bytes * (tp - 1) / tp)  # AG+RS x2 x fwd/bwd; AR = 2x
    passes = 1.0 + np.where(full, frac * 0.5, 0.0)  # recompute re-runs the forward half
    mb["tp_comm"] = np.where(tp > 1, tp_vol * L_stage * passes / _bw(cluster, tp_span, coef), 0.0)
    kv_bytes = tokens / cp * 2 * model.num_kv_heads * model.head_dim * 2.0 / tp
    attn_layers = stage_sums((lt.kind != 2).astype(float), t.pp, t.vpp, S)
    mb["cp_comm"] = np.where(cp > 1, 3 * (cp - 1) * kv_bytes * attn_layers * (1 - coef.cp_hidden)
                             / _bw(cluster, tp * cp, coef), 0.0)
    if model.is_moe:
        k = model.moe.top_k
        span = ep * etp * np.where(tp > etp, tp / etp, 1.0)
        a2a_vol = tokens * tok_share * k * h * 2.0 * (ep * etp - 1) / (ep * etp)
        ag_vol = tokens / cp * h * 2.0 * (ep * tp - 1)
        vol = np.where((t.dispatcher == 1)[:, None], ag_vol, a2a_vol)
        n_ops = 4 + np.where(full, 2 * frac, 0.0)  # dispatch + combine, forward and backward (+ recompute)
        ep_t = np.where(ep * etp > 1, n_ops * _a2a_time(vol, span, cluster, coef, t.dispatcher[:, None]), 0.0)
        mb["ep_comm"] = ep_t * moe_stage
        shared = 0.0
        if model.moe.shared_ffn_hidden_size:
            shared_frac = 3 * h * model.moe.shared_ffn_hidden_size * 2 / np.maximum(lt.flops_dense.mean(), 1)
            shared = mb["compute_dense"] * min(1.0, shared_frac) * coef.shared_overlap_gain
        hidden = np.where(t.shared_overlap[:, None], np.minimum(shared, mb["ep_comm"]), 0.0)
        mb["ep_comm"] = mb["ep_comm"] - hidden
        mb["imbalance"] = (imb - 1.0) * (mb["compute_experts"] + mb["ep_comm"])
    else:
        mb["ep_comm"] = np.zeros((n, S))
        mb["imbalance"] = np.zeros((n, S))
    stages_per_node = np.maximum(1.0, cluster.node_size / (t.world / t.pp))[:, None]
    pp_span = np.where(stages_per_node > 1, 1.0, 2 * cluster.node_size)
    p2p = 2 * seq_bytes * tok_share * cp * t.vpp[:, None] / _bw(cluster, pp_span, coef)
    mb["pp_p2p"] = np.where((t.pp > 1)[:, None], p2p, 0.0)
    overhead = (coef.layer_overhead_s * L_stage + coef.moe_overhead_s * moe_stage) * (3 + np.where(full, frac, 0.0))
    mb["layer_overhead"] = overhead + np.where(full, groups * coef.recompute_group_s, 0.0)

    valid = np.arange(S)[None, :] < t.pp[:, None]
    mb = {k: np.where(valid, v * coef.scale.get(k, 1.0), 0.0) for k, v in mb.items()}
    if mem is None:
        mem = estimate_memory(model, workload, cluster, t, mcoef)
    return _compose(workload, cluster, t, mb, coef, mem, model)


def _compose(workload, cluster, t, mb, coef, mem: MemoryResult, model) -> TimeResult:
    """Pipeline schedule, DP traffic and optimizer: from per-micro-batch stage times to a step."""
    S = next(iter(mb.values())).shape[1]
    valid = np.arange(S)[None, :] < t.pp[:, None]
    stage = sum(mb.values())
    worst = stage.argmax(axis=1)
    rows = np.arange(len(t))
    M = t.num_microbatches(workload.global_batch, workload.seq_len).astype(float)
    step = {k: v[rows, worst] * M for k, v in mb.items()}
    mean_stage = np.where(valid, stage, 0).sum(axis=1) / t.pp
    step["bubble"] = (t.pp - 1) / t.vpp * mean_stage * coef.scale.get("bubble", 1.0)

    params = (mem.terms["weights"] / 2.0).max(axis=1)  # most loaded stage
    dp = np.maximum(t.dp, 1).astype(float)
    grad_bytes = params * 4.0
    dp_span = t.tp * t.cp * t.dp
    traffic = np.where(t.dist_opt, grad_bytes * (dp - 1) / dp + params * 2.0 * (dp - 1) / dp,
                       2 * grad_bytes * (dp - 1) / dp)
    exposed = np.where(t.overlap_grad, coef.dp_exposed, 1.0)
    step["dp_comm"] = np.where(dp > 1, traffic * exposed / _bw(cluster, dp_span, coef), 0.0) * coef.scale.get("dp_comm", 1.0)
    held = np.where(t.dist_opt, (mem.terms["optimizer"] / 12.0).max(axis=1), params)
    offload = t.offload * held * 12.0 / 20e9  # host Adam at ~20 GB/s effective
    step["optimizer"] = (held * coef.optimizer_bytes / (cluster.gpu.hbm_gbps * 1e9) + offload) * coef.scale.get("optimizer", 1.0)
    step["step_overhead"] = np.full(len(t), coef.step_overhead_s * coef.scale.get("step_overhead", 1.0))
    total = sum(step.values())
    tokens_step = float(workload.tokens_per_step)
    tps = tokens_step / total / t.world
    g = cluster.gpu
    return TimeResult(
        mb_terms=mb, step_terms=step, step_time=total, tokens_per_step=tokens_step, world=t.world,
        tokens_per_s_per_gpu=tps, mfu=mfu(model, tps, g.bf16_tflops),
        usd_per_million_tokens=np.where(tps > 0, g.usd_per_hour / (tps * 3600.0) * 1e6, np.inf),
    )
