"""The physics of the throughput model: unscaled time terms for every layout of a LayoutTable.

`microbatch_terms` gives seconds per micro-batch per pipeline stage for each MB term; `step_raw` adds
the per-step pieces (DP traffic, optimizer, overhead) and packs a `RawTime`. time.py composes them into
step times under calibrated factors. Every term is a closed form over numpy columns: no per-layout
Python loops. Shapes and why:
  - GEMMs run at gemm x width/(width + gemm_width) x rows/(rows + gemm_rows) of peak: narrow sides (TP-split
    hidden sizes, thin experts) and few rows (tokens per expert) waste tiles and waves. The routed experts
    use the same curve at their own shape (per-expert rows, min(hidden, FFN / ETP)) times `grouped`.
  - backward is 2x forward for GEMMs, ~2.5x for flash attention; full recompute re-runs the forward of
    every layer of a recompute region, with its TP and EP collectives.
  - collectives move (n - 1) / n of the data per GPU at NVLink inside a node, the node's network share
    per GPU across nodes; an all-to-all splits its bytes by the share of peers off the node.
No torch, no ray.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..catalog import ClusterSpec, ModelSpec, Workload
from ..layout import LayoutTable
from ._mtp import mtp_stage_params
from .flops import stage_flops
from .layers import PARTS, fold_activations, layer_tables, stage_sums, stage_sums_by_pair, vocab_per_row
from .memory import MemoryCoefficients, owned_params, stage_params

__all__ = ["microbatch_terms", "step_raw", "gemm_efficiency", "RawTime", "raw_time", "MB_TERMS", "STEP_TERMS",
           "DERIVED", "DEPS"]

MB_TERMS = ("compute_dense", "compute_attention", "compute_linear_attention", "compute_experts", "compute_output",
            "recompute", "memory_bound", "quantize", "tp_comm", "cp_comm", "ep_comm", "pp_p2p", "layer_overhead",
            "imbalance")
STEP_TERMS = MB_TERMS + ("bubble", "dp_comm", "optimizer", "step_overhead", "offload")
DERIVED = ("recompute", "imbalance")  # linear in other MB terms: they follow those terms' factors
DEPS = tuple(("recompute", k) for k in ("compute_dense", "compute_attention", "compute_linear_attention",
                                        "compute_experts", "memory_bound", "quantize")) \
    + (("imbalance", "compute_experts"), ("imbalance", "ep_comm"))  # (derived, primary) pairs with a coefficient

# share of each activation part that is a TE linear's input (quantised under FP8): the QKV / MLP / expert
# inputs whole; the activation output inside the MLP and shared-expert parts (half of those parts); the
# attention output (o_proj input) ~ a quarter of the q, k, v, o part
_QUANT_SHARE = {"attn_in": 1.0, "mlp_in": 1.0, "moe_perm": 1.0, "moe_act": 1.0, "mlp": 0.5, "shared": 0.5,
                "attn_core": 0.25}
QUANT_PARTS = np.array([_QUANT_SHARE.get(p, 0.0) for p in PARTS])

@dataclass
class RawTime:
    """Unscaled terms of n layouts: what `compose` turns into step times under any factors."""

    mb: np.ndarray  # (n, len(MB_TERMS), S) seconds per micro-batch per stage, zero beyond PP
    dep: np.ndarray  # (n, len(DEPS), S): derived term = sum of coefficient x its (scaled) primary term
    valid: np.ndarray  # (n, S)
    microbatches: np.ndarray  # (n,)
    bubble_coef: np.ndarray  # (n,) (PP - 1) / VPP
    dp_comm: np.ndarray  # (n,) DP traffic time before overlap
    dp_overlap: np.ndarray  # (n,) micro-batch stage times it can hide behind (0: not overlapped)
    optimizer: np.ndarray  # (n,)
    step_overhead: np.ndarray  # (n,)
    offload: np.ndarray  # (n,) host optimizer step and PCIe copies
    tokens_per_step: float
    world: int

    def pad(self, S: int) -> "RawTime":
        extra = S - self.mb.shape[2]
        if extra <= 0:
            return self
        return RawTime(np.pad(self.mb, ((0, 0), (0, 0), (0, extra))),
                       np.pad(self.dep, ((0, 0), (0, 0), (0, extra))), np.pad(self.valid, ((0, 0), (0, extra))),
                       self.microbatches, self.bubble_coef, self.dp_comm, self.dp_overlap, self.optimizer,
                       self.step_overhead, self.offload, self.tokens_per_step, self.world)


def gemm_efficiency(c, width, rows):
    """Fraction of peak of a GEMM whose narrowest side is `width` and that has `rows` rows."""
    return c.gemm * width / (width + c.gemm_width) * rows / (rows + c.gemm_rows)


def link_bandwidths(cluster: ClusterSpec, c) -> tuple[float, float]:
    """Achieved per-GPU bytes/s over (NVLink, the network): the network is the node's NICs shared by its GPUs."""
    nvl = cluster.gpu.nvlink_gbps * 1e9 * c.nvlink_eff
    net = cluster.network_gbps * 1e9 / cluster.gpus_per_node * c.net_eff
    return nvl, net


def _bw(cluster: ClusterSpec, span, c):
    """Per-GPU bandwidth (bytes/s) of a ring over `span` consecutive ranks: NVLink inside a node,
    otherwise the node's network share per GPU (the slowest link sets a ring's pace)."""
    nvl, net = link_bandwidths(cluster, c)
    return np.where(span <= cluster.nvlink_size, nvl, net)


def _a2a_time(volume, span, cluster: ClusterSpec, c, dispatcher):
    """All-to-all of `volume` bytes per GPU over `span` consecutive ranks: the off-node share goes over
    the network, the rest over NVLink. DeepEP (flex) moves intra-node bytes a little slower than NCCL
    but forwards inter-node bytes over NVLink so each NIC sends once per node (faster)."""
    nvl, net = link_bandwidths(cluster, c)
    off = np.clip(1.0 - cluster.nvlink_size / np.maximum(span, 1), 0.0, 1.0)
    flex = dispatcher == 2
    nvl = np.where(flex, nvl * c.flex_nvl, nvl)
    net = np.where(flex, net * c.flex_net, net)
    return volume * ((1 - off) / nvl + off / net)


def microbatch_terms(model: ModelSpec, workload: Workload, cluster: ClusterSpec, t: LayoutTable, c,
                     mcoef: MemoryCoefficients) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """Seconds per micro-batch per stage of every MB term, and the derived terms' recipes:
    {derived term: {primary term: coefficient (n, S)}} (recompute, imbalance)."""
    g = cluster.gpu
    peak = g.bf16_tflops * 1e12
    # TE linears (projections, MLPs, experts) run FP8 (or NVFP4) GEMMs under a low-precision recipe; attention's
    # core and the output layer stay BF16. `fp8_gemm` is the low-precision GEMM's achieved share of its peak
    # relative to BF16's; the peak is the recipe's format's (catalog.workload.QUANT).
    fp8 = workload.quantized
    lin_peak = workload.linear_peak_tflops(g) * 1e12 * c.fp8_gemm * (
        c.fp8_blockwise if workload.precision == "fp8-blockwise" else 1.0) if fp8 else peak
    lt = layer_tables(model)
    n, S = len(t), int(t.pp.max())
    h = model.hidden_size
    fl = stage_flops(model, workload, t)
    tokens = fl.tokens[:, None]
    tp, cp, ep, etp = (a[:, None].astype(float) for a in (t.tp, t.cp, t.ep, t.etp))
    sp = t.sp_eff[:, None]
    tok_share = 1.0 / (cp * np.where(sp, tp, 1.0))  # tokens on one GPU's sequence-parallel path
    L_stage = stage_sums(np.ones(lt.n_layers), t.pp, t.vpp, S, t.split)
    moe_stage = stage_sums(lt.is_moe.astype(float), t.pp, t.vpp, S, t.split)
    lb = workload.load_balancing_loss
    imb = np.where(ep > 1, mcoef.imbalance_on if lb else mcoef.imbalance_off, 1.0)
    mb: dict[str, np.ndarray] = {}

    # --- compute: forward x 3 (forward + 2x backward) -------------------------------------------------
    rows = tokens / cp  # with SP the GEMMs see the gathered sequence of the CP shard
    dense_eff = gemm_efficiency(c, h / tp, rows)
    mb["compute_dense"] = 3 * fl.dense / (lin_peak * dense_eff)
    mb["compute_attention"] = 3.5 * fl.attention / (peak * c.attention)
    mb["compute_linear_attention"] = 3 * fl.linear_attention / (peak * c.linear_attention)
    if model.is_moe:
        e = model.moe
        copies = tokens * tok_share * e.top_k * etp  # routed token copies per GPU (ETP ranks share tokens)
        per_expert = copies / np.maximum(1.0, e.num_experts / ep)
        exp_eff = c.grouped * gemm_efficiency(c, np.minimum(e.width(h), e.ffn_hidden_size / etp), per_expert)
        mb["compute_experts"] = 3 * fl.experts / (lin_peak * exp_eff)
    else:
        mb["compute_experts"] = np.zeros((n, S))
    # output layer GEMMs plus the loss: the logits cross HBM ~4 times in bf16 when TE fuses the
    # cross-entropy (write, softmax read, gradient write, gradient read), ~10 x 4 B unfused (fp32 copies)
    last = np.arange(S)[None, :] == (t.pp - 1)[:, None]
    vocab = vocab_per_row(model, t.tp).astype(float)[:, None]
    logit_bytes = np.where(t.ce_fusion, 8.0, 40.0)[:, None] * vocab / tp * rows
    loss = np.where(last, logit_bytes / (g.hbm_gbps * 1e9), 0.0)
    mb["compute_output"] = 3 * fl.output / (peak * gemm_efficiency(c, h, rows)) + loss

    # --- memory-bound traffic: norms, activations, rope, permutes, router softmax ---------------------
    div = {"seq": tok_share, "tp": 1.0 / (cp * tp), "rep": tok_share, "exph": tok_share * etp, "expf": tok_share}
    per_pair, pair_of = stage_sums_by_pair(lt.act, t.pp, t.vpp, S, t.split)  # per pair: no (n, S, P) table
    act_bytes = (np.zeros((n, S)) + fold_activations(per_pair, pair_of, div)) * tokens
    mb["memory_bound"] = 3 * c.mem_touch * act_bytes / (g.hbm_gbps * 1e9)
    # FP8 casts: every TE linear's input (forward) and output gradient (backward) read in BF16 and written
    # in FP8 row- and column-wise (`quant_bytes` per element); per-tensor current scaling reads it once more
    # for the amax. Elements per token ~ the saved linear inputs' BF16 bytes / 2, twice (two passes).
    if fp8:
        q_pair, q_of = stage_sums_by_pair(lt.act * QUANT_PARTS[None, :], t.pp, t.vpp, S, t.split)
        q_elems = (np.zeros((n, S)) + fold_activations(q_pair, q_of, div)) * tokens
        q_bytes = c.quant_bytes + (c.amax_bytes if workload.amax_pass else 0.0)
        mb["quantize"] = q_elems * q_bytes / (g.hbm_gbps * 1e9)
    else:
        mb["quantize"] = np.zeros((n, S))

    # --- recompute: a re-run forward, so it is expressed in the (scaled) forward terms it repeats ------
    full = (t.rc_gran == 2)[:, None]
    block = (t.rc_method == 1)[:, None]
    chunk_layers = np.maximum(1.0, L_stage / t.vpp[:, None])
    N = np.maximum(1, t.rc_layers)[:, None].astype(float)
    frac = np.where(full, np.where(block, np.minimum(N, chunk_layers) / chunk_layers, 1.0), 0.0)
    regions = np.where(block, 1.0, np.ceil(chunk_layers / N)) * t.vpp[:, None]
    sel = np.broadcast_to((t.rc_gran == 1)[:, None], (n, S))
    deps = {"recompute": {k: frac / 3 for k in ("compute_dense", "compute_linear_attention", "compute_experts",
                                                 "memory_bound")},
            "imbalance": {}}
    deps["recompute"]["compute_attention"] = np.where(sel, 1.0, frac) / 3.5  # selective: core attention
    deps["recompute"]["memory_bound"] = np.where(sel, 0.1 / 3, frac / 3)
    deps["recompute"]["quantize"] = frac / 2  # the re-run forward quantises its inputs again

    # --- communication -----------------------------------------------------------------------------------
    seq_bytes = tokens / cp * h * 2.0
    tp_vol = 8 * seq_bytes * (tp - 1) / tp  # AG + RS around attention and MLP, forward and backward
    passes = 1.0 + frac * 0.5  # recompute re-runs the forward half
    mb["tp_comm"] = np.where(tp > 1, tp_vol * L_stage * passes / _bw(cluster, tp, c), 0.0)
    kv_bytes = tokens / cp * 2 * model.num_kv_heads * model.head_dim * 2.0 / tp
    attn_layers = stage_sums(lt.is_attention.astype(float), t.pp, t.vpp, S, t.split)
    mb["cp_comm"] = np.where(cp > 1, 3 * (cp - 1) * kv_bytes * attn_layers * (1 - c.cp_hidden)
                             / _bw(cluster, tp * cp, c), 0.0)
    if model.is_moe:
        k = model.moe.top_k
        span = ep * etp  # Megatron's expert ranks run etp-ep-edp-pp: an EP group is ep x etp consecutive ranks
        a2a_vol = tokens * tok_share * k * model.moe.width(h) * 2.0 * (ep * etp - 1) / (ep * etp)
        ag_vol = tokens / cp * model.moe.width(h) * 2.0 * (ep * tp - 1)
        vol = np.where((t.dispatcher == 1)[:, None], ag_vol, a2a_vol)
        n_ops = 4 + 2 * frac  # dispatch + combine, forward and backward (+ the recompute's forward)
        ep_t = np.where(ep * etp > 1, n_ops * _a2a_time(vol, span, cluster, c, t.dispatcher[:, None]), 0.0)
        mb["ep_comm"] = ep_t * moe_stage
        shared = 0.0
        if model.moe.shared_ffn_hidden_size:  # shared-expert GEMMs run while the dispatch is in flight
            shared_frac = 3 * h * model.moe.shared_ffn_hidden_size * 2 / np.maximum(lt.flops_dense.mean(), 1)
            shared = mb["compute_dense"] * min(1.0, shared_frac) * c.shared_overlap_gain
        hidden = np.where(t.shared_overlap[:, None], np.minimum(shared, mb["ep_comm"]), 0.0)
        mb["ep_comm"] = mb["ep_comm"] - hidden
        extra = (imb - 1.0) * np.ones((n, S))  # the hottest EP rank's extra routed tokens
        deps["imbalance"] = {"compute_experts": extra, "ep_comm": extra}
    else:
        mb["ep_comm"] = np.zeros((n, S))
    stages_per_node = np.maximum(1.0, cluster.nvlink_size / (t.world / t.pp))[:, None]
    pp_span = np.where(stages_per_node > 1, 1.0, 2 * cluster.nvlink_size)
    p2p = 2 * seq_bytes * tok_share * cp * t.vpp[:, None] / _bw(cluster, pp_span, c)
    p2p = p2p * np.where((t.vpp > 1)[:, None], 1.0 - c.p2p_hidden_vpp, 1.0)
    mb["pp_p2p"] = np.where((t.pp > 1)[:, None], p2p, 0.0)
    # launches are per layer per pass; the MoE host sync (token counts -> split sizes) per forward pass
    overhead = c.launch_s * L_stage * (3 + frac) + c.moe_sync_s * moe_stage * (1 + frac)
    mb["layer_overhead"] = overhead + np.where(full, regions * c.recompute_group_s, 0.0)
    for name, parts in deps.items():  # derived terms follow the factors of what they are made of
        mb[name] = sum((mb[k] * v for k, v in parts.items()), np.zeros((n, S)))
    return mb, deps


def step_raw(model: ModelSpec, workload: Workload, cluster: ClusterSpec, t: LayoutTable, c,
             mb: np.ndarray, dep: np.ndarray, valid: np.ndarray):
    """Per-step pieces: DP traffic of the most loaded stage (dense over DP, experts over expert-DP;
    a stage's ranks are consecutive in Megatron's tp-cp-ep-dp-pp order), optimizer on the GPU and its
    offloaded share on the host, fixed overhead."""

    dense, expert = stage_params(model, t, mb.shape[2])
    m_dense, m_exp = mtp_stage_params(model, workload, t, mb.shape[2])  # a trained MTP block, on the last stage
    dense, expert = dense + m_dense, expert + m_exp
    dp, edp = (np.maximum(a, 1)[:, None].astype(float) for a in (t.dp, t.edp))
    g = 4.0 if workload.grads_fp32 else 2.0  # gradient bytes on the wire
    ag = 1.0 if workload.fp8_param_gather else 2.0  # --fp8-param-gather all-gathers FP8 parameters
    per_param = np.where(t.dist_opt, g + ag, 2 * g)[:, None]  # grad RS + param AG, or grad all-reduce
    bw = _bw(cluster, (t.world // t.pp)[:, None], c)
    M = t.num_microbatches(workload.global_batch, workload.seq_len).astype(float)
    # FSDP gathers the parameters in forward and again in backward and reduce-scatters the gradients, every
    # micro-batch; layer-by-layer prefetch hides it behind all the micro-batches' compute
    per_param = np.where(t.fsdp[:, None], (2 * ag + g) * M[:, None], per_param)
    comm = per_param * (dense * (dp - 1) / dp + expert * (edp - 1) / edp) / bw
    comm = np.where(valid, comm, 0.0).max(axis=1)
    held = np.where(valid, owned_params(t, dense, expert), 0.0).max(axis=1)
    on_host = t.offload * held
    optimizer = (held - on_host) * c.optimizer_bytes / (cluster.gpu.hbm_gbps * 1e9)
    host_bw = cluster.gpu.host_mem_gbps * 1e9 * c.host_mem_eff / cluster.node_size  # one rank's share
    link_bw = cluster.gpu.host_link_gbps * 1e9 * c.host_link_eff
    # --overlap-cpu-optimizer-d2h-h2d (emitted with offload): the copies of one parameter group overlap the
    # host's Adam step on another, so the slower of the two paces the step
    offload = on_host * np.maximum((c.cpu_adam_bytes + c.offload_copy_bytes) / host_bw, c.offload_copy_bytes / link_bw)
    return RawTime(
        mb=mb, dep=dep, valid=valid,
        microbatches=t.num_microbatches(workload.global_batch, workload.seq_len).astype(float),
        bubble_coef=(t.pp - 1) / t.vpp, dp_comm=comm,
        dp_overlap=np.where(t.fsdp, M, np.where(t.overlap_grad, c.dp_overlap, 0.0)), optimizer=optimizer,
        step_overhead=np.full(len(t), c.step_overhead_s), offload=offload,
        tokens_per_step=float(workload.tokens_per_step),
        world=t.world,
    )


def raw_time(model: ModelSpec, workload: Workload, cluster: ClusterSpec, t: LayoutTable,
             coef, mcoef: MemoryCoefficients = MemoryCoefficients()) -> RawTime:
    """Unscaled terms; `mcoef` supplies the routing imbalance shared with the memory model."""
    mb, deps = microbatch_terms(model, workload, cluster, t, coef, mcoef)
    n, S = mb["compute_dense"].shape
    valid = np.arange(S)[None, :] < t.pp[:, None]
    arr = np.stack([np.where(valid, mb[k], 0.0) for k in MB_TERMS], axis=1)
    dep = np.zeros((n, len(DEPS), S))
    for i, (d, k) in enumerate(DEPS):
        if k in deps[d]:
            dep[:, i, :] = np.where(valid, deps[d][k], 0.0)
    return step_raw(model, workload, cluster, t, coef, arr, dep, valid)
