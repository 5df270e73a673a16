"""`autotune estimate`: memory per pipeline stage and predicted throughput of one layout."""

from __future__ import annotations

from dataclasses import replace

import typer
from rich.markup import escape
from rich.table import Table

from ..catalog import param_counts
from ..cost import (MEMORY_TERMS, TERM_MEANINGS, MemoryCoefficients, evaluate, lever_text, levers, memory_lever,
                    routing_summary)
from ..errors import BadInput
from ..layout import LayoutTable, format_args, layout_args, validate
from ..layout.args import fp8_module_args, precision_args
from .common import (BatchOpt, Fp8AttentionOpt, Fp8OutputProjOpt, GradsOpt, JsonOpt, PerNodeOpt, PrecisionOpt,
                     RoutingOpt, SeqOpt, layout_options, recipe_inputs, resolve)
from .console import console, print_json

GiB = 1024**3


# the options --recipe leaves in force: it takes everything else (model, GPUs, workload, layout) from the recipe
_WITH_RECIPE = ("recipe", "layer_split", "fsdp", "json_out")


def estimate(
    ctx: typer.Context,
    model: str = typer.Option(None, "--model", "-m", help="Catalog name or config.json path."),
    gpu: str = typer.Option(None, "--gpu", "-g", help="GPU kind (see `autotune gpus`) or a GPU file path.yaml."),
    count: int = typer.Option(None, "--count", "-n", help="Number of GPUs."),
    layout: str = typer.Option(None, "--layout", "-l", help='Degrees, e.g. "TP1 PP4 EP8 DP8" (add VPP2, CP2, ETP2).'),
    recompute: str = typer.Option("none", "--recompute", help=(
        "none | selective[:modules] | full:uniform|block:N. Selective modules (Megatron's --recompute-modules; "
        "each re-runs only its own forward): core_attn (the default), layernorm, moe_act, moe (the whole MoE "
        "layer, its all-to-alls too), shared_experts, mlp (dense layers), mla_up_proj (MLA models), comma-separated.")),
    dispatcher: str = typer.Option("alltoall", "--dispatcher", help="alltoall | allgather | flex (the flex dispatcher on DeepEP) | hybridep (on HybridEP)"),
    max_tokens_per_gpu: int = typer.Option(None, "--max-tokens-per-gpu", help="Dynamic batching cap (default: one row)."),
    micro_batch_size: int = typer.Option(None, "--micro-batch-size", help="Fixed rows per micro-batch instead."),
    precision_aware: bool = typer.Option(False, "--precision-aware-optimizer", help="TE precision-aware optimizer."),
    no_dist_opt: bool = typer.Option(False, "--no-distributed-optimizer", help="Replicate the optimizer state "
                                     "on every DP rank (Megatron's default) instead of sharding it as the seed does."),
    shared_overlap: bool = typer.Option(False, "--shared-expert-overlap", help="--moe-shared-expert-overlap"),
    offload: float = typer.Option(0.0, "--optimizer-offload", help="Fraction of optimizer state on the host."),
    layer_split: str = typer.Option(None, "--layer-split", help="Uneven pipeline split: 'auto' (Megatron's when "
                                    "layers do not divide: embedding/loss counted, ...), 'even', or decoder layers "
                                    "per virtual stage, e.g. 2,3,3,2 or 2,3x30,2 (3x30: thirty stages of 3), or Megatron's "
                                    "--pipeline-model-parallel-layout string, e.g. 'Et*4|(tttt|)*14tmL' (its stage "
                                    "count / PP sets VPP)."),
    fsdp: bool = typer.Option(False, "--fsdp", help="Megatron FSDP (parameters, gradients, optimizer sharded)."),
    ep_overlap: bool = typer.Option(False, "--ep-overlap", help="--overlap-moe-expert-parallel-comm: the all-to-all "
                                    "beside another micro-batch's compute (EP > 1, no full recompute, VPP with PP)."),
    tp_overlap: bool = typer.Option(False, "--tp-comm-overlap", help="TE userbuffers overlap of the TP "
                                    "collectives with their GEMMs (TP > 1 with sequence parallel)."),
    cuda_graphs: str = typer.Option("none", "--cuda-graphs", help="none | router | attn | full (full needs "
                                    "--capacity-factor on an MoE model)."),
    capacity: float = typer.Option(0.0, "--capacity-factor", help="MoE token drop at this capacity factor, padded "
                                   "(0: dropless)."),
    act_offload: int = typer.Option(0, "--activation-offload-layers", help="--cpu-offloading-num-layers: layers "
                                    "whose activations wait in host memory (PP 1, no recompute)."),
    offload_modules: str = typer.Option("", "--offload-modules", help="Fine-grained activation offloading: the "
                                        "submodules whose inputs wait in host memory, comma-separated (attn_norm, "
                                        "qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act), e.g. "
                                        "core_attn,attn_proj or expert_fc1."),
    routing: str = RoutingOpt,
    force_balance: bool = typer.Option(False, "--force-balance", hidden=True, help="Same as --routing forced."),
    gpus_per_node: int = PerNodeOpt,
    seq_len: int | None = SeqOpt,
    global_batch: int | None = BatchOpt,
    grads: str = GradsOpt,
    precision: str = PrecisionOpt,
    fp8_param_gather: bool = typer.Option(False, "--fp8-param-gather", help="FP8 parameters and all-gathers "
                                          "(Megatron --fp8-param-gather; FP8 precisions only)."),
    fp8_attention: bool = Fp8AttentionOpt,
    fp8_output_proj: bool = Fp8OutputProjOpt,
    lora: bool = typer.Option(False, "--lora", help="LoRA fine-tuning: the base weights frozen (no weight-gradient "
                              "GEMMs, gradients, optimizer state or DP gradient traffic for them), as Megatron-Bridge's "
                              "PEFT runs it; the adapters themselves are not counted. Estimate only: the search's trials "
                              "run Megatron-core, which has no LoRA."),
    packed_doc_len: int = typer.Option(0, "--packed-doc-len", help="Fine-tuning on packed sequences: the mean "
                                       "document length in tokens; attention runs within each document (THD, "
                                       "cu_seqlens), not across the row (0: each row is one document)."),
    recipe: str = typer.Option(None, "--recipe", help="Take model, GPUs, workload and layout from a recipe file."),
    json_out: bool = JsonOpt,
) -> None:
    """Will this layout fit, and how fast will it be? Memory per stage, peak against capacity, and the
    predicted tokens/s/GPU with the step-time breakdown.

    Example:
      autotune estimate --model Qwen3.5-122B-A10B --gpu H200 --count 32 \\
        --layout "TP1 PP4 EP8 DP8" --recompute full:uniform:2
    """
    measured, recipe_status = None, None
    notes: list[str] = []
    if recipe:
        _only_with_recipe(ctx)
        doc, m, cluster, workload, lay = recipe_inputs(recipe)
        measured = (doc.get("result") or {}).get("tokens_per_s_per_gpu")
        recipe_status = doc.get("status")
    else:
        missing = [f for f, v in (("--model", model), ("--gpu", gpu), ("--count", count), ("--layout", layout)) if v is None]
        if missing:
            raise BadInput(f"missing {', '.join(missing)}: give them, or --recipe PATH (see `autotune estimate --help`)")
        if force_balance and routing not in ("natural", "forced"):
            raise BadInput(f"--force-balance is --routing forced, not {routing}; give one of them")
        m, cluster, workload = resolve(model, gpu, count, gpus_per_node, seq_len, global_batch, grads,
                                       precision, fp8_param_gather, notes=notes,
                                       routing="forced" if force_balance else routing, fp8_attention=fp8_attention,
                                       fp8_output_proj=fp8_output_proj)
        lay = layout_options(layout, count, recompute, dispatcher, max_tokens_per_gpu, micro_batch_size, workload.seq_len,
                             precision_aware_optimizer=precision_aware, distributed_optimizer=not no_dist_opt,
                             moe_shared_expert_overlap=shared_overlap, optimizer_offload=offload,
                             ep_overlap=ep_overlap, tp_comm_overlap=tp_overlap, cuda_graphs=cuda_graphs,
                             moe_capacity_factor=capacity, activation_offload_layers=act_offload,
                             offload_modules=tuple(x for x in offload_modules.replace(",", " ").split()))
        if tp_overlap and not lay.tp_overlap:  # the layout would drop it without a word (Layout.tp_overlap)
            raise BadInput(f"--tp-comm-overlap needs TP > 1 (it overlaps the sequence-parallel TP collectives with "
                           f"their GEMMs), but the layout has TP {lay.tp}; drop --tp-comm-overlap or use TP 2 or more")
        workload = replace(workload, lora=lora, packed_doc_len=packed_doc_len)
    if layer_split:
        lay = _split(layer_split, m.num_layers, lay)
    if fsdp:
        lay = lay.with_(fsdp=True)
        if lay.pp > 1:  # cost/_state.py and _raw.py: with PP a stage's parameters stay gathered for its micro-batches
            notes.append(f"--fsdp with PP {lay.pp}: each stage keeps its parameters gathered across its micro-batches, "
                         "so memory and time are predicted as with the distributed optimizer alone (the model "
                         "shards them only at PP 1)")
    if global_batch is None and recipe is None:
        workload = _batch_for(m, workload, lay, notes)
    validate(m, workload, lay)
    ev = evaluate(m, workload, cluster, LayoutTable.from_layouts([lay]))
    out = report(m, cluster, workload, lay, ev, 0)
    out["workload"] = workload.rows()
    if notes:
        out["notes"] = notes
    if measured is not None:  # a predicted recipe's number is the model's own: shown as the recipe's, not measured
        key = "recipe_predicted" if recipe_status == "predicted" else "measured"
        out[key] = {"tokens_per_s_per_gpu": float(measured),
                    "error_percent": 100.0 * (out["throughput"]["tokens_per_s_per_gpu"] / float(measured) - 1)}
    if json_out:
        print_json(out)
    else:
        render(out)


def _batch_for(m, workload, lay, notes: list[str]):
    """The default global batch, or, when that divides over the layout's DP not at all and the batch is the only
    thing wrong, the nearest multiple of DP above it, with a note (a batch the user gave is never changed)."""
    from ..layout.rules import violations

    bad = violations(m, workload, lay)
    if [v.code for v in bad] != ["dp_batch"] or lay.dp < 1:
        return workload
    new = replace(workload, global_batch=-(-workload.global_batch // lay.dp) * lay.dp)
    if violations(m, new, lay):
        return workload
    notes.append(f"--global-batch {new.global_batch} by default: the default {workload.global_batch} rows do not "
                 f"divide over DP {lay.dp}; {new.global_batch} = {lay.dp} x {new.global_batch // lay.dp} do. Give "
                 "--global-batch to choose another")
    return new


def _only_with_recipe(ctx: typer.Context) -> None:
    """Refuse options --recipe would ignore: the recipe names the model, GPUs, workload and layout, and a flag
    beside it that changed nothing would read as applied. Told from defaults by where click took each value."""
    given = [p.opts[0] for p in ctx.command.params
             if p.name not in _WITH_RECIPE and getattr(ctx.get_parameter_source(p.name), "name", "DEFAULT")
             not in ("DEFAULT", "DEFAULT_MAP")]
    if given:
        raise BadInput(f"--recipe takes the model, GPU, count, layout and workload from the recipe; drop "
                       f"{', '.join(given)} (only --layer-split, --fsdp and --json go with --recipe) or drop --recipe")


def _split(text: str, num_layers: int, lay):
    """The layout with --layer-split's split: 'auto', 'even', layers per virtual stage ('2,3x30,2'), or Megatron's
    --pipeline-model-parallel-layout string ('Et*4|(tttt|)*14tmL'), whose stage count sets VPP."""
    from ..layout.splits import is_pipeline_layout, layout_vpp, legal_splits, parse_pipeline_layout, parse_split

    if text == "auto":
        alts = legal_splits(num_layers, lay.pp, lay.vpp)
        return lay.with_(layer_split=alts[0] if alts else ())
    if is_pipeline_layout(text):
        stages, _ = parse_pipeline_layout(text)
        try:
            vpp = layout_vpp(len(stages), lay.pp, lay.vpp)
        except BadInput as exc:
            raise BadInput(f"--layer-split {text!r}: {exc}") from None
        return lay.with_(vpp=vpp, layer_split=stages)
    try:
        split = parse_split(text)
    except BadInput:
        raise BadInput(f"--layer-split {text!r}: give 'auto', 'even', decoder layers per virtual stage, e.g. "
                       "2,3,3,2 or 2,3x30,2 (3x30: thirty stages of 3), or a Megatron pipeline layout such as "
                       "'Et*4|(tttt|)*14tmL'") from None
    return lay.with_(layer_split=split)


def report(m, cluster, workload, lay, ev, i: int) -> dict:
    """The JSON shape of one layout's prediction (also used by space and search)."""
    mem, tim = ev.memory, ev.time
    counts = param_counts(m)
    stages = [{"stage": s, **{k: int(v) for k, v in row.items()}} for s, row in enumerate(mem.stage_breakdown(i))]
    mcoef = ev.calibration.memory if ev.calibration is not None else MemoryCoefficients()
    moe = {"moe_routing": routing_summary(m, workload, cluster, ev.table, mcoef, i)} if m.is_moe else {}
    return {
        "model": m.name,
        "gpu": cluster.gpu.name,
        "count": cluster.count,
        "active_params": counts.active,
        "total_params": counts.total,
        "layout": lay.label(m.is_moe),
        # a dense model has no EP; TP comm overlap as it takes effect (a space asks for it everywhere: off at TP 1,
        # where `estimate --tp-comm-overlap` is refused), so a script can pass these settings back as flags
        "layout_detail": {**lay.to_dict(), "tp_comm_overlap": lay.tp_overlap, "label": lay.label(m.is_moe)},
        "summary": lay.summary(workload.seq_len, m.is_moe),
        "precision": workload.precision,
        "lora": workload.lora,
        "fp8_attention": workload.fp8_attention,
        "fp8_output_proj": workload.fp8_output_proj,
        "packed_doc_len": workload.packed_doc_len,
        "args": format_args(layout_args(lay, "slime", workload.seq_len, moe=m.is_moe)
                            + precision_args(workload.precision, workload.fp8_param_gather)
                            + fp8_module_args(workload)),
        "memory": {
            "peak_bytes": int(mem.peak[i]),
            "capacity_bytes": int(mem.capacity_bytes),
            "headroom_bytes": int(mem.capacity_bytes - mem.peak[i]),
            "fits": bool(mem.fits[i]),
            "peak_stage": int(mem.peak_stage[i]),
            "stages": stages,
            "host_bytes_per_node": int(mem.host_bytes[i]),
            "host_capacity_bytes": int(mem.host_capacity_bytes),
            "to_fit": None if mem.fits[i] else memory_lever(stages[int(mem.peak_stage[i])], lay, workload, cluster),
        },
        "throughput": {
            "tokens_per_s_per_gpu": float(tim.tokens_per_s_per_gpu[i]),
            # one sigma either side, from the calibration's residuals (cost.uncertainty)
            "relative_sigma": float(ev.sigma[i]),
            "tokens_per_s_per_gpu_68": [round(x, 1) for x in ev.interval(i)],
            "mfu": float(tim.mfu[i]),
            "usd_per_million_tokens": float(tim.usd_per_million_tokens[i]),
            "step_time_s": float(tim.step_time[i]),
            "gpu_hours_per_step": float(tim.gpu_hours(1)[i]),
            "microbatches_per_step": int(lay.num_microbatches(workload.global_batch, workload.seq_len)),
            "breakdown": tim.breakdown(i),
            "levers": levers(tim.breakdown(i), float(tim.step_time[i]), lay, workload, cluster),
        },
        **moe,
    }


def routing_line(r: dict, dispatcher: str) -> str:
    """One line of what the time model assumes of an MoE layout's routing (`moe_routing`)."""
    line = (f"MoE routing as priced: the hottest of {r['ep_group_ranks']} EP ranks carries {r['hottest_rank_load']:.2f}x "
            f"the mean load")
    if r["nvlink_domains"] > 1:
        line += f"; the EP group spans {r['nvlink_domains']} NVLink domains"
        if dispatcher in ("flex", "hybridep"):
            line += (f" and a token goes once to each of the {r['domains_per_token']:.2f} it reaches "
                     f"({r['spread']}), then over NVLink")
        elif dispatcher == "alltoall":
            line += f" and NCCL's alltoall sends each of a token's {r['top_k']} routed copies"
    return line


# what a --routing other than the seed's natural one changes, said above the tables (estimate, space)
ROUTING_LINES = {"aux-loss": "routing: the load-balancing loss on (the hottest expert rank carries less than the "
                             "seed's natural routing puts on it)",
                 "forced": "routing: forced even (--moe-router-force-load-balancing, as published MoE benchmarks "
                           "run: no expert rank carries more than its share; not a training setting)"}


def render(out: dict) -> None:
    mem, thr = out["memory"], out["throughput"]
    console.print(f"[bold]{escape(out['model'])}[/] on {out['count']} x {out['gpu']}: [bold]{out['layout']}[/]  ({out['summary']})")
    if out.get("lora"):
        console.print("LoRA fine-tuning: base weights frozen (no weight gradients, gradients or optimizer state for them)")
    if out.get("packed_doc_len"):
        console.print(f"packed rows: attention within documents of ~{out['packed_doc_len']:,} tokens")
    routing = (out.get("workload") or {}).get("routing", "natural")
    if routing != "natural":
        console.print(ROUTING_LINES[routing])
    if out.get("moe_routing") and out["layout_detail"].get("ep", 1) > 1:
        console.print(routing_line(out["moe_routing"], out["layout_detail"].get("dispatcher", "")), markup=False)
    for note in out.get("notes", ()):
        console.print(f"note: {note}", markup=False)
    t = Table(title="memory per GPU by pipeline stage (GiB)")
    t.add_column("term")
    for s in mem["stages"]:
        t.add_column(f"stage {s['stage']}", justify="right")
    for term in MEMORY_TERMS + ("total",):
        t.add_row(term, *[f"{s[term] / GiB:.1f}" for s in mem["stages"]], style="bold" if term == "total" else None)
    console.print(t)
    verdict = "[green]fits[/]" if mem["fits"] else "[red]does not fit[/]"
    console.print(f"peak {mem['peak_bytes'] / GiB:.1f} GiB (stage {mem['peak_stage']}) of {mem['capacity_bytes'] / GiB:.1f} GiB: "
                  f"{verdict}, headroom {mem['headroom_bytes'] / GiB:.1f} GiB")
    if mem.get("to_fit"):
        tf = mem["to_fit"]
        console.print(f"to fit: the largest term on stage {mem['peak_stage']} is {tf['term']} ({tf['bytes'] / GiB:.1f} GiB): "
                      f"{tf['lever']}", markup=False)
    if mem["host_bytes_per_node"]:
        over = mem["host_bytes_per_node"] > mem["host_capacity_bytes"]
        console.print(f"offloaded optimizer: {mem['host_bytes_per_node'] / GiB:,.0f} GiB of host memory per node "
                      f"of {mem['host_capacity_bytes'] / GiB:,.0f}" + (" [red](too much: offload less)[/]" if over else ""))
    b = Table(title="step time breakdown (s per step, slowest stage)")
    b.add_column("term")
    b.add_column("seconds", justify="right")
    b.add_column("share", justify="right")
    b.add_column("what it is")
    for k, v in sorted(thr["breakdown"].items(), key=lambda kv: -kv[1]):
        if v > 0:
            b.add_row(k, f"{v:.3f}", f"{v / thr['step_time_s']:.1%}", TERM_MEANINGS.get(k, ""))
    console.print(b)
    lo, hi = thr["tokens_per_s_per_gpu_68"]
    line = (f"predicted [bold]{thr['tokens_per_s_per_gpu']:,.1f}[/] tokens/s/GPU (68%: {lo:,.0f}-{hi:,.0f}), "
            f"MFU {thr['mfu']:.1%}, "
            f"${thr['usd_per_million_tokens']:.2f} per 1M tokens, step {thr['step_time_s']:.2f} s")
    if not mem["fits"]:  # the speed of a layout that runs out of memory is what it would be with the memory
        line += "; [red]it does not fit, so it would not run[/]"
    for key, what in (("measured", "measured"), ("recipe_predicted", "the recipe's prediction")):
        if key in out:
            line += f"; {what} {out[key]['tokens_per_s_per_gpu']:,.1f} ({round(out[key]['error_percent'], 1) + 0.0:+.1f}%)"  # + 0.0: never -0.0%
    for lev in thr.get("levers", ()):  # before the prediction, which stays the last line
        console.print(f"bottleneck: {lever_text(lev)}", markup=False)
    console.print(line)


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate)
