"""The per-step pieces of the time model, the host's time per micro-batch, and `RawTime` (the fit's container).

`step_pieces` gives what happens once per step or per row rather than per micro-batch and stage: DP traffic of
the most loaded stage (dense over DP x CP, experts over expert-DP; a stage's ranks are consecutive in Megatron's
tp-cp-ep-dp-pp order) and how much compute it can hide behind, the optimizer step on the GPU (with the step's
cast of the weights to a low-precision recipe's format) and its offloaded share on the host, a fixed overhead,
and the overlap shares of `_terms.OVERLAPS`. `host_time` is what the host needs to launch a micro-batch's
kernels on each stage. `raw_time` stacks everything into a `RawTime`: the calibration composes it under many
factor vectors at once (time.step_times); `evaluate` composes the same terms without stacking them
(time._compose_terms). No torch, no ray.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..catalog import ClusterSpec, ModelSpec, Workload
from ..layout import LayoutTable
from ._comm import group_bw
from ._terms import DEPS, MB_TERMS, microbatch_terms, weight_cast_bytes
from .layers import layer_tables, stage_sums
from ._mtp import mtp_stage_params
from .memory import MemoryCoefficients, embedding_params, owned_params, stage_params

__all__ = ["RawTime", "raw_time", "step_pieces", "host_time", "PIECES"]

PIECES = ("microbatches", "bubble_coef", "dp_comm", "dp_overlap", "optimizer", "step_overhead", "offload", "overlap",
          "contention")


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
    host: np.ndarray  # (n, S) host seconds per micro-batch per stage (launches the GPU waits for when slower)
    overlap: np.ndarray  # (n, len(OVERLAPS)) share of each overlappable term put beside compute (0: none)
    contention: np.ndarray  # (n, len(OVERLAPS)) compute lost per second hidden (SMs the overlapped kernels take)
    tokens_per_step: float
    world: int
    lora: bool = False  # Workload.lora: MFU counts forward + data gradient (flops.mfu_of)

    FIELDS = ("mb", "dep", "valid", "host") + PIECES

    def pad(self, S: int) -> "RawTime":
        extra = S - self.mb.shape[2]
        if extra <= 0:
            return self
        kw = {f: getattr(self, f) for f in self.FIELDS}
        kw["mb"] = np.pad(self.mb, ((0, 0), (0, 0), (0, extra)))
        kw["dep"] = np.pad(self.dep, ((0, 0), (0, 0), (0, extra)))
        kw["valid"] = np.pad(self.valid, ((0, 0), (0, extra)))
        kw["host"] = np.pad(self.host, ((0, 0), (0, extra)))
        return RawTime(**kw, tokens_per_step=self.tokens_per_step, world=self.world, lora=self.lora)


def host_time(model: ModelSpec, t: LayoutTable, c, S: int, frac) -> np.ndarray:
    """Host seconds per micro-batch per stage (n, S): launches of every layer (forward + backward; a recomputed
    forward once more), less the scopes CUDA graphs replay (router / attn / the whole step)."""
    lt = layer_tables(model)
    L_stage = stage_sums(np.ones(lt.n_layers), t.pp, t.vpp, S, t.split)
    moe_stage = stage_sums(lt.is_moe.astype(float), t.pp, t.vpp, S, t.split) if lt.is_moe.any() else 0.0
    graphs = t.cuda_graphs[:, None]
    dense_share = np.select([graphs == 2, graphs == 3], [1.0 - c.host_graph_attn, 0.0], 1.0)
    moe_share = np.select([graphs == 1, graphs == 2, graphs == 3], [1.0 - c.host_graph_router] * 2 + [0.0], 1.0)
    per_pass = L_stage * (c.host_layer_s * dense_share * (1.0 + frac / 3))
    return per_pass + moe_stage * (c.host_moe_s * moe_share * (1.0 + frac / 3)) if lt.is_moe.any() else per_pass


def step_pieces(model: ModelSpec, workload: Workload, cluster: ClusterSpec, t: LayoutTable, c, S: int,
                params: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Per-row pieces (see the module docstring); `params`: (dense, expert) parameters per stage when known."""
    if params is None:  # the memory model's, else counted here: the stages' and a trained MTP block's
        dense, expert = stage_params(model, t, S)
        m_dense, m_exp = mtp_stage_params(model, workload, t, S)
        dense, expert = dense + m_dense, expert + m_exp
    else:
        dense, expert = params
    valid = np.arange(S)[None, :] < t.pp[:, None]
    dp, edp = (np.maximum(a, 1)[:, None].astype(float) for a in (t.dp * t.cp, t.edp))  # grads reduce over DP x CP
    g = 4.0 if workload.grads_fp32 else 2.0  # gradient bytes on the wire
    # --fp8-param-gather all-gathers FP8 parameters, except MXFP8's: their row- and column-wise block-scaled
    # copies cannot be gathered as one flat shard, so Megatron gathers them in BF16 into the gradient buffer and
    # casts after the gather (distributed/param_and_grad_buffer.py: with the distributed optimizer and MXFP8
    # parameters, param_data is a BF16 view of the grad buffer; core_v0.15 onward)
    mx = workload.precision == "mxfp8"
    ag = 1.0 if workload.fp8_param_gather and not mx else 2.0
    per_param = np.where(t.dist_opt, g + ag, 2 * g)  # grad RS + param AG, or grad all-reduce
    # dense parameters reduce over DP x CP (ranks TP apart), experts over expert-DP (ranks EP x ETP apart)
    bw_dense = group_bw(cluster, t.dp * t.cp, t.tp, c)[:, None]
    bw_exp = group_bw(cluster, t.edp, t.ep * t.etp, c)[:, None]
    M = t.num_microbatches(workload.global_batch, workload.seq_len).astype(float)
    # FSDP gathers the parameters in forward and again in backward and reduce-scatters the gradients, every
    # micro-batch; layer-by-layer prefetch hides it behind all the micro-batches' compute. With PP a stage keeps
    # its layers gathered across its micro-batches (torch pipelining stops resharding between them,
    # torchtitan's default reshard_after_forward = not pp_enabled): once per step. Llama 3's FSDP keeps the parameters
    # gathered but shards the gradients: each micro-batch's are reduce-scattered as they come (cost/_state.py)
    zero2 = workload.framework == "llama3"
    per_param = np.where(t.fsdp, np.where(t.pp > 1, ag + g * (M if zero2 else 1.0), (2 * ag + g) * M), per_param)
    if workload.lora:  # frozen base weights: no gradients to reduce, no optimizer; FSDP still gathers them
        per_param = np.where(t.fsdp, np.where(t.pp > 1, ag, 2 * ag * M), 0.0)
    comm = dense * ((dp - 1) / dp / bw_dense)  # (n, 1) factors first: one pass over each (n, S) array
    comm += expert * ((edp - 1) / edp / bw_exp)
    comm = np.where(valid, comm, 0.0).max(axis=1)
    comm = comm * per_param
    held = np.where(valid, owned_params(t, dense, expert), 0.0).max(axis=1)
    # once per step every rank puts its stage's linear weights in the recipe's format on the compute stream
    # (`weight_cast_bytes`: a full cast for MXFP8 after its BF16 gather and for any recipe without --fp8-param-gather,
    # the column-wise copy of gathered FP8 weights where the GEMMs need one); the optimizer's own cast of its
    # 1 / DP shard is in `optimizer_bytes`
    cast = 0.0
    per_weight = weight_cast_bytes(workload, cluster.gpu, c)
    if per_weight:
        linear = np.where(valid, dense + expert - embedding_params(model, t, S), 0.0).max(axis=1)
        cast = linear * per_weight / (cluster.gpu.hbm_gbps * 1e9)
    on_host = t.offload * held * (0.0 if workload.lora else 1.0)  # LoRA: no base optimizer state to offload
    host_bw = cluster.gpu.host_mem_gbps * 1e9 * c.host_mem_eff / cluster.node_size  # one rank's share
    link_bw = cluster.gpu.host_link_gbps * 1e9 * c.host_link_eff
    # --overlap-cpu-optimizer-d2h-h2d (emitted with offload): the copies of one parameter group overlap the
    # host's Adam step on another, so the slower of the two paces the step
    offload = on_host * np.maximum((c.cpu_adam_bytes + c.offload_copy_bytes) / host_bw, c.offload_copy_bytes / link_bw)
    # 1F1B A2A overlap pairs one micro-batch's forward with another's backward: all but one micro-batch's
    # all-to-all can sit beside compute
    overlap = np.stack([np.where(t.ep_overlap, (M - 1) / M, 0.0), np.where(t.tp_overlap, 1.0, 0.0),
                        np.where((t.act_offload > 0) | (t.off_modules > 0), 1.0, 0.0)], axis=1)
    contention = np.broadcast_to(np.array([c.ep_overlap_sm, c.tp_overlap_sm, 0.0]), overlap.shape)
    return dict(microbatches=M, bubble_coef=(t.pp - 1) / t.vpp, dp_comm=comm,
                dp_overlap=np.where(t.fsdp & ((t.pp == 1) | zero2), M, np.where(t.overlap_grad | t.fsdp, c.dp_overlap, 0.0)),
                optimizer=(0.0 if workload.lora else 1.0) * (held - on_host) * c.optimizer_bytes
                / (cluster.gpu.hbm_gbps * 1e9) + cast,
                step_overhead=np.full(len(t), c.step_overhead_s), offload=offload, overlap=overlap,
                contention=contention)


def raw_time(model: ModelSpec, workload: Workload, cluster: ClusterSpec, t: LayoutTable,
             coef, mcoef: MemoryCoefficients = MemoryCoefficients()) -> RawTime:
    """Unscaled terms, stacked; `mcoef` supplies the routing imbalance shared with the memory model."""
    mb, deps, frac = microbatch_terms(model, workload, cluster, t, coef, mcoef)
    n, S = len(t), int(t.pp.max())
    valid = np.arange(S)[None, :] < t.pp[:, None]
    arr = np.stack([np.where(valid, mb[k], 0.0) if k in mb else np.zeros((n, S)) for k in MB_TERMS], axis=1)
    dep = np.zeros((n, len(DEPS), S))
    for i, (d, k) in enumerate(DEPS):
        if k in deps[d]:
            dep[:, i, :] = np.where(valid, deps[d][k], 0.0)
    host = np.where(valid, host_time(model, t, coef, S, frac), 0.0)
    return RawTime(mb=arr, dep=dep, valid=valid, host=host, **step_pieces(model, workload, cluster, t, coef, S),
                   tokens_per_step=float(workload.tokens_per_step), world=t.world, lora=workload.lora)
