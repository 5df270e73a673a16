"""`autotune check convergence | config | component`: the correctness gates, one at a time.

Exit codes: 0 the gate passed, 1 it failed (or could not run: not_run), 2 bad input (an unreadable or
malformed loss file or recipe, a rule file with an unknown class, too few steps to score; for component, torch or
megatron-core not installed here), one line.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from ..gates import GateResult
from .console import console, print_json

check_app = typer.Typer(help="Correctness gates: loss curves, argument classes, a dispatcher's component test.",
                        no_args_is_help=True)

JsonOpt = typer.Option(False, "--json", help="Print the gate result as JSON.")


def _finish(result: GateResult, json_out: bool, rows: list[tuple[str, str]] = ()) -> None:
    if json_out:
        print_json(result.model_dump(mode="json"))
    else:
        colour = {"pass": "green", "fail": "red"}.get(result.status, "yellow")
        word = result.recipe_status  # 'not run', not 'not_run'
        summary = result.summary  # most summaries begin with the status itself: say it once
        for head in (f"{result.status}: ", f"{word}: "):
            if summary.startswith(head):
                summary = summary[len(head):]
                break
        summary = "" if summary in (result.status, word) else summary
        console.print(f"[bold]{result.gate}[/]: [{colour}]{word}[/]" + (f"  {escape(summary)}" if summary else ""))
        if rows:
            t = Table(show_header=True)
            for col in rows[0]:
                t.add_column(col)
            for r in rows[1:]:
                t.add_row(*r)
            console.print(t)
    if result.status != "pass":
        raise typer.Exit(code=1)


@check_app.command("convergence")
def convergence(
    candidate: Path = typer.Option(..., "--candidate", help="Loss file: the runner's steps.jsonl or JSON {step: loss}."),
    reference: Path = typer.Option(..., "--reference", help="The reference run's loss file, same format."),
    profile: str = typer.Option("bridge", "--profile", help="Thresholds: bridge (Megatron-Bridge's pipeline, bf16 "
                                "runs) or fp32 (deterministic fp32 runs, e.g. CPU trials)."),
    json_out: bool = JsonOpt,
) -> None:
    """Score a candidate's loss curve against a reference's (correlation, pointwise, final loss, outliers).

    Example:
      autotune check convergence --candidate runs/s/trials/3/steps.jsonl \\
        --reference runs/s/trials/0/steps.jsonl
    """
    from ..gates.convergence import convergence_gate, read_losses, with_thresholds

    th = with_thresholds(profile)
    result = convergence_gate(read_losses(candidate), read_losses(reference), th)
    _finish(result, json_out)


@check_app.command("config")
def config(
    candidate: Path = typer.Option(..., "--candidate", help="The candidate recipe (YAML)."),
    reference: Path = typer.Option(..., "--reference", help="The reference recipe (YAML)."),
    rules: Path = typer.Option(None, "--rules", help="Argument classes (default: skill/correctness/numerics_list.yaml)."),
    json_out: bool = JsonOpt,
) -> None:
    """List every argument that differs between two recipes, with its class; fail on a numerics change.

    Example:
      autotune check config \\
        --candidate recipes/qwen3.5-122b-a10b/h200/attune-tp1-pp4-ep8-flex.yaml \\
        --reference recipes/qwen3.5-122b-a10b/h200/attune-tp1-pp4-ep8.yaml
    """
    from ..gates.arguments import recipe_arguments
    from ..gates.configuration import configuration_gate
    from ..gates.rules import load_rules

    table = load_rules(rules)
    result = configuration_gate(recipe_arguments(candidate), recipe_arguments(reference), table)
    rows = [("argument", "reference", "candidate", "class")] + [
        (d["argument"], d["reference"], d["candidate"], d["class"]) for d in result.details["differences"]]
    _finish(result, json_out, rows if len(rows) > 1 else [])


@check_app.command("component")
def component(
    dispatcher: str = typer.Option(..., "--dispatcher", help="Candidate dispatcher: alltoall, allgather, flex (DeepEP) or hybridep (HybridEP)."),
    reference_dispatcher: str = typer.Option("alltoall", "--reference-dispatcher", help="The default to compare with."),
    ep: int = typer.Option(2, "--ep", help="Expert-parallel ranks (processes) to start."),
    tokens: int = typer.Option(256, "--tokens", help="Tokens per rank."),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16 (as trained on GPUs) or fp32."),
    json_out: bool = JsonOpt,
) -> None:
    """One MoE layer with a dispatcher against an FP32 reference, at EP ranks over gloo (CPU) or NCCL.

    Example:
      autotune check component --dispatcher allgather --reference-dispatcher alltoall
    """
    from ..errors import BadInput
    from ..gates.component import ComponentSpec, component_gate, run_component
    from ..trials import plan
    from .common import positive_int

    if dtype not in ("bf16", "fp32"):
        raise BadInput(f"--dtype {dtype!r}: choose bf16 or fp32")
    positive_int("--tokens", tokens, 2**20)  # each rank makes a (tokens, hidden) batch: 0 rows cannot be compared
    spec = ComponentSpec(dispatcher=dispatcher, reference_dispatcher=reference_dispatcher, ep=ep, tokens=tokens, dtype=dtype)

    def run(spec: ComponentSpec) -> dict:
        # the ranks import torch and megatron-core: without them every rank dies on import, which would read as a
        # failed numerics test. Checked here, where the ranks would start, so a gate that cannot run anyway
        # (flex without DeepEP, EP 1) still says not_run; looked up on the module so a test can stand in for it
        missing = plan.trials_missing()
        if missing:
            raise BadInput(f"check component starts megatron-core MoE layers, but {missing}")
        return run_component(spec)

    result = component_gate(spec, run=run)
    rows = []
    if "tensors" in result.details:
        rows = [("tensor", "error", "bound")] + [(r["tensor"], f"{r['error']:.3g}", f"{r['bound']:.3g}")
                                                for r in result.details["tensors"]]
    _finish(result, json_out, rows)


def register(app: typer.Typer) -> None:
    app.add_typer(check_app, name="check")
