"""Layout: the one object that knows the parallel degrees of a training run.

It holds what the user or a planner chooses (TP, PP, VPP, CP, EP, ETP, recompute, dispatcher, batching,
optimizer options) and derives the rest (DP, expert-DP, effective sequence parallel). Nothing else in
autotune multiplies degrees. The seed's label form ("TP1 PP4 EP8 DP8") parses and prints here; the
Megatron/slime argument mapping is in `args.py`; the legality rules in `rules.py`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from ..errors import BadInput

__all__ = ["Layout", "Recompute", "DISPATCHERS", "FLEX_DISPATCHERS", "dispatcher_config", "SELECTIVE_MODULES", "CUDA_GRAPHS",
           "OFFLOAD_MODULES", "MOE_OFFLOAD_MODULES"]

# flex is Megatron's flex dispatcher on its DeepEP backend; hybridep the same dispatcher on its HybridEP backend
# (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep | hybridep)
DISPATCHERS = ("alltoall", "allgather", "flex", "hybridep")
FLEX_DISPATCHERS = ("flex", "hybridep")
# CUDA graph capture: none; router (--cuda-graph-scope moe_router moe_preprocess); attn (attention too, or the
# whole dense layer); full (--cuda-graph-impl local --cuda-graph-scope full_iteration: the whole step)
CUDA_GRAPHS = ("none", "router", "attn", "full")


def dispatcher_config(dispatcher: str) -> dict:
    """megatron-core TransformerConfig fields of a dispatcher name (flex runs on a backend: DeepEP or HybridEP)."""
    if dispatcher == "flex":
        return {"moe_token_dispatcher_type": "flex", "moe_enable_deepep": True, "moe_flex_dispatcher_backend": "deepep"}
    if dispatcher == "hybridep":
        return {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"}
    return {"moe_token_dispatcher_type": dispatcher}


GRANULARITIES = ("none", "selective", "full")
METHODS = ("uniform", "block")
# (mhc: megatron-core's hyper-connections' intermediates, models with residual streams: DeepSeek-V4; later releases
# than slime's pin, as that model's attention is)
SELECTIVE_MODULES = ("core_attn", "layernorm", "moe_act", "mlp", "moe", "shared_experts", "mla_up_proj", "mhc")
# megatron-core's fine-grained activation offloading (--fine-grained-activation-offloading --offload-modules ...):
# the submodules whose input activation goes to host memory in forward and comes back before backward
# (TransformerConfig.offload_modules at Megatron-LM 1dcf0daf, slime's pin; later releases add "fused_group_mlp", which
# needs the TE op fuser the pin lacks, and "gdp_qkv", a mixer no catalog model has)
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
MOE_OFFLOAD_MODULES = ("expert_fc1", "moe_act")


@dataclass(frozen=True)
class Recompute:
    """Activation recomputation, as Megatron's --recompute-* arguments."""

    granularity: Literal["none", "selective", "full"] = "none"
    method: Literal["uniform", "block"] | None = None  # full only
    num_layers: int | None = None  # full only: layers per uniform chunk, or first N layers (block)
    modules: tuple[str, ...] = ()  # selective only; empty means Megatron's default (core_attn)

    def __post_init__(self):
        if self.granularity not in GRANULARITIES:
            raise BadInput(f"recompute granularity {self.granularity!r}: choose one of {', '.join(GRANULARITIES)}")
        if self.granularity == "full":
            if self.method not in METHODS:
                raise BadInput(f"full recompute method {self.method!r}: choose uniform or block (e.g. full:uniform:1)")
            if not self.num_layers or self.num_layers < 1:
                raise BadInput(f"full recompute needs num_layers >= 1, got {self.num_layers} (e.g. full:uniform:2)")
        bad = [m for m in self.modules if m not in SELECTIVE_MODULES]
        if bad:
            raise BadInput(f"selective recompute module(s) {bad}: choose from {', '.join(SELECTIVE_MODULES)}")

    @classmethod
    def parse(cls, text: str | None) -> "Recompute":
        """'none', 'selective', 'selective:core_attn,moe_act', 'full:uniform:2', 'full:block:4'. None is 'none';
        an empty or blank string is refused (a user's `--recompute ''` is a mistake, not a choice)."""
        if text is None or text == "none":
            return cls()
        if not text.strip():
            raise BadInput(f"--recompute {text!r}: empty; use none, selective[:modules], or full:uniform|block:N "
                           "(e.g. full:uniform:2)")
        parts = text.split(":")
        if parts[0] == "selective":
            mods = tuple(m for m in (parts[1].split(",") if len(parts) > 1 else []) if m)
            # 'selective:' names no module (plain 'selective' is the default, core_attn); a second ':' is a typo
            if len(parts) > 2 or (len(parts) == 2 and not mods):
                raise BadInput(f"--recompute {text!r}: give comma-separated modules after 'selective:' (e.g. "
                               f"selective:core_attn,moe_act; choose from {', '.join(SELECTIVE_MODULES)}), or "
                               "plain 'selective' for core_attn")
            try:
                return cls("selective", modules=mods)
            except BadInput as exc:
                raise BadInput(f"--recompute {text!r}: {exc}") from None
        if parts[0] == "full" and len(parts) == 3 and parts[2].isdigit():
            try:
                return cls("full", parts[1], int(parts[2]))  # type: ignore[arg-type]
            except BadInput as exc:
                raise BadInput(f"--recompute {text!r}: {exc}") from None
        raise BadInput(
            f"--recompute {text!r}: use none, selective[:modules], or full:uniform|block:N (e.g. full:uniform:2)"
        )

    def __str__(self) -> str:
        if self.granularity == "full":
            return f"full:{self.method}:{self.num_layers}"
        if self.granularity == "selective":
            return "selective" + (":" + ",".join(self.modules) if self.modules else "")
        return "none"

    def describe(self) -> str:
        if self.granularity == "full":
            n = self.num_layers
            return f"full recompute ({self.method}, {n} layer{'s' if n != 1 else ''})"
        if self.granularity == "selective":
            return f"selective recompute ({', '.join(self.modules) or 'core_attn'})"
        return "no recompute"


_DEGREE = r"(VPP|ETP|TP|PP|CP|EP|DP)(\d+)"  # VPP and ETP before PP and TP / EP: the longest name first
_SPACED = re.compile(r"\b(VPP|ETP|TP|PP|CP|EP|DP)\s*[=:]?\s*(\d+)\b", re.IGNORECASE)  # a name, then its value
_LABEL = re.compile(rf"^(?:{_DEGREE})+$", re.IGNORECASE)  # one token: a degree, or several run together (TP1PP4)


@dataclass(frozen=True)
class Layout:
    """A parallel layout for `world` GPUs. DP and expert-DP are derived, never stored."""

    world: int
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    sequence_parallel: bool = True  # requested; effective only when TP > 1 (see `sp`)
    recompute: Recompute = field(default_factory=Recompute)
    dispatcher: Literal["alltoall", "allgather", "flex", "hybridep"] = "alltoall"
    max_tokens_per_gpu: int | None = None  # dynamic batching (slime --max-tokens-per-gpu)
    micro_batch_size: int | None = None  # rows per micro-batch when not dynamic
    distributed_optimizer: bool = True
    precision_aware_optimizer: bool = False
    optimizer_offload: float = 0.0  # fraction of optimizer state on the host
    moe_shared_expert_overlap: bool = False
    cross_entropy_fusion: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    # decoder layers per virtual pipeline stage in layer order (virtual stage k is chunk k // PP of stage
    # k % PP); () = Megatron's even split. Built by splits.megatron_split from its flags, or any split
    # --pipeline-model-parallel-layout can write (a stage may hold only the embedding or the loss)
    layer_split: tuple[int, ...] = ()
    # Megatron FSDP (--use-megatron-fsdp, sharding optim_grads_params): parameters and gradients sharded over
    # DP (experts over expert-DP) besides the optimizer state, parameters all-gathered layer by layer
    fsdp: bool = False
    # --overlap-moe-expert-parallel-comm (with --delay-wgrad-compute): the 1F1B schedule runs one micro-batch's
    # dispatch and combine while another micro-batch's attention and experts compute
    ep_overlap: bool = False
    # --tp-comm-overlap: TE userbuffers split the sequence-parallel all-gather / reduce-scatter into chunks that
    # run under the GEMMs they feed. Requested; effective only with TP > 1 and sequence parallel (as `sp`)
    tp_comm_overlap: bool = False
    cuda_graphs: Literal["none", "router", "attn", "full"] = "none"
    # token dropping: each expert takes at most capacity_factor x its even share of the routed tokens, padded to
    # exactly that (--moe-expert-capacity-factor, --moe-pad-expert-input-to-capacity); 0 = dropless
    moe_capacity_factor: float = 0.0
    # --cpu-offloading-num-layers: the saved activations of this many layers per pipeline chunk go to host memory
    # in the forward pass and come back for the backward
    activation_offload_layers: int = 0
    # --fine-grained-activation-offloading --offload-modules ...: these submodules' input activations go to host
    # memory (OFFLOAD_MODULES), on every layer that has them; () = off
    offload_modules: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("world", "tp", "pp", "vpp", "cp", "ep", "etp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise BadInput(f"{name.upper()} {v!r}: parallel degrees are positive integers")
        if self.dispatcher not in DISPATCHERS:
            raise BadInput(f"--dispatcher {self.dispatcher!r}: choose one of {', '.join(DISPATCHERS)}")
        if self.max_tokens_per_gpu is not None and self.micro_batch_size is not None:
            raise BadInput("set either --max-tokens-per-gpu (dynamic batching) or --micro-batch-size, not both")
        if self.max_tokens_per_gpu is not None and self.max_tokens_per_gpu < 1:
            raise BadInput(f"--max-tokens-per-gpu {self.max_tokens_per_gpu}: must be positive")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise BadInput(f"--micro-batch-size {self.micro_batch_size}: must be positive")
        if not 0.0 <= self.optimizer_offload <= 1.0:
            raise BadInput(f"optimizer offload fraction {self.optimizer_offload}: must be within [0, 1]")
        if self.cuda_graphs not in CUDA_GRAPHS:
            raise BadInput(f"--cuda-graphs {self.cuda_graphs!r}: choose one of {', '.join(CUDA_GRAPHS)}")
        if not (self.moe_capacity_factor == 0 or 0.5 <= self.moe_capacity_factor <= 8):
            raise BadInput(f"--capacity-factor {self.moe_capacity_factor:g}: give 0 (dropless) or a factor in "
                           "[0.5, 8] (e.g. 1.0 or 1.25)")
        if isinstance(self.activation_offload_layers, bool) or not isinstance(self.activation_offload_layers, int) \
                or self.activation_offload_layers < 0:
            raise BadInput(f"--activation-offload-layers {self.activation_offload_layers!r}: give a layer count >= 0")
        mods = (self.offload_modules.replace(",", " ").split() if isinstance(self.offload_modules, str)
                else list(self.offload_modules))
        bad = [m for m in mods if m not in OFFLOAD_MODULES]
        if bad:
            raise BadInput(f"--offload-modules {' '.join(map(str, bad))}: choose among {', '.join(OFFLOAD_MODULES)}")
        object.__setattr__(self, "offload_modules", tuple(m for m in OFFLOAD_MODULES if m in mods))
        object.__setattr__(self, "layer_split", tuple(int(x) for x in self.layer_split))
        if self.layer_split and (len(self.layer_split) != self.pp * self.vpp or min(self.layer_split) < 0):
            from .splits import split_text

            raise BadInput(f"layer split {split_text(self.layer_split)} ({len(self.layer_split)} stages): give PP x VPP "
                           f"= {self.pp * self.vpp} non-negative layer counts (one per virtual pipeline stage)")
        if len(set(self.layer_split)) == 1:  # every stage the same: Megatron's even split, which takes no flags
            object.__setattr__(self, "layer_split", ())

    # --- derived degrees -------------------------------------------------------------------------
    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        return self.world // self.model_parallel if self.world % self.model_parallel == 0 else 0

    @property
    def expert_dp(self) -> int:
        g = self.ep * self.etp * self.pp
        return self.world // g if self.world % g == 0 else 0

    @property
    def sp(self) -> bool:
        """Sequence parallel as Megatron applies it: only with TP > 1."""
        return self.sequence_parallel and self.tp > 1

    @property
    def tp_overlap(self) -> bool:
        """TP communication overlap as it takes effect: userbuffers need TP > 1 and sequence parallel."""
        return self.tp_comm_overlap and self.sp

    def rows_per_microbatch(self, seq_len: int) -> int:
        if self.max_tokens_per_gpu is not None:
            return max(1, self.max_tokens_per_gpu // max(1, seq_len // self.cp))
        return self.micro_batch_size or 1

    def num_microbatches(self, global_batch: int, seq_len: int) -> int:
        """Micro-batches per DP rank per step (what sets the pipeline schedule)."""
        rows = global_batch // max(1, self.dp)
        return max(1, -(-rows // self.rows_per_microbatch(seq_len)))

    # --- label -----------------------------------------------------------------------------------
    def label(self, moe: bool = True) -> str:
        """The seed's label: 'TP1 PP4 EP8 DP8' (VPP, CP, ETP appear when above 1; EP for MoE models)."""
        parts = [f"TP{self.tp}", f"PP{self.pp}"]
        if self.vpp > 1:
            parts.append(f"VPP{self.vpp}")
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        if moe or self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.etp > 1:
            parts.append(f"ETP{self.etp}")
        if self.dp > 0:  # 0: TP x PP x CP does not divide the world (the rules say so), no DP to show
            parts.append(f"DP{self.dp}")
        return " ".join(parts)

    def __str__(self) -> str:
        return self.label()

    @classmethod
    def parse(cls, label: str, world: int | None = None, **options) -> "Layout":
        """Parse 'TP1 PP4 EP8 DP8' (any order; commas, dashes or underscores between degrees, or none: 'TP1PP4EP8',
        'tp1-pp4-ep8' as recipe names write it; 'TP=1 PP=4', 'tp:1' and 'TP 1' as configs and prose write it). DP, if
        given, must match the world size."""
        degrees: dict[str, int] = {}
        joined = re.sub(_SPACED, r"\1\2", label.strip())  # 'TP = 2' -> 'TP2'
        for token in re.split(r"[\s,;_-]+", joined):
            if not token:
                continue
            if not _LABEL.match(token):
                raise BadInput(
                    f"layout {label!r}: cannot read {token!r}; write degrees like 'TP1 PP4 EP8 DP8' "
                    "(TP, PP, VPP, CP, EP, ETP, DP)"
                )
            for name, value in re.findall(_DEGREE, token, re.IGNORECASE):
                key = name.lower()
                if key in degrees:
                    raise BadInput(f"layout {label!r}: {key.upper()} given twice ({key.upper()}{degrees[key]} and "
                                   f"{key.upper()}{value}); give each degree once")
                degrees[key] = int(value)
                if degrees[key] < 1:
                    raise BadInput(f"layout {label!r}: {key.upper()} must be at least 1")
        dp = degrees.pop("dp", None)
        mp = degrees.get("tp", 1) * degrees.get("pp", 1) * degrees.get("cp", 1)
        if world is not None and world < 1:  # no DP or count to suggest from a count below one GPU
            raise BadInput(f"layout {label!r}: the GPU count {world} must be at least 1")
        if world is None:
            if dp is None:
                raise BadInput(f"layout {label!r}: give DP or the GPU count (--count) so DP can be derived")
            world = mp * dp
        elif dp is not None and mp * dp != world:
            # a DP to suggest only when one exists: TP x PP x CP must divide the GPU count
            way = f"use DP{world // mp} or --count {mp * dp}" if world % mp == 0 else (
                f"use --count {mp * dp}, or degrees whose TP x PP x CP ({mp}) divides {world}")
            raise BadInput(f"layout {label!r} uses TP x PP x CP x DP = {mp * dp} GPUs but --count is {world}; {way}")
        return cls(world=world, **degrees, **options)

    def with_(self, **changes) -> "Layout":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layer_split"] = list(self.layer_split)
        d["recompute"] = asdict(self.recompute)
        d["recompute"]["modules"] = list(self.recompute.modules)
        d.update(dp=self.dp, expert_dp=self.expert_dp, label=self.label())
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Layout":
        d = {k: v for k, v in d.items() if k not in ("dp", "expert_dp", "label")}
        rc = d.pop("recompute", None) or {}
        if isinstance(rc, dict):
            rc = Recompute(**{**rc, "modules": tuple(rc.get("modules") or ())})
        if "layer_split" in d:
            d["layer_split"] = tuple(d["layer_split"] or ())
        return cls(recompute=rc, **d)

    def summary(self, seq_len: int = 8192, moe: bool = True) -> str:
        """A one-line description in the seed's words (a dense model's without the token dispatcher: it has none)."""
        bits = [f"TP {self.tp}, PP {self.pp}" + (f", VPP {self.vpp}" if self.vpp > 1 else "")]
        bits[0] += f", CP {self.cp}, EP {self.ep}, ETP {self.etp}, DP {self.dp}"
        if self.layer_split:
            from .splits import split_text

            bits.append(f"uneven layer split {split_text(self.layer_split)} (decoder layers per virtual stage)")
        if self.max_tokens_per_gpu:
            bits.append(f"max {self.max_tokens_per_gpu:,} tokens/GPU")
        else:
            bits.append(f"{self.micro_batch_size or 1} row(s) per micro-batch")
        bits.append(self.recompute.describe())
        if self.distributed_optimizer:
            bits.append(("precision-aware " if self.precision_aware_optimizer else "") + "distributed optimizer")
        if self.fsdp:  # changes memory and DP traffic: a summary that left it out would misdescribe the run
            bits.append("Megatron FSDP (parameters, gradients and optimizer state sharded over DP)")
        name = {"hybridep": "flex (HybridEP)"}.get(self.dispatcher, self.dispatcher)
        if moe:
            bits.append(f"{name} dispatcher" + (" with shared-expert overlap" if self.moe_shared_expert_overlap else ""))
        if self.optimizer_offload:
            bits.append(f"optimizer offload {self.optimizer_offload:.0%}")
        extras = [("EP communication overlap", self.ep_overlap), ("TP communication overlap", self.tp_overlap),
                  (f"CUDA graphs ({self.cuda_graphs}" + (", paged stash" if moe and self.cuda_graphs == "full"
                                                         and not self.moe_capacity_factor else "") + ")",
                   self.cuda_graphs != "none"),
                  (f"token drop at capacity factor {self.moe_capacity_factor:g}", self.moe_capacity_factor > 0),
                  (f"activations of {self.activation_offload_layers} layer(s) per chunk offloaded",
                   self.activation_offload_layers > 0),
                  (f"inputs of {', '.join(self.offload_modules)} offloaded to host memory", bool(self.offload_modules))]
        bits += [text for text, on in extras if on]
        return "; ".join(bits)
