"""The end of a search: ranked table, recipes written to runs/<study>/recipes/, the JSON shape, summary."""

from __future__ import annotations

import datetime as dt

from rich.table import Table

from ..cost import evaluate
from ..layout import LayoutTable
from ..trials.spec import TrialResult, read_model, write_json_atomic
from .console import console

GiB = 1024**3
RECIPES_PER_STUDY = 5


def _ranked(outcome) -> list:
    ok = [r for r in outcome.records if r.status == "ok" and r.value]
    return sorted(ok, key=lambda r: -r.value)


def emit_recipes(driver, outcome) -> list[str]:
    """Write a recipe per ranked trial (best first) to runs/<study>/recipes/rank-NN-<name>.yaml."""
    from ..recipes.emit import recipe_from_candidate, recipe_name
    from ..recipes.io import write_recipe

    out_dir = driver.sd.root / "recipes"
    written = []
    for old in out_dir.glob("rank-*.yaml") if out_dir.exists() else []:
        old.unlink()
    for rank, rec in enumerate(_ranked(outcome)[:RECIPES_PER_STUDY], 1):
        res_path = driver.sd.trial_dir(rec.number) / "trial_result.json"
        res = read_model(TrialResult, res_path) if res_path.exists() else None
        wl = driver.workload
        recipe = recipe_from_candidate(
            driver.model, driver.cluster, rec.layout, wl,
            status="measured" if rec.source == "measured" else "predicted",
            tokens_per_s_per_gpu=rec.value,
            step_time_cv_percent=res.step_time_cv_percent if res and res.source == "measured" else None,
            gpu_hours=res.gpu_hours if res else None, window=tuple(wl.window), steps_per_run=wl.steps,
            stack=_stack(res, driver.cluster),
            measured=dt.date.today().isoformat(),
            gpu_hours_note="predicted: GPUs x (20 steps + 10 min startup)" if rec.source != "measured" else None,
        )
        name = recipe_name("autotune", rec.layout, wl, moe=driver.model.is_moe)
        path = out_dir / f"rank-{rank:02d}-{name}.yaml"
        write_recipe(recipe, path, name=name)
        written.append(str(path))
    return written


def _stack(res: TrialResult | None, cluster) -> dict:
    """The recipe's stack section from what the trial detected (or says plainly that nothing ran)."""
    import platform

    from .. import __version__

    got = dict(res.stack) if res and res.source == "measured" else {}
    missing = "not run: predicted by autotune's cost model"
    out = {
        "framework": got.get("framework") or (f"autotune {__version__} runner (megatron-core)" if got else missing),
        "megatron_lm": got.get("megatron_core") or missing,
        "pytorch": got.get("torch") or missing,
        "python": got.get("python") or platform.python_version(),
        "network": f"{cluster.gpus_per_node} GPUs per node, {cluster.network_gbps * 8 / 1000:g} Tb/s per node",
    }
    for src, dst in (("transformer_engine", "transformer_engine"), ("cuda", "cuda"), ("nccl", "nccl"), ("deepep", "deepep")):
        if got.get(src):
            out[dst] = got[src]
    out["source"] = "detected by the trial runner" if got else "nothing ran: no stack to detect"
    return out


def outcome_json(driver, outcome, recipes: list[str]) -> dict:
    ranked = _ranked(outcome)
    rows = []
    table = LayoutTable.from_layouts([r.layout for r in outcome.records]) if outcome.records else None
    ev = evaluate(driver.model, driver.workload, driver.cluster, table, driver.calibration) if table else None
    for i, r in enumerate(outcome.records):
        row = {
            "number": r.number,
            "layout": r.layout.label(driver.model.is_moe),
            "recompute": str(r.layout.recompute),
            "dispatcher": r.layout.dispatcher,
            "state": r.status if r.status != "ok" else ("measured" if r.source == "measured" else "predicted"),
            "predicted": r.predicted,
            "measured": r.value if r.source == "measured" else None,
            "value": r.value,
        }
        if ev is not None:
            tps = r.value or float(ev.time.tokens_per_s_per_gpu[i])
            g = driver.cluster.gpu
            row.update(mfu=float(tps * 6 * _active(driver.model) / (g.bf16_tflops * 1e12)),
                       usd_per_million_tokens=float(g.usd_per_hour / (tps * 3600) * 1e6) if tps else None,
                       peak_memory_bytes=int(ev.memory.peak[i]))
        rows.append(row)
    best = None
    if ranked:
        b = ranked[0]
        best = {"number": b.number, "layout": b.layout.label(driver.model.is_moe), "tokens_per_s_per_gpu": b.value,
                "status": "measured" if b.source == "measured" else "predicted", "recompute": str(b.layout.recompute),
                "dispatcher": b.layout.dispatcher, "summary": b.layout.summary(driver.workload.seq_len)}
    reference = _reference(driver)
    if best and reference:
        best["vs_reference"] = best["tokens_per_s_per_gpu"] / reference["tokens_per_s_per_gpu"]
    out = {
        "study": outcome.study,
        "runs_dir": outcome.runs_dir,
        "study_dir": str(driver.sd.root),
        "backend": outcome.backend,
        "planner": driver.cfg.planner,
        "stop_reason": outcome.stop_reason,
        "best": best,
        "trials": rows,
        "dispatched": driver.n_dispatched(),
        "gpu_hours": outcome.gpu_hours,
        "funnel": [{"stage": s, "count": c} for s, c in driver.funnel],
        "recipes": recipes,
        "reference": reference,
        "notes": outcome.notes,
        "dashboard": f"optuna-dashboard sqlite:///{driver.sd.db_path}",
        "export": f"autotune export {driver.sd.root} --rank 1",
    }
    write_json_atomic(driver.sd.root / "summary.json", out)
    return out


def _reference(driver) -> dict | None:
    """The best measured or verified recipe already known for this model, GPU kind and GPU count."""
    from ..recipes.rank import leaderboard, load_all

    items, _ = load_all()
    same = [(p, r) for p, r in items if r.gpu.count == driver.cluster.count and r.status != "predicted"
            and r.workload.row_tokens == driver.workload.seq_len and r.workload.global_batch == driver.workload.global_batch]
    board = leaderboard(same, driver.model.name, driver.cluster.gpu.name)
    if not board:
        return None
    e = board[0]
    return {"name": e.name, "layout": e.recipe.layout.label, "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
            "status": e.recipe.status, "author": e.recipe.author.name, "path": str(e.path)}


def _active(model) -> int:
    from ..catalog import param_counts

    return param_counts(model).active


def render_outcome(out: dict) -> None:
    t = Table(title=f"study {out['study']}: trials ranked ({out['backend']} backend)")
    for col in ("rank", "trial", "layout", "recompute", "disp.", "predicted", "measured", "MFU", "$/1M", "peak GiB", "state"):
        t.add_column(col, justify="right" if col in ("rank", "trial", "predicted", "measured", "MFU", "$/1M", "peak GiB") else "left")
    order = sorted(out["trials"], key=lambda r: -(r["value"] or 0))
    for k, r in enumerate(order, 1):
        fmt = lambda v: f"{v:,.1f}" if v else "-"  # noqa: E731
        t.add_row(str(k) if r["value"] else "-", str(r["number"]), r["layout"], r["recompute"], r["dispatcher"],
                  fmt(r["predicted"]), fmt(r["measured"]), f"{r.get('mfu', 0):.1%}" if r["value"] else "-",
                  f"{r['usd_per_million_tokens']:.2f}" if r["value"] and r.get("usd_per_million_tokens") else "-",
                  f"{r.get('peak_memory_bytes', 0) / GiB:.1f}", r["state"])
    console.print(t)
    for note in out["notes"]:
        console.print(f"note: {note}")
    console.print(f"stopped: {out['stop_reason']}")
    console.print(f"{out['dispatched']} trial(s), {out['gpu_hours']:.1f} GPU-hours"
                  + (" (predicted)" if out["backend"] == "simulate" else ""))
    b = out["best"]
    if b:
        console.print(f"best: [bold]{b['layout']}[/] ({b['summary']}): {b['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU "
                      f"[{b['status']}]")
        ref = out.get("reference")
        if ref:
            console.print(f"against the best known recipe {ref['name']} ({ref['layout']}, {ref['tokens_per_s_per_gpu']:,.1f} "
                          f"tokens/s/GPU, {ref['status']}): {b['vs_reference']:.2f}x"
                          + (" [predicted, not yet measured]" if b["status"] == "predicted" else ""))
        console.print(f"recipes: {out['study_dir']}/recipes/   export the best: [bold]{out['export']}[/]")
    console.print(f"dashboard: {out['dashboard']}")
