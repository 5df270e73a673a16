"""The report's scatter and line charts of a StudyView: best so far against trials and against GPU-hours,
predicted against measured, memory against throughput. Bars, maps and the funnel live in bars.py.

Each function returns one SVG string; with nothing to draw it returns `svg.empty(...)` saying why.
"""

from __future__ import annotations

from ..words import count
from .study import StudyView, TrialView
from .svg import PALETTE, Axes, empty

__all__ = ["best_vs_trials", "best_vs_gpu_hours", "predicted_vs_measured", "memory_vs_throughput", "GiB"]

GiB = 1024**3
MEASURED, PREDICTED, FAILED = PALETTE[0], PALETTE[1], "#c0392b"


def _tip(t: TrialView, extra: str = "") -> str:
    v = f"{t.value:,.1f} tokens/s/GPU" if t.value else t.display_state
    return f"trial {t.number}: {t.label} ({t.recompute}, {t.dispatcher}) {v} [{t.display_state}]" + extra


def _progress(view: StudyView) -> list[tuple[int, float, float, TrialView]]:
    """(trials so far, GPU-hours so far, best so far, trial) in dispatch order; screened proposals cost nothing."""
    out, best, hours = [], 0.0, 0.0
    for k, t in enumerate(sorted(view.dispatched, key=lambda t: t.number), 1):
        hours += t.gpu_hours or 0.0
        if t.ok:
            best = max(best, t.value)
        out.append((k, hours, best, t))
    return out


def _best_chart(view: StudyView, name: str, title: str, xlabel: str, xi: int) -> str:
    prog = _progress(view)
    if not any(p[2] for p in prog):
        return empty(name, title, "no trial has a result yet")
    xs = [p[xi] for p in prog]
    ok = [p for p in prog if p[3].ok]
    ax = Axes(name, title, xlabel, "tokens/s per GPU", xs + [0], [p[3].value for p in ok], xzero=True)
    ax.line([(p[xi], p[2]) for p in prog if p[2]], stroke=PALETTE[2], step=True, width=2.4)
    for p in prog:
        t = p[3]
        if t.ok:
            ax.point(p[xi], t.value, _tip(t), MEASURED if t.source == "measured" else PREDICTED, r=3.5)
        elif t.status not in (None, "requeued"):
            ax.point(p[xi], ax.y0 + (ax.y1 - ax.y0) * 0.02, _tip(t, f": {t.reason or ''}"), FAILED, "cross", r=3.5)
    ax.add_legend(PALETTE[2], "best so far", "line")
    if any(p[3].ok and p[3].source == "measured" for p in prog):
        ax.add_legend(MEASURED, "measured trial")
    if any(p[3].ok and p[3].source != "measured" for p in prog):
        ax.add_legend(PREDICTED, "simulated trial (prediction)")
    if any(not p[3].ok and p[3].status not in (None, "requeued") for p in prog):
        ax.add_legend(FAILED, "failed (OOM, crash, ...)", "cross")
    return ax.render()


def best_vs_trials(view: StudyView) -> str:
    return _best_chart(view, "best-vs-trials", "Best so far against trials", "trials dispatched", 0)


def best_vs_gpu_hours(view: StudyView) -> str:
    sim = " (predicted)" if view.backend == "simulate" else ""
    return _best_chart(view, "best-vs-gpu-hours", "Best so far against GPU-hours" + sim, "GPU-hours spent" + sim, 1)


def predicted_vs_measured(view: StudyView) -> str:
    """The model's error per trial: the prediction at dispatch against the result (y = x is a perfect model)."""
    name, title = "predicted-vs-measured", "Predicted against measured (tokens/s per GPU)"
    pts = [t for t in view.trials if t.ok and t.predicted]
    if not pts:
        return empty(name, title, "no trial has both a prediction and a result")
    vals = [t.predicted for t in pts] + [t.value for t in pts]
    errs = view.model_errors()
    if errs:
        sub = f"the model's median error {errs[len(errs) // 2]:.1%} over {count(len(errs), 'measured trial')}"
    else:
        sub = "no measured trial: a simulator result is the model's own prediction"
    ax = Axes(name, title, "predicted at dispatch", "result", vals, vals, subtitle=sub)
    lo, hi = max(ax.x0, ax.y0), min(ax.x1, ax.y1)
    ax.line([(lo, lo), (hi, hi)], stroke="#888", dash="4 3", width=1.2)
    for t in pts:
        err = f"; model error {t.predicted / t.value - 1:+.1%}" if t.value else ""
        ax.point(t.predicted, t.value, _tip(t, f", predicted {t.predicted:,.1f}{err}"),
                 MEASURED if t.source == "measured" else PREDICTED)
    ax.add_legend("#888", "y = x (perfect model)", "dash")
    if errs:
        ax.add_legend(MEASURED, "measured")
    if len(errs) < len(pts):
        ax.add_legend(PREDICTED, "simulated (prediction)")
    return ax.render()


def memory_vs_throughput(view: StudyView) -> str:
    """Peak memory per GPU against throughput, with the usable capacity; OOM trials sit at zero, marked."""
    name, title = "memory-vs-throughput", "Peak memory against throughput"
    rows = []
    for t in view.dispatched:
        peak = t.peak_bytes or t.predicted_peak_bytes or (t.prediction.peak_bytes if t.prediction else None)
        if peak and (t.ok or t.status == "oom"):
            rows.append((peak / GiB, t.value if t.ok else 0.0, t))
    if not rows:
        return empty(name, title, "no trial recorded its peak memory")
    cap = view.capacity_bytes / GiB if view.capacity_bytes else None
    xs = [r[0] for r in rows] + ([cap * 1.02] if cap else [])
    ax = Axes(name, title, "peak memory per GPU (GiB), most loaded stage", "tokens/s per GPU", xs,
              [r[1] for r in rows], yzero=True)
    if cap:
        ax.vline(cap, f"usable HBM {cap:,.1f} GiB")
    ooms = 0
    for gib, v, t in rows:
        if t.status == "oom":
            ooms += 1
            ax.point(gib, 0.0, _tip(t, f", peak {gib:,.1f} GiB: {t.reason or 'out of memory'}"), FAILED, "cross", r=5)
        else:
            ax.point(gib, v, _tip(t, f", peak {gib:,.1f} GiB"), MEASURED if t.source == "measured" else PREDICTED)
    if any(t.ok and t.source == "measured" for _, _, t in rows):
        ax.add_legend(MEASURED, "measured")
    if any(t.ok and t.source != "measured" for _, _, t in rows):
        ax.add_legend(PREDICTED, "simulated (prediction)")
    ax.add_legend(FAILED, f"OOM ({ooms})", "cross")
    if cap:
        ax.add_legend("#c0392b", "usable HBM per GPU", "dash")
    return ax.render()
