"""The multi-token-prediction block when it is trained (`Workload.train_mtp`): its parameters, the bytes it
saves for backward and its FLOPs, all on the last pipeline stage (Megatron builds the MTP block in the last
stage's post-process, next to the output layer).

One block is two norms and a 2h -> h projection of (embedding of the next token, hidden state), the decoder
layers of the block (catalog.params.mtp_items) and a final norm; each pass runs the block once and the
shared output layer once more (its logits and loss). `Workload.mtp_passes` passes per step (Megatron's
--mtp-num-layers; with Megatron-Bridge's mtp_use_repeated_layer one block runs that many times), else the
model's MTP layer count. Not modelled: recompute of the MTP layers (their activations are always kept) and
the MTP logits' transient memory (each pass's logits are freed before the next pass's). No torch, no ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..catalog import ModelSpec, Workload
from ..catalog.params import mtp_items
from ..layout import LayoutTable
from .layers import BF16, PART_CLASS, PARTS, attention_parts, ffn_parts, flops_of, layer_norm_parts

__all__ = ["MtpBlock", "mtp_block", "mtp_passes", "mtp_stage_params", "mtp_stage_activations"]


@dataclass(frozen=True)
class MtpBlock:
    params_tp: float  # split over TP
    params_rep: float  # whole on every TP rank
    params_exp: float  # split over EP x ETP
    params_exp_ep: float  # split over EP only
    act: np.ndarray  # (P,) bytes per token saved for backward by one pass, by activation part
    flops: tuple[float, float, float, float]  # forward per token: dense, attention per context token, experts, scan


@lru_cache(maxsize=32)
def mtp_block(m: ModelSpec) -> MtpBlock | None:
    if not m.mtp_layers:
        return None
    params = {"tp": 0.0, "rep": 0.0, "expert": 0.0, "expert_ep": 0.0, "buffer": 0.0}
    act = np.zeros(len(PARTS))
    flops = np.zeros(4)
    subs = mtp_items(m)
    for mixer, ffn, items in subs[1:-1]:  # the block's decoder layers
        for it in items:
            params[it.shard] += it.count
        parts = {**layer_norm_parts(m), **attention_parts(m, mixer, m.num_layers), **ffn_parts(m, ffn)}
        for name, v in parts.items():
            act[PARTS.index(name)] += v
        flops += flops_of(m, items, mixer)
    for _, _, items in (subs[0], subs[-1]):  # input norms, the 2h -> h projection, the final norm
        for it in items:
            params[it.shard] += it.count
    h = m.hidden_size
    flops[0] += 2 * 2 * h * h
    act[PARTS.index("ln")] += BF16 * 2 * h  # the two input norms' inputs
    act[PARTS.index("attn_in")] += BF16 * 2 * h  # the projection's input (both halves)
    return MtpBlock(params["tp"], params["rep"], params["expert"], params["expert_ep"], act, tuple(flops))


def mtp_passes(m: ModelSpec, w: Workload) -> int:
    """MTP block passes per step: 0 unless the workload trains MTP and the model has an MTP block."""
    if not (w.train_mtp and m.mtp_layers):
        return 0
    return w.mtp_passes or m.mtp_layers


def _last(t: LayoutTable, S: int) -> np.ndarray:
    return np.arange(S)[None, :] == (t.pp - 1)[:, None]


def mtp_stage_params(m: ModelSpec, w: Workload, t: LayoutTable, S: int) -> tuple[np.ndarray, np.ndarray]:
    """(dense, expert) parameters per GPU the trained MTP block adds to each stage (n, S): the last one.
    A repeated block (several passes) has one copy of its weights."""
    zero = np.zeros((len(t), S))
    b = mtp_block(m)
    if b is None or not mtp_passes(m, w):
        return zero, zero
    dense = b.params_tp / t.tp.astype(float) + b.params_rep
    expert = b.params_exp / (t.ep * t.etp).astype(float) + b.params_exp_ep / t.ep.astype(float)
    last = _last(t, S)
    return np.where(last, dense[:, None], 0.0), np.where(last, expert[:, None], 0.0)


def mtp_stage_activations(m: ModelSpec, w: Workload, t: LayoutTable, S: int, div: dict) -> np.ndarray:
    """Bytes per token of a micro-batch the trained MTP passes keep for backward on each stage (n, S), each
    part divided by its class's per-GPU share `div[class]` as the decoder layers' parts are."""
    b = mtp_block(m)
    passes = mtp_passes(m, w)
    if b is None or not passes:
        return np.zeros((len(t), S))
    per_token = sum(b.act[j] * np.asarray(div[PART_CLASS[p]], dtype=float) for j, p in enumerate(PARTS))
    per_token = np.broadcast_to(np.asarray(per_token, dtype=float).reshape(-1, 1), (len(t), 1))
    return np.where(_last(t, S), passes * per_token, 0.0)
