"""The throughput model: step time for many layouts at once, as a named breakdown.

Per micro-batch and pipeline stage (seconds, forward + backward + recompute), built in `_terms.py`:
  compute_dense, compute_attention, compute_linear_attention, compute_experts, compute_output
  recompute      forward work re-run in backward (full: every recomputed layer; selective: the dropped parts)
  memory_bound   elementwise/norm/permute traffic, from the bytes the layer touches and the HBM bandwidth
  expert_memory  the same for the routed experts' FFN-width activations (per routed copy), fitted apart
  tp_comm        SP all-gather/reduce-scatter (or all-reduce without SP) at the TP group's bandwidth
  cp_comm        ring exchange of K/V for context parallelism (partly hidden behind attention)
  ep_comm        token dispatch and combine (alltoall / allgather / flex) over NVLink or the network
  pp_p2p         activations sent between pipeline stages (hidden behind compute with VPP)
  layer_overhead launches and host syncs that GPU work cannot hide; per recompute-region costs
  imbalance      the hottest EP rank's extra expert work and traffic (or the padding of token drop)
  act_offload    activation offload copies over PCIe left beside compute
Overlaps (`OVERLAPS`): with EP overlap (1F1B A2A), TP overlap (userbuffers) or activation offload, the term's
overlapped share hides behind its compute window (another micro-batch's attention and experts, the GEMMs it
feeds): what stays exposed is ~x^2/2W when small against the window W, x - W when large; each hidden second
still costs `*_sm` of a second (the SMs the communication kernels take from the compute they run beside).
host_bound: the host launches every kernel; when that takes longer than the GPU's work for a micro-batch the
stage runs at the host's pace (the larger of the two; CUDA graphs shrink the host's part).
Per step (`compose`): the steady state (micro-batches x the slowest stage), the pipeline bubble
((PP - 1) / VPP x the mean stage), the DP gradient reduce-scatter / parameter all-gather left exposed
after overlap with one micro-batch, the optimizer step on the GPU, a fixed step overhead, and `offload`:
the host's share of the optimizer when it is offloaded (`--optimizer-cpu-offload`): the fused CPU Adam
step, bound by the node's DRAM bandwidth shared by its GPUs' ranks, or the gradients sent down and the
updated fp32 parameters sent back over each GPU's PCIe link, whichever is slower (Megatron's
HybridDeviceOptimizer with --overlap-cpu-optimizer-d2h-h2d, which autotune emits with offload).

Calibration (calibrate.py) multiplies each term by one fitted factor (`TimeCoefficients.scale`). The
unscaled terms (`RawTime`) are computed once; `compose` applies any factors cheaply, so a fit can try
many factor vectors without re-running the physics. No torch, no ray.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..catalog import ClusterSpec, ModelSpec, Workload
from ..layout import LayoutTable
from .flops import mfu, usd_per_million_tokens
from ._raw import RawTime, host_time, raw_time, step_pieces
from ._coefficients import TimeCoefficients
from ._terms import DEPS, DERIVED, MB_TERMS, OVERLAPS, STEP_TERMS, TERM_MEANINGS, WINDOW, microbatch_terms
from ._groups import LazyRows, pp_groups, scatter_rows
from .memory import MemoryCoefficients, MemoryResult, take_rows

_DERIVED_IDX = [MB_TERMS.index(d) for d in DERIVED]
_DEP_SRC = [MB_TERMS.index(k) for _, k in DEPS]
_DEP_SUM = np.array([[1.0 if d == dd else 0.0 for dd, _ in DEPS] for d in DERIVED])  # (derived, deps)
_OV_IDX = [MB_TERMS.index(k) for k in OVERLAPS]
_WIN = np.array([[1.0 if k in WINDOW[o] else 0.0 for k in MB_TERMS] for o in OVERLAPS])  # (overlaps, K)
_STEP = {k: i for i, k in enumerate(STEP_TERMS)}

__all__ = ["TimeCoefficients", "TimeResult", "RawTime", "estimate_time", "raw_time", "compose", "step_breakdown",
           "MB_TERMS", "STEP_TERMS", "TERM_MEANINGS", "DERIVED"]


class _Masked(dict):
    """MB terms per stage, zeroed beyond each row's PP on first access (10^5 rows x 15 terms cost more to mask
    than to compute; the search never reads them)."""

    def __init__(self, terms: dict, valid: np.ndarray):
        super().__init__(terms)
        self._valid, self._done = valid, set()

    def __getitem__(self, k):
        if k not in self._done:
            super().__setitem__(k, np.where(self._valid, super().__getitem__(k), 0.0))
            self._done.add(k)
        return super().__getitem__(k)


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


def factor_vector(scale: dict) -> np.ndarray:
    return np.array([float(scale.get(k, 1.0)) for k in STEP_TERMS])


def _exposed(comm: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Traffic left exposed after overlapping with `window` seconds of compute: ~comm^2 / 2W when the
    traffic is small against the window, comm - W when it is large; smooth in between."""
    w = np.maximum(window, 1e-12)
    return np.where(window > 0, comm - w * -np.expm1(-comm / w), comm)


def _scaled(raw: RawTime, F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(B, n, K, S) per-micro-batch terms under factor vectors F (B, len(STEP_TERMS)): derived terms rebuilt from
    the scaled primaries, overlapped terms reduced to what their windows leave exposed; and the (B, n, S) host
    excess over the GPU's work (host_bound, per micro-batch)."""
    K = len(MB_TERMS)
    mb = raw.mb[None] * F[:, None, :K, None]
    derived = np.einsum("dj,bnjs->bnds", _DEP_SUM, raw.dep[None] * mb[:, :, _DEP_SRC, :])
    mb[:, :, _DERIVED_IDX, :] = derived * F[:, None, _DERIVED_IDX, None]
    for o in np.flatnonzero(raw.overlap.any(axis=0)):  # only the overlaps some row uses
        j = _OV_IDX[o]
        x = mb[:, :, j, :]
        window = np.einsum("k,bnks->bns", _WIN[o], mb)
        beside = x * raw.overlap[None, :, o, None]
        hidden = beside - _exposed(beside, window)
        mb[:, :, j, :] = x - hidden * (1.0 - raw.contention[None, :, o, None])
    gpu = mb.sum(axis=2)
    host = np.maximum(raw.host[None] * F[:, None, _STEP["host_bound"], None] - gpu, 0.0)
    return mb, host


def step_times(raw: RawTime, f: np.ndarray) -> np.ndarray:
    """Step times under factor vectors f: (len(STEP_TERMS),) -> (n,), or a batch (B, len) -> (B, n).
    The fit's inner loop: a whole finite-difference Jacobian is one call."""
    F = np.atleast_2d(f)
    mb, host = _scaled(raw, F)
    stage = mb.sum(axis=2) + host
    worst = np.where(raw.valid[None], stage, 0.0).max(axis=2)
    mean = stage.sum(axis=2) / np.maximum(raw.valid.sum(axis=1), 1)
    c = {k: F[:, _STEP[k], None] for k in ("bubble", "dp_comm", "optimizer", "step_overhead", "offload")}
    dp = _exposed(raw.dp_comm * c["dp_comm"], raw.dp_overlap * worst)
    out = (raw.microbatches * worst + c["bubble"] * raw.bubble_coef * mean + dp + c["optimizer"] * raw.optimizer
           + c["step_overhead"] * raw.step_overhead + c["offload"] * raw.offload)
    return out[0] if np.ndim(f) == 1 else out


def step_breakdown(raw: RawTime, f: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per-step terms {name: (n,)} of the slowest stage under factors f, and the scaled (n, K, S) terms."""
    mb, host = _scaled(raw, f[None])
    mbs, host = mb[0], host[0]
    stage = mbs.sum(axis=1) + host
    worst_i = np.where(raw.valid, stage, -np.inf).argmax(axis=1)
    rows = np.arange(mbs.shape[0])
    step = {k: mbs[rows, j, worst_i] * raw.microbatches for j, k in enumerate(MB_TERMS)}
    step["host_bound"] = host[rows, worst_i] * raw.microbatches
    mean = stage.sum(axis=1) / np.maximum(raw.valid.sum(axis=1), 1)
    step["bubble"] = f[_STEP["bubble"]] * raw.bubble_coef * mean
    step["dp_comm"] = _exposed(raw.dp_comm * f[_STEP["dp_comm"]], raw.dp_overlap * stage[rows, worst_i])
    step["optimizer"] = f[_STEP["optimizer"]] * raw.optimizer
    step["step_overhead"] = f[_STEP["step_overhead"]] * raw.step_overhead
    step["offload"] = f[_STEP["offload"]] * raw.offload
    return step, mbs


def compose(raw: RawTime, scale: dict, model: ModelSpec, gpu) -> TimeResult:
    """Step time and its named breakdown under the factors `scale`."""
    step, mbs = step_breakdown(raw, factor_vector(scale))
    total = sum(step.values())
    tps = raw.tokens_per_step / total / raw.world
    return TimeResult(
        mb_terms={k: mbs[:, j, :] for j, k in enumerate(MB_TERMS)}, step_terms=step, step_time=total,
        tokens_per_step=raw.tokens_per_step, world=raw.world, tokens_per_s_per_gpu=tps,
        mfu=mfu(model, tps, gpu.bf16_tflops, raw.lora),
        usd_per_million_tokens=usd_per_million_tokens(gpu.usd_per_hour, tps),
    )


def _own(a, shape) -> bool:
    """Whether `a` is a whole (n, S) array of its own that may be overwritten (not a scalar, column or view)."""
    return isinstance(a, np.ndarray) and a.shape == shape and a.flags.writeable and a.base is None


def _compose_terms(mb: dict, deps: dict, host, pieces: dict, valid, f: np.ndarray) -> tuple[dict, dict, np.ndarray]:
    """`step_breakdown` without stacking: the same arithmetic on a dict of (n, S) terms (what `evaluate` uses; a
    (n, K, S) stack of 10^5 layouts is the slow part). Scales `mb`'s own arrays in place (estimate_time made them
    for this call): a fresh 10^5 x 16 array costs its page faults as much as the arithmetic. Returns (step terms,
    scaled MB terms, step time)."""
    fk = dict(zip(STEP_TERMS, f))
    shape = valid.shape
    out = {}
    for k in MB_TERMS:
        if k in DERIVED:
            continue
        x = mb[k]
        if _own(x, shape):
            x *= fk[k]
            out[k] = x
        else:
            out[k] = x * fk[k]
    for d in DERIVED:  # derived terms follow the scaled terms they are made of
        acc = 0.0
        for k, v in deps[d].items():
            if _own(acc, shape):
                acc += out[k] * v
            else:
                acc = acc + out[k] * v
        out[d] = acc * fk[d]
    for o, name in enumerate(OVERLAPS):
        share = pieces["overlap"][:, o]
        if not share.any():
            continue
        x = out[name]
        beside = x * share[:, None]
        hidden = beside - _exposed(beside, sum(out[k] for k in WINDOW[name]))
        out[name] = x - hidden * (1.0 - pieces["contention"][:, o, None])
    gpu = np.zeros(shape)
    for v in out.values():
        gpu += v
    excess = host * fk["host_bound"] - gpu
    np.maximum(excess, 0.0, out=excess)
    gpu += excess
    stage = np.where(valid, gpu, -np.inf)
    worst_i = stage.argmax(axis=1)
    rows = np.arange(len(worst_i))
    M = pieces["microbatches"]
    pick = lambda a: np.broadcast_to(a, shape)[rows, worst_i]  # noqa: E731 - terms may be (n, 1)
    step = {k: pick(out[k]) * M for k in MB_TERMS}
    step["host_bound"] = pick(excess) * M
    worst = stage[rows, worst_i]
    gpu[~valid] = 0.0
    mean = gpu.sum(axis=1) / np.maximum(valid.sum(axis=1), 1)
    step["bubble"] = fk["bubble"] * pieces["bubble_coef"] * mean
    step["dp_comm"] = _exposed(pieces["dp_comm"] * fk["dp_comm"], pieces["dp_overlap"] * worst)
    for k in ("optimizer", "step_overhead", "offload"):
        step[k] = fk[k] * pieces[k]
    return step, out, sum(step.values())


def estimate_time(
    model: ModelSpec, workload: Workload, cluster: ClusterSpec, t: LayoutTable,
    coef: TimeCoefficients = TimeCoefficients(), mcoef: MemoryCoefficients = MemoryCoefficients(),
    mem: MemoryResult | None = None,
) -> TimeResult:
    """Predicted step time and tokens/s/GPU of every layout in `t`, with named breakdowns. `mem` (the memory
    model's result for the same table) lends its parameter shards. A large table is priced in groups of equal PP
    (_groups.py: the same numbers, without (n, largest PP) arrays for shallow rows)."""
    params = mem.params if mem is not None else None
    groups = pp_groups(t.pp)
    if groups is None:
        return _estimate_time(model, workload, cluster, t, coef, mcoef, params)
    parts = []
    for g in groups:
        sub = t.take(g)
        S_g = int(sub.pp.max())
        p_g = None if params is None else tuple(take_rows(p, g)[:, :S_g] for p in params)
        parts.append(_estimate_time(model, workload, cluster, sub, coef, mcoef, p_g))
    n, S = len(t), int(t.pp.max())
    one = lambda name: scatter_rows([getattr(p, name) for p in parts], groups, n)  # noqa: E731
    return TimeResult(
        mb_terms=LazyRows([p.mb_terms for p in parts], groups, n, S),
        step_terms={k: scatter_rows([p.step_terms[k] for p in parts], groups, n) for k in parts[0].step_terms},
        step_time=one("step_time"), tokens_per_step=parts[0].tokens_per_step, world=t.world,
        tokens_per_s_per_gpu=one("tokens_per_s_per_gpu"), mfu=one("mfu"),
        usd_per_million_tokens=one("usd_per_million_tokens"),
    )


def _estimate_time(model: ModelSpec, workload: Workload, cluster: ClusterSpec, t: LayoutTable,
                   coef: TimeCoefficients, mcoef: MemoryCoefficients, params) -> TimeResult:
    mb, deps, frac = microbatch_terms(model, workload, cluster, t, coef, mcoef)
    S = int(t.pp.max())
    valid = np.arange(S)[None, :] < t.pp[:, None]
    pieces = step_pieces(model, workload, cluster, t, coef, S, params)
    step, mbs, total = _compose_terms(mb, deps, host_time(model, t, coef, S, frac), pieces, valid,
                                      factor_vector(coef.scale))
    tps = workload.tokens_per_step / total / t.world
    return TimeResult(
        mb_terms=_Masked(mbs, valid), step_terms=step, step_time=total,
        tokens_per_step=float(workload.tokens_per_step), world=t.world, tokens_per_s_per_gpu=tps,
        mfu=mfu(model, tps, cluster.gpu.bf16_tflops, workload.lora),
        usd_per_million_tokens=usd_per_million_tokens(cluster.gpu.usd_per_hour, tps),
    )
