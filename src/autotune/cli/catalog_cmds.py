"""`autotune models` and `autotune gpus`: list the catalog."""

from __future__ import annotations

import typer
from rich.table import Table

from ..catalog import GPUS, load_model, model_names, param_counts
from ..report.fit import fit
from .console import console, print_json


def param_count(n: int) -> str:
    """A parameter count for the table: 2 decimals of B from 1B, else M or K to 3 significant digits, else the
    count itself (0.00B hid the small test models)."""
    if round(n / 1e9, 2) >= 1:
        return f"{n / 1e9:,.2f}B"
    for scale, unit in ((1e6, "M"), (1e3, "K")):
        text = f"{n / scale:.3g}"  # decided after rounding, so 999,999 is 1M, not 1e+03K
        if float(text) >= 1:
            return f"{text}{unit}"
    return str(n)


def models(json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the shipped models with their exact parameter counts (active per token under the seed's rule)."""
    rows = []
    for name in model_names():
        m = load_model(name)
        c = param_counts(m)
        rows.append(dict(name=name, total_params=c.total, active_params=c.active, layers=m.num_layers,
                         hidden=m.hidden_size, moe=m.is_moe, hybrid=m.is_hybrid, description=m.describe()))
    if json_out:
        print_json(rows)
        return
    t = Table(title="models (use --model NAME, or --model path/to/config.json)")
    for col in ("name", "total", "active", "architecture"):
        t.add_column(col, justify="right" if col in ("total", "active") else "left")
    for r in rows:
        t.add_row(r["name"], param_count(r["total_params"]), param_count(r["active_params"]), r["description"])
    console.print(fit(t))


def gpus(json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the GPU kinds with memory, dense BF16 peak, bandwidths and price."""
    if json_out:
        print_json([g.__dict__ for g in GPUS.values()])
        return
    t = Table(title="GPUs (use --gpu NAME)")
    for col in ("name", "memory", "BF16 TFLOP/s", "HBM GB/s", "NVLink GB/s", "$/GPU-h", "per node", "instance"):
        t.add_column(col, justify="left" if col in ("name", "instance") else "right")  # numbers line up
    for g in GPUS.values():
        t.add_row(g.name, f"{g.memory_bytes / 2**30:.1f} GiB", f"{g.bf16_tflops:g}", f"{g.hbm_gbps:g}",
                  f"{g.nvlink_gbps:g}", f"{g.usd_per_hour:.2f}", str(g.gpus_per_node), g.instance)
    console.print(fit(t))


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.command("gpus")(gpus)
