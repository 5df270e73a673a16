"""Megatron-core's legality rules for a layout, vectorised over a LayoutTable.

Each rule is a mask function (True = satisfied) and a message that names the values. `check` runs all
of them over a table; `violations` and `validate` explain one layout and propose the nearest legal
alternative (fewest, smallest changes to the degrees). Sources: megatron/core/transformer/
transformer_config.py (heads, query groups, Gated DeltaNet, recompute, shared-expert overlap),
moe_layer.py (MoE with TP needs SP), pipeline_parallel/schedules.py (interleaved micro-batches),
token_dispatcher.py (flex needs TP x EP > 1), parallel_state.py (world-size divisibility); the rules of the
overlap, CUDA-graph, token-drop and activation-offload settings are in _setting_rules.py.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..catalog import ModelSpec, Workload
from ..errors import IllegalLayout
from .core import Layout
from .splits import legal_splits, split_text, too_many_stages
from .table import LayoutTable, split_of
from ._setting_rules import SETTING_RULES

__all__ = ["Rule", "RULES", "Violation", "check", "legal_mask", "violations", "validate", "nearest_legal"]


@dataclass(frozen=True)
class Rule:
    code: str
    ok: Callable[[ModelSpec, Workload, LayoutTable], np.ndarray]
    message: Callable[[ModelSpec, Workload, Layout], str]


@dataclass(frozen=True)
class Violation:
    code: str
    message: str


def _div(a, b):
    return (np.asarray(a) % np.asarray(b)) == 0


def _layers_per_chunk(m: ModelSpec, t: LayoutTable):
    """Decoder layers of the smallest non-empty virtual stage (the even split's chunk otherwise)."""
    out = m.num_layers // (t.pp * t.vpp)
    if t.split.any():
        for code in np.unique(t.split[t.split > 0]):
            sp = [x for x in split_of(code) if x > 0]
            out = np.where(t.split == code, min(sp) if sp else 0, out)
    return out


def _split_ok(m: ModelSpec, w: Workload, t: LayoutTable):
    """Even split when no split is given; a given split covers PP x VPP virtual stages and every layer."""
    ok = _div(m.num_layers, t.pp * t.vpp) & (t.split == 0)
    for code in np.unique(t.split[t.split > 0]):
        sp = split_of(code)
        ok = ok | ((t.split == code) & (t.pp * t.vpp == len(sp)) & (sum(sp) == m.num_layers))
    return ok


def _split_message(m: ModelSpec, w: Workload, l: Layout) -> str:
    S = l.pp * l.vpp
    if l.layer_split:  # Layout itself refuses a split with other than PP x VPP stages: here the layers are off
        return (f"layer split {split_text(l.layer_split)} places {sum(l.layer_split)} decoder layers; "
                f"{m.name} has {m.num_layers} (--layer-split auto: Megatron's split for PP x VPP = {S})")
    crowded = too_many_stages(m.num_layers, l.pp, l.vpp)
    if crowded:
        return crowded
    alts = legal_splits(m.num_layers, l.pp, l.vpp)
    hint = (f"; give an uneven split: --layer-split auto (or e.g. {split_text(alts[0])}: decoder layers per virtual "
            "stage; a search space lists layer_split: [even, uneven])") if alts else ""
    return f"{m.num_layers} layers do not split evenly over PP x VPP = {S} stages{hint}"


def _tokens_within_rows(m: ModelSpec, w: Workload, t: LayoutTable):
    """A token cap packs whole rows per micro-batch (`rows_per_mb`); one that holds more rows than a DP rank gets
    would be costed as rows that do not exist. A cap whose rows do not divide the rank's is fine: slime's dynamic
    batching packs what is left into a last, smaller micro-batch, and the Megatron export takes the largest
    micro-batch that divides (layout/args.py, export_micro_batch). A global batch that does not divide over DP is
    its own rule's to name: here it would count a fraction of a row as none."""
    dp = np.maximum(t.dp, 1)
    return (t.max_tokens == 0) | (w.global_batch % dp != 0) | (t.rows_per_mb(w.seq_len) <= w.global_batch // dp)


def _tokens_message(m: ModelSpec, w: Workload, l: Layout) -> str:
    local = max(1, w.seq_len // l.cp)
    rows, per_mb = w.global_batch // max(1, l.dp), l.rows_per_microbatch(w.seq_len)
    return (f"max tokens per GPU {l.max_tokens_per_gpu:,} holds {per_mb} rows, more than the {rows} row(s) of "
            f"{local:,} tokens a DP rank gets (global batch {w.global_batch} / DP {l.dp}); use at most {rows * local:,}")


def _divisor_below(l: Layout, w: Workload) -> int:
    """The largest micro-batch (rows) at most `l`'s that divides the rows per DP rank."""
    rows = max(1, w.global_batch // max(1, l.dp))
    return max(k for k in range(1, min(rows, l.rows_per_microbatch(w.seq_len)) + 1) if rows % k == 0)


def _latent(m: ModelSpec) -> bool:
    """MLA or DeepSeek-V4's attention: heads need no KV-group split."""
    return m.latent_attention


RULES: list[Rule] = [
    Rule("world_mp", lambda m, w, t: _div(t.world, t.tp * t.pp * t.cp),
         lambda m, w, l: f"TP x PP x CP = {l.tp * l.pp * l.cp} does not divide the {l.world} GPUs"),
    Rule("world_ep", lambda m, w, t: _div(t.world, t.ep * t.etp * t.pp),
         lambda m, w, l: f"EP x ETP x PP = {l.ep * l.etp * l.pp} does not divide the {l.world} GPUs"),
    Rule("heads_tp", lambda m, w, t: _div(m.num_heads, t.tp),
         lambda m, w, l: f"num_attention_heads {m.num_heads} is not a multiple of TP {l.tp}"),
    Rule("csa_tp", lambda m, w, t: np.full(len(t), True) if m.csa is None else t.tp == 1,
         lambda m, w, l: f"DeepSeek-V4's attention runs at TP 1 only (megatron-core DSv4HybridAttention); {m.name} at "
                         f"TP {l.tp}: use TP 1 and EP for the experts"),
    Rule("csa_cp", lambda m, w, t: np.full(len(t), True) if m.csa is None else t.cp == 1,
         lambda m, w, l: f"DeepSeek-V4's attention takes CP only on packed (THD) rows, which autotune's trials do not "
                         f"run; {m.name} at CP {l.cp}: use CP 1"),
    Rule("query_groups_tp",
         lambda m, w, t: np.full(len(t), True) if _latent(m) else (_div(m.num_kv_heads, t.tp) | _div(t.tp, m.num_kv_heads)),
         lambda m, w, l: f"num_query_groups {m.num_kv_heads} is neither a multiple nor a divisor of TP {l.tp}"),
    Rule("gate_query_groups_tp",
         lambda m, w, t: np.full(len(t), True) if not m.attn_output_gate or _latent(m) else (t.tp <= m.num_kv_heads),
         lambda m, w, l: f"the attention output gate with TP {l.tp} above the {m.num_kv_heads} query groups crashes "
                         f"megatron-core 0.16 (fixed upstream later); use TP <= {m.num_kv_heads}"),
    Rule("linear_heads_tp",
         lambda m, w, t: np.full(len(t), True) if not m.linear
         else _div(m.linear.num_key_heads, t.tp) & _div(m.linear.num_value_heads, t.tp),
         lambda m, w, l: f"Gated DeltaNet heads ({m.linear.num_key_heads} key / {m.linear.num_value_heads} value) "
                         f"are not multiples of TP {l.tp}"),
    Rule("linear_no_cp", lambda m, w, t: (t.cp == 1) | (not m.linear),
         lambda m, w, l: f"Gated DeltaNet does not support context parallelism (CP {l.cp}); use CP 1"),
    Rule("cp_seq", lambda m, w, t: _div(w.seq_len, 2 * t.cp) | (t.cp == 1),
         lambda m, w, l: f"sequence length {w.seq_len} is not divisible by 2 x CP = {2 * l.cp}"),
    Rule("layers_pp", _split_ok, _split_message),
    Rule("vpp_needs_pp", lambda m, w, t: (t.vpp == 1) | (t.pp > 1),
         lambda m, w, l: f"VPP {l.vpp} needs pipeline parallelism (PP > 1), got PP {l.pp}"),
    Rule("interleaved_microbatches",
         lambda m, w, t: (t.vpp == 1) | _div(t.num_microbatches(w.global_batch, w.seq_len), t.pp),
         lambda m, w, l: f"the interleaved schedule needs micro-batches per DP rank "
                         f"({l.num_microbatches(w.global_batch, w.seq_len)}) to be a multiple of PP {l.pp}"),
    Rule("dense_no_ep", lambda m, w, t: (t.ep == 1) & (t.etp == 1) if not m.is_moe else np.full(len(t), True),
         lambda m, w, l: f"{m.name} has no experts: EP and ETP must be 1 (got EP {l.ep}, ETP {l.etp})"),
    Rule("experts_ep", lambda m, w, t: _div(m.moe.num_experts, t.ep) if m.moe else np.full(len(t), True),
         lambda m, w, l: f"{m.moe.num_experts} experts do not divide over EP {l.ep}"),
    Rule("expert_ffn_etp", lambda m, w, t: _div(m.moe.ffn_hidden_size, t.etp) if m.moe else np.full(len(t), True),
         lambda m, w, l: f"expert FFN {m.moe.ffn_hidden_size} is not divisible by ETP {l.etp}"),
    Rule("expert_bias_etp", lambda m, w, t: (t.etp == 1) | (not (m.is_moe and m.bias_linear)),
         lambda m, w, l: f"{m.name} has biases on every linear, its experts' too, which megatron-core shards at "
                         f"ETP 1 only; use ETP 1, not {l.etp}"),
    Rule("ffn_tp",
         lambda m, w, t: _div(m.ffn_hidden_size, t.tp)
         & (_div(m.moe.shared_ffn_hidden_size, t.tp) if m.moe and m.moe.shared_ffn_hidden_size else True),
         lambda m, w, l: f"FFN width {m.ffn_hidden_size}"
                         + (f" / shared expert {m.moe.shared_ffn_hidden_size}" if m.moe else "")
                         + f" is not divisible by TP {l.tp}"),
    Rule("moe_tp_needs_sp", lambda m, w, t: (t.tp == 1) | t.sp | (not m.is_moe),
         lambda m, w, l: f"MoE with TP {l.tp} needs sequence parallelism (--sequence-parallel)"),
    # DP 0 (TP x PP x CP does not divide the world) is world_mp's to report, not a batch that fails to divide
    Rule("dp_batch", lambda m, w, t: (t.dp == 0) | _div(w.global_batch, np.maximum(t.dp, 1)),
         lambda m, w, l: f"global batch {w.global_batch} rows does not divide over DP {l.dp} (use --global-batch "
                         f"{-(-w.global_batch // max(l.dp, 1)) * l.dp}, the nearest multiple of {l.dp} above it)"),
    Rule("row_fits_tokens", lambda m, w, t: (t.max_tokens == 0) | (t.max_tokens >= w.seq_len // t.cp),
         lambda m, w, l: f"max tokens per GPU {l.max_tokens_per_gpu} is below one row's share "
                         f"({w.seq_len // l.cp} = {w.seq_len} tokens / CP {l.cp})"),
    Rule("tokens_within_rows", _tokens_within_rows, _tokens_message),
    Rule("microbatch_divides",
         lambda m, w, t: (t.max_tokens > 0) | _div(w.global_batch // np.maximum(t.dp, 1), t.mbs),
         lambda m, w, l: f"micro-batch size {l.micro_batch_size} does not divide the "
                         f"{w.global_batch // max(1, l.dp)} rows per DP rank; use {_divisor_below(l, w)} rows"),
    Rule("recompute_layers",
         lambda m, w, t: (t.rc_gran != 2) | ((t.rc_layers >= 1) & (t.rc_layers <= _layers_per_chunk(m, t))),
         lambda m, w, l: f"recompute over {l.recompute.num_layers} layers exceeds the "
                         f"{min([x for x in l.layer_split if x] or [m.num_layers // (l.pp * l.vpp)])} layers "
                         "per pipeline chunk"),
    Rule("shared_overlap_alltoall", lambda m, w, t: ~t.shared_overlap | (t.dispatcher == 0),
         lambda m, w, l: f"--moe-shared-expert-overlap works only with the alltoall dispatcher, not {l.dispatcher}"),
    Rule("dense_no_dispatcher", lambda m, w, t: (t.dispatcher == 0) | m.is_moe,
         lambda m, w, l: f"{m.name} has no experts: the {l.dispatcher} token dispatcher has nothing to dispatch; "
                         "leave --dispatcher at its default (alltoall)"),
    Rule("flex_needs_tp_ep", lambda m, w, t: (t.dispatcher < 2) | (t.tp * t.ep > 1) | (not m.is_moe),
         lambda m, w, l: f"the flex dispatcher ({l.dispatcher}) needs TP x EP > 1"),
    Rule("precision_aware_needs_dist", lambda m, w, t: ~t.precision_aware | t.dist_opt,
         lambda m, w, l: "the precision-aware optimizer needs the distributed optimizer"),
    *(Rule(code, ok, msg) for code, ok, msg in SETTING_RULES),
]


# the rules that read a row's layer split (the others give the same answer whatever the split): space.explore
# checks an "uneven" row against the others first and against these once it has its splits
SPLIT_RULES = ("layers_pp", "recompute_layers")
# rules about a setting whose message names the value that fixes it (the nearest-layout search keeps settings)
_NAMES_ITS_FIX = {code for code, _, _ in SETTING_RULES} | {"tokens_within_rows", "microbatch_divides", "dp_batch"}


def check(model: ModelSpec, workload: Workload, t: LayoutTable) -> dict[str, np.ndarray]:
    return {r.code: np.asarray(r.ok(model, workload, t), dtype=bool) & np.ones(len(t), bool) for r in RULES}


def legal_mask(model: ModelSpec, workload: Workload, t: LayoutTable) -> np.ndarray:
    ok = np.ones(len(t), dtype=bool)
    for mask in check(model, workload, t).values():
        ok &= mask
    return ok


def violations(model: ModelSpec, workload: Workload, layout: Layout) -> list[Violation]:
    t = LayoutTable.from_layouts([layout])
    out = []
    for r in RULES:
        if not bool(np.asarray(r.ok(model, workload, t)).reshape(-1)[0]):
            out.append(Violation(r.code, r.message(model, workload, layout)))
    return out


def _divisors(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def nearest_legal(model: ModelSpec, workload: Workload, layout: Layout) -> Layout | None:
    """The legal layout with the smallest change in degrees (log2 distance), other settings kept."""
    w = layout.world
    small = [d for d in (1, 2, 4, 8, 16) if d <= w]  # TP, CP, ETP: powers of two inside a node
    pp_vals = _divisors(model.num_layers, w)
    ep_vals = _divisors(model.moe.num_experts, w) if model.is_moe else [1]
    etp_vals = small if model.is_moe else [1]
    grid = np.array(list(itertools.product(small, pp_vals, [1, 2, 3, 4, 6, 8], small, ep_vals, etp_vals)))
    tp, pp, vpp, cp, ep, etp = grid.T
    base = LayoutTable.from_layouts([layout])
    n = len(grid)
    t = LayoutTable.from_columns(
        layout.world, n, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp,
        sp=np.where(tp > 1, True, base.sp[0]),
        rc_gran=base.rc_gran[0], rc_method=base.rc_method[0],
        rc_layers=np.minimum(np.maximum(base.rc_layers[0], 0), np.maximum(1, model.num_layers // (pp * vpp))),
        rc_modules=base.rc_modules[0], dispatcher=base.dispatcher[0] if model.is_moe else 0,
        max_tokens=np.where(base.max_tokens[0] > 0, np.maximum(base.max_tokens[0], workload.seq_len // cp), 0),
        mbs=base.mbs[0], dist_opt=base.dist_opt[0] | base.precision_aware[0], precision_aware=base.precision_aware[0],
        offload=base.offload[0], shared_overlap=base.shared_overlap[0] & (base.dispatcher[0] == 0),
        ce_fusion=base.ce_fusion[0], overlap_grad=base.overlap_grad[0], overlap_param=base.overlap_param[0],
        ep_overlap=base.ep_overlap[0], tp_comm_overlap=base.tp_comm_overlap[0], cuda_graphs=base.cuda_graphs[0],
        capacity=base.capacity[0], act_offload=base.act_offload[0], off_modules=base.off_modules[0],
    )
    ok = legal_mask(model, workload, t)
    if not ok.any():
        return None
    cur = np.array([layout.tp, layout.pp, layout.vpp, layout.cp, layout.ep, layout.etp])
    dist = np.abs(np.log2(grid) - np.log2(cur)).sum(axis=1) + 1e-3 * np.log2(grid).sum(axis=1)
    dist = np.where(ok, dist, np.inf)
    return t.row(int(np.argmin(dist)))


def validate(model: ModelSpec, workload: Workload, layout: Layout) -> None:
    """Raise IllegalLayout naming every violated rule and the nearest legal alternative."""
    bad = violations(model, workload, layout)
    if not bad:
        return
    near = nearest_legal(model, workload, layout)
    hint = f"; nearest legal layout: {near.label(model.is_moe)}" if near else "; no legal layout is near"
    if near and near.label(model.is_moe) == layout.label(model.is_moe):  # only a setting was wrong: its message says
        hint = ""
    if near is None and all(v.code in _NAMES_ITS_FIX for v in bad):  # the degrees keep the setting: no layout near
        hint = ""  # fixes it, and the message already says what does
    if near and near.recompute != layout.recompute:
        hint += f" with recompute {near.recompute}"
    msg = f"layout {layout.label(model.is_moe)} is illegal for {model.name}: " + "; ".join(v.message for v in bad) + hint
    raise IllegalLayout(msg, bad, near)
