"""`autotune dashboard`: a study's summary in the terminal, its offline HTML report, or optuna-dashboard on it."""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import BadInput
from .common import regular_target
from .console import console, err_console, print_json


def _study_dir(run_dir: str | None, runs_dir: str) -> Path:
    from ..report.study import newest_study

    if run_dir is None:
        return newest_study(Path(runs_dir))
    p = Path(run_dir)
    if not p.exists():
        raise BadInput(f"{run_dir}: no such folder; pass a study folder (runs/<study>) or omit it for the newest study")
    if p.is_dir() and not (p / "study.db").exists() and not (p / "summary.json").exists() \
            and any((c / "study.db").exists() for c in p.glob("*")):
        return newest_study(p)  # a runs folder: its newest study
    return p


def dashboard(
    run_dir: str = typer.Argument(None, help="Study folder (runs/<study>) or a runs folder; default: the newest "
                                  "study under --runs-dir."),
    html: Path = typer.Option(None, "--html", help="Write one self-contained offline HTML report to this path."),
    json_out: bool = typer.Option(False, "--json", help="Print the study's summary as one JSON object."),
    optuna: bool = typer.Option(False, "--optuna", help="Serve the study with optuna-dashboard on 127.0.0.1 "
                                "until Ctrl-C."),
    port: int = typer.Option(8080, "--port", help="Port for --optuna."),
    runs_dir: str = typer.Option("runs", "--runs-dir", help="Where studies live (for the default RUN_DIR)."),
) -> None:
    """Review a study: what was tried, what it cost, where the model was wrong, why each layout lost.

    Examples:
      autotune dashboard runs/my-study --html report.html
      autotune dashboard --optuna
    """
    from ..report.study import load_study

    root = _study_dir(run_dir, runs_dir)
    if html is not None and html.exists() and html.is_dir():
        raise BadInput(f"--html {html}: is a folder; pass a file path such as {html / 'report.html'}")
    if html is not None:
        regular_target("--html", html)  # not a device, FIFO or socket (the write would replace it); a link: its target
    view = load_study(root)  # not a study, or no trials: one line, exit 2
    if optuna:
        _serve(view, port)
        return
    if html is not None:
        from ..report.html import write_html

        write_html(view, html)
    if json_out:
        from ..report.summary import view_json

        out = view_json(view)
        if html is not None:
            out["html"] = str(html)
        print_json(out)
        return
    from ..report.summary import render_summary

    render_summary(view, console)
    if html is not None:
        console.print(f"wrote {html}", markup=False)


def _serve(view, port: int) -> None:
    from ..report.serve import OptunaDashboard

    db = view.root / "study.db"
    if not db.exists():
        raise BadInput(f"{view.root}: no study.db to serve (only a summary.json); run the search again or pass "
                       "another study")
    server = OptunaDashboard(db, port)
    with server:
        console.print(f"optuna-dashboard serving study {view.name} at {server.url} (Ctrl-C stops it)", markup=False)
        try:
            rc = server.wait()
        except KeyboardInterrupt:
            rc = 0
            err_console.print("stopped optuna-dashboard")
    if rc:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)
