"""FLOPs: per GPU, per pipeline stage, per micro-batch, by kind of work; and the MFU convention.

Kinds: dense GEMMs (attention projections, dense MLPs, shared experts, router, Mamba2 projections), attention
scores and values (causal: half the context on average; sliding windows capped), the Gated DeltaNet and
Mamba2 (SSD) chunked scans, routed-expert grouped GEMMs, the output layer. A trained MTP block (cost._mtp)
adds its layers and one more output-layer pass per MTP pass to the last stage. Forward only; backward is 2x
forward for GEMMs (see time.py). MFU follows the seed: tokens/s/GPU x 6 x N_active / peak.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..catalog import ModelSpec, Workload, padded_vocab, param_counts
from ..layout import LayoutTable
from ._mtp import mtp_block, mtp_passes
from .layers import attention_flops, csa_context, layer_tables, stage_sums, vocab_per_row

__all__ = ["StageFlops", "stage_flops", "model_flops_per_token", "mfu", "mfu_of", "usd_per_million_tokens",
           "train_flops_per_token"]


@dataclass
class StageFlops:
    """Forward FLOPs per GPU for one micro-batch, each (n, S)."""

    dense: np.ndarray
    attention: np.ndarray
    linear_attention: np.ndarray
    experts: np.ndarray
    output: np.ndarray
    tokens: np.ndarray  # (n,) tokens in one micro-batch (whole rows, before CP)


def stage_flops(model: ModelSpec, workload: Workload, t: LayoutTable) -> StageFlops:
    lt = layer_tables(model)
    S = int(t.pp.max())
    s = workload.seq_len
    tokens = (t.rows_per_mb(s) * s).astype(float)
    # each GPU of a TP x CP group computes 1 / (TP x CP) of the replica's work; experts spread evenly
    share = (1.0 / (t.tp * t.cp))[:, None]
    tok = tokens[:, None]
    span = workload.attention_span  # packed rows attend within each document
    attn = stage_sums(attention_flops(model, lt, span), t.pp, t.vpp, S, t.split)
    last = np.arange(S)[None, :] == (t.pp - 1)[:, None]
    vocab = vocab_per_row(model, t.tp).astype(float)[:, None]
    dense = stage_sums(lt.flops_dense, t.pp, t.vpp, S, t.split)
    lin = stage_sums(lt.flops_linear_attn, t.pp, t.vpp, S, t.split)
    experts = stage_sums(lt.flops_expert, t.pp, t.vpp, S, t.split)
    passes = mtp_passes(model, workload)
    if passes:  # the MTP block's layers on the last stage, each pass attending over the whole (causal) row
        d, q, e, li = mtp_block(model).flops
        dense, lin, experts = (a + np.where(last, passes * v, 0.0) for a, v in ((dense, d), (lin, li), (experts, e)))
        attn = attn + np.where(last, passes * mtp_attention(model, q, span), 0.0)
    return StageFlops(
        dense=dense * tok * share,
        attention=attn * tok * share,
        linear_attention=lin * tok * share,
        experts=experts * tok * share,
        output=np.where(last, (1 + passes) * 2.0 * model.hidden_size * vocab * tok * share, 0.0),
        tokens=tokens,
    )


def mtp_attention(model: ModelSpec, per_context: float, span: float, causal: bool = True) -> float:
    """Forward attention FLOPs per token of one MTP pass (its layer attends like the model's full-attention layers,
    or, in DeepSeek-V4, per the MTP layer's own compress ratio)."""
    if model.csa is not None:
        keys, indexer = csa_context(model, model.csa.ratio(model.num_layers), span)
        return per_context * keys + indexer
    return per_context * (span / 2 if causal else span)


def model_flops_per_token(model: ModelSpec) -> float:
    """6 x N_active, the seed's MFU convention (attention scores not counted)."""
    return 6.0 * param_counts(model).active


def mfu(model: ModelSpec, tokens_per_s_per_gpu, peak_tflops: float, lora: bool = False):
    """tokens/s/GPU x 6 x N_active / peak (the seed's convention; 4 x N_active for LoRA, see mfu_of)."""
    return mfu_of(tokens_per_s_per_gpu, param_counts(model).active, peak_tflops, lora)


def mfu_of(tokens_per_s_per_gpu, active_params: int, peak_tflops: float, lora: bool = False):
    """The one place MFU is computed: tokens/s/GPU x 6 x active parameters / dense BF16 peak. LoRA's frozen base
    runs forward and data gradient only: 4 x active parameters (Megatron-Bridge's LoRA TFLOP/s count it so)."""
    return np.asarray(tokens_per_s_per_gpu) * (4.0 if lora else 6.0) * active_params / (peak_tflops * 1e12)


def usd_per_million_tokens(usd_per_gpu_hour: float, tokens_per_s_per_gpu):
    """Price per GPU-hour / (tokens/s/GPU x 3600) x 1e6; inf where nothing is produced. The one place."""
    tps = np.asarray(tokens_per_s_per_gpu, dtype=float)
    with np.errstate(divide="ignore"):
        return np.where(tps > 0, usd_per_gpu_hour / (np.maximum(tps, 1e-300) * 3600.0) * 1e6, np.inf)


def train_flops_per_token(model: ModelSpec, seq_len: int, causal: bool = True, mtp_passes: int = 0) -> float:
    """Forward + backward FLOPs per token (3x forward): every matmul, causal attention over half the
    context (sliding windows capped; `causal=False`: the whole row, as Megatron-LM's older count has it), the
    GDN / Mamba2 scans, the output layer, and `mtp_passes` passes of the MTP block (its layer, its 2h -> h
    projection, the output layer again), as Megatron's num_floating_point_operations counts a run that trains MTP.
    Close to Megatron's own count, which is what the TFLOP/s columns of Megatron-based sources use; others differ by
    a few %."""
    lt = layer_tables(model)
    out = 2.0 * model.hidden_size * padded_vocab(model, 1)
    fwd = (lt.flops_dense.sum() + lt.flops_expert.sum() + lt.flops_linear_attn.sum()
           + attention_flops(model, lt, seq_len, causal).sum() + out)
    if mtp_passes and model.mtp_layers:
        d, q, e, li = mtp_block(model).flops
        fwd += mtp_passes * (d + e + li + mtp_attention(model, q, seq_len, causal) + out)
    return 3.0 * float(fwd)
