"""Options and lookups shared by estimate, space and search: one place that turns flags into specs, and
the reusable range checks every command applies to its numbers, names and paths (one-line BadInput)."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import typer

from ..catalog import ClusterSpec, ModelSpec, Workload, load_model
from ..catalog.hardware import MAX_GPUS
from ..catalog.workload import MAX_ROWS
from ..errors import BadInput, Unwritable
from ..layout import Layout, Recompute

__all__ = ["ModelOpt", "GpuOpt", "CountOpt", "PerNodeOpt", "SeqOpt", "BatchOpt", "GradsOpt", "PrecisionOpt",
           "RoutingOpt", "ROUTINGS", "JsonOpt", "resolve", "rows_defaults",
           "recipe_inputs", "positive_int", "non_negative_int", "finite_positive", "finite_non_negative", "fraction",
           "input_file", "output_dir", "output_file", "regular_target"]


def _num(name: str, value, kind: str):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInput(f"{name} {value!r}: must be {kind}")
    return value


def positive_int(name: str, value, upper: int | None = None):
    """`value` unchanged if it is an integer >= 1 (and <= upper); None passes (an unset option)."""
    if value is None:
        return None
    if not isinstance(_num(name, value, "a positive integer"), int) or value < 1:
        raise BadInput(f"{name} {value!r}: must be a positive integer (1 or more)")
    if upper is not None and value > upper:
        raise BadInput(f"{name} {value:,}: more than the largest accepted, {upper:,}")
    return value


def non_negative_int(name: str, value, upper: int | None = 2**32 - 1):
    """An integer >= 0 (seeds, counts that may be zero); None passes."""
    if value is None:
        return None
    if not isinstance(_num(name, value, "a non-negative integer"), int) or value < 0:
        raise BadInput(f"{name} {value!r}: must be a non-negative integer (0 or more)")
    if upper is not None and value > upper:
        raise BadInput(f"{name} {value:,}: more than the largest accepted, {upper:,}")
    return value


def finite_positive(name: str, value):
    """A finite number > 0; None passes."""
    if value is None:
        return None
    if not math.isfinite(_num(name, value, "a finite positive number")) or value <= 0:
        raise BadInput(f"{name} {value!r}: must be a finite number above 0")
    return value


def finite_non_negative(name: str, value):
    """A finite number >= 0; None passes."""
    if value is None:
        return None
    if not math.isfinite(_num(name, value, "a finite number")) or value < 0:
        raise BadInput(f"{name} {value!r}: must be a finite number, 0 or more")
    return value


def fraction(name: str, value, lo: float = 0.0, hi: float = 1.0):
    """A finite number in [lo, hi]; None passes."""
    if value is None:
        return None
    if not math.isfinite(_num(name, value, "a number")) or not lo <= value <= hi:
        raise BadInput(f"{name} {value!r}: must be between {lo:g} and {hi:g}")
    return value


def input_file(name: str, path) -> Path:
    """An existing, readable regular file."""
    p = Path(path)
    if p.is_dir():
        raise BadInput(f"{name} {str(p)!r} is a directory; give a file")
    if not p.is_file():
        raise BadInput(f"{name} {str(p)!r} does not exist; check the path")
    if not os.access(p, os.R_OK):
        raise BadInput(f"{name} {str(p)!r} is not readable; check its permissions")
    return p


def output_dir(name: str, path) -> Path:
    """A directory that exists or can be created, and is writable: the nearest existing ancestor decides."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise BadInput(f"{name} {str(p)!r} is a file, not a directory; choose another path")
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise BadInput(f"{name} {str(p)!r}: {str(probe)!r} is a file, so the directory cannot be made; choose another path")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise BadInput(f"{name} {str(p)!r}: {str(probe)!r} is not writable; choose a writable location")
    return p


def regular_target(name: str, path, stdout: bool = False) -> Path:
    """The file a write to `path` lands in (fsutil.write_target: `path`, or the regular file a symlink there
    resolves to; the write goes through it and the link stays), refused as the option's one-line BadInput when it
    is a device (/dev/null), a FIFO, a socket or a link to nothing; a folder is returned for the callers' own
    message. `stdout`: the command prints to stdout without this option, so the message offers that."""
    import errno as _errno

    from ..fsutil import write_target

    try:
        return write_target(path, follow=True)
    except Unwritable as exc:
        if exc.errno == _errno.EISDIR:
            return Path(path)
        if exc.problem is None:  # the link's target could not be looked at: fsutil's message has its own way out
            raise BadInput(f"{name}: {exc}") from None
        way_out = f"give a file path, or leave {name} out to print on stdout" if stdout else "give a file path"
        raise BadInput(f"{name} {exc.problem}; {way_out}") from None  # '<path>: it is a FIFO, not a regular file'


def output_file(name: str, path, new_folders: bool = False, stdout: bool | None = None) -> Path:
    """A file path whose directory exists (or, with new_folders, can be created) and is writable; not a directory.
    A missing folder in a path the user typed is more likely a typo than a wish for new folders.

    An existing path must be a regular file, or a symlink to one (see regular_target: its folder is then the
    target's). `stdout` (default: for --out) says the command prints to stdout without this option."""
    p = Path(path)
    if p.is_dir():
        raise BadInput(f"{name} {str(p)!r} is a directory; give a file name")
    target = regular_target(name, p, name == "--out" if stdout is None else stdout)
    link = target != p
    p = target if link else p
    folder = p.parent if str(p.parent) else Path(".")
    if not new_folders and not folder.exists() and not folder.is_symlink():
        raise BadInput(f"{name} {str(p)!r}: folder {str(folder)!r} does not exist; create it first "
                       f"(mkdir -p {folder}) or choose another path")
    output_dir(name, folder)
    return target if link else Path(path)

ModelOpt = typer.Option(..., "--model", "-m", help="Catalog name (see `autotune models`) or a path to a config.json.")
GpuOpt = typer.Option(..., "--gpu", "-g", help="GPU kind (H100, H200, H800, B200, B300, GB200, GB300, cpu; see "
                      "`autotune gpus`) or a GPU file path.yaml/.json.")
CountOpt = typer.Option(..., "--count", "-n", help="Number of GPUs (the world size).")
PerNodeOpt = typer.Option(None, "--gpus-per-node", help="GPUs per node (default: the GPU kind's, 8 for H100/H200/B200).")
SpaceOpt = typer.Option(None, "--space", help="A search-space YAML (default: search_spaces/default.yaml merged "
                        "with the model's override; `autotune space` shows what it keeps).")
SEQ_LEN, GLOBAL_BATCH = 8192, 128  # the seed's rows: the defaults on GPUs
# on `--gpu cpu` (this machine, gloo) the seed's rows take minutes a step without Transformer Engine's fused
# attention (tiny-moe on 2 CPU ranks: ~280 s predicted); these keep a real trial of tiny-moe to a few minutes
CPU_SEQ_LEN, CPU_GLOBAL_BATCH = 2048, 16
SeqOpt = typer.Option(None, "--seq-len", show_default=False,
                      help=f"Tokens per training row (default {SEQ_LEN:,}, the seed's; {CPU_SEQ_LEN:,} with --gpu cpu; "
                           "a model's learned positions when fewer).")
BatchOpt = typer.Option(None, "--global-batch", show_default=False,
                        help=f"Rows per optimizer step (default {GLOBAL_BATCH}, the seed's; {CPU_GLOBAL_BATCH} with "
                             "--gpu cpu; for space and search, when no data-parallel size the GPU count leaves divides "
                             "the default, e.g. 72 GPUs, the smallest one that does, with a note).")
GradsOpt = typer.Option("fp32", "--grads", help="Gradient buffers and their DP reduction: fp32 "
                        "(--accumulate-allreduce-grads-in-fp32, the seed) or bf16 (Megatron's default: half the "
                        "gradient memory and DP traffic).")
PrecisionOpt = typer.Option("bf16", "--precision", help="bf16, or a Transformer Engine low-precision recipe: "
                            "fp8-delayed, fp8-tensorwise (per-tensor current scaling), fp8-blockwise, mxfp8 (Blackwell), "
                            "nvfp4 (Blackwell: FP4 linears, attention and the output layer in BF16).")
JsonOpt = typer.Option(False, "--json", help="Print one JSON object instead of tables.")
# how an MoE model's router spreads tokens over the experts during the run (the hottest expert rank's load): the
# seed's SFT trains with the load-balancing loss off; pretraining usually keeps it on; published MoE benchmarks force
# an even spread, which replaces the router's choice (a benchmark setting, not a training one)
ROUTINGS = ("natural", "aux-loss", "forced")
RoutingOpt = typer.Option("natural", "--routing", help="MoE routing during the run: natural (the load-balancing "
                          "loss off, as the seed's SFT), aux-loss (Megatron's load-balancing loss on, as pretraining "
                          "runs it: a less loaded hottest expert rank) or forced (--moe-router-force-load-balancing: "
                          "even routing, as published MoE benchmarks run; not for training).")
# software the cluster lacks: each removes what needs it from the space (a missing DeepEP takes HybridEP with it)
NoDeepEPOpt = typer.Option(False, "--no-deepep", help="The cluster lacks DeepEP: no flex or hybridep dispatcher.")
NoHybridEPOpt = typer.Option(False, "--no-hybridep", help="The cluster's DeepEP lacks HybridEP (its hybrid-ep "
                             "branch): no hybridep dispatcher.")
# modules a low-precision recipe moves into FP8 beyond the linears (Workload.fp8_attention, fp8_output_proj)
Fp8AttentionOpt = typer.Option(False, "--fp8-attention", help="Attention's core in FP8 (Megatron "
                               "--fp8-dot-product-attention, cuDNN's FP8 fused attention; FP8 precisions only): its "
                               "matrix products at the FP8 rate.")
Fp8OutputProjOpt = typer.Option(False, "--fp8-output-proj", help="The output layer under MXFP8 (megatron-core's "
                                "fp8_output_proj; --precision mxfp8 only).")
NoTEOpt = typer.Option(False, "--no-te", help="The cluster lacks Transformer Engine: no precision-aware optimizer, "
                       "no context parallelism.")


def missing_software(no_deepep: bool, no_hybridep: bool, no_te: bool) -> dict[str, bool]:
    """ClusterSpec keyword arguments for --no-deepep / --no-hybridep / --no-te."""
    return {k: False for k, off in (("has_deepep", no_deepep), ("has_hybridep", no_hybridep), ("has_te", no_te))
            if off}


def rows_defaults(gpu: str | None, seq_len: int | None, global_batch: int | None) -> tuple[int, int, str | None]:
    """--seq-len and --global-batch where not given: the seed's on a GPU, CPU-sized on `--gpu cpu` (with a note
    saying so)."""
    on_cpu = isinstance(gpu, str) and gpu.strip().lower() == "cpu"
    seq = seq_len if seq_len is not None else (CPU_SEQ_LEN if on_cpu else SEQ_LEN)
    batch = global_batch if global_batch is not None else (CPU_GLOBAL_BATCH if on_cpu else GLOBAL_BATCH)
    chosen = [f"{flag} {v}" for flag, given, v in (("--seq-len", seq_len, seq), ("--global-batch", global_batch, batch))
              if given is None]
    note = (f"--gpu cpu: {' and '.join(chosen)} by default (the seed's {SEQ_LEN} x {GLOBAL_BATCH} rows take minutes a "
            "step on a CPU); give them to change it") if on_cpu and chosen else None
    return seq, batch, note


def default_batch_retry(res, workload: Workload, given: int | None, count: int) -> tuple[Workload, str] | None:
    """(the workload at another global batch, the note that says so) when --global-batch was not given and no layout
    survived only because the default batch divides over none of the DP sizes the GPU count leaves (72 GPUs: DP 3, 9,
    ...; space.batch_fallback); None otherwise. A batch the user gave is never changed."""
    from ..space import batch_fallback

    new = batch_fallback(res, workload) if given is None else None
    if new is None:
        return None
    d = res.blocked_dp
    return (dataclasses.replace(workload, global_batch=new),
            f"--global-batch {new} by default: the default {workload.global_batch} rows divide over none of the "
            f"data-parallel sizes {count:,} GPUs leave (the smallest is {d}); {new} = {d} x {new // d} rows do. Give "
            "--global-batch to choose another")


def resolve(model: str, gpu: str, count: int, gpus_per_node: int | None, seq_len: int | None,
            global_batch: int | None, grads: str = "fp32", precision: str = "bf16", fp8_param_gather: bool = False,
            notes: list[str] | None = None, routing: str = "natural", fp8_attention: bool = False,
            fp8_output_proj: bool = False, **cluster_kw) -> tuple[ModelSpec, ClusterSpec, Workload]:
    """Model, cluster and workload of a command's options, checked; `notes` (when given) gets a line for any
    default that depends on the GPU, or for a --routing a dense model has nothing to apply to."""
    given_seq = seq_len
    seq_len, global_batch, note = rows_defaults(gpu, seq_len, global_batch)
    if note and notes is not None:
        notes.append(note)
    if grads not in ("fp32", "bf16"):
        raise BadInput(f"--grads {grads!r}: choose fp32 (the seed) or bf16")
    if routing not in ROUTINGS:
        raise BadInput(f"--routing {routing!r}: choose {', '.join(ROUTINGS)}")
    positive_int("--count", count, MAX_GPUS)
    positive_int("--gpus-per-node", gpus_per_node, 1024)  # 0 must not mean "the GPU kind's default"
    positive_int("--seq-len", seq_len, MAX_ROWS)
    positive_int("--global-batch", global_batch, MAX_ROWS)
    m = load_model(model)
    if given_seq is None and m.learned_positions and seq_len > m.learned_positions:
        # the default rows are longer than the model's position table (GPT-3-style models): its longest, said so;
        # a --seq-len given past it stays an error (Workload.check_model)
        seq_len = m.learned_positions
        if notes is not None:
            notes.append(f"--seq-len {seq_len} by default: {m.name} has learned position embeddings for "
                         f"{seq_len:,} positions only (the seed's {SEQ_LEN:,}-token rows would not fit them)")
    cluster = ClusterSpec.of(gpu, count, gpus_per_node, **cluster_kw)
    if routing != "natural" and not m.is_moe and notes is not None:
        notes.append(f"--routing {routing}: {m.name} has no experts, so routing changes nothing")
    if routing == "natural" and m.is_moe and m.moe.router_bias and m.moe.sigmoid_router and notes is not None:
        # DeepSeek's e_score_correction_bias (noaux_tc), Kimi's, GLM-4.5's, Nemotron-H's: a bias pretraining moves to
        # even the experts' load (gpt-oss's is a learned linear bias on a softmax router, not that)
        notes.append(f"{m.name}'s router balances its experts with a bias that pretraining updates (aux-loss-free "
                     "balancing); if your run updates it, --routing aux-loss estimates the busiest expert rank more "
                     "closely than the default natural routing")
    if notes is not None:
        from ..cost._sources import unpriced_note

        if unpriced_note(m.name):
            notes.append(unpriced_note(m.name))
    workload = Workload(seq_len=seq_len, global_batch=global_batch, grads_fp32=grads == "fp32", precision=precision,
                        fp8_param_gather=fp8_param_gather, fp8_attention=fp8_attention,
                        fp8_output_proj=fp8_output_proj, load_balancing_loss=m.is_moe and routing == "aux-loss",
                        force_balance=m.is_moe and routing == "forced")
    workload.check_gpu(cluster.gpu)
    workload.check_model(m)
    return m, cluster, workload


def recipe_inputs(path: str) -> tuple[dict, ModelSpec, ClusterSpec, Workload, Layout]:
    """Model, cluster, workload and layout of a recipe file (validated; layout read from its run: block)."""
    from ..errors import UnknownName
    from ..recipes.convert import cluster_of, model_of, run_layout, workload_of
    from ..recipes.io import load_recipe

    input_file("--recipe", path)
    recipe = load_recipe(path)
    model = model_of(recipe)
    if model is None:
        raise UnknownName(f"recipe {path!r}: model {recipe.model!r} is not in the catalog; see `autotune models`")
    try:
        cluster = cluster_of(recipe)
    except UnknownName:  # a recipe of a search on a GPU file: the recipe names the GPU, not the file
        raise UnknownName(f"recipe {path!r}: GPU {recipe.gpu.type!r} is not in the catalog (a GPU file's?); estimate "
                          f"its layout with --model, --gpu FILE.yaml, --count and --layout instead") from None
    doc = recipe.model_dump(mode="json")
    workload = workload_of(recipe)
    workload.check_model(model)
    return doc, model, cluster, workload, run_layout(recipe)


def layout_options(layout: str, count: int, recompute: str | None, dispatcher: str, max_tokens: int | None,
                   micro_batch: int | None, seq_len: int, **flags) -> Layout:
    if not layout or not layout.strip():  # an empty label must not read as TP1 PP1 ... DP<count>
        raise BadInput(f"--layout {layout!r}: give degrees like 'TP1 PP4 EP8 DP8'")
    positive_int("--max-tokens-per-gpu", max_tokens, 2**26)
    positive_int("--micro-batch-size", micro_batch, 2**20)
    if "optimizer_offload" in flags:
        fraction("--optimizer-offload", flags["optimizer_offload"])
    if max_tokens is None and micro_batch is None:
        max_tokens = seq_len  # the seed's dynamic batching: one row per micro-batch
    return Layout.parse(layout, world=count, recompute=Recompute.parse(recompute), dispatcher=dispatcher,
                        max_tokens_per_gpu=max_tokens, micro_batch_size=micro_batch, **flags)
