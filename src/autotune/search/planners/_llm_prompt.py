"""The LLM planner's messages: the skill's prompt templates (skill/prompts/*.txt) filled from a PlanContext.

Templates are plain text with `${name}` placeholders (string.Template), read through importlib.resources
so a wheel install finds them. The context is ours, not the model's: the model, cluster and workload,
the space's funnel, the top untried candidates by predicted tokens/s with their uncertainty, memory
headroom and largest step-time terms, every trial so far (the last ones when there are many) with its
result or failure class, and the skill's findings. It is kept compact: a small local model has a
context of a few thousand tokens.
"""

from __future__ import annotations

import json
from importlib import resources
from string import Template
from typing import Callable

import numpy as np

from ...catalog.workload import routing_of
from ...layout.dimensions import PARAM_NAMES, layout_params
from ...trials.spec import Prediction
from ._llm_check import RATIONALE_EXAMPLE
from .base import PlanContext

__all__ = ["template", "listed_candidates", "messages", "repair_message"]

def template(name: str) -> Template:
    # via the regular package: skill/ has no __init__.py (it holds data, not code)
    return Template(resources.files("autotune").joinpath("skill", "prompts", f"{name}.txt").read_text())


def listed_candidates(ctx: PlanContext, n: int) -> list[int]:
    """The top n untried candidates by predicted tokens/s (the ids c0.. the model may name)."""
    score = np.where(ctx.untried(), ctx.predicted, -np.inf)
    order = np.argsort(-score, kind="stable")[:n]
    return [int(i) for i in order if np.isfinite(score[i])]


def _layout_text(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _candidate_line(ctx: PlanContext, j: int, i: int, predict: Callable[[int], Prediction]) -> str:
    lay = ctx.table.row(i)
    sigma = float(ctx.uncertainty()[i])
    line = f"c{j}: {_layout_text(layout_params(lay))} | {ctx.predicted[i]:,.0f} tok/s +/-{sigma:.0%}"
    if ctx.breakdown is not None:
        p = predict(i)
        if p.capacity_bytes:
            line += f" | mem {p.peak_bytes / 1e9:.0f}/{p.capacity_bytes / 1e9:.0f} GB"
        top = sorted(p.time_terms.items(), key=lambda kv: -kv[1])[:3]
        line += " | " + ", ".join(f"{k} {v:.2f}" for k, v in top)
    return line


def _trial_lines(ctx: PlanContext, last: int = 20) -> str:
    hist = ctx.history[-last:]
    if not hist:
        return "none yet"
    lines = [] if len(ctx.history) <= last else [f"({len(ctx.history) - last} earlier trials not shown)"]
    for r in hist:
        val = f"{r.value:,.0f}" if r.value else "-"
        if r.value and r.stderr and r.stderr > ctx.noise:  # a trial that scattered more than trials do: said
            val += f" +/-{r.stderr:.0%}"
        pred = f"{r.predicted:,.0f}" if r.predicted else "-"
        lines.append(f"#{r.number}: {_layout_text(layout_params(r.layout))} | {r.status} ({r.source}) | {val} | {pred}")
    return "\n".join(lines)


def messages(ctx: PlanContext, k: int, listed: list[int], hints: list[str],
             predict: Callable[[int], Prediction] | None = None) -> list[dict]:
    """The system and user messages; `predict` (default ctx.prediction) gives a candidate's breakdowns."""
    m, c, w = ctx.model, ctx.cluster, ctx.workload
    predict = predict or ctx.prediction
    example = ", ".join(f'"{n}": {json.dumps(v)}' for n, v in layout_params(ctx.table.row(listed[0])).items()) \
        if listed else ""
    system = template("system").safe_substitute(
        node_size=c.node_size, k=k, dimension_names=", ".join(PARAM_NAMES), param_example=example,
        rationale_example=RATIONALE_EXAMPLE)
    user = template("user").safe_substitute(
        model=f"{m.name}: {m.describe()}",
        cluster=f"{c.count} x {c.gpu.name}, {c.gpus_per_node} per node ({c.nodes} nodes), "
                f"DeepEP {'yes' if c.has_deepep else 'no'}, HybridEP {'yes' if c.has_hybridep else 'no'}, Transformer Engine {'yes' if c.has_te else 'no'}",
        workload=f"{w.seq_len}-token rows, global batch {w.global_batch}, {w.precision}, {w.task}"
                 + (f", MoE routing {routing_of(w)} (--routing)" if m.is_moe else ""),
        funnel=", ".join(f"{s} {n:,}" for s, n in ctx.funnel) or "not given",
        candidates="\n".join(_candidate_line(ctx, j, i, predict) for j, i in enumerate(listed)) or "none left",
        trials=_trial_lines(ctx),
        hints="\n".join(f"- {h}" for h in hints[-8:]) or "- nothing yet: start from the best predicted candidates",
        k=k)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def repair_message(invalid: list[tuple[str, str]], parse_error: str | None, k: int) -> dict:
    lines = [f"- {what}: {why}" for what, why in invalid[:12]]
    if parse_error:
        lines.insert(0, f"- the whole answer: {parse_error}")
    return {"role": "user", "content": template("repair").safe_substitute(invalid="\n".join(lines), k=k)}
