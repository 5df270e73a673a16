"""`autotune calibrate`: fit the time model's per-term factors to measured runs and save them.

Rows come from the seed page's three H200 recipes (--seeds), the shipped public throughput table
(--published, only the rows the model can represent) and the user's own rows (--measurements: a CSV in
the published columns, a JSON list of measurements, or a study folder whose measured trials become rows).
Prints the factors and each row's error before (the calibration in use now) and after; with --out, writes the
JSON atomically there, merging with the GPU kinds already in that file (without --out nothing is written: a fit to
look at). estimate, space and search use the file when $AUTOTUNE_CALIBRATION names it.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from ..catalog import get_gpu
from ..cost.calibrate import (ENV_VAR, FAMILIES, STACK_SEP, fit_kinds, load_calibration, predict,
                              published_measurements, read_calibrations, read_measurements, row_report,
                              save_calibrations, seed_measurements, stack_kind)
from ..cost.time import STEP_TERMS
from ..errors import BadInput
from .common import input_file, output_file
from .console import console, print_json


def calibrate(
    gpu: str = typer.Option(None, "--gpu", "-g", help="Fit this GPU kind only (default: every kind with rows)."),
    measurements: str = typer.Option(None, "--measurements",
                                     help="Your rows: FILE.csv (published columns), FILE.json, or a study folder "
                                          "(runs/<study>: its measured trials)."),
    published: bool = typer.Option(True, "--published/--no-published", help="Use the shipped public table's rows."),
    seeds: bool = typer.Option(True, "--seeds/--no-seeds", help="Use the seed page's three measured H200 layouts."),
    out: str = typer.Option(None, "--out", "-o", help="Write the calibration JSON here (merged with the GPU kinds "
                            "already in the file); without --out the fit is only shown."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Fit per-GPU-kind factors on the time terms (least squares on log step time, with a prior toward 1);
    with --out, save them for estimate, space and search ($AUTOTUNE_CALIBRATION=FILE).

    A GPU kind's factors are Megatron-core's, fitted on its rows; rows another stack ran (a measurement's
    framework: torchtitan, automodel, llama3) fit factors of their own, shown as GPU+framework, with the kind's
    as their prior.

    Example: autotune calibrate --gpu H200 --measurements my_runs.csv --out calib.json

    A study's measured trials calibrate the model for the next search on the same cluster:
    autotune calibrate --measurements runs/<study> --out calib.json, then AUTOTUNE_CALIBRATION=calib.json.
    """
    if measurements and Path(measurements).suffix.lower() in (".csv", ".json"):  # else read_measurements says which
        input_file("--measurements", measurements)
    if out is not None and not out.strip():
        raise BadInput("--out '': give a file name, e.g. --out calib.json (or leave --out out to only see the fit)")
    if out is not None:
        output_file("--out", Path(out), stdout=False)  # before the fit: nothing half-done
        if Path(out).exists():  # the fit merges into it: a file it cannot read is refused now, not after the fit
            try:
                read_calibrations(out)
            except BadInput as exc:
                raise BadInput(f"--out {out}: the fit merges into an existing file, and this one is not a calibration "
                               f"({str(exc).split(': ', 1)[-1].split(';')[0]}); move it away or choose another --out") from None
    kind = get_gpu(gpu).name if gpu else None
    if kind is not None and kind not in FAMILIES:
        raise BadInput(f"--gpu {kind}: no throughput model to calibrate for it; choose one of {', '.join(FAMILIES)}")
    rows, skipped = [], []
    if seeds:
        rows += seed_measurements()
    if published:
        kept, skip = published_measurements()
        rows, skipped = rows + kept, skipped + [("published", r, why) for r, why in skip]
    if measurements:
        if Path(measurements).is_dir():  # a study folder: its measured trials
            from ..search.candidates import study_measurements

            kept, skip = study_measurements(measurements)
        else:
            kept, skip = read_measurements(measurements)
        rows, skipped = rows + kept, skipped + [(measurements, r, why) for r, why in skip]
        if not kept:  # the fit would run on the other rows alone, as if the file had been left out
            why = Counter(w for _, w in skip).most_common(1)
            raise BadInput(f"--measurements {measurements}: no usable row ("
                           + (f"{len(skip)} skipped, most for: {why[0][0]}" if why else "the file has none")
                           + "); fix the rows or leave --measurements out")
    family = {k for k in FAMILIES if kind and FAMILIES[k] == FAMILIES[kind]}
    usable = [m for m in rows if not kind or m.gpu in family]
    if not usable:
        where = f" for {kind} (or its family: {', '.join(sorted(family))})" if kind else ""
        raise BadInput(f"no measured rows{where}: add --measurements FILE.csv|.json (with rows of that GPU), or drop "
                       "--no-seeds/--no-published")
    cals = fit_kinds(usable, [kind] if kind else None)
    path = save_calibrations(Path(out), cals) if out is not None else None
    result = {"written": str(path) if path else None, "use": f"export {ENV_VAR}={path}" if path else None,
              "gpus": {}, "skipped": _skip_summary(skipped)}
    for k, cal in cals.items():
        shown = ([m for m in usable if stack_kind(m.gpu, m.framework) == k]
                 or [m for m in usable if m.framework == "megatron" and FAMILIES.get(m.gpu) == FAMILIES.get(k)])
        before = load_calibration(k) if path is None or os.environ.get(ENV_VAR) != str(path) else None
        rows_k = row_report(shown, predict(shown, before) if before else [float("nan")] * len(shown),
                            predict(shown, cal))
        result["gpus"][k] = {"provenance": cal.provenance, "factors": cal.factors,
                             "fitted_terms": cal.report.get("fitted_terms", []), "rows": rows_k}
    stacks_only = sorted({k.split(STACK_SEP)[0] for k in cals if STACK_SEP in k} - set(cals))
    if stacks_only:  # a user's torchtitan rows calibrate torchtitan's factors, which no search reads
        result["notes"] = [f"no Megatron rows for {', '.join(stacks_only)}: estimate, space and search predict "
                           "Megatron-core and keep its current factors; only the other stacks' were fitted"]
    if json_out:
        print_json(result)
    else:
        _render(result)


def _skip_summary(skipped: list) -> dict:
    reasons = Counter(why.split(":")[0] if why.startswith(("GPU", "model", "precision")) else why
                      for _, _, why in skipped)
    return {"count": len(skipped), "reasons": dict(reasons.most_common())}


def _render(result: dict) -> None:
    kinds = list(result["gpus"])
    # the GPU kinds (Megatron's factors) in one table, other stacks' (GPU+framework) in another: one table of
    # every column cut the term names at 100 columns
    for title, cols in (("fitted factors (x the physics estimate of each term; 1 = not moved)",
                         [k for k in kinds if STACK_SEP not in k]),
                        ("other training stacks' factors (GPU+framework; prior: that GPU's)",
                         [k for k in kinds if STACK_SEP in k])):
        if not cols:
            continue
        t = Table(title=title)
        t.add_column("term", no_wrap=True)
        for k in cols:
            t.add_column(k.replace(STACK_SEP, STACK_SEP + "\n"), justify="right")
        for term in STEP_TERMS:
            vals = [result["gpus"][k]["factors"][term] for k in cols]
            fitted = [term in result["gpus"][k]["fitted_terms"] for k in cols]
            t.add_row(term, *[f"{v:.2f}" if f else "[dim]1.00[/]" if v == 1 else f"[dim]{v:.2f}[/]"
                              for v, f in zip(vals, fitted)])
        console.print(t)
    for k in kinds:
        prov = result["gpus"][k]["provenance"]
        r = Table(title=escape(prov if prov.startswith(f"{k}:") else f"{k}: {prov}"))
        for col in ("row", "measured", "before", "err", "after", "err "):
            r.add_column(col, justify="left" if col == "row" else "right")
        for row in result["gpus"][k]["rows"]:
            r.add_row(escape(row["row"]), f"{row['measured']:,.0f}", f"{row['predicted_before']:,.0f}",
                      f"{row['error_before_pct']:+.1f}%", f"{row['predicted_after']:,.0f}",
                      f"{row['error_after_pct']:+.1f}%")
        console.print(r)
    sk = result["skipped"]
    if sk["count"]:
        top = "; ".join(f"{n} x {why}" for why, n in list(sk["reasons"].items())[:4])
        console.print(f"skipped {sk['count']} rows the model cannot represent ({top}; --json lists all reasons)",
                      markup=False)
    for note in result.get("notes", ()):
        console.print(f"note: {note}", markup=False)
    if result["written"]:
        console.print(f"wrote {escape(result['written'])}; to use it: [bold]{escape(result['use'])}[/]")
    else:
        console.print("nothing written (before: the calibration in use now); to keep this fit: --out FILE, "
                      f"then export {ENV_VAR}=FILE", markup=False)


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)
