"""A StudyView for the terminal (rich tables) and as one JSON object (`autotune dashboard --json`)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..catalog.workload import rows_of
from ..search.study import calibration_command
from ..words import count, hours
from .bars import funnel_stages
from .fit import fit
from .study import StudyView

__all__ = ["render_summary", "view_json"]

GiB = 1024**3


def view_json(view: StudyView) -> dict:
    ranked = {t.number: k for k, t in enumerate(view.ranked(), 1)}
    return {
        "study": view.name, "study_dir": str(view.root), "model": view.model, "gpu": view.gpu, "count": view.count,
        "workload": rows_of(view.workload) if view.workload else None,
        "backend": view.backend, "planner": view.planner, "stop_reason": view.stop_reason,
        "in_flight": view.in_flight,
        "dispatched": len(view.dispatched), "screened": len(view.trials) - len(view.dispatched),
        "gpu_hours": view.gpu_hours, "best": view.best,
        "trials": [{"rank": ranked.get(t.number), "number": t.number, "layout": t.label, "recompute": t.recompute,
                    "dispatcher": t.dispatcher, "state": t.display_state, "predicted": t.predicted,
                    "measured": t.measured, "stderr": t.stderr if t.measured else None, "value": t.value if t.ok else None,
                    "source": t.source if t.ok else None,  # what `value` is: measured, or the simulator's prediction
                    "mfu": t.mfu,
                    "usd_per_million_tokens": t.usd_per_million_tokens,
                    "layer_split": t.split,
                    "peak_memory_bytes": _bytes(t.peak_bytes or t.predicted_peak_bytes), "gpu_hours": t.gpu_hours,
                    "wall_s": t.wall_s, "reason": t.reason, "why": t.why,
                    "time_terms": t.prediction.time_terms if t.prediction else None} for t in view.trials],
        "funnel": [{"stage": s, "count": c} for s, c in funnel_stages(view)],
        "recipes": [{"name": r.name, "path": str(r.path), "status": r.status, "layout": r.label,
                     "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu, "correctness": r.correctness} for r in view.recipes],
        "notes": view.notes, "not_available": list(dict.fromkeys(view.missing)),
    }


def _bytes(x) -> int | None:
    """Bytes as an integer (Optuna keeps a trial's attributes as floats; a byte count reads as a whole number)."""
    return int(round(x)) if x is not None else None


def render_summary(view: StudyView, console: Console, top: int = 15) -> None:
    sim = " (predicted)" if view.backend == "simulate" else ""
    rows = f" ({view.rows_text()})" if view.rows_text() else ""
    console.print(f"[bold]study {view.name}[/]: {view.model} on {view.count or '?'} x {view.gpu}{rows}, {view.backend} "
                  f"backend, {view.planner} planner")
    console.print(f"{count(len(view.dispatched), 'trial')} dispatched, {len(view.trials) - len(view.dispatched)} screened, "
                  f"{hours(view.gpu_hours)} GPU-hours{sim}; "
                  + view.state_line())
    ranked = view.ranked()
    t = Table(title=f"top {min(top, len(ranked))} of {len(ranked)} ranked trials")
    # "measured" is a real run's tokens/s/GPU: a simulated trial's only number is its prediction (its state
    # says so), the same as `autotune search` and the HTML report show it
    split = any(r.split != "even" for r in ranked[:top])  # an uneven layer split: a column when one shows
    for c in ("rank", "trial", "layout") + (("split",) if split else ()) + ("recompute", "disp.", "predicted",
                                                                           "measured", "MFU", "$/1M", "peak GiB", "state"):
        t.add_column(c, justify="left" if c in ("layout", "split", "recompute", "disp.", "state") else "right")
    for k, r in enumerate(ranked[:top], 1):
        peak = r.peak_bytes or r.predicted_peak_bytes
        pred = r.predicted or (r.value if r.measured is None else None)  # an old study: the simulated value
        t.add_row(str(k), str(r.number), r.label, *((r.split,) if split else ()), r.recompute, r.dispatcher,
                  f"{pred:,.1f}" if pred else "-",
                  r.measured_text, f"{r.mfu:.1%}" if r.mfu else "-",
                  f"{r.usd_per_million_tokens:.2f}" if r.usd_per_million_tokens else "-",
                  f"{peak / GiB:.1f}" if peak else "-", r.display_state)
    console.print(fit(t))
    failed = [x for x in view.trials if not x.ok and x.status not in (None, "requeued")]
    for x in failed[:8]:
        console.print(f"trial {x.number} {x.display_state}: {x.label}: {x.reason or '-'}", markup=False)
    if len(failed) > 8:
        console.print(f"... and {count(len(failed) - 8, 'more screened or failed trial')}")
    stages = funnel_stages(view)
    if stages:
        console.print("funnel: " + " -> ".join(f"{s} {c:,}" for s, c in stages), markup=False)
    for r in view.recipes:
        c = r.correctness
        console.print(f"recipe {r.name} [{r.status}]: correctness {c.get('result', '?')} "
                      f"(configuration {c.get('configuration', '?')}, convergence "
                      f"{(c.get('convergence') or {}).get('result', 'not run')})", markup=False)
    for m in dict.fromkeys(view.missing):
        console.print(f"not available: {m}", markup=False)
    errs = view.model_errors()
    if errs:  # how wrong the model was here, and how to keep what the trials taught for the next search
        console.print(f"the model's median error at dispatch: {errs[len(errs) // 2]:.1%} over "
                      f"{count(len(errs), 'measured trial')}; calibrate it to this cluster: "
                      f"{calibration_command(view.root)[0]}", markup=False, soft_wrap=True)
    console.print(f"html report: autotune dashboard {view.root} --html report.html · "
                  f"optuna-dashboard: autotune dashboard --optuna {view.root}", markup=False)
