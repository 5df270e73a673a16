"""A layout's settings beyond its degrees, in a few words: what tells two trials with the same label apart.

`Layout.label()` is the seed's 'TP2 PP4 EP8 DP4'; a search tries many layouts under one label (recompute,
dispatcher, token cap, optimizer and overlap options). `settings_label` names them from the one table of
searched dimensions (dimensions.py), so a dimension added there is described here too: the recompute and
the dispatcher always, the token cap when set, every other dimension only where it differs from its
default ('optimizer offload 0.5', 'ep overlap', 'cuda graphs attn'). Pure: no torch, no ray.
"""

from __future__ import annotations

from .core import Layout
from .dimensions import DIMENSIONS

__all__ = ["settings_label", "full_label"]

_DEGREES = ("tp", "pp", "vpp", "cp", "ep", "etp")
_ALWAYS = ("recompute", "dispatcher", "max_tokens_per_gpu")


def settings_label(lay: Layout, moe: bool = True) -> str:
    """'full:block:2, alltoall, max 8,192 tokens/GPU, precision aware optimizer, moe shared expert overlap'."""
    bits = [str(lay.recompute) if lay.recompute.granularity != "none" else "no recompute"]
    if moe:
        bits.append(lay.dispatcher)
    if lay.max_tokens_per_gpu is not None:
        bits.append(f"max {lay.max_tokens_per_gpu:,} tokens/GPU")
    elif lay.micro_batch_size is not None:
        bits.append(f"micro-batch {lay.micro_batch_size}")
    for d in DIMENSIONS:
        if d.name in _DEGREES or d.name in _ALWAYS:
            continue
        v = lay.tp_overlap if d.name == "tp_comm_overlap" else d.encode(lay)  # as it takes effect (TP > 1)
        if d.default and v == d.default[0]:
            continue
        words = d.name.replace("_", " ")
        bits.append(words if v is True else f"no {words}" if v is False else f"{words} {v}")
    return ", ".join(bits)


def full_label(lay: Layout, moe: bool = True) -> str:
    """'TP2 PP4 EP8 DP4 [full:block:2, alltoall, ...]': the label and its settings."""
    return f"{lay.label(moe)} [{settings_label(lay, moe)}]"
