"""The report's bar-like charts: the step-time breakdown of the top layouts side by side, layout maps
(two layout dimensions, each cell coloured by the best throughput seen there), and the pruning funnel."""

from __future__ import annotations

import math

from ..words import count
from .study import StudyView, TrialView
from .svg import PALETTE, colour, empty, esc

__all__ = ["step_breakdown", "layout_map", "funnel", "funnel_stages", "TERM_ORDER", "TERM_COLOURS"]

# step-time terms in reading order: compute by layer type, recompute, exposed communication, bubble, the rest
# and a colour per term by family: compute blues and teals, recompute orange, communication reds and purples
TERM_COLOURS = {"compute_dense": "#1f4e9c", "compute_attention": "#3b82c4", "compute_linear_attention": "#8fbde6",
                "compute_experts": "#0f8b8d", "compute_output": "#7cc7b9", "recompute": "#e69f00",
                "memory_bound": "#f0d264", "expert_memory": "#d4ac0d", "tp_comm": "#8e44ad", "cp_comm": "#c39bd3", "ep_comm": "#c0392b",
                "pp_p2p": "#ec8b7f", "dp_comm": "#d35d9b", "bubble": "#a0a0a0", "imbalance": "#5a5a5a",
                "layer_overhead": "#c8b68e", "optimizer": "#2e7d32", "offload": "#8d6e63", "step_overhead": "#d6d6d6"}
TERM_ORDER = list(TERM_COLOURS)


def _distinct_top(view: StudyView, k: int) -> list[TrialView]:
    seen, out = set(), []
    for t in view.ranked():
        key = (t.label, t.recompute, t.dispatcher, str(sorted(t.layout.items())) if t.layout else "")
        if t.prediction is None or not t.prediction.time_terms or key in seen:
            continue
        seen.add(key)
        out.append(t)
        if len(out) == k:
            break
    return out


def step_breakdown(view: StudyView, k: int = 5) -> str:
    name, title = "step-breakdown", f"Predicted step time of the top {k} layouts, by term (seconds per step)"
    top = _distinct_top(view, k)
    if not top:
        return empty(name, title, "no ranked trial carries a Prediction with time terms")
    terms = [x for x in TERM_ORDER if any(t.prediction.time_terms.get(x, 0) > 0 for t in top)]
    terms += sorted({x for t in top for x, v in t.prediction.time_terms.items() if v > 0} - set(terms))
    col = {x: TERM_COLOURS.get(x) or PALETTE[i % len(PALETTE)] for i, x in enumerate(terms)}
    total = max(sum(v for v in t.prediction.time_terms.values() if v > 0) for t in top)
    labels = [f"#{i + 1} trial {t.number}: {t.label} ({t.recompute}, {t.dispatcher})" for i, t in enumerate(top)]
    label_w = int(16 + 6.4 * max(len(x) for x in labels))  # wide enough that no label is clipped
    w, bar_h, gap = label_w + 640, 24, 10
    legend_rows = math.ceil(len(terms) / 4)
    h = 34 + len(top) * (bar_h + gap) + 26 + legend_rows * 17 + 8
    scale = (w - label_w - 70) / total
    g = [f'<svg class="plot" data-plot="{name}" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
         f'xmlns="http://www.w3.org/2000/svg"><text x="8" y="18" font-weight="600" font-size="13">{esc(title)}</text>']
    for i, t in enumerate(top):
        y = 34 + i * (bar_h + gap)
        g.append(f'<text x="{label_w - 8}" y="{y + 16}" text-anchor="end" font-size="11.5">{esc(labels[i])}</text>')
        x = label_w
        tt = t.prediction.time_terms
        for term in terms:
            v = tt.get(term, 0.0)
            if v <= 0:
                continue
            g.append(f'<rect class="mark" x="{x:.1f}" y="{y}" width="{v * scale:.1f}" height="{bar_h}" fill="{col[term]}">'
                     f'<title>{esc(term)}: {v:.3f} s ({v / sum(tt.values()):.1%})</title></rect>')
            x += v * scale
        g.append(f'<text x="{x + 5:.1f}" y="{y + 16}" font-size="11">{sum(tt.values()):.2f} s</text>')
    y0 = 34 + len(top) * (bar_h + gap) + 14
    for j, term in enumerate(terms):
        x, y = 8 + (j % 4) * 240, y0 + (j // 4) * 17
        g.append(f'<rect x="{x}" y="{y - 9}" width="11" height="11" fill="{col[term]}"/>'
                 f'<text x="{x + 16}" y="{y + 1}" font-size="11">{esc(term.replace("_", " "))}</text>')
    g.append("</svg>")
    return "".join(g)


def _sort_key(v):
    return (0, float(v), "") if isinstance(v, (int, float)) else (1, 0.0, str(v))


def layout_map(view: StudyView, xdim: str, ydim: str, title: str) -> str:
    """A grid over two layout dimensions; each cell shows the best tokens/s/GPU among its trials."""
    name = f"map-{xdim}-{ydim}"
    get = {"recompute": lambda t: t.recompute, "dispatcher": lambda t: t.dispatcher}
    cells: dict[tuple, list[TrialView]] = {}
    for t in view.dispatched:
        if not t.layout and xdim not in get:
            continue
        xv = get[xdim](t) if xdim in get else t.layout.get(xdim)
        yv = get[ydim](t) if ydim in get else t.layout.get(ydim)
        if xv is None or yv is None:
            continue
        cells.setdefault((xv, yv), []).append(t)
    if not cells:
        return empty(name, title, "the trials carry no layout")
    xs = sorted({k[0] for k in cells}, key=_sort_key)
    ys = sorted({k[1] for k in cells}, key=_sort_key)
    best = {k: max((t.value for t in v if t.ok), default=None) for k, v in cells.items()}
    vals = [v for v in best.values() if v]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    cw, ch, top = max(64, min(110, 620 // max(1, len(xs)))), 34, 62
    left = 24 + 6.3 * max(len(str(y)) for y in ys)
    w, h = max(600, left + cw * len(xs) + 20), top + ch * len(ys) + 40
    g = [f'<svg class="plot" data-plot="{name}" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
         f'xmlns="http://www.w3.org/2000/svg"><text x="8" y="18" font-weight="600" font-size="13">{esc(title)}</text>',
         f'<text x="{left + cw * len(xs) / 2:.0f}" y="{top - 22}" text-anchor="middle" font-size="11.5">{esc(xdim.upper())}</text>',
         f'<text x="8" y="{top - 6}" font-size="11.5">{esc(ydim.upper() if ydim not in get else ydim)}</text>']
    for i, xv in enumerate(xs):
        g.append(f'<text x="{left + cw * i + cw / 2:.0f}" y="{top - 6}" text-anchor="middle" font-size="11">{esc(xv)}</text>')
    for j, yv in enumerate(ys):
        g.append(f'<text x="{left - 6}" y="{top + ch * j + ch / 2 + 4:.0f}" text-anchor="end" font-size="11">{esc(yv)}</text>')
        for i, xv in enumerate(xs):
            x, y, ts = left + cw * i, top + ch * j, cells.get((xv, yv))
            if not ts:
                g.append(f'<rect x="{x}" y="{y}" width="{cw - 2}" height="{ch - 2}" fill="#f4f4f4"/>')
                continue
            v = best[(xv, yv)]
            f = (v - lo) / (hi - lo) if v and hi > lo else 1.0
            fill = colour(f) if v else "#e0b4b4"
            ink = "#000" if not v or f > 0.55 else "#fff"
            label = f"{v:,.0f}" if v else ",".join(sorted({t.display_state for t in ts}))
            tip = f"{xdim} {xv}, {ydim} {yv}: {count(len(ts), 'trial')}" + (f", best {v:,.1f} tokens/s/GPU" if v else "")
            g.append(f'<rect class="mark" x="{x}" y="{y}" width="{cw - 2}" height="{ch - 2}" fill="{fill}"><title>'
                     f'{esc(tip)}</title></rect><text x="{x + cw / 2 - 1:.0f}" y="{y + ch / 2 + 3:.0f}" text-anchor="middle" '
                     f'font-size="10.5" fill="{ink}">{esc(label)}</text>')
    g.append(f'<text x="8" y="{h - 12}" font-size="10.5" fill="#555">best tokens/s per GPU in the cell: {lo:,.0f} dark, '
             f'{hi:,.0f} bright; grey: not tried; pink: tried, no result</text></svg>')
    return "".join(g)


def funnel_stages(view: StudyView) -> list[tuple[str, int]]:
    stages = list(view.funnel)
    have = {s for s, _ in stages}
    extra = [("dispatched", len(view.dispatched)),
             ("measured", sum(1 for t in view.trials if t.ok and t.source == "measured")),
             ("verified", sum(1 for r in view.recipes if r.correctness.get("result") == "pass"))]
    return stages + [(s, c) for s, c in extra if s not in have]


def funnel(view: StudyView) -> str:
    name, title = "funnel", "The pruning funnel: what the model screened before a GPU-hour was spent (log scale)"
    stages = funnel_stages(view)
    if not stages:
        return empty(name, title, "summary.json holds no funnel and the study has no trials")
    top = max(c for _, c in stages) or 1
    w, left, bh = 900, 190, 22
    h = 34 + len(stages) * (bh + 6) + 8
    g = [f'<svg class="plot" data-plot="{name}" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
         f'xmlns="http://www.w3.org/2000/svg"><text x="8" y="18" font-weight="600" font-size="13">{esc(title)}</text>']
    for i, (stage, c) in enumerate(stages):
        y = 30 + i * (bh + 6)
        bw = max(2.0, (w - left - 90) * math.log10(1 + c) / math.log10(1 + top))
        g.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end" font-size="11.5">{esc(stage)}</text>'
                 f'<rect class="mark" x="{left}" y="{y}" width="{bw:.1f}" height="{bh}" fill="{PALETTE[0 if i < len(view.funnel) else 2]}">'
                 f'<title>{esc(stage)}: {c:,}</title></rect><text x="{left + bw + 6:.1f}" y="{y + 15}" font-size="11.5">{c:,}</text>')
    g.append("</svg>")
    return "".join(g)
