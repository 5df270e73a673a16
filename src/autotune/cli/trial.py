"""`autotune trial run SPEC.json`: run one real trial on this machine, one process per rank.

Everything that is the user's mistake fails here with exit 2 before any rank starts: a malformed
TrialSpec, a layout whose degrees do not match the world size, a layout Megatron-core rejects, a
missing dataset. The ranks run through LocalBackend (logs in <trial dir>/logs/rank<r>.log); the
summary says what was measured and why the run departed from the spec on this machine, if it did.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from ..catalog import get_gpu, load_model
from ..errors import AutotuneError, BadInput, ConfigError
from ..layout import Layout
from ..trials.plan import plan_trial, trials_missing
from ..trials.spec import TrialResult, TrialSpec, read_model
from .common import input_file, output_dir
from .console import console, err_console, print_json


class TrialFailed(AutotuneError):
    """The trial ran and failed (oom, nan, crash, ...): exit 1 after the summary."""


trial_app = typer.Typer(help="Run and inspect single trials (a short real training run of one layout).",
                        no_args_is_help=True)


def _with_world(spec: TrialSpec, nproc: int) -> TrialSpec:
    """The spec at world size `nproc`: DP (and expert DP) follow; the other degrees stay."""
    layout = dict(spec.layout)
    layout["world"] = nproc
    per_node = max(spec.gpus_per_node, nproc) if spec.gpu.lower() == "cpu" else spec.gpus_per_node
    return spec.model_copy(update={"count": nproc, "gpus_per_node": per_node, "layout": layout})


def _with_proxy(spec: TrialSpec, target: str) -> TrialSpec:
    from ..trials.proxy import make_proxy

    try:
        get_gpu(target)  # cpu or a GPU kind of the catalog
    except BadInput as exc:
        raise BadInput(f"--proxy {target!r}: {exc}") from None
    model = load_model(spec.model)
    try:
        layout = Layout.from_dict(spec.layout)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"trial {spec.number}: layout: {exc}") from None
    _, proxy = make_proxy(model, layout, target)
    return spec.model_copy(update={"proxy": proxy})


def _summary(res: TrialResult, spec: TrialSpec, layout_label: str, model_name: str, trial_dir: Path) -> None:
    t = Table(title=escape(f"trial {spec.study}/{spec.number}: {model_name}, {layout_label} on {spec.count} x {spec.gpu}"),
              show_header=False)
    t.add_column("what")
    t.add_column("value")
    colour = "green" if res.ok else "red"
    t.add_row("status", f"[{colour}]{res.status}[/]")
    if res.tokens_per_s_per_gpu is not None:
        se = f" +/-{res.stderr:.1%} (standard error)" if res.stderr else ""
        t.add_row("tokens/s/GPU", f"{res.tokens_per_s_per_gpu:,.1f}{se} (steps {res.window[0]}..{res.window[1]})")
        t.add_row("step time", f"{res.step_time_s:.3f} s, CV {res.step_time_cv_percent:.1f}%")
    if res.peak_memory_bytes:
        t.add_row("peak memory", f"{res.peak_memory_bytes / 2**30:.2f} GiB (max over ranks)")
    losses = [s.lm_loss for s in res.steps if s.lm_loss is not None]
    if losses:
        t.add_row("lm loss", f"{losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")
    if res.reason:
        t.add_row("reason" if not res.ok else "notes", escape(res.reason))
    if res.stack:
        t.add_row("stack", escape(", ".join(f"{k} {v}" for k, v in res.stack.items() if v != "none")))
    t.add_row("files", escape(str(trial_dir)))
    console.print(t)


@trial_app.command("run")
def run(
    spec_path: Path = typer.Argument(..., help="A trial_spec.json (TrialSpec)."),
    nproc: int = typer.Option(None, "--nproc", min=1, help="Ranks to start (sets the spec's count; DP follows)."),
    proxy: str = typer.Option(None, "--proxy", help="Shrink the model for this target first: cpu, or a GPU kind."),
    out: Path = typer.Option(None, "--out", help="Trial directory for logs and results (default: the spec's folder)."),
    json_out: bool = typer.Option(False, "--json", help="Print the TrialResult as JSON."),
) -> None:
    """Run one trial locally through the local backend and print what it measured.

    Example: autotune trial run runs/demo/trials/0/trial_spec.json --nproc 2
    """
    from ..trials.backends.local import LocalBackend

    input_file("SPEC", spec_path)
    if out is not None:
        output_dir("--out", out)
    spec = read_model(TrialSpec, spec_path)
    try:
        spec.gpu_of()
    except BadInput as exc:
        raise ConfigError(f"{spec_path}: field gpu: {exc}") from None
    if nproc is not None and nproc != spec.count:
        spec = _with_world(spec, nproc)
    if proxy:
        spec = _with_proxy(spec, proxy)
    plan = plan_trial(spec)  # every BadInput (exit 2) before a process starts
    trial_dir = (out or spec_path.resolve().parent).resolve()
    done = trial_dir / "trial_result.json"
    if done.exists():  # a study's finished trial: running it again here would overwrite what the study recorded
        raise BadInput(f"{trial_dir} already holds a finished trial ({done.name}); run it again elsewhere with "
                       "--out NEW_FOLDER")
    missing = trials_missing()
    if missing:
        raise BadInput(f"a trial runs megatron-core on this machine, but {missing}")
    label = plan.layout.label(plan.model.is_moe)
    if not json_out:
        err_console.print(escape(f"running {plan.model.name} at {label} on {spec.count} local rank(s), "
                                 f"{spec.steps} steps; logs in {trial_dir / 'logs'}"))
    backend = LocalBackend()
    result = backend.wait(backend.submit(spec, trial_dir))
    if json_out:
        print_json(result.model_dump(mode="json"))
    else:
        _summary(result, spec, label, plan.model.name, trial_dir)
    if not result.ok:  # a failed trial is a result, but this command did not get what it ran for
        raise TrialFailed(f"trial {spec.study}/{spec.number} ended {result.status}: {result.reason}")


def register(app: typer.Typer) -> None:
    app.add_typer(trial_app, name="trial")
