"""One self-contained, offline HTML report of a study: header, plots, the sortable ranked trials table
(with the planner's rationale per trial), each recipe's gate results, and what was not available.

No external resource of any kind: the SVG is generated (svg.py, plots.py, bars.py), the CSS is inline and
the only script is a dozen lines that sort tables. The file opens from disk, offline, in any browser.
"""

from __future__ import annotations

from pathlib import Path

from ..cost.advice import lever_text, shares_text
from ..fsutil import write_text_atomic
from ..words import hours
from . import bars, plots
from .study import StudyView, TrialView
from .svg import esc

__all__ = ["render_html", "write_html", "CSS", "SORT_JS"]

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1d1d1f;margin:0;background:#fff}
main{max-width:1280px;margin:0 auto;padding:18px 24px 40px}
h1{font-size:22px;margin:6px 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #e5e5e5;padding-bottom:4px}
.sub{color:#555}.warn{background:#fff7e0;border:1px solid #f0d890;padding:6px 10px;border-radius:6px;margin:10px 0}
.kpis{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0}.kpi{border:1px solid #e5e5e5;border-radius:8px;padding:8px 12px;min-width:150px}
.kpi b{display:block;font-size:18px}.kpi span{color:#666;font-size:12px}
.grid{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}.grid svg,.wide svg{max-width:100%;height:auto;border:1px solid #eee;border-radius:6px}
svg text{font-family:system-ui,sans-serif}
table{border-collapse:collapse;width:100%;font-size:12.5px}th,td{padding:4px 7px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{background:#f7f7f7;position:sticky;top:0}table.sortable th{cursor:pointer;user-select:none}
table.sortable th:after{content:" \\2195";color:#aaa}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.best td{background:#eef7ee}.st-oom,.st-crash,.st-timeout,.st-nan,.st-nccl,.st-infra{color:#b00020}.st-screened{color:#777}
.why{color:#444;font-size:11.5px;min-width:200px;max-width:360px}td.nw{white-space:nowrap}.pass{color:#0a7a2f;font-weight:600}.fail{color:#b00020;font-weight:600}.notrun{color:#777}
.scroll{max-height:620px;overflow:auto;border:1px solid #eee}ul.missing{color:#555}
"""

SORT_JS = """
document.querySelectorAll('table.sortable').forEach(function(tb){
  tb.querySelectorAll('th').forEach(function(th,i){th.addEventListener('click',function(){
    var asc=th.dataset.dir!=='asc';th.dataset.dir=asc?'asc':'desc';var body=tb.tBodies[0];
    var rows=Array.prototype.slice.call(body.rows);
    rows.sort(function(a,b){var x=a.cells[i].dataset.v,y=b.cells[i].dataset.v;var p=parseFloat(x),q=parseFloat(y);
      var c=(!isNaN(p)&&!isNaN(q))?p-q:String(x).localeCompare(String(y));return asc?c:-c;});
    rows.forEach(function(r){body.appendChild(r);});});});});
"""

GiB = 1024**3


def _td(text, v=None, cls: str = "") -> str:
    v = text if v is None else v
    c = f' class="{cls}"' if cls else ""
    return f'<td{c} data-v="{esc("" if v is None else v)}">{esc("" if text is None else text)}</td>'


def _num(x, f: str = "{:,.1f}", cls: str = "n") -> str:
    return _td(f.format(x) if x is not None else "-", x if x is not None else "-1e308", cls)


def _trial_rows(view: StudyView) -> list[str]:
    ranked = {t.number: k for k, t in enumerate(view.ranked(), 1)}
    order = sorted(view.trials, key=lambda t: (t.number not in ranked, ranked.get(t.number, 0), t.number))
    rows = []
    for t in order:
        k = ranked.get(t.number)
        peak = t.peak_bytes or t.predicted_peak_bytes
        cells = [_num(k, "#{}"), _num(t.number, "{}"), _td(t.label + (f" split {t.split}" if t.split != "even" else ""), cls="nw"), _td(t.recompute, cls="nw"), _td(t.dispatcher),
                 _num(t.predicted or (t.value if t.ok and t.measured is None else None)),
                 _td(t.measured_text, t.measured if t.measured else "-1e308", "n"),
                 _num(t.mfu, "{:.1%}"), _num(t.usd_per_million_tokens, "${:.2f}"),
                 _num(peak / GiB if peak else None), _num(t.gpu_hours, "{:.2f}"), _num(t.wall_s, "{:.1f}"),
                 _td(t.display_state, cls=f"st-{t.display_state}"), _td(t.why or "", cls="why"),
                 _td(_reason(t), cls="why")]
        rows.append(f'<tr{" class=best" if k == 1 else ""}>' + "".join(cells) + "</tr>")
    return rows


TRIAL_COLS = ["rank", "trial", "layout", "recompute", "dispatcher", "predicted", "measured", "MFU",
              "$ / 1M tokens", "peak GiB", "GPU-h", "wall s", "state", "planner's rationale", "reason"]


def _reason(t: TrialView) -> str:
    """Why a trial failed or was screened, or what a real run noted; a simulated result's stock note is
    already said by its state (predicted), so it is left out."""
    if t.ok and t.source != "measured":
        return ""
    return t.reason or ""


def _gate(v, detail: str = "") -> str:
    s = str(v if v is not None else "not run")
    cls = "pass" if s == "pass" else "fail" if s == "fail" else "notrun"
    more = f' <span class="sub">({esc(detail)})</span>' if detail else ""
    return f'<td class="{cls}" data-v="{esc(s)}">{esc(s)}{more}</td>'


def _recipes(view: StudyView) -> str:
    if not view.recipes:
        return '<p class="sub">No recipes in this study yet (the search writes them to recipes/ when it ends).</p>'
    head = ["recipe", "status", "layout", "tokens/s per GPU", "$ / 1M", "correctness", "configuration",
            "component tests", "convergence", "summary"]
    rows = []
    for r in view.recipes:
        c = r.correctness or {}
        comps = c.get("component_tests") or []
        comp = "none run" if not comps else ", ".join(f"{x.get('test', '?')}: {x.get('result', '?')}" for x in comps)
        conv = c.get("convergence")
        conv_s = ("" if not conv else f"correlation {conv.get('correlation')}, final loss "
                  f"difference {conv.get('final_loss_difference')}, {conv.get('pointwise_failures')} pointwise "
                  f"failures over {conv.get('steps')} steps")
        rows.append("<tr>" + _td(r.name) + _td(r.status) + _td(r.label) + _num(r.tokens_per_s_per_gpu)
                    + _num(r.usd_per_million_tokens, "${:.2f}") + _gate(c.get("result")) + _gate(c.get("configuration"))
                    + _td(comp) + _gate(conv.get("result") if conv else None, conv_s)
                    + _td(c.get("summary", "")) + "</tr>")
    return (f'<table class="sortable"><thead><tr>{"".join(f"<th>{esc(h)}</th>" for h in head)}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _kpis(view: StudyView, best: TrialView | None) -> str:
    sim = view.backend == "simulate"
    items = [(f"{len(view.dispatched)}", f"trials dispatched ({len(view.trials) - len(view.dispatched)} screened)"),
             (hours(view.gpu_hours), "GPU-hours" + (" (predicted)" if sim else "")),
             (f"{best.value:,.1f}" if best else "-", "best tokens/s per GPU" + (" (predicted)" if best and best.source != "measured" else "")),
             (f"{best.mfu:.1%}" if best and best.mfu else "-", "best MFU"),
             (f"${best.usd_per_million_tokens:.2f}" if best and best.usd_per_million_tokens else "-", "best $ / 1M tokens")]
    ref = view.reference
    if best and ref and ref.get("tokens_per_s_per_gpu"):
        items.append((f"{best.value / ref['tokens_per_s_per_gpu']:.2f}x", f"against {ref.get('name')} ({ref.get('status')})"))
    return '<div class="kpis">' + "".join(f'<div class="kpi"><b>{esc(a)}</b><span>{esc(b)}</span></div>' for a, b in items) + "</div>"


def render_html(view: StudyView) -> str:
    ranked = view.ranked()
    best = ranked[0] if ranked else None
    where = f"{view.model} on {view.count or '?'} x {view.gpu}" + (f" ({view.rows_text()})" if view.rows_text() else "")
    state = view.state_line()
    warn = ('<div class="warn">Simulator study: every result is the cost model\'s <b>prediction</b>; nothing was measured.'
            '</div>' if view.backend == "simulate" else "")
    best_line = (f"<p>Best: <b>{esc(best.label)}</b> ({esc(best.recompute)}, {esc(best.dispatcher)}), trial {best.number}, "
                 f"{best.value:,.1f} tokens/s per GPU [{esc(best.display_state)}]</p>" if best else "<p>No result yet.</p>")
    step = (view.best or {}).get("step") if best and (view.best or {}).get("number") == best.number else None
    if step:  # the search's own reading of its best layout (summary.json): the model's terms, and the bottleneck
        best_line += (f"<p>Where its step goes (the model's terms): {esc(shares_text(step.get('shares', [])))}</p>"
                      + "".join(f"<p>Bottleneck: {esc(lever_text(lev))}</p>" for lev in step.get("levers", [])))
    notes = "".join(f"<li>{esc(n)}</li>" for n in view.notes)
    missing = "".join(f"<li>{esc(m)}</li>" for m in dict.fromkeys(view.missing))
    table = (f'<div class="scroll"><table id="trials" class="sortable"><thead><tr>'
             f'{"".join(f"<th>{esc(c)}</th>" for c in TRIAL_COLS)}</tr></thead><tbody>{"".join(_trial_rows(view))}'
             f'</tbody></table></div>')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>autotune study {esc(view.name)}</title><style>{CSS}</style></head>
<body><main>
<h1>Study {esc(view.name)}</h1>
<div class="sub">{esc(where)} · {esc(view.backend)} backend · {esc(view.planner)} planner · {esc(state)}</div>
{warn}{_kpis(view, best)}{best_line}
{f"<ul>{notes}</ul>" if notes else ""}
<h2>Search progress</h2>
<div class="grid">{plots.best_vs_trials(view)}{plots.best_vs_gpu_hours(view)}</div>
<h2>Where the model was wrong, and where memory ran out</h2>
<div class="grid">{plots.predicted_vs_measured(view)}{plots.memory_vs_throughput(view)}</div>
<h2>Why the top layouts differ: step-time breakdown</h2>
<div class="wide">{bars.step_breakdown(view)}</div>
<h2>Layout maps</h2>
<div class="grid">{bars.layout_map(view, "tp", "pp", "TP x PP: best tokens/s per GPU")}{bars.layout_map(view, "ep", "recompute", "EP x recompute: best tokens/s per GPU")}</div>
<h2>Pruning funnel</h2>
<div class="wide">{bars.funnel(view)}</div>
<h2>Trials, ranked (click a column to sort)</h2>
{table}
<h2>Recipes and their correctness gates</h2>
{_recipes(view)}
<h2>Not available in this study</h2>
{f'<ul class="missing">{missing}</ul>' if missing else '<p class="sub">Everything was available.</p>'}
<p class="sub">Study folder: {esc(view.root)} · optuna-dashboard: autotune dashboard --optuna {esc(view.root)}</p>
</main><script>{SORT_JS}</script></body></html>
"""


def write_html(view: StudyView, path: str | Path) -> Path:
    return write_text_atomic(path, render_html(view), mode=0o644, make_parents=False)  # a page to share, not a secret
