"""The words of a recipe: the layout summary, the leaderboard highlights, the slime loss-mask type.

The summary follows the seed's sentence ("TP 1, PP 4, CP 1, EP 8, ETP 1, DP 8; one 8,192-token row per
microbatch; full recompute (uniform, 2 layers); precision-aware distributed optimizer; alltoall dispatcher;
load-balancing loss off; TE cross-entropy fusion; no offload"; a dense model's names no dispatcher). Its option
phrases are the ones `convert.layout_of` reads back (convert.PHRASE), so a recipe's summary and run block can be
compared.

Highlights name the token cap, the recompute (always: "recompute 1 layer" too, or a full-recompute recipe
reads as one without), what differs from the seed's alltoall dispatcher, the options turned on beyond the
seed's (FSDP, EP and TP communication overlap, CUDA graphs, token drop), and end with the load-balancing loss:
the seed's "max 8,192 tokens/GPU, recompute 2 layers, load-balancing loss off".
"""

from __future__ import annotations

from ..catalog import Workload
from ..layout import Layout
from ..words import count
from .convert import PHRASE

__all__ = ["summarize", "highlights"]


def _rows_phrase(layout: Layout, seq_len: int) -> str:
    rows = layout.rows_per_microbatch(seq_len)
    if rows == 1:
        return f"one {seq_len:,}-token row per microbatch"
    return f"{rows} rows of {seq_len:,} tokens per microbatch"


def _optimizer_phrase(layout: Layout) -> str:
    kind = PHRASE["distributed_optimizer"] if layout.distributed_optimizer else "unsharded optimizer"
    return (PHRASE["precision_aware_optimizer"] + " " if layout.precision_aware_optimizer else "") + kind


def summarize(layout: Layout, workload: Workload, moe: bool = True) -> str:
    """The recipe's layout summary, in the seed's words and order."""
    degrees = f"TP {layout.tp}, PP {layout.pp}" + (f", VPP {layout.vpp}" if layout.vpp > 1 else "")
    degrees += f", CP {layout.cp}, EP {layout.ep}, ETP {layout.etp}, DP {layout.dp}"
    bits = [degrees]
    if layout.tp > 1:
        bits.append("sequence parallel" if layout.sp else "no sequence parallel")
    bits += [_rows_phrase(layout, workload.seq_len), layout.recompute.describe(), _optimizer_phrase(layout)]
    if moe:  # a dense model has no token dispatcher (and its run block no --moe-* flag)
        overlap = " with " + PHRASE["moe_shared_expert_overlap"] if layout.moe_shared_expert_overlap else ""
        bits.append(f"{layout.dispatcher} dispatcher{overlap}")
        bits.append(PHRASE["load_balancing_on"] if workload.load_balancing_loss else "load-balancing loss off")
    if layout.cross_entropy_fusion:
        bits.append("TE " + PHRASE["cross_entropy_fusion"])
    bits.append(f"optimizer offload {layout.optimizer_offload:.0%}" if layout.optimizer_offload else "no offload")
    bits += [long for long, _ in _extras(layout)]
    if not workload.grads_fp32:
        bits.append("bf16 gradient reduction")
    return "; ".join(bits)


def _extras(layout: Layout) -> list[tuple[str, str]]:
    """The options a run turns on beyond the seed's (summary words, highlight words), each only when on: two
    recipes that differ only in these must not read alike."""
    out = []
    if layout.fsdp:
        out.append(("Megatron FSDP (parameters, gradients and optimizer state sharded over DP)", "FSDP"))
    if layout.ep_overlap:
        out.append(("EP communication overlap", "EP comm overlap"))
    if layout.tp_overlap:  # as it takes effect: TP > 1 with sequence parallel
        out.append(("TP communication overlap", "TP comm overlap"))
    if layout.cuda_graphs != "none":
        out.append((f"CUDA graphs ({layout.cuda_graphs})", f"CUDA graphs {layout.cuda_graphs}"))
    if layout.moe_capacity_factor > 0:
        cf = f"{layout.moe_capacity_factor:g}"
        out.append((f"token drop at capacity factor {cf}", f"token drop (capacity {cf})"))
    if layout.activation_offload_layers:
        n = layout.activation_offload_layers
        out.append((f"activations of {count(n, 'layer')} per chunk offloaded",
                    f"activation offload {count(n, 'layer')}"))
    if layout.offload_modules:
        mods = ", ".join(layout.offload_modules)
        out.append((f"inputs of {mods} offloaded to host memory", f"offload {mods}"))
    return out


def highlights(layout: Layout, workload: Workload, moe: bool = True) -> str:
    """What sets the recipe apart, as the leaderboard prints it under the layout label."""
    if layout.max_tokens_per_gpu is not None:
        bits = [f"max {layout.max_tokens_per_gpu:,} tokens/GPU"]
    else:
        n = layout.micro_batch_size or 1
        bits = [f"micro-batch {count(n, 'row')}"]
    rc = layout.recompute
    # the seed page leaves its reference recompute (full, uniform, 1 layer) unsaid and says the others; with "no
    # recompute" written out, a recipe whose highlights name no recompute is that reference
    if rc.granularity == "full" and not (rc.method == "uniform" and rc.num_layers == 1):
        n = rc.num_layers
        bits.append(f"{'block ' if rc.method == 'block' else ''}recompute {count(n, 'layer')}")
    elif rc.granularity == "selective":
        bits.append("selective recompute")
    elif rc.granularity == "none":
        bits.append("no recompute")
    if layout.dispatcher != "alltoall":
        bits.append(f"{layout.dispatcher} dispatcher")
    if layout.optimizer_offload:
        bits.append(f"optimizer offload {layout.optimizer_offload:.0%}")
    bits += [short for _, short in _extras(layout)]
    if moe and not workload.load_balancing_loss:
        bits.append("load-balancing loss off")
    return ", ".join(bits)
