"""Render a search's outcome (the SearchOutcome JSON shape) in the terminal. Computes nothing."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from ..cost.advice import lever_text, shares_text
from ..report.fit import fit
from ..search.acquisition import STOP_CHANCE
from ..search.study import calibration_command
from ..words import count, hours, measured_text, percent
from .console import console

GiB = 1024**3
TOP = 20  # trials in the table; the dashboard and --json have them all


def render_outcome(out: dict, shown: frozenset[str] = frozenset()) -> None:
    """The ranked trials, the notes (less those in `shown`: already on this screen) and the best layout."""
    t = Table(title=f"study {out['study']}: trials ranked ({out['backend']} backend)")
    for col in ("rank", "trial", "layout", "settings", "predicted", "measured", "MFU", "$/1M", "peak GiB", "state"):
        t.add_column(col, justify="right" if col in ("rank", "trial", "predicted", "measured", "MFU", "$/1M", "peak GiB") else "left")
    order = sorted(out["trials"], key=lambda r: -(r["value"] or 0))
    for k, r in enumerate(order[:TOP], 1):
        fmt = lambda v: f"{v:,.1f}" if v else "-"  # noqa: E731
        t.add_row(str(k) if r["value"] else "-", str(r["number"]), r["layout"],
                  r.get("settings") or f"{r['recompute']}, {r['dispatcher']}",
                  fmt(r["predicted"]), measured_text(r["measured"], r.get("stderr")),
                  f"{r.get('mfu', 0):.1%}" if r["value"] else "-",
                  f"{r['usd_per_million_tokens']:.2f}" if r["value"] and r.get("usd_per_million_tokens") else "-",
                  f"{r.get('peak_memory_bytes', 0) / GiB:.1f}", r["state"])
    console.print(fit(t))
    if len(order) > TOP:
        console.print(f"... {count(len(order) - TOP, 'more trial')}: autotune dashboard {out['study_dir']} (or --json)",
                      markup=False)
    for note in out["notes"]:
        if note not in shown:
            console.print(f"note: {note}", markup=False, soft_wrap=True)
    chance = out.get("chance_untried_beats")
    more = ""
    if chance is not None and not out["stop_reason"].startswith(("converged", "exhausted")):
        # the stop rule's number at the end: did the budget cut the search short?
        odds = f"the chance that an untried layout beats the best by > {out['noise']:.0%} is {percent(chance)}"
        if chance < STOP_CHANCE:
            more = f" (nearly converged: {odds})"
        elif out["backend"] == "simulate":
            more = f" (on the model's predictions alone, {odds}: trials on a cluster would settle it)"
        else:
            more = f" ({odds}: more --trials or --budget-gpu-hours could still pay)"
    console.print(f"stopped: {out['stop_reason']}{more}", markup=False, soft_wrap=True)
    console.print(f"{count(out['dispatched'], 'trial')}, {hours(out['gpu_hours'])} GPU-hours"
                  + (" (predicted)" if out["backend"] == "simulate" else ""))
    b = out["best"]
    if b:
        console.print(f"best: [bold]{b['layout']}[/] ({escape(b['summary'])}): {b['tokens_per_s_per_gpu']:,.1f} "
                      f"tokens/s/GPU \\[{b['status']}]", soft_wrap=True)
        step = b.get("step")
        if step:
            console.print("where its step goes (the model's terms): " + shares_text(step["shares"]), markup=False,
                          soft_wrap=True)
            for lev in step["levers"]:
                console.print(f"bottleneck: {lever_text(lev)}", markup=False, soft_wrap=True)
        ref = out.get("reference")
        if ref:
            console.print(f"against the best known recipe {ref['name']} ({ref['layout']}, {ref['tokens_per_s_per_gpu']:,.1f} "
                          f"tokens/s/GPU, {ref['status']}): {b['vs_reference']:.2f}x"
                          + (" \\[predicted, not yet measured]" if b["status"] == "predicted" else ""))
        # paths and commands are not broken over lines (a copied command must run): the terminal wraps them
        console.print(f"recipes: {escape(out['study_dir'])}/recipes/   export the best: [bold]{escape(out['export'])}[/]",
                      soft_wrap=True)
    elif out["dispatched"]:
        console.print("best: none: no trial succeeded (each trial's state and reason are in the table above and the "
                      "dashboard), so no recipe was written", soft_wrap=True)
    console.print(f"dashboard: {out['dashboard']}", markup=False, soft_wrap=True)
    if out.get("calibrate"):  # what the measured trials taught, kept for the next search on this cluster
        console.print(f"calibrate the model to this cluster: {out['calibrate']}   (then AUTOTUNE_CALIBRATION="
                      f"{calibration_command(out['study_dir'])[1]} for the next search)", markup=False, soft_wrap=True)
