"""Layout <-> Megatron-LM / slime command-line arguments.

`layout_args(layout, style)` gives the layout's flags in the order the seed recipes' `run:` blocks use;
`layout_from_args(argv)` reads them back (unknown flags are ignored; the last occurrence wins, as with
argparse, so `--moe-token-dispatcher-type flex` after MODEL_ARGS overrides alltoall).
"""

from __future__ import annotations

import shlex
from typing import Iterable, Literal

from ..catalog.workload import FP4_RECIPES, FP8_RECIPES, precision_of_class, recipe_precision
from ..errors import BadInput
from .core import FLEX_DISPATCHERS, Layout, Recompute
from .setting_args import graphs_of, setting_args
from .splits import layout_vpp, megatron_split, parse_pipeline_layout, pipeline_layout_text, split_flags

__all__ = ["layout_args", "layout_from_args", "format_args", "precision_args", "precision_switches", "fp8_module_args",
           "precision_from_args"]

Style = Literal["slime", "megatron"]


def export_micro_batch(layout: Layout, seq_len: int, global_batch: int | None) -> int:
    """--micro-batch-size for a token-capped layout exported to Megatron: the rows the cap packs, or the largest
    micro-batch below that divides the rows a DP rank gets (Megatron's micro-batch calculator needs it to divide;
    slime's dynamic batching packs the remainder into a smaller last micro-batch instead)."""
    rows = layout.rows_per_microbatch(seq_len)
    if not global_batch or not layout.dp:
        return rows
    per_rank = max(1, global_batch // layout.dp)
    return max(k for k in range(1, min(rows, per_rank) + 1) if per_rank % k == 0)


def layout_args(layout: Layout, style: Style = "slime", seq_len: int = 8192,
                moe: bool = False, global_batch: int | None = None) -> list[tuple[str, str | None]]:
    """Ordered (flag, value) pairs; value None for a switch. `moe`: the model has MoE layers (the attention
    CUDA-graph scope then also captures the router, as Megatron-Bridge's MoE recipes do; the megatron style names
    the dispatcher, whose default there is allgather; a dense model gets no MoE flag). `global_batch`: the megatron
    style's --micro-batch-size for a token cap then divides a DP rank's rows (export_micro_batch)."""
    a: list[tuple[str, str | None]] = [
        ("--tensor-model-parallel-size", str(layout.tp)),
        ("--pipeline-model-parallel-size", str(layout.pp)),
    ]
    split = split_args(layout)
    # a --pipeline-model-parallel-layout string says VPP itself (one '|'-stage per virtual stage): Megatron refuses
    # --num-virtual-stages-per-pipeline-rank beside it (arguments.py: at most one of the two)
    if layout.vpp > 1 and not any(f == "--pipeline-model-parallel-layout" for f, _ in split):
        a.append(("--num-virtual-stages-per-pipeline-rank", str(layout.vpp)))
    a += [
        ("--context-parallel-size", str(layout.cp)),
        ("--expert-model-parallel-size", str(layout.ep)),
        ("--expert-tensor-parallel-size", str(layout.etp)),
    ]
    if layout.sequence_parallel:
        a.append(("--sequence-parallel", None))
    a += split
    rc = layout.recompute
    if rc.granularity != "none":
        a.append(("--recompute-granularity", rc.granularity))
    if rc.granularity == "full":
        a += [("--recompute-method", str(rc.method)), ("--recompute-num-layers", str(rc.num_layers))]
    if rc.granularity == "selective" and rc.modules:
        a.append(("--recompute-modules", " ".join(rc.modules)))
    if layout.max_tokens_per_gpu is not None:
        if style == "slime":
            a += [("--use-dynamic-batch-size", None), ("--max-tokens-per-gpu", str(layout.max_tokens_per_gpu))]
        else:
            a.append(("--micro-batch-size", str(export_micro_batch(layout, seq_len, global_batch))))
    else:
        a.append(("--micro-batch-size", str(layout.micro_batch_size or 1)))
    if layout.distributed_optimizer:
        a.append(("--use-distributed-optimizer", None))
    if layout.fsdp:  # Megatron FSDP saves and loads only its own checkpoint format (arguments.py asserts it)
        a += [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", "optim_grads_params"),
              ("--ckpt-format", "fsdp_dtensor")]
    if layout.precision_aware_optimizer:
        a.append(("--use-precision-aware-optimizer", None))
    if layout.optimizer_offload:
        a += [("--optimizer-cpu-offload", None), ("--optimizer-offload-fraction", f"{layout.optimizer_offload:g}"),
              ("--overlap-cpu-optimizer-d2h-h2d", None)]  # copies overlap the host's Adam step
    if layout.moe_shared_expert_overlap:
        a.append(("--moe-shared-expert-overlap", None))
    if layout.cross_entropy_fusion:
        a += [("--cross-entropy-loss-fusion", None), ("--cross-entropy-fusion-impl", "te")]
    if style == "megatron":
        if layout.overlap_grad_reduce:
            a.append(("--overlap-grad-reduce", None))
        if layout.overlap_param_gather and layout.distributed_optimizer:
            a.append(("--overlap-param-gather", None))
    a += setting_args(layout, moe)
    # a non-default dispatcher always (the rules keep dense models at alltoall); the megatron style names alltoall
    # too for an MoE model (megatron-core's default is allgather), never for a dense one: it has nothing to dispatch
    if (style == "megatron" and moe) or layout.dispatcher != "alltoall":
        flex = layout.dispatcher in FLEX_DISPATCHERS
        a.append(("--moe-token-dispatcher-type", "flex" if flex else layout.dispatcher))
        if layout.dispatcher == "hybridep":  # deepep is megatron-core's default backend (the seed's flex recipe)
            a.append(("--moe-flex-dispatcher-backend", "hybridep"))
    return a


def split_args(layout: Layout) -> list[tuple[str, str | None]]:
    """An uneven layer split in Megatron's words: the account-for / first-last flags where they build it,
    else --pipeline-model-parallel-layout ('E' embedding, 't' decoder layer, 'L' loss, '|' between stages)."""
    ls = layout.layer_split
    if not ls:
        return []
    kw = split_flags(ls, sum(ls), layout.pp, layout.vpp)
    if kw is None:
        return [("--pipeline-model-parallel-layout", pipeline_layout_text(ls))]
    out: list[tuple[str, str | None]] = []
    if kw.get("embedding"):
        out.append(("--account-for-embedding-in-pipeline-split", None))
    if kw.get("loss"):
        out.append(("--account-for-loss-in-pipeline-split", None))
    if kw.get("first"):
        out.append(("--decoder-first-pipeline-num-layers", str(kw["first"])))
    if kw.get("last"):
        out.append(("--decoder-last-pipeline-num-layers", str(kw["last"])))
    return out


def precision_args(precision: str, fp8_param_gather: bool = False) -> list[tuple[str, str | None]]:
    """Megatron's FP8 (or FP4) flags for a workload precision (none for bf16; --bf16 is in MODEL_ARGS)."""
    if precision in FP4_RECIPES:
        fmt, kind = FP4_RECIPES[precision]
        return [("--fp4-format", fmt), ("--fp4-recipe", kind)]
    recipe = FP8_RECIPES.get(precision, "unknown")
    if recipe == "unknown":
        raise BadInput(f"precision {precision!r}: choose one of {', '.join([*FP8_RECIPES, *FP4_RECIPES])}")
    if recipe is None:
        return []
    fmt, kind = recipe
    a: list[tuple[str, str | None]] = [("--fp8-format", fmt), ("--fp8-recipe", kind)]
    if fp8_param_gather:
        a.append(("--fp8-param-gather", None))
    return a


def fp8_module_args(workload) -> list[tuple[str, str | None]]:
    """The flags of the modules a workload moves into FP8 beyond the linears: attention's core
    (--fp8-dot-product-attention) and the output layer under MXFP8 (megatron-core's fp8_output_proj)."""
    a: list[tuple[str, str | None]] = []
    if workload.fp8_attention:
        a.append(("--fp8-dot-product-attention", None))
    if workload.fp8_output_proj:
        a.append(("--fp8-output-proj", None))
    return a


# Megatron's base switch per precision class: FP8 and FP4 train in BF16 around their GEMMs; fp32 has none
_BASE_SWITCH = {"bf16": "--bf16", "fp16": "--fp16", "fp8": "--bf16", "fp4": "--bf16", "fp32": None}


def precision_switches(precision: str, fp8_param_gather: bool = False) -> list[tuple[str, str | None]]:
    """Every Megatron precision flag of a workload precision (mxfp8) or a recipe's precision class (fp8: Megatron's
    default recipe for it): the base switch, then the FP8 / FP4 recipe's flags (precision_args)."""
    cls = recipe_precision(precision)
    if cls not in _BASE_SWITCH:
        choices = dict.fromkeys([*_BASE_SWITCH, *FP8_RECIPES, *FP4_RECIPES])
        raise BadInput(f"precision {precision!r}: choose one of {', '.join(choices)}")
    base = [(_BASE_SWITCH[cls], None)] if _BASE_SWITCH[cls] else []
    return base + (precision_args(precision_of_class(precision), fp8_param_gather) if cls in ("fp8", "fp4") else [])


def precision_from_args(flags: dict) -> tuple[str, bool]:
    """(precision, fp8_param_gather) from parsed flags {flag: value or None}; bf16 without --fp8-format."""
    if "--fp4-format" in flags:
        kind = flags.get("--fp4-recipe") or "nvfp4"  # Megatron's default FP4 recipe
        for name, recipe in FP4_RECIPES.items():
            if recipe[1] == kind:
                return name, False
        raise BadInput(f"--fp4-recipe {kind!r}: not one autotune models; use nvfp4")
    if "--fp8-format" not in flags:
        return "bf16", False
    kind = flags.get("--fp8-recipe") or "delayed"  # Megatron's default recipe
    for name, recipe in FP8_RECIPES.items():
        if recipe is not None and recipe[1] == kind:
            return name, "--fp8-param-gather" in flags
    raise BadInput(f"--fp8-recipe {kind!r}: not one autotune models; use delayed, tensorwise, blockwise or mxfp8")


MULTI_WORD = ("--recompute-modules", "--cuda-graph-scope", "--offload-modules")  # nargs='+': their value is one word per module / scope


def format_args(pairs: Iterable[tuple[str, str | None]]) -> list[str]:
    """The command-line words of (flag, value) pairs: a multi-word flag's value (MULTI_WORD) one word per item."""
    out: list[str] = []
    for flag, value in pairs:
        out.append(flag)
        if value is not None:
            out.extend(value.split(" ") if flag in MULTI_WORD else [value])
    return out


_INT = {
    "--tensor-model-parallel-size": "tp",
    "--pipeline-model-parallel-size": "pp",
    "--num-virtual-stages-per-pipeline-rank": "vpp",
    "--virtual-pipeline-model-parallel-size": "vpp",
    "--context-parallel-size": "cp",
    "--expert-model-parallel-size": "ep",
    "--expert-tensor-parallel-size": "etp",
    "--max-tokens-per-gpu": "max_tokens_per_gpu",
    "--micro-batch-size": "micro_batch_size",
}
_SWITCH = {
    "--sequence-parallel": "sequence_parallel",
    "--use-distributed-optimizer": "distributed_optimizer",
    "--use-precision-aware-optimizer": "precision_aware_optimizer",
    "--moe-shared-expert-overlap": "moe_shared_expert_overlap",
    "--cross-entropy-loss-fusion": "cross_entropy_fusion",
    "--overlap-grad-reduce": "overlap_grad_reduce",
    "--overlap-param-gather": "overlap_param_gather",
    "--use-megatron-fsdp": "fsdp",
    "--overlap-moe-expert-parallel-comm": "ep_overlap",
    "--tp-comm-overlap": "tp_comm_overlap",
}


_SPLIT_SWITCH = {"--account-for-embedding-in-pipeline-split": "embedding",
                 "--account-for-loss-in-pipeline-split": "loss"}
_SPLIT_INT = {"--decoder-first-pipeline-num-layers": "first", "--decoder-last-pipeline-num-layers": "last"}


def layout_from_args(argv: str | list[str], world: int | None = None, num_layers: int | None = None) -> Layout:
    """Read a layout from a command line (a string, e.g. a recipe's run: block, or a token list).
    An uneven layer split's account-for / first-last flags need the model's `num_layers`."""
    if isinstance(argv, str):
        argv = shlex.split(argv.replace("\\\n", " "), comments=True)
    kw: dict = {k: False for k in _SWITCH.values()}
    kw["overlap_grad_reduce"] = kw["overlap_param_gather"] = True
    rc: dict = {}
    split: dict = {}
    graphs: dict = {}
    dynamic = False
    backend = None
    nodes = per_node = None
    offload_modules: tuple = ()
    fine_offload = False
    i = 0
    while i < len(argv):
        tok = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        try:
            if tok in _INT and nxt is not None:
                kw[_INT[tok]] = int(nxt)
                i += 1
            elif tok in _SWITCH:
                kw[_SWITCH[tok]] = True
            elif tok in _SPLIT_SWITCH:
                split[_SPLIT_SWITCH[tok]] = True
            elif tok in _SPLIT_INT and nxt is not None:
                split[_SPLIT_INT[tok]] = int(nxt)
                i += 1
            elif tok == "--pipeline-model-parallel-layout" and nxt is not None:
                split["layout"] = parse_pipeline_layout(nxt)[0]
                i += 1
            elif tok == "--use-dynamic-batch-size":
                dynamic = True
            elif tok == "--moe-token-dispatcher-type" and nxt is not None:
                kw["dispatcher"] = nxt
                i += 1
            elif tok == "--moe-flex-dispatcher-backend" and nxt is not None:
                backend = nxt
                i += 1
            elif tok == "--recompute-granularity" and nxt is not None:
                rc["granularity"] = nxt
                i += 1
            elif tok == "--recompute-method" and nxt is not None:
                rc["method"] = nxt
                i += 1
            elif tok == "--recompute-num-layers" and nxt is not None:
                rc["num_layers"] = int(nxt)
                i += 1
            elif tok == "--recompute-modules":
                mods = []
                while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    mods.append(argv[i + 1])
                    i += 1
                rc["modules"] = tuple(mods)
            elif tok == "--optimizer-offload-fraction" and nxt is not None:
                kw["optimizer_offload"] = float(nxt)
                i += 1
            elif tok == "--moe-expert-capacity-factor" and nxt is not None:
                kw["moe_capacity_factor"] = max(0.0, float(nxt))  # Megatron reads a negative factor as dropless
                i += 1
            elif tok == "--cpu-offloading-num-layers" and nxt is not None:
                kw["activation_offload_layers"] = int(nxt)
                i += 1
            elif tok == "--offload-modules":  # read as set; --fine-grained-activation-offloading switches it on
                mods = []
                while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    mods.append(argv[i + 1])
                    i += 1
                offload_modules = tuple(mods)
            elif tok == "--fine-grained-activation-offloading":
                fine_offload = True
            elif tok == "--cuda-graph-impl" and nxt is not None:
                graphs["impl"] = nxt
                i += 1
            elif tok == "--cuda-graph-scope":
                while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    graphs.setdefault("scope", []).append(argv[i + 1])
                    i += 1
            elif tok == "--actor-num-nodes" and nxt is not None:
                nodes = int(nxt)
                i += 1
            elif tok == "--actor-num-gpus-per-node" and nxt is not None:
                per_node = int(nxt)
                i += 1
        except ValueError:
            raise BadInput(f"argument {tok} {nxt!r}: expected a number") from None
        i += 1
    if world is None:
        if nodes is None or per_node is None:
            raise BadInput("the command line has no --actor-num-nodes/--actor-num-gpus-per-node; pass the GPU count")
        world = nodes * per_node
    if dynamic:
        kw.pop("micro_batch_size", None)
    else:
        kw.pop("max_tokens_per_gpu", None)
    kw["cuda_graphs"] = graphs_of(graphs)
    if fine_offload:  # megatron-core asserts modules when it is on; without it --offload-modules does nothing
        if not offload_modules:
            raise BadInput("--fine-grained-activation-offloading without --offload-modules: name the modules whose "
                           "inputs go to host memory (e.g. --offload-modules core_attn attn_proj)")
        kw["offload_modules"] = offload_modules
    if backend not in (None, "deepep", "hybridep"):
        raise BadInput(f"--moe-flex-dispatcher-backend {backend!r}: choose deepep or hybridep")
    if kw.get("dispatcher") == "flex" and backend == "hybridep":
        kw["dispatcher"] = "hybridep"
    if "layout" in split:
        kw["layer_split"] = split.pop("layout")
        try:
            kw["vpp"] = layout_vpp(len(kw["layer_split"]), kw.get("pp", 1), kw.get("vpp"))
        except BadInput as exc:
            raise BadInput(f"--pipeline-model-parallel-layout: {exc}") from None
    if split:
        if num_layers is None:
            raise BadInput(f"{', '.join('--' + k for k in split)}: reading an uneven layer split needs the model's "
                           "layer count; pass the model")
        kw["layer_split"] = megatron_split(num_layers, kw.get("pp", 1), kw.get("vpp", 1), **split)
    return Layout(world=world, recompute=Recompute(**rc) if rc else Recompute(), **kw)
