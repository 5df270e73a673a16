"""`autotune search`: find the fastest layout, with as few real trials as the model allows."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import typer

from ..errors import AutotuneError, BadInput
from ..search.driver import SearchConfig
from ..report.live import LiveView
from ..search.gates import RecipeGates
from ..search.session import SearchSession
from ..search.planners import PlannerOptions, resolve_planner
from ..search.study import StudyDir
from ..space import load_space
from ..trials.backends import BACKENDS, get_backend
from .common import (BatchOpt, CountOpt, Fp8AttentionOpt, Fp8OutputProjOpt, GpuOpt, GradsOpt, JsonOpt, ModelOpt,
                     NoDeepEPOpt, NoHybridEPOpt, NoTEOpt, PerNodeOpt, PrecisionOpt, RoutingOpt, SeqOpt, SpaceOpt,
                     finite_non_negative, finite_positive, fraction, input_file, missing_software, non_negative_int,
                     output_dir, positive_int, resolve, default_batch_retry)
from .console import console, err_console, print_json, screening
from .report import render_outcome

BACKEND_CHOICES = ("auto", "simulate", "local", "ray", "slime")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def _latest_study(runs: Path, model: str, gpu: str, count: int) -> str | None:
    """The most recently changed study under `runs` created for this model, GPU and count, whatever its name."""
    if not runs.is_dir():
        return None
    dbs = sorted((p for p in runs.glob("*/study.db") if p.is_file()), key=lambda p: p.stat().st_mtime, reverse=True)
    for db in dbs:
        try:
            sd = StudyDir(runs, db.parent.name)
        except AutotuneError:  # a folder whose name is no study name
            continue
        attrs = sd.attrs() or {}
        if (attrs.get("model"), attrs.get("gpu"), attrs.get("count")) == (model, gpu, count):
            return sd.name
    return None


def search(
    model: str = ModelOpt,
    gpu: str = GpuOpt,
    count: int = CountOpt,
    gpus_per_node: int = PerNodeOpt,
    seq_len: int | None = SeqOpt,
    global_batch: int | None = BatchOpt,
    grads: str = GradsOpt,
    precision: str = PrecisionOpt,
    fp8_attention: bool = Fp8AttentionOpt,
    fp8_output_proj: bool = Fp8OutputProjOpt,
    routing: str = RoutingOpt,
    space_file: str = SpaceOpt,
    backend: str = typer.Option("auto", "--backend", help="auto | simulate | local | ray | slime. auto: ray when "
                                "--ray-address or RAY_ADDRESS is set, else the cost-model simulator."),
    planner: str = typer.Option("auto", "--planner", help="auto | model | optuna | random | heuristic | llm. auto: the "
                                "LLM planner (mixed with the model-guided one) when --llm-base-url answers, else "
                                "model-guided."),
    llm_base_url: str = typer.Option(None, "--llm-base-url", envvar="AUTOTUNE_LLM_BASE_URL",
                                     help="OpenAI-compatible endpoint for the LLM planner, e.g. "
                                     "http://127.0.0.1:8080/v1; the key comes from OPENAI_API_KEY only."),
    llm_model: str = typer.Option(None, "--llm-model", help="Model name at the endpoint (default: the first it lists)."),
    llm_timeout_s: float = typer.Option(60.0, "--llm-timeout", help="Seconds per LLM request before it is retried."),
    sampler: str = typer.Option("auto", "--sampler", help="For --planner optuna: tpe | gp | auto (GP when scipy "
                                "and torch are installed and trials are real, else TPE)."),
    trials: int = typer.Option(10, "--trials", help="Most trials to dispatch (screened-out proposals do not count)."),
    budget_gpu_hours: float = typer.Option(None, "--budget-gpu-hours", help="Stop once trials have used this many GPU-hours."),
    parallel: int = typer.Option(1, "--parallel", help="Trials running at once."),
    study: str = typer.Option(None, "--study", help="Study name (default: <model>-<gpu>x<count>-<time>); an existing name resumes it."),
    runs_dir: str = typer.Option("runs", "--runs-dir", help="Where studies live: <runs-dir>/<study>/study.db, trials/, recipes/."),
    resume: bool = typer.Option(False, "--resume", help="Continue the latest study for this model/GPU/count (or --study)."),
    ray_address: str = typer.Option(None, "--ray-address", help="Ray cluster address for --backend ray/slime."),
    steps: int = typer.Option(None, "--steps", help="Training steps per real trial (default: the workload's 20)."),
    timeout_s: float = typer.Option(3600.0, "--trial-timeout", help="Seconds before a trial is stopped."),
    noise: float = typer.Option(0.02, "--noise", help="Run-to-run noise: a gain below this is not worth a trial."),
    seed: int = typer.Option(0, "--seed", help="Seed for planners and synthetic data."),
    no_deepep: bool = NoDeepEPOpt,
    no_hybridep: bool = NoHybridEPOpt,
    no_te: bool = NoTEOpt,
    reference: str = typer.Option(None, "--reference", help="A recipe whose layout is the gates' reference arm "
                                  "(default: the simplest candidate layout, run on the same rows)."),
    proxy: bool = typer.Option(False, "--proxy", help="Real trials run a shrunk proxy of the model that fits this "
                               "machine (CPU) or one GPU: they prove a layout runs; ranking uses the full model's prediction."),
    sim_delay: float = typer.Option(0.0, "--sim-delay", hidden=True, help="Seconds each simulated trial takes."),
    json_out: bool = JsonOpt,
) -> None:
    """Search for the fastest correct layout and emit ranked recipes.

    The model screens every layout first (illegal, missing software, predicted OOM, cannot win); the planner
    proposes trials; the backend runs them; measured trials recalibrate the model and re-rank what is left.
    With no cluster configured, trials run on the cost-model simulator and results are predictions.

    Example: autotune search --model Qwen3.5-122B-A10B --gpu H200 --count 32
    """
    positive_int("--trials", trials, 100_000)
    positive_int("--parallel", parallel, 4096)
    positive_int("--steps", steps, 1_000_000)
    finite_positive("--budget-gpu-hours", budget_gpu_hours)
    finite_positive("--trial-timeout", timeout_s)
    finite_positive("--llm-timeout", llm_timeout_s)
    fraction("--noise", noise, 0.0, 0.5)
    non_negative_int("--seed", seed)
    finite_non_negative("--sim-delay", sim_delay)
    if not runs_dir.strip():
        raise BadInput("--runs-dir '': give a folder for the studies, e.g. --runs-dir runs (the default)")
    output_dir("--runs-dir", runs_dir)
    if space_file:
        input_file("--space", space_file)
    if sampler not in ("auto", "tpe", "gp"):
        raise BadInput(f"--sampler {sampler!r}: choose auto, tpe or gp")
    if backend not in BACKEND_CHOICES:
        raise BadInput(f"--backend {backend!r}: choose one of {', '.join(BACKEND_CHOICES)}")
    planner_name, planner_note = resolve_planner(planner, PlannerOptions(
        llm_base_url=llm_base_url, llm_model=llm_model, llm_timeout_s=llm_timeout_s))
    notes = [planner_note] if planner_note else []
    address = ray_address or os.environ.get("RAY_ADDRESS")
    if backend == "auto":
        backend = "ray" if address else "simulate"
        if backend == "simulate":
            notes.append("no cluster configured (no --ray-address or RAY_ADDRESS): trials run on the cost-model "
                         "simulator; results are PREDICTIONS and recipes carry status: predicted")
    if backend not in BACKENDS:
        raise BadInput(f"--backend {backend!r} is not available in this installation")
    software = missing_software(no_deepep, no_hybridep, no_te)
    if backend == "local":  # the trials run here: what this machine lacks narrows the space, before any trial
        from ..trials.plan import local_software, trials_missing

        why = trials_missing()
        if why:
            raise BadInput(f"--backend local runs megatron-core on this machine, but {why}; or use --backend "
                           "simulate")
        software = {**local_software(), **software}
        notes.append("--backend local: the trials run on this machine, so the space follows the kernels installed here")
    if routing == "forced":  # it replaces the router's choice: its trials and recipes would not train the model
        raise BadInput("--routing forced: even routing is a benchmark setting (it replaces the router's choice, so a "
                       "recipe would not train the model); search with natural or aux-loss, and compare with "
                       "published numbers by `autotune estimate` or `autotune space --routing forced`")
    m, cluster, workload = resolve(model, gpu, count, gpus_per_node, seq_len, global_batch, grads, precision,
                                   notes=notes, routing=routing, fp8_attention=fp8_attention,
                                   fp8_output_proj=fp8_output_proj, **software)
    if backend == "local":
        from ..trials.plan import local_capacity_refusal

        why = local_capacity_refusal(cluster.gpu.name, cluster.gpu.is_accelerator, cluster.count)
        if why:
            raise BadInput(why)
    sp = load_space(space_file, m)
    gates = RecipeGates(reference_recipe=str(input_file("--reference", reference)) if reference else None)
    gates.check(m, cluster, workload)  # a --reference the gates cannot use is refused before any trial is spent
    runs = Path(runs_dir)
    prefix = f"{_slug(m.name)}-{_slug(cluster.gpu.name)}x{cluster.count}"
    if study is None:
        study = _latest_study(runs, m.name, cluster.gpu.name, cluster.count) if resume else None
        if resume and study is None:
            raise BadInput(f"--resume: no study for {m.name} on {cluster.count} x {cluster.gpu.name} under {runs}/; "
                           "run without --resume to start one")
        study = study or f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    sd = StudyDir(runs, study)  # checks the name, resolved, stays inside --runs-dir
    if resume and not sd.root.exists():  # --resume --study NAME promises a study to continue: none is an error
        raise BadInput(f"--resume --study {study}: no such study under {runs}/; run without --resume to start it "
                       f"(ls {runs} lists the studies there)")
    opts = {"delay_s": sim_delay} if backend == "simulate" else {}
    if backend in ("ray", "slime"):
        opts["address"] = address
    be = get_backend(backend, **opts)
    cfg = SearchConfig(trials=trials, budget_gpu_hours=budget_gpu_hours, parallel=parallel, planner=planner_name,
                       noise=noise, steps=steps, seed=seed, timeout_s=timeout_s, proxy=proxy and backend != "simulate",
                       # GP proposals cost seconds each: worth it when trials cost GPU-hours, not in the simulator
                       sampler="tpe" if sampler == "auto" and backend == "simulate" else sampler,
                       poll_s=0.02 if backend == "simulate" else 1.0, llm_base_url=llm_base_url, llm_model=llm_model,
                       llm_timeout_s=llm_timeout_s)
    view = LiveView.for_search(m, cluster, sd.name, trials_budget=cfg.trials, gpu_hours_budget=cfg.budget_gpu_hours,
                               enabled=not json_out, console=err_console)
    session = SearchSession(m, cluster, workload, sp, be, sd, cfg, on_event=view.on_event, gates=gates, notes=notes)
    # bad input fails here, before any output; the spinner (a terminal's only, gone when done) covers the screening
    # of the space, seconds for a space of millions
    with screening(m.name, cluster.count, cluster.gpu.name, not json_out):
        try:
            session.prepare()
        except BadInput as exc:  # a default global batch no DP of this GPU count divides: once more at one that does
            retry = default_batch_retry(getattr(exc, "space_result", None), workload, global_batch, cluster.count) \
                if getattr(exc, "space_result", None) is not None else None
            if retry is None:
                raise
            workload, note = retry
            notes.append(note)
            gates.check(m, cluster, workload)
            be = get_backend(backend, **opts)  # the failed start closed the first
            session = SearchSession(m, cluster, workload, sp, be, sd, cfg, on_event=view.on_event, gates=gates,
                                    notes=notes)
            session.prepare()
    resumed = session.driver.resume_line()  # an existing study: say so before anything runs
    if resumed:
        err_console.print(resumed, markup=False, soft_wrap=True)
    funnel = session.driver.candidates.funnel
    notes += session.driver.candidates.space_notes  # --no-deepep, --no-te, a CPU, this machine's kernels
    notes.append(f"search space {sp.source}: " + " -> ".join(f"{c:,} {s}" for s, c in funnel))
    for note in notes:
        err_console.print(f"note: {note}", markup=False, soft_wrap=True)
    try:
        with view:
            outcome = session.run()
    except KeyboardInterrupt:
        err_console.print(f"interrupted: finished trials are kept in {sd.root}; continue with the same command "
                          f"and --study {study}", markup=False)
        raise typer.Exit(130) from None
    out = outcome.to_json()
    if json_out:
        print_json(out)
    else:
        # the notes printed before the run are not repeated under the table when both went to one terminal
        same_screen = console.is_terminal and err_console.is_terminal
        render_outcome(out, shown=frozenset(notes) if same_screen else frozenset())


def register(app: typer.Typer) -> None:
    app.command("search")(search)
