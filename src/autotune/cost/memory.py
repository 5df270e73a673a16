"""The memory model: per-GPU peak bytes for every pipeline stage of many layouts at once.

Terms (each an array of shape (n_layouts, n_stages), bytes per GPU):
  weights      bf16 parameters (dense / TP, experts / (EP x ETP), embedding on the first stage, output
               layer on the last; Megatron pads the vocabulary to a multiple of 128 x TP)
  grads        main gradients: fp32 with --accumulate-allreduce-grads-in-fp32 (the seed), else bf16
  optimizer    fp32 master copy + two Adam moments: 12 B/param, sharded over DP x CP (dense) and expert-DP
               (experts) by the distributed optimizer, less the host-offloaded fraction. Other frameworks
               (Workload.framework: torch FSDP2 as torchtitan and NeMo AutoModel run it, Llama 3's FSDP) keep
               other shards and gathered copies: _state.py
  activations  what the in-flight micro-batches keep for backward: 1F1B keeps PP - stage micro-batches,
               interleaved keeps 2(PP - stage - 1) + (VPP - 1) PP + 1 model chunks; full recompute keeps only
               each recompute group's input; selective recompute drops the named parts
  recompute    the transient working set while one recompute group is re-run in backward
  logits       output layer and loss on the last stage (BF16 logits, the gradient written over them, when the loss
               is fused on TE; an fp32 softmax and its gradient beside them unfused)
  dispatcher   token-dispatch buffers: all-to-all receive copies, all-gather of the EP x TP group, or DeepEP's
               preallocated NVLink/RDMA buffers for flex (DeepEP: a fixed size; HybridEP: sized by the group's worst
               case, see hybridep_buffer); EP overlap keeps two micro-batches' buffers at once (not HybridEP's one)
  overhead     CUDA context, cuBLAS workspaces, NCCL communicators; CUDA graphs' private memory pool (an
               assumption: `cuda_graph_pool`, more for a whole-step graph). The caching allocator adds nothing on
               top: every run priced grows expandable segments (MemoryCoefficients.fragmentation)
Routed experts' activations and buffers scale with the hottest rank's load (_comm.routing_load); under the paged stash
(a dropless MoE model with full-iteration CUDA graphs, _comm.paged_stash) the activations fill a page pool of
_comm.PAGED_STASH_POOL x their even share whatever the load (pages beyond it spill to host). Activation offload
(--cpu-offloading-num-layers N) keeps the offloaded layers' activations on the host, one in flight on the GPU.
Host (per node, only with optimizer offload): Megatron's HybridDeviceOptimizer keeps the offloaded share's fp32
master copy, both Adam moments and a pinned fp32 gradient buffer in host memory (16 B/param) per GPU of the node.

Sources: Korthikanti et al. 2022 (activation accounting), megatron/training/theoretical_memory_usage.py
(weights/optimizer, in-flight micro-batches), extended for MoE, hybrid attention and full recompute.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..catalog import ClusterSpec, ModelSpec, Workload
from ..catalog.model import SLIDING
from ..layout import SELECTIVE_MODULES, LayoutTable
from ._groups import per_row_view, pp_groups, scatter_rows
from ._mtp import mtp_stage_activations, mtp_stage_params
from ._sac import op_sac_kept
from ._offload import offloaded_per_token
from ._quant import lowp_copies
from ._state import state_terms
from ._comm import PAGED_STASH_POOL, fused_grouped_mlp, paged_stash, routing_load
from .layers import (KIND, PART_CLASS, PARTS, fold_activations, layer_tables, stage_sums, stage_sums_by_pair,
                     vocab_per_row)

__all__ = ["MemoryResult", "estimate_memory", "TERMS", "MemoryCoefficients"]

TERMS = ("weights", "grads", "optimizer", "activations", "recompute", "logits", "dispatcher", "overhead")
GiB = 1024**3

# selective-recompute module -> activation parts it frees
SELECTIVE_DROPS = {
    # with the flash kernel the recompute checkpoint keeps its inputs (q, k, v), which are all the kernel
    # saves besides the softmax statistics: recomputing core attention frees almost nothing (it pays off
    # only for the unfused kernel's s x s scores, which autotune does not model)
    "core_attn": (),
    "layernorm": ("ln",),
    "moe_act": ("moe_act", "moe_clamp"),
    "mlp": ("mlp",),
    # the whole MoELayer forward runs under one checkpoint (moe/moe_layer.py, moe_layer_recompute): routing, the
    # routed experts and the shared experts keep nothing but the layer's input
    "moe": ("router", "moe_perm", "moe_fc1", "moe_act", "moe_clamp", "shared"),
    "shared_experts": ("shared",),
    # MLA's up projections and RoPE run under a CheckpointWithoutOutput whose outputs, the core attention's q, k, v,
    # are discarded once attention has run and recomputed before its backward (megatron/core/transformer/
    # multi_latent_attention.py, recompute_up_proj: discard_output_and_register_recompute(core_attn_out)), and so
    # does what the up projections' fused norms save (the normalized latents, counted with q, k, v); the latents it
    # starts from and the attention output (linear_proj's input) stay
    "mla_up_proj": ("attn_core",),
    "mhc": ("hc",),
}


_MLA_BIT = 1 << SELECTIVE_MODULES.index("mla_up_proj")


def saved_parts(model: ModelSpec, workload: Workload, t: LayoutTable) -> np.ndarray:
    """(n, P) whether each row saves each activation part (PARTS): all but what its selective recompute frees
    (SELECTIVE_DROPS) and a clamped GLU's second copy where TE's fused grouped MLP clamps inside its op."""
    keep = np.ones((len(t), len(PARTS)), dtype=bool)
    sel = t.rc_gran == 1
    mods = selected_modules(model, t)
    for b, mod in enumerate(SELECTIVE_MODULES):
        on = sel & ((mods >> b) & 1).astype(bool)
        for part in SELECTIVE_DROPS[mod]:
            keep[on, PARTS.index(part)] = False
    if model.is_moe and model.moe.activation_clamp:
        keep[fused_grouped_mlp(model, workload, t), PARTS.index("moe_clamp")] = False
    return keep


def selected_modules(model: ModelSpec, t: LayoutTable) -> np.ndarray:
    """(n,) bitmask over SELECTIVE_MODULES of the selective-recompute modules that act on `model`: Megatron's default
    (core_attn) when none is named; mla_up_proj only where attention is MLA or DeepSeek-V4's, built on it (the MLA
    modules alone read it)."""
    mods = np.where((t.rc_gran == 1) & (t.rc_modules == 0), 1, t.rc_modules)
    return mods if model.latent_attention else mods & ~_MLA_BIT


# FP8: share of each activation part's BF16 bytes still saved. TE saves a linear's quantised input (1 B
# per element, +1/32 scales for MXFP8) for the weight gradient: the linear inputs halve, the MLP parts
# (fc1 output kept in BF16 for the activation's backward, activation output saved in FP8) drop a quarter
_FP8_SAVED = {"attn_in": 0.5, "mlp_in": 0.5, "moe_perm": 0.5, "moe_act": 0.5, "mlp": 0.75, "shared": 0.75}
FP8_SAVED = np.array([_FP8_SAVED.get(p, 1.0) for p in PARTS])


@dataclass(frozen=True)
class MemoryCoefficients:
    """Fixed costs that no formula gives; defaults from published measurements on Hopper."""

    cuda_context: float = 0.8 * GiB  # context + cuBLAS/cuDNN workspaces
    nccl_per_group: float = 0.25 * GiB  # buffers per communicator kind in use
    # share of activation bytes the caching allocator reserves beyond what it hands out. Every run this model prices
    # sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the recipes and trials autotune writes (launch.SEED_ENV),
    # the seed's, Megatron-Bridge's perf runs (scripts/performance/utils/executors.py, v0.4.0 on; the v0.6.0 perf
    # recipes' env_vars) and torchtitan's run_train.sh. Expandable segments grow one mapped range page by page, so
    # what is reserved follows what is allocated (PyTorch PR 96995). The recipes NVIDIA runs bound what is left: Llama
    # 3.1 405B's BF16 recipe on 256 GB200 (TP4 PP16 VPP8 DP4, Megatron-Bridge v0.3.0 to v0.6.0) fits only at a share
    # under 0.3% (bench/bridge_recipes_fit.py). The 8% this was before (the default allocator's rounding into fixed
    # segments) put that recipe and 15 others NVIDIA ships out of memory.
    fragmentation: float = 0.0
    # hottest of 8 EP ranks' token load at 32 experts per rank, load-balancing loss off / on (_comm.routing_load)
    imbalance_off: float = 1.3
    imbalance_on: float = 1.1
    deepep_buffer: float = 2.0 * GiB  # DeepEP NVLink (+ RDMA) buffers for the flex dispatcher
    grad_bytes: float = 4.0  # fp32 main gradients
    optim_bytes: float = 12.0  # fp32 master + Adam m, v
    host_offload_bytes: float = 16.0  # per offloaded parameter in host memory: master, m, v, pinned grad
    fsdp_layers_in_flight: float = 2.0  # FSDP: unsharded layers held at once (the running one, the prefetched)
    cuda_graph_pool: float = 1.0 * GiB  # partial graphs' private pool (static inputs/outputs, workspaces); x2 full


@dataclass
class MemoryResult:
    terms: dict[str, np.ndarray]  # name -> (n, S)
    n_stages: np.ndarray  # (n,) = PP
    capacity_bytes: float
    host_bytes: np.ndarray  # (n,) host memory per node for the offloaded optimizer
    host_capacity_bytes: float
    params: tuple | None = None  # (dense, expert) parameters per GPU per stage (n, S): the time model reuses them

    @cached_property
    def total(self) -> np.ndarray:
        """Bytes per stage (n, S), zero beyond each row's PP (the terms themselves are not masked there)."""
        shape = next(iter(self.terms.values())).shape
        tot = np.zeros(shape)
        for v in self.terms.values():  # in place: a fresh 10^5 x 16 array per term costs as much as the adds
            tot += v
        tot[np.arange(shape[1])[None, :] >= self.n_stages[:, None]] = 0.0
        return tot

    @property
    def peak(self) -> np.ndarray:
        return self.total.max(axis=1)

    @property
    def peak_stage(self) -> np.ndarray:
        return self.total.argmax(axis=1)

    @property
    def host_fits(self) -> np.ndarray:
        return self.host_bytes <= self.host_capacity_bytes

    @property
    def fits(self) -> np.ndarray:
        return (self.peak <= self.capacity_bytes) & self.host_fits

    def oom_reason(self, i: int) -> str | None:
        """Why layout i does not fit (GPU first, then host), or None when it does."""
        if self.peak[i] > self.capacity_bytes:
            return f"predicted OOM: peak {self.peak[i] / GiB:.1f} GiB of {self.capacity_bytes / GiB:.1f}"
        if not self.host_fits[i]:
            return (f"predicted host OOM: the offloaded optimizer needs {self.host_bytes[i] / GiB:,.0f} GiB of host "
                    f"memory per node, {self.host_capacity_bytes / GiB:,.0f} GiB there; offload less")
        return None

    def take(self, idx) -> "MemoryResult":
        """The rows `idx` (an index array), like LayoutTable.take; a term that is one value per row (broadcast over
        the stages) stays that way."""
        idx = np.asarray(idx)
        return MemoryResult({k: take_rows(v, idx) for k, v in self.terms.items()}, self.n_stages[idx],
                            self.capacity_bytes, self.host_bytes[idx], self.host_capacity_bytes,
                            None if self.params is None else tuple(take_rows(p, idx) for p in self.params))

    @classmethod
    def concat(cls, parts: list["MemoryResult"], stages: int | None = None) -> "MemoryResult":
        """The rows of `parts` in order, as one result with `stages` stage columns (default: the widest part's),
        each part's columns padded with zeros or cut to that width: nothing beyond a row's PP is read (`total`
        masks it, the time model sums the stages below PP), so `stages` = the rows' largest PP loses nothing."""
        if not parts:
            raise ValueError("MemoryResult.concat needs at least one part")
        S = stages if stages is not None else max(next(iter(p.terms.values())).shape[1] for p in parts)
        ends = np.cumsum([len(p.n_stages) for p in parts])
        rows = [np.arange(e - len(p.n_stages), e) for p, e in zip(parts, ends)]  # each part's rows, in order
        return cls.scattered(parts, rows, int(ends[-1]), S)

    @classmethod
    def scattered(cls, parts: list["MemoryResult"], groups: list[np.ndarray], n: int, S: int) -> "MemoryResult":
        """One result over n rows from each part's, part i's rows at `groups[i]` (_groups.scatter_rows: columns
        padded with zeros or cut to S; per-row terms stay one value per row)."""
        first = parts[0]
        params = None
        if all(p.params is not None for p in parts):
            params = tuple(scatter_rows([p.params[j] for p in parts], groups, n, S) for j in range(len(first.params)))
        return cls({k: scatter_rows([p.terms[k] for p in parts], groups, n, S) for k in first.terms},
                   scatter_rows([p.n_stages for p in parts], groups, n), first.capacity_bytes,
                   scatter_rows([p.host_bytes for p in parts], groups, n), first.host_capacity_bytes, params)

    def stage_breakdown(self, i: int) -> list[dict[str, float]]:
        out = []
        for s in range(int(self.n_stages[i])):
            row = {k: float(v[i, s]) for k, v in self.terms.items()}
            row["total"] = float(sum(row.values()))
            out.append(row)
        return out


def take_rows(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Rows `idx` of a (n, S) term, a per-row term kept as a broadcast view."""
    if per_row_view(a):
        return np.broadcast_to(a[idx, :1], (len(idx), a.shape[1]))
    return a[idx]


def stage_params(model: ModelSpec, t: LayoutTable, S: int) -> tuple[np.ndarray, np.ndarray]:
    """Parameters per GPU on each pipeline stage (n, S): (dense, expert). Exact against megatron-core's
    GPTModel (tests/parity): dense / TP (replicated tensors whole), experts / (EP x ETP), the experts'
    row-parallel biases / EP, the padded embedding on the first stage, the output layer (or the tied
    copy) and the final norm on the last."""
    lt = layer_tables(model)
    h = model.hidden_size
    tp = t.tp[:, None].astype(float)
    last = np.arange(S)[None, :] == (t.pp - 1)[:, None]
    dense = (stage_sums(lt.params_tp, t.pp, t.vpp, S, t.split) / tp
             + stage_sums(lt.params_rep, t.pp, t.vpp, S, t.split))
    expert = stage_sums(lt.params_exp, t.pp, t.vpp, S, t.split) / (t.ep * t.etp)[:, None].astype(float)
    if lt.params_exp_ep.any():  # the experts' fc2 biases: whole on every ETP rank
        expert = expert + stage_sums(lt.params_exp_ep, t.pp, t.vpp, S, t.split) / t.ep[:, None].astype(float)
    # the embedding (first stage), the output layer or the tied copy (last stage), the final norm (last stage)
    return dense + embedding_params(model, t, S) + np.where(last, h, 0), expert


def embedding_params(model: ModelSpec, t: LayoutTable, S: int) -> np.ndarray:
    """Embedding and output-layer parameters per GPU on each stage (n, S), as `stage_params` counts them."""
    tp = t.tp[:, None].astype(float)
    last = np.arange(S)[None, :] == (t.pp - 1)[:, None]
    first = np.broadcast_to(np.arange(S)[None, :] == 0, (len(t), S))
    vocab = vocab_per_row(model, t.tp)[:, None].astype(float) * model.hidden_size / tp
    out = np.where(first, vocab, 0.0)
    if not model.tie_embeddings:
        return out + np.where(last, vocab, 0.0)
    return out + np.where(last & ~first, vocab, 0.0) if S > 1 else out


def hybridep_buffer(model: ModelSpec, cluster: ClusterSpec, t: LayoutTable, tokens: np.ndarray) -> np.ndarray:
    """Bytes of HybridEP's buffers per GPU (n, 1) for `tokens` tokens per rank per micro-batch. megatron-core builds
    one HybridEPBuffer (fused_a2a.init_hybrid_ep_buffer: max_num_of_tokens_per_rank = the micro-batch's tokens, BF16
    tokens) shared by every layer and micro-batch; DeepEP's hybrid-ep branch (csrc/hybrid_ep/buffer/intranode.cu,
    internode_doca.cu, shared dispatch/combine buffer by default) sizes its NVLink buffers for the worst case of every
    token of the R-rank group landing on one rank: R x tokens x (2 H bytes + 4 bytes per expert of the NVLink domain +
    4 H / 128 scale bytes), and, with D > 1 NVLink domains, RDMA staging of 2 H bytes per token for the input and
    (D - 1) x 3 copies (dispatch group, combine group and reduction)."""
    R = (t.ep * t.etp).astype(float)[:, None]
    D = np.maximum(np.ceil(R / cluster.nvlink_size), 1.0)
    N = R / D  # ranks per NVLink domain
    h = model.hidden_size
    experts_local = model.moe.num_experts / np.maximum(t.ep, 1)[:, None]
    nvl = R * tokens * (2.0 * h + 4.0 * experts_local * N + 4.0 * h / 128)
    rdma = np.where(D > 1, tokens * 2.0 * h * (1 + 3 * (D - 1)), 0.0)
    return nvl + rdma


def owned_params(t: LayoutTable, dense: np.ndarray, expert: np.ndarray) -> np.ndarray:
    """Parameters whose optimizer state a rank holds (n, S): the distributed optimizer shards dense
    parameters over DP x CP (megatron-core's intra_dp_cp group: CP ranks hold the same parameters) and expert
    parameters over expert-DP; without it every rank holds all of its own."""
    dp, edp = (np.maximum(a, 1)[:, None].astype(float) for a in (t.dp * t.cp, t.edp))
    return np.where(t.dist_opt[:, None], dense / dp + expert / edp, dense + expert)


def unfused_scores(model: ModelSpec, workload: Workload, cluster: ClusterSpec, t: LayoutTable, S: int,
                   rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, S) bytes one micro-batch's attention layers of each stage keep for backward when attention is not
    fused (no Transformer Engine: megatron.core's DotProductAttention): the softmax's output, which its backward
    needs (fp32 with --attention-softmax-in-fp32), and the probabilities cast back for the AV product (bf16; on
    a CPU the runner works in fp32, where the two are one tensor), [rows, heads / TP, s / CP, window]; and (n, 1)
    the bytes of the widest layer's scores."""
    lt = layer_tables(model)
    if not lt.is_attention.any():
        return np.zeros((len(t), S)), np.zeros((len(t), 1))
    s = workload.seq_len
    window = np.where(lt.kind == KIND[SLIDING], min(s, model.sliding_window or s), s)
    per_token = np.where(lt.is_attention, window, 0.0).astype(float)  # key positions per query, per layer
    stage = stage_sums(per_token, t.pp, t.vpp, S, t.split)  # (n, S)
    B = (6.0 if cluster.gpu.is_accelerator else 4.0)
    per = rows[:, None] * (s / t.cp[:, None]) * (model.num_heads / t.tp[:, None]) * B
    return per * stage, per * float(per_token.max())  # and the widest layer's, the one working set


def _inflight(t: LayoutTable, M: np.ndarray, S: int) -> np.ndarray:
    """Micro-batch-equivalents of activations each stage keeps (n, S)."""
    ahead = t.pp[:, None] - np.arange(S)[None, :]  # stages from this one to the last, inclusive
    one_f_one_b = np.minimum(ahead, M[:, None])
    if not (t.vpp > 1).any():
        return np.maximum(one_f_one_b, 0)
    vpp = t.vpp[:, None]
    chunks = 2 * ahead + ((vpp - 1) * t.pp[:, None] - 1)  # 2 (pp - s - 1) + (vpp - 1) pp + 1
    interleaved = np.minimum(chunks, (M * t.vpp)[:, None]) / vpp  # in units of a whole stage's layers
    return np.maximum(np.where(vpp > 1, interleaved, one_f_one_b), 0)


def estimate_memory(
    model: ModelSpec, workload: Workload, cluster: ClusterSpec, t: LayoutTable,
    coef: MemoryCoefficients = MemoryCoefficients(),
) -> MemoryResult:
    """Memory per stage of every layout in `t`. A large table is priced in groups of equal PP (_groups.py: the
    same numbers, without (n, largest PP) arrays for shallow rows)."""
    groups = pp_groups(t.pp)
    if groups is None:
        return _estimate_memory(model, workload, cluster, t, coef)
    parts = [_estimate_memory(model, workload, cluster, t.take(g), coef) for g in groups]
    return MemoryResult.scattered(parts, groups, len(t), int(t.pp.max()))


def _estimate_memory(
    model: ModelSpec, workload: Workload, cluster: ClusterSpec, t: LayoutTable, coef: MemoryCoefficients,
) -> MemoryResult:
    lt = layer_tables(model)
    n, S = len(t), int(t.pp.max())
    h = model.hidden_size
    last = (np.arange(S)[None, :] == (t.pp - 1)[:, None])
    tp, cp, ep, etp = (a[:, None].astype(float) for a in (t.tp, t.cp, t.ep, t.etp))

    # --- parameters --------------------------------------------------------------------------------
    p_dense, p_exp = stage_params(model, t, S)
    m_dense, m_exp = mtp_stage_params(model, workload, t, S)  # a trained MTP block, on the last stage
    p_dense, p_exp = p_dense + m_dense, p_exp + m_exp
    params = p_dense + p_exp
    owned = owned_params(t, p_dense, p_exp)
    keep = (1.0 - t.offload)[:, None]
    w_bytes, g_bytes, o_bytes = state_terms(model, workload, t, S, p_dense, p_exp, owned, keep,
                                            embedding_params(model, t, S), coef, lowp_copies(workload, cluster.gpu))
    terms = {"weights": w_bytes, "grads": g_bytes, "optimizer": o_bytes}

    # --- activations per token of one micro-batch ------------------------------------------------------
    rows = t.rows_per_mb(workload.seq_len)
    tokens = (rows * workload.seq_len)[:, None].astype(float)  # tokens of one micro-batch (whole rows)
    sp = t.sp_eff[:, None]
    tok = 1.0 / (cp * np.where(sp, tp, 1.0))
    imb = routing_load(model, workload, t, coef)[:, None]
    # the paged stash keeps the routed experts' saved activations in a pool sized PAGED_STASH_POOL x their even share
    imb = np.where(paged_stash(model, t)[:, None], PAGED_STASH_POOL, imb)
    div = {"seq": tok, "tp": 1.0 / (cp * tp), "rep": tok, "exph": tok * etp * imb, "expf": tok * imb}
    # per (PP, VPP) pair, never per row x part: the (n, S, P) table is the slow part at 10^5 rows
    act = lt.act * FP8_SAVED[None, :] if workload.quantized else lt.act
    per_pair, pair_of = stage_sums_by_pair(act, t.pp, t.vpp, S, t.split)  # (pairs, S, P)
    keep_part = saved_parts(model, workload, t)
    sel = t.rc_gran == 1
    full_layer = fold_activations(per_pair, pair_of, div)  # per token, everything saved (n, S)
    if model.is_moe and model.moe.activation_clamp:  # TE's fused grouped MLP clamps inside its op: no second copy
        fused = fused_grouped_mlp(model, workload, t)
        full_layer = full_layer - np.where(fused[:, None], per_pair[pair_of, :, PARTS.index("moe_clamp")] * div["expf"],
                                           0.0)
    kept_layer = full_layer
    if sel.any():  # only selective rows drop parts
        kept_layer = full_layer.copy()
        rs = np.flatnonzero(sel)
        kept = np.zeros((len(rs), S))
        for j, part in enumerate(PARTS):
            d = div[PART_CLASS[part]]
            kept += per_pair[pair_of[rs], :, j] * (d[rs] if np.ndim(d) else d) * keep_part[rs, j][:, None]
        kept_layer[rs] = kept
        if workload.framework == "torchtitan":  # its "selective" is per-op SAC (_sac.py), not Megatron's modules
            kept_layer = np.where(sel[:, None], op_sac_kept(model, t, S, div), kept_layer)
    L_stage = np.maximum(1.0, stage_sums(np.ones(lt.n_layers), t.pp, t.vpp, S, t.split))  # layers per stage
    seq_in = 2.0 * h * tok  # a recompute group's checkpointed input
    full = (t.rc_gran == 2)[:, None]
    block = (t.rc_method == 1)[:, None]
    N = np.maximum(1, t.rc_layers)[:, None].astype(float)
    avg_layer = full_layer / L_stage if full.any() or t.ep_overlap.any() else None
    stored, working = kept_layer, np.where(sel[:, None], (full_layer - kept_layer) / L_stage, 0.0) if sel.any() else 0.0
    if full.any():  # full recompute keeps each group's input; a block keeps its N layers' inputs, the rest whole
        chunk_layers = L_stage / t.vpp[:, None]
        groups = np.ceil(chunk_layers / N) * t.vpp[:, None]
        n_rc = np.minimum(N, chunk_layers) * t.vpp[:, None]  # block: layers recomputed per stage
        stored_full = np.where(block, n_rc * seq_in + (L_stage - n_rc) * avg_layer, groups * seq_in)
        stored = np.where(full, stored_full, kept_layer)
        working = np.where(full, np.where(block, 1.0, np.minimum(N, chunk_layers)) * avg_layer, working)
    if (t.act_offload > 0).any():  # offloaded layers leave their saved activations on the host
        off = np.minimum(t.act_offload[:, None], L_stage)
        stored = stored * (L_stage - off + np.minimum(off, 1.0)) / L_stage
    if (t.off_modules > 0).any():  # fine-grained offloading: the stage keeps the offloaded inputs of one layer only
        off = offloaded_per_token(model, t, S, div, FP8_SAVED if workload.quantized else None, dropped=~keep_part)
        stored = stored - off * (1.0 - 1.0 / L_stage)
    stored = stored + mtp_stage_activations(model, workload, t, S, div)  # a trained MTP block, last stage
    M = t.num_microbatches(workload.global_batch, workload.seq_len)
    inflight = _inflight(t, M, S)
    terms["activations"] = stored * (tokens * (1 + coef.fragmentation)) * inflight
    if t.ep_overlap.any():  # EP overlap runs a layer of the next micro-batch's forward inside this one's backward
        terms["activations"] = terms["activations"] + np.where(t.ep_overlap[:, None], avg_layer * tokens, 0.0)
    terms["recompute"] = working * tokens
    if not cluster.has_te:  # without Transformer Engine Megatron's local attention materialises the s x s scores
        scores, layer = unfused_scores(model, workload, cluster, t, S, rows)
        terms["activations"] = terms["activations"] + np.where(full, 0.0, scores * inflight)
        # working set of the layer being run: its raw and scaled scores beside the saved softmax in forward, their
        # gradients in backward (a recomputed layer's saved ones too)
        terms["recompute"] = terms["recompute"] + layer * np.where(full, 3.0, 2.0)

    # --- output layer and loss on the last stage ----------------------------------------------------
    vocab_local = vocab_per_row(model, t.tp)[:, None] / tp
    # fused (--cross-entropy-fusion-impl te, what autotune emits and Megatron-Bridge's perf recipes run): TE's Triton
    # loss keeps the BF16 logits it is given and writes their gradient over them, with three fp32 values per row
    # (transformer_engine/pytorch/triton/cross_entropy.py: cross_entropy_backward_kernel stores into X_ptr); unfused:
    # the logits, their fp32 copy, the softmax and its gradient
    logit_bytes = np.where(t.ce_fusion[:, None], 2.0, 2.0 + 4.0 + 4.0 + 4.0)
    terms["logits"] = np.where(last, tokens / cp * vocab_local * logit_bytes, 0.0)

    # --- dispatcher buffers ---------------------------------------------------------------------------
    if model.is_moe:
        k = model.moe.top_k
        a2a = tokens * tok * k * 2.0 * h * 2 * imb  # send + receive copies of the routed tokens
        ag = tokens / cp * ep * 2.0 * h  # all-gather of the TP x EP group's tokens (bf16)
        inter_node = (t.ep * t.etp * t.tp > cluster.nvlink_size)[:, None]
        deepep = np.broadcast_to(coef.deepep_buffer * np.where(inter_node, 1.5, 1.0), a2a.shape)
        buf = np.select([t.dispatcher[:, None] == 0, t.dispatcher[:, None] == 1], [a2a, ag], deepep)
        buf = buf * np.where(t.ep_overlap, 2.0, 1.0)[:, None]  # the overlapped micro-batch's buffers too
        if (t.dispatcher == 3).any():
            buf = np.where(t.dispatcher[:, None] == 3, hybridep_buffer(model, cluster, t, tokens * tok), buf)
        terms["dispatcher"] = np.where((ep * etp * tp) > 1, buf, 0.0) * bool(lt.is_moe.any())
    else:
        terms["dispatcher"] = 0.0

    groups_in_use = 2 + (t.tp > 1) + (t.pp > 1) + (t.cp > 1) + (t.ep > 1) + (t.etp > 1) + (t.edp > 1)
    graphs = coef.cuda_graph_pool * np.select([t.cuda_graphs == 0, t.cuda_graphs == 3], [0.0, 2.0], 1.0)
    terms["overhead"] = (coef.cuda_context + coef.nccl_per_group * groups_in_use + graphs)[:, None]
    mask = np.arange(S)[None, :] < t.pp[:, None]
    terms = {k: np.broadcast_to(v, (n, S)) for k, v in terms.items()}  # views: every term (n, S), not masked
    held = np.where(mask, owned, 0.0).max(axis=1)  # the optimizer's share on the fullest stage
    host = coef.host_offload_bytes * t.offload * held * cluster.node_size * (0.0 if workload.lora else 1.0)
    # a CPU "GPU" is the host: its ranks share its memory
    share = 1 if cluster.gpu.is_accelerator else cluster.node_size
    return MemoryResult(terms=terms, n_stages=t.pp.copy(), capacity_bytes=float(cluster.gpu.memory_bytes) / share,
                        host_bytes=host, host_capacity_bytes=cluster.gpu.host_mem_gib * GiB, params=(p_dense, p_exp))
