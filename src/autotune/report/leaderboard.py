"""The recipes leaderboard as one offline HTML page, in the style of the OpenRecipes seed page: per model and
GPU kind, a ranked table (tokens/s per GPU, $ per 1M tokens, GPUs, layout with its highlights, measured,
author, a link to the recipe's block), then one detail block per recipe (author, GPUs, layout, numbers,
correctness, stack, environment, the command and the recipe file itself)."""

from __future__ import annotations

from pathlib import Path

from ..fsutil import write_text_atomic
from ..recipes.io import recipe_relpath
from ..recipes.rank import Entry, caption
from .svg import esc

__all__ = ["leaderboard_html", "write_leaderboard", "correctness_line"]

CSS = """
body{font:14px/1.5 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1d1d1f;margin:0}
main{max-width:1100px;margin:0 auto;padding:18px 24px 48px}.brand{font-weight:700;color:#555}
h1{font-size:24px;margin:10px 0 2px}h2{font-size:19px;margin:34px 0 10px}.cap{color:#666;margin-bottom:10px}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:8px 10px;border-bottom:1px solid #eee;vertical-align:top}
th{font-size:12px;color:#666;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.hl{color:#666;font-size:12.5px}.badge{font-size:11px;border-radius:9px;padding:1px 7px;margin-left:6px;background:#eee}
.badge.predicted{background:#fff1c2;color:#7a5b00}.badge.verified{background:#dff3e3;color:#17602b}
.card{border:1px solid #e5e5e5;border-radius:10px;padding:14px 18px;margin:18px 0}.card h3{margin:0 0 8px;font-size:16px}
dl{display:grid;grid-template-columns:200px 1fr;gap:4px 14px;margin:8px 0}dt{color:#666}dd{margin:0}
pre{background:#f6f8fa;border-radius:6px;padding:10px;overflow:auto;font-size:12px}a{color:#0b62c4;text-decoration:none}
"""


def correctness_line(result: str, summary: str) -> str:
    """'not run: convergence: predicted ...', 'passed; 1 component test passed': the result once (a summary
    that begins with it, as the gates write them, is not prefixed again)."""
    if not summary:
        return result
    return summary if summary.startswith(result) else f"{result}: {summary}"


def _badge(status: str) -> str:
    return f'<span class="badge {esc(status)}">{esc(status)}</span>'


def _table(entries: list[Entry]) -> str:
    rows = []
    for e in entries:
        r = e.recipe
        rows.append(f'<tr><td class="n">#{e.rank}</td><td class="n">{r.result.tokens_per_s_per_gpu:,.1f}</td>'
                    f'<td class="n">${r.result.usd_per_million_tokens:.2f}</td><td class="n">{r.gpu.count}</td>'
                    f'<td>{esc(r.layout.label)}{_badge(r.status) if r.status != "measured" else ""}'
                    f'<div class="hl">{esc(r.layout.highlights)}</div></td><td>{r.result.measured.isoformat()}</td>'
                    f'<td>{esc(r.author.name)}</td><td><a href="#{esc(e.name)}">Recipe ›</a></td></tr>')
    head = "".join(f"<th>{h}</th>" for h in ("#", "Tokens/s per GPU", "$ / 1M tokens", "GPUs", "Layout", "Measured",
                                              "Author", ""))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _dl(rows: list[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def _card(e: Entry) -> str:
    r, res, lay = e.recipe, e.recipe.result, e.recipe.layout
    author = esc(r.author.name) + (f' (<a href="{esc(r.author.url)}">cite</a>)' if r.author.url else "")
    measured = res.measured.isoformat()
    if (res.steps_per_run, list(res.window)) != (20, [5, 19]):  # the seed notes only a non-standard run
        measured += f", {res.steps_per_run}-step run scored over steps {res.window[0]}–{res.window[1]}"
    c = r.correctness
    conv = c.convergence
    rows = [("Author", author), ("Status", _badge(r.status)),
            ("GPUs", esc(f"{r.gpu.count} x {r.gpu.type} {r.gpu.memory_gb} GB ({r.gpu.instance}, {r.gpu.per_node} per node)")),
            ("Layout", esc(lay.summary)), ("Tokens/s per GPU", f"{res.tokens_per_s_per_gpu:,.2f}"),
            ("$ / 1M tokens", f"${res.usd_per_million_tokens:.2f}"),
            ("MFU", esc(f"{res.mfu:.1%} (N = {res.active_params.count:,} active parameters per token)"
                        + (f"; {res.mfu_note}" if res.mfu_note else "")))]
    if res.step_time_cv_percent is not None:
        rows.append(("Step-time CV", f"{res.step_time_cv_percent:.2f}%"))
    rows.append(("Correctness", esc(correctness_line(c.result, c.summary))))
    rows.append(("Convergence check", esc(f"correlation {conv.correlation}, final loss difference "
                                          f"{conv.final_loss_difference}, {conv.pointwise_failures} pointwise failures "
                                          f"over {conv.steps} steps" if conv else "not run")))
    rows += [("Component test", esc(f"{t.test}: {t.result} on {t.gpu}, {t.date.isoformat()}. Shape: {t.shape}. {t.detail}"))
             for t in c.component_tests]
    rows.append(("Measured", esc(measured)))
    if res.gpu_hours is not None:
        rows.append(("GPU-hours", f"{res.gpu_hours:g}"))
    d = r.workload.dataset
    if d is not None:
        rows.append(("Rows", esc(f"{d.build.name} (rows_sha256 {d.rows_sha256})")))
    stack = [(k.replace("_", " "), esc(v)) for k, v in r.stack.model_dump().items() if v is not None]
    env = "".join(f"<li><code>{esc(k)}={esc(v)}</code></li>" for k, v in r.env.items())
    try:
        text = Path(e.path).read_text()
    except OSError:
        text = ""
    return (f'<section class="card" id="{esc(e.name)}"><h3>#{e.rank} {esc(e.name)} · {res.tokens_per_s_per_gpu:,.1f} '
            f'tokens/s/GPU · {esc(lay.label)} <span class="hl">{esc(lay.highlights)}</span></h3>{_dl(rows)}'
            f'<h4>Stack</h4>{_dl(stack)}<h4>Environment</h4><ul>{env}</ul><h4>Command <span class="hl">How to run</span></h4>'
            f'<pre>{esc(r.run)}</pre><h4>{esc(recipe_relpath(r, e.name))}</h4><pre>{esc(text)}</pre></section>')


def leaderboard_html(entries: list[Entry]) -> str:
    groups: dict[tuple[str, str], list[Entry]] = {}
    for e in entries:
        groups.setdefault((e.recipe.model, e.recipe.gpu.type), []).append(e)
    body = []
    for (model, gpu), es in groups.items():
        # ranks restart per model and GPU kind, as on the seed page
        es = [Entry(i + 1, e.name, e.path, e.recipe) for i, e in enumerate(es)]
        body.append(f"<h1>Training {esc(model)} on {esc(gpu)}</h1><div class=cap>{esc(caption(es))}</div>{_table(es)}"
                    f"<h2>Recipes</h2>{''.join(_card(e) for e in es)}")
    if not body:
        body.append("<h1>Recipes</h1><p>No recipes.</p>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Recipes leaderboard</title>'
            f'<style>{CSS}</style></head><body><main><div class="brand">OpenRecipes · autotune</div>{"".join(body)}'
            f"</main></body></html>\n")


def write_leaderboard(entries: list[Entry], path: str | Path) -> Path:
    return write_text_atomic(path, leaderboard_html(entries), mode=0o644, make_parents=False)
