"""SlimeBackend: a trial is the seed recipes' slime command, submitted as a Ray Job.

The job's entrypoint is a bash script: `MODEL_ARGS=( ... )` from `slime_model_args(model)` (slime's
model-script arguments, generalised from ModelSpec), then the recipe's `run:` block from
`autotune.launch.build_run_block` with `python3 -m <slime entry module>` replaced by the
configured entry (default `python3 train_async.py`, run from `slime_dir`). It is submitted through
`ray.job_submission.JobSubmissionClient` to the Ray dashboard at `address` (the CLI's `--ray-address`;
a dashboard URL, "auto", or a cluster address Ray maps to its dashboard);
`poll()` asks for the job's status, and at the end fetches its log into `<trial_dir>/logs/job.log` and
reads Megatron's (or slime's) per-step lines into StepRecords and a TrialResult. Cancel is stop_job.
Model arguments (MODEL_ARGS) live in `autotune.launch.model_args`; log parsing in `_megatron_log.py`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import time
import uuid
from pathlib import Path

from ...errors import AutotuneError, require
from ...launch import ENTRY_PLACEHOLDER
from ..spec import TrialResult, TrialSpec, write_json_atomic
from ._megatron_log import parse_training_log, window_metrics
from ...launch import slime_model_args
from .base import Backend, Handle

__all__ = ["SlimeBackend", "slime_model_args", "launch_script", "parse_training_log", "window_metrics"]

_ENTRY_PLACEHOLDER = f"python3 -m {ENTRY_PLACEHOLDER}"
_TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
_FORWARDED = ("HF_CKPT", "TORCH_DIST", "SFT_DATA", "NVLINK_COUNT")


def launch_script(spec: TrialSpec, *, entry: str = "train_async.py", python: str = "python3",
                  slime_dir: str | None = None, env: dict[str, str] | None = None,
                  model_args: list[str] | None = None) -> str:
    """The bash script a Ray Job runs for this trial (the seed's run block plus MODEL_ARGS)."""
    from ...catalog import Workload, load_model
    from ...layout import Layout
    from ...launch import build_run_block, loss_mask_for

    model = load_model(spec.model)
    layout = Layout.from_dict(spec.layout)
    w = dict(spec.workload)
    w["window"] = tuple(w.get("window", (0, 0)))
    workload = dataclasses.replace(Workload(**w), steps=spec.steps)  # the trial's step count wins
    cluster = spec.cluster()
    run = build_run_block(layout, workload, cluster, loss_mask=loss_mask_for(model.name), moe=model.is_moe)
    if _ENTRY_PLACEHOLDER not in run:
        raise AutotuneError(f"the run block has no {_ENTRY_PLACEHOLDER!r} to replace; launch/run_block.py changed its format")
    # A script path runs as `python3 path`; a dotted name as `python3 -m name`.
    launcher = f"{python} {shlex.quote(entry)}" if entry.endswith(".py") or "/" in entry else f"{python} -m {entry}"
    # set -f: the seed expands ${MODEL_ARGS[@]} unquoted, so '[1]*48' must not be globbed.
    head = [f"# autotune trial {spec.study}/{spec.number}: slime as a Ray Job", "set -f"]
    if slime_dir:
        head.append(f"cd {shlex.quote(str(slime_dir))}")
    head += [f"export {k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    lines: list[list[str]] = []
    for tok in slime_model_args(model) if model_args is None else model_args:
        if tok.startswith("--") or not lines:
            lines.append([])
        lines[-1].append(shlex.quote(tok))
    head.append("MODEL_ARGS=(\n" + "".join(f"   {' '.join(ln)}\n" for ln in lines) + ")")
    return "\n".join(head) + "\n\n" + run.replace(_ENTRY_PLACEHOLDER, launcher)


@dataclasses.dataclass
class _Job:
    spec: TrialSpec
    trial_dir: Path
    job_id: str
    submitted: float
    attempt: int = 1
    last_log_fetch: float = 0.0
    result: TrialResult | None = None


class SlimeBackend(Backend):
    """slime trials as Ray Jobs on an existing Ray cluster (its dashboard address).

    `slime_dir` (default $SLIME_DIR): the slime checkout on the cluster, the job's working directory.
    `env`: exports for the job; HF_CKPT, TORCH_DIST, SFT_DATA and NVLINK_COUNT default to this
    process's values. `retries`: a Ray-level failure (the job supervisor died) is resubmitted.
    """

    name = "slime"

    def __init__(self, address: str | None = None, entry: str = "train_async.py", python: str = "python3",
                 slime_dir: str | None = None, env: dict[str, str] | None = None, runtime_env: dict | None = None,
                 retries: int = 1, log_every_s: float = 30.0, agent_wait_s: float = 60.0):
        # Ray resolves the address: a dashboard URL, "auto", a ray:// or bootstrap address, or (None)
        # RAY_API_SERVER_ADDRESS / RAY_ADDRESS / the running local Ray.
        js = require("ray.job_submission", "ray")
        self.client = js.JobSubmissionClient(address)
        self.address = getattr(self.client, "_address", address)
        self.entry, self.python = entry, python
        self.slime_dir = slime_dir or os.environ.get("SLIME_DIR")  # where train_async.py lives on the cluster
        # The run block's data paths come from this environment when the caller does not set them.
        self.env = {k: os.environ[k] for k in _FORWARDED if k in os.environ} | dict(env or {})
        self.runtime_env = runtime_env
        self.retries, self.log_every_s, self.agent_wait_s = retries, log_every_s, agent_wait_s

    def submit(self, spec: TrialSpec, trial_dir: Path) -> Handle:
        trial_dir = Path(trial_dir).resolve()
        (trial_dir / "logs").mkdir(parents=True, exist_ok=True)
        (trial_dir / "trial_result.json").unlink(missing_ok=True)
        script = launch_script(spec, entry=self.entry, python=self.python, slime_dir=self.slime_dir, env=self.env)
        spec = spec.model_copy(update={"command": ["bash", "-c", script], "env": {**spec.env, **self.env}})
        write_json_atomic(trial_dir / "trial_spec.json", spec)
        (trial_dir / "launch.sh").write_text(script)  # the same text, for a human to read or rerun
        job = _Job(spec, trial_dir, self._submit_job(spec, script), time.monotonic())
        return Handle(spec, trial_dir, job)

    def _submit_job(self, spec: TrialSpec, script: str) -> str:
        sid = f"autotune-{spec.study}-{spec.number}-{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + self.agent_wait_s
        while True:
            try:
                return self.client.submit_job(
                    entrypoint="bash -c " + shlex.quote(script), submission_id=sid, runtime_env=self.runtime_env,
                    metadata={"autotune_study": spec.study, "autotune_trial": str(spec.number)},
                )
            except RuntimeError as exc:  # a just-started cluster: its job agent is not up yet
                if "No available agent" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def poll(self, handle: Handle) -> TrialResult | None:
        job: _Job = handle.token
        if job.result is not None:
            return job.result
        status = str(self.client.get_job_status(job.job_id).value)
        now = time.monotonic()
        if status not in _TERMINAL:
            if now - job.submitted > job.spec.timeout_s:
                self.client.stop_job(job.job_id)
                self._finish(job, "timeout", f"ran past its timeout of {job.spec.timeout_s:g} s; job stopped")
            elif now - job.last_log_fetch > self.log_every_s:  # a live log for whoever watches the trial
                self._fetch_log(job)
            return job.result
        log = self._fetch_log(job)
        info = self.client.get_job_info(job.job_id)
        if status == "SUCCEEDED":
            self._finish(job, "ok", None, log)
        elif status == "STOPPED":
            self._finish(job, "crash", f"job stopped outside autotune: {info.message}", log)
        else:
            status_, reason = _job_failure(info, log)
            if status_ == "infra" and job.attempt <= self.retries:
                job.attempt += 1
                os.replace(job.trial_dir / "logs" / "job.log", job.trial_dir / "logs" / f"job.attempt{job.attempt - 1}.log")
                job.job_id, job.submitted = self._submit_job(job.spec, job.spec.command[-1]), time.monotonic()
                return None
            self._finish(job, status_, reason, log)
        return job.result

    def cancel(self, handle: Handle) -> None:
        job: _Job = handle.token
        if job.result is None:
            self.client.stop_job(job.job_id)
            self._finish(job, "crash", "cancelled by the search driver", cancelled=True)

    def _fetch_log(self, job: _Job) -> str:
        text = self.client.get_job_logs(job.job_id)
        (job.trial_dir / "logs" / "job.log").write_text(text)
        job.last_log_fetch = time.monotonic()
        return text

    def _finish(self, job: _Job, status: str, reason: str | None, log: str | None = None,
                cancelled: bool = False) -> None:
        spec = job.spec
        if log is None:
            log = self._fetch_log(job)
        w = spec.workload
        steps, peak = parse_training_log(log, int(w.get("seq_len", 8192)), int(w.get("global_batch", 128)))
        window = tuple(w.get("window", (spec.warmup_steps, spec.steps - 1)))
        metrics = window_metrics(steps, window, spec.count) or {}
        if status == "ok" and not metrics:
            status = "crash"
            reason = f"job succeeded but its log has no iteration lines for every step of the window {window}"
        wall = time.monotonic() - job.submitted
        (job.trial_dir / "steps.jsonl").write_text("".join(s.model_dump_json() + "\n" for s in steps))
        job.result = TrialResult(
            study=spec.study, number=spec.number, status=status, backend=self.name, reason=reason,
            steps=steps, peak_memory_bytes=max(peak.values()) if peak else None, attempts=job.attempt,
            wall_s=round(wall, 3), gpu_hours=spec.count * wall / 3600, log_tail="\n".join(log.splitlines()[-40:]),
            stack={"launcher": f"slime via Ray Job {job.job_id} at {self.address}"}, cancelled=cancelled, **metrics,
        )
        write_json_atomic(job.trial_dir / "trial_result.json", job.result)


_RAY_DEATH = re.compile(r"\b(ActorDiedError|RayActorError|WorkerCrashedError|NodeDiedError|ActorUnavailableError)\b")


def _job_failure(info, log: str) -> tuple[str, str]:
    """A failed job: Ray's own failures to run it are infra (or a bad command: crash); a non-zero exit
    of slime is classified from its log, where a dead Ray actor or node inside slime is infra."""
    kind = str(getattr(info.error_type, "value", info.error_type) or "")
    if kind.startswith("JOB_SUPERVISOR"):
        return "infra", f"Ray Job failed ({kind}): {info.message}"
    if kind in ("RUNTIME_ENV_SETUP_FAILURE", "JOB_ENTRYPOINT_COMMAND_START_ERROR") or info.driver_exit_code is None:
        return "crash", f"Ray Job could not start ({kind or 'no exit code'}): {info.message}"
    from ..failure import classify

    status, reason = classify([int(info.driver_exit_code)], log)
    if status == "crash" and (m := _RAY_DEATH.search(log)):
        return "infra", f"a Ray actor or node died inside slime ({m.group(1)})"
    return status, reason
