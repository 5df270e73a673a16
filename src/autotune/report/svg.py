"""Hand-written SVG: axes with nice ticks, marks, a colour scale. No JavaScript, no external resources.

Every chart is an `<svg class="plot" data-plot=NAME>` with a viewBox, so it scales with the page; marks carry
a `<title>` (the browser's own tooltip). Strings are escaped here, once.
"""

from __future__ import annotations

import math
from html import escape

__all__ = ["Axes", "nice_ticks", "colour", "empty", "esc", "PALETTE"]

# colour-blind-safe categorical palette (Okabe-Ito, then greys)
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
           "#999999", "#6a3d9a", "#b15928", "#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#a6761d", "#666666",
           "#e6ab02"]
_STOPS = [(0.0, (68, 1, 84)), (0.25, (59, 82, 139)), (0.5, (33, 145, 140)), (0.75, (94, 201, 98)),
          (1.0, (253, 231, 37))]  # viridis


def esc(s) -> str:
    return escape(str(s), quote=True)


def colour(f: float) -> str:
    """Viridis at f in [0, 1]."""
    f = min(1.0, max(0.0, f))
    for (a, ca), (b, cb) in zip(_STOPS, _STOPS[1:]):
        if f <= b:
            u = (f - a) / (b - a)
            return "#%02x%02x%02x" % tuple(round(x + (y - x) * u) for x, y in zip(ca, cb))
    return "#fde725"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step + 1e-9) + 1)]


def fmt(v: float) -> str:
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:,.0f}" if a >= 100 or v == int(v) else f"{v:.3g}"


def _span(vals, pad: float = 0.06, zero: bool = False) -> tuple[float, float]:
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    if not vals:
        return 0.0, 1.0
    lo, hi = min(vals), max(vals)
    if zero:
        lo = min(lo, 0.0)
    if hi == lo:
        lo, hi = lo - (abs(lo) or 1) * 0.1, hi + (abs(hi) or 1) * 0.1
    d = (hi - lo) * pad
    return (lo if zero and lo == 0 else lo - d), hi + d


class Axes:
    """A cartesian chart: data ranges map into a plotting box; marks are SVG fragments in data space."""

    def __init__(self, name: str, title: str, xlabel: str, ylabel: str, xs, ys, w: int = 560, h: int = 330,
                 xzero: bool = False, yzero: bool = False, subtitle: str = ""):
        self.subtitle = subtitle
        self.name, self.title, self.xlabel, self.ylabel, self.w, self.h = name, title, xlabel, ylabel, w, h
        self.x0, self.x1 = _span(xs, zero=xzero)
        self.y0, self.y1 = _span(ys, zero=yzero)
        self.left, self.right, self.top, self.bottom = 64, 16, 44 if subtitle else 30, 62
        self.marks: list[str] = []
        self.legend: list[tuple[str, str, str]] = []  # (colour, shape, text)

    def sx(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.w - self.left - self.right)

    def sy(self, y: float) -> float:
        return self.h - self.bottom - (y - self.y0) / (self.y1 - self.y0) * (self.h - self.top - self.bottom)

    def point(self, x, y, tip: str, fill: str = PALETTE[0], shape: str = "circle", r: float = 4.5) -> None:
        cx, cy = self.sx(x), self.sy(y)
        t = f"<title>{esc(tip)}</title>"
        if shape == "cross":
            d = r * 1.1
            self.marks.append(f'<g class="mark" stroke="{fill}" stroke-width="2.2"><path d="M{cx - d:.1f},{cy - d:.1f}'
                              f'L{cx + d:.1f},{cy + d:.1f}M{cx - d:.1f},{cy + d:.1f}L{cx + d:.1f},{cy - d:.1f}"/>{t}</g>')
        else:
            self.marks.append(f'<circle class="mark" cx="{cx:.1f}" cy="{cy:.1f}" r="{r}" fill="{fill}" '
                              f'fill-opacity="0.85" stroke="#fff" stroke-width="0.8">{t}</circle>')

    def line(self, pts, stroke: str = PALETTE[0], step: bool = False, dash: str = "", width: float = 2.0) -> None:
        if not pts:
            return
        out, prev = [], None
        for x, y in pts:
            if step and prev is not None:
                out.append(f"{self.sx(x):.1f},{self.sy(prev):.1f}")
            out.append(f"{self.sx(x):.1f},{self.sy(y):.1f}")
            prev = y
        da = f' stroke-dasharray="{dash}"' if dash else ""
        self.marks.append(f'<polyline class="mark" fill="none" stroke="{stroke}" stroke-width="{width}"{da} '
                          f'points="{" ".join(out)}"/>')

    def vline(self, x: float, text: str, stroke: str = "#c0392b") -> None:
        X = self.sx(x)
        self.marks.append(f'<line x1="{X:.1f}" x2="{X:.1f}" y1="{self.top}" y2="{self.h - self.bottom}" stroke="{stroke}" '
                          f'stroke-width="1.5" stroke-dasharray="5 3"/><text x="{X - 4:.1f}" y="{self.top + 12}" '
                          f'text-anchor="end" fill="{stroke}" font-size="11">{esc(text)}</text>')

    def add_legend(self, fill: str, text: str, shape: str = "circle") -> None:
        self.legend.append((fill, shape, text))

    def render(self) -> str:
        w, h, L, B = self.w, self.h, self.left, self.h - self.bottom
        g = [f'<svg class="plot" data-plot="{esc(self.name)}" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
             f'role="img" aria-label="{esc(self.title)}" xmlns="http://www.w3.org/2000/svg">',
             f'<text x="{L}" y="18" font-weight="600" font-size="13">{esc(self.title)}</text>']
        if self.subtitle:
            g.append(f'<text x="{L}" y="34" font-size="11" fill="#555">{esc(self.subtitle)}</text>')
        for t in nice_ticks(self.x0, self.x1):
            X = self.sx(t)
            g.append(f'<line x1="{X:.1f}" x2="{X:.1f}" y1="{self.top}" y2="{B}" stroke="#eee"/>'
                     f'<text x="{X:.1f}" y="{B + 15}" text-anchor="middle" font-size="10.5">{fmt(t)}</text>')
        for t in nice_ticks(self.y0, self.y1):
            Y = self.sy(t)
            g.append(f'<line x1="{L}" x2="{w - self.right}" y1="{Y:.1f}" y2="{Y:.1f}" stroke="#eee"/>'
                     f'<text x="{L - 6}" y="{Y + 3.5:.1f}" text-anchor="end" font-size="10.5">{fmt(t)}</text>')
        g.append(f'<rect x="{L}" y="{self.top}" width="{w - L - self.right}" height="{B - self.top}" fill="none" stroke="#999"/>')
        g.append(f'<text x="{(L + w - self.right) / 2:.0f}" y="{h - 26}" text-anchor="middle" font-size="11.5">'
                 f'{esc(self.xlabel)}</text>')
        g.append(f'<text transform="translate(14 {(self.top + B) / 2:.0f}) rotate(-90)" text-anchor="middle" '
                 f'font-size="11.5">{esc(self.ylabel)}</text>')
        g += self.marks
        x = L  # the legend is one row under the x label, so it never covers a mark
        for fill, shape, text in self.legend:
            y = h - 6
            dash = ' stroke-dasharray="5 3"' if shape == "dash" else ""
            mark = (f'<circle cx="{x + 5}" cy="{y - 4}" r="4.5" fill="{fill}"/>' if shape == "circle" else
                    f'<path d="M{x + 1},{y - 8}L{x + 9},{y}M{x + 1},{y}L{x + 9},{y - 8}" stroke="{fill}" stroke-width="2.2"/>'
                    if shape == "cross" else f'<line x1="{x - 1}" x2="{x + 11}" y1="{y - 4}" y2="{y - 4}" stroke="{fill}" '
                    f'stroke-width="2"{dash}/>')
            g.append(f'{mark}<text x="{x + 15}" y="{y}" font-size="11">{esc(text)}</text>')
            x += 28 + 6.2 * len(text)
        g.append("</svg>")
        return "".join(g)


def empty(name: str, title: str, why: str, w: int = 560, h: int = 120) -> str:
    """A chart that has nothing to draw says why, in place (so the page never has a silent hole)."""
    return (f'<svg class="plot empty" data-plot="{esc(name)}" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
            f'xmlns="http://www.w3.org/2000/svg"><text x="10" y="20" font-weight="600" font-size="13">{esc(title)}</text>'
            f'<rect x="1" y="30" width="{w - 2}" height="{h - 32}" fill="#fafafa" stroke="#ddd"/>'
            f'<text x="{w / 2:.0f}" y="{(h + 30) / 2 + 4:.0f}" text-anchor="middle" fill="#777" font-size="12">'
            f'not available: {esc(why)}</text></svg>')
