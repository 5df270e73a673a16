"""`autotune space`: the pruning funnel of a search space and the best predicted layouts."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from ..catalog.workload import routing_of
from ..errors import BadInput
from ..layout.splits import split_text
from ..report.fit import fit
from ..space import explore, load_space, nothing_survives
from .common import (BatchOpt, CountOpt, Fp8AttentionOpt, Fp8OutputProjOpt, GpuOpt, GradsOpt, JsonOpt, ModelOpt,
                     NoDeepEPOpt, NoHybridEPOpt, NoTEOpt, PerNodeOpt, PrecisionOpt, RoutingOpt, SeqOpt, SpaceOpt,
                     default_batch_retry, missing_software, resolve)
from .console import console, print_json, screening
from .estimate import ROUTING_LINES, report

GiB = 1024**3


def space(
    model: str = ModelOpt,
    gpu: str = GpuOpt,
    count: int = CountOpt,
    gpus_per_node: int = PerNodeOpt,
    seq_len: int | None = SeqOpt,
    global_batch: int | None = BatchOpt,
    grads: str = GradsOpt,
    precision: str = PrecisionOpt,
    fp8_attention: bool = Fp8AttentionOpt,
    fp8_output_proj: bool = Fp8OutputProjOpt,
    routing: str = RoutingOpt,
    space_file: str = SpaceOpt,
    top: int = typer.Option(20, "--top", help="How many of the best layouts to show."),
    no_deepep: bool = NoDeepEPOpt,
    no_hybridep: bool = NoHybridEPOpt,
    no_te: bool = NoTEOpt,
    json_out: bool = JsonOpt,
) -> None:
    """What is legal, what fits and what could win: enumerate the search space for a model and cluster,
    prune it (Megatron's rules, missing software, predicted OOM, cannot win) and rank the rest by
    predicted tokens/s/GPU.

    Example: autotune space --model Qwen3.5-122B-A10B --gpu H200 --count 32 --top 10
    """
    if top < 1:
        raise BadInput(f"--top {top}: must be at least 1")
    notes: list[str] = []
    m, cluster, workload = resolve(model, gpu, count, gpus_per_node, seq_len, global_batch, grads, precision,
                                   notes=notes, routing=routing, fp8_attention=fp8_attention,
                                   fp8_output_proj=fp8_output_proj, **missing_software(no_deepep, no_hybridep, no_te))
    sp = load_space(space_file, m)
    with screening(m.name, cluster.count, cluster.gpu.name, not json_out):
        res = explore(sp, m, workload, cluster)
        retry = default_batch_retry(res, workload, global_batch, cluster.count)
        if retry:
            workload, note = retry
            notes.append(note)
            res = explore(sp, m, workload, cluster)
    res.notes[:0] = notes
    best = [report(m, cluster, workload, res.table.row(int(i)), res.evaluation, int(i)) for i in res.kept[:top]]
    why_none = None if best else nothing_survives(res, workload)
    if json_out:
        print_json({
            "model": m.name, "gpu": cluster.gpu.name, "count": cluster.count, "precision": workload.precision,
            "workload": workload.rows(),
            "space": sp.source,
            "funnel": [{"stage": s, "count": c} for s, c in res.funnel],
            "reasons": res.reasons, "notes": res.notes, "top": best,
            # what removed the last layouts (when none is legal: the rules the closest break) and the way out
            **({"last_reasons": res.last_reasons, "error": why_none} if why_none else {}),
        })
        if why_none:  # the same exit code as the tables: a script must not read an empty space as a result
            raise BadInput(why_none)
        return
    prec = "" if workload.precision == "bf16" else f" in {workload.precision}"
    console.print(f"search space [bold]{escape(sp.source)}[/] for {escape(m.name)} on "
                  f"{cluster.count} x {cluster.gpu.name}{prec}")
    routing = routing_of(workload)
    if routing != "natural":
        console.print(ROUTING_LINES[routing])
    f = Table(title="pruning funnel")
    f.add_column("stage")
    f.add_column("layouts", justify="right")
    for s, c in res.funnel:
        f.add_row(s, f"{c:,}")
    console.print(fit(f))
    r = Table(title="removed, by first reason")
    r.add_column("reason")
    r.add_column("layouts", justify="right")
    for k, v in sorted(res.reasons.items(), key=lambda kv: -kv[1]):
        r.add_row(escape(k), f"{v:,}")
    console.print(fit(r))
    for note in res.notes:
        console.print(f"note: {note}", markup=False)
    if why_none:
        raise BadInput(why_none)
    t = Table(title=f"top {len(best)} by predicted tokens/s/GPU")
    offload = any(b["layout_detail"]["optimizer_offload"] for b in best)  # a column only when it matters
    disp = m.is_moe  # a dense model has no token dispatcher to show
    split = any(b["layout_detail"]["layer_split"] for b in best)  # an uneven layer split: a column when one shows
    cols = ("#", "layout") + (("split",) if split else ()) + ("recompute",) + (("disp.",) if disp else ()) \
        + (("offload",) if offload else ()) + ("tok/GPU", "tokens/s/GPU", "MFU", "$/1M", "peak GiB", "top cost")
    for col in cols:
        t.add_column(col, justify="right" if col not in ("layout", "split", "recompute", "disp.", "top cost") else "left")
    for k, b in enumerate(best, 1):
        d, thr = b["layout_detail"], b["throughput"]
        rc = d["recompute"]
        rc_s = rc["granularity"] if rc["granularity"] != "full" else f"full {rc['method']} {rc['num_layers']}"
        top_term = max(thr["breakdown"].items(), key=lambda kv: kv[1])
        off = (f"{d['optimizer_offload']:.0%}",) if offload else ()
        dd = (d["dispatcher"] + ("+ovl" if d["moe_shared_expert_overlap"] else ""),) if disp else ()
        sp = (split_text(tuple(d["layer_split"])),) if split else ()
        t.add_row(str(k), b["layout"], *sp, rc_s, *dd, *off, f"{d['max_tokens_per_gpu'] or ''}", f"{thr['tokens_per_s_per_gpu']:,.1f}", f"{thr['mfu']:.1%}",
                  f"{thr['usd_per_million_tokens']:.2f}", f"{b['memory']['peak_bytes'] / GiB:.1f}",
                  f"{top_term[0]} {top_term[1] / thr['step_time_s']:.0%}")
    console.print(fit(t))


def register(app: typer.Typer) -> None:
    app.command("space")(space)
