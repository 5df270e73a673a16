"""LocalBackend: real trials on this machine, one subprocess per rank, as torchrun would start them.

`submit()` writes the spec (with the exact command and environment) to `<trial_dir>/trial_spec.json`
and starts WORLD_SIZE processes of `python -m autotune.runner <trial_dir>/trial_spec.json` with
torchrun's variables and a free port, each rank's output in `<trial_dir>/logs/rank<r>.log`. All ranks
share one process group, so cancel, the spec's timeout and a failed rank's stuck peers are stopped
with one killpg and nothing is left behind. `poll()` never blocks. Reading a finished trial back and
classifying a failure is the same bookkeeping as for Ray trials (`_ray_trial.Trial`, no ray in it).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..spec import TrialResult, TrialSpec, write_json_atomic
from ._ray_trial import Trial
from .base import Backend, Handle

__all__ = ["LocalBackend"]


def _free_port() -> int:
    with socket.socket() as s:  # the OS picks a free port, as torchrun does for a single node
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Run:
    """One local trial: the Trial bookkeeping plus the rank processes and their process group."""

    def __init__(self, trial: Trial, procs: list[subprocess.Popen], logs: list):
        self.trial, self.procs, self.logs = trial, procs, logs
        self.pgid = procs[0].pid

    def kill(self) -> None:
        """SIGKILL the ranks' process group (every rank and anything they started), then reap."""
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait on the child
                pass
        for fh in self.logs:
            fh.close()


class LocalBackend(Backend):
    """Trials as local processes (CPU over gloo, or the GPUs of this node)."""

    name = "local"

    def __init__(self, python: str = sys.executable, grace_s: float = 10.0, runner_module: str = "autotune.runner"):
        self.python = python
        self.grace_s = grace_s  # how long survivors of a failed rank may take to fail on their own
        self.runner_module = runner_module

    def command(self, trial_dir: Path) -> list[str]:
        return [self.python, "-m", self.runner_module, str(Path(trial_dir).resolve() / "trial_spec.json")]

    def submit(self, spec: TrialSpec, trial_dir: Path) -> Handle:
        trial = Trial(spec=spec, trial_dir=Path(trial_dir).resolve(), submitted=time.monotonic(), runner=self.runner_module)
        trial.clear_outputs()
        argv = self.command(trial.trial_dir)
        n = spec.count
        common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(n),
                  "LOCAL_WORLD_SIZE": str(n), "PYTHONUNBUFFERED": "1"}
        trial.spec = spec.model_copy(update={"command": argv, "env": {**spec.env, **common}})
        write_json_atomic(trial.spec_path, trial.spec)
        threads = str(max(1, (os.cpu_count() or 1) // n))
        procs, logs = [], []
        try:
            for r in range(n):
                env = {**os.environ, "OMP_NUM_THREADS": threads, **trial.spec.env, "RANK": str(r), "LOCAL_RANK": str(r)}
                log = open(trial.log_path(r), "wb")
                logs.append(log)
                # Rank 0 leads a new process group (in our session, so Ctrl-C of a CLI stays ours to
                # handle); the other ranks join it.
                procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              env=env, cwd=trial.trial_dir,
                                              process_group=0 if r == 0 else procs[0].pid))
        except BaseException:
            if procs:
                _Run(trial, procs, logs).kill()
            else:
                for fh in logs:
                    fh.close()
            raise
        trial.started = time.monotonic()
        return Handle(trial.spec, trial.trial_dir, token=_Run(trial, procs, logs))

    def poll(self, handle: Handle) -> TrialResult | None:
        run: _Run = handle.token
        trial = run.trial
        if trial.result is not None:
            return trial.result
        now = time.monotonic()
        for r, p in enumerate(run.procs):
            if trial.returncodes[r] is None:
                trial.returncodes[r] = p.poll()
        live = [r for r, rc in enumerate(trial.returncodes) if rc is None]
        if live and now - trial.started > trial.spec.timeout_s:
            run.kill()
            reason = f"ran past its timeout of {trial.spec.timeout_s:g} s; stopped"
            base = TrialResult(study=trial.spec.study, number=trial.spec.number, status="timeout", reason=reason,
                               steps=trial._steps())
            return self._finish(run, "timeout", reason, base)
        if live and any(rc not in (None, 0) for rc in trial.returncodes):
            trial.first_failure = trial.first_failure or now
            if now - trial.first_failure > self.grace_s:  # the survivors hang in collectives: stop them
                trial.killed_by_us.update(live)
                run.kill()
                live = []
        if live:
            return None
        run.kill()  # reaps; the group may still hold a grandchild
        status, reason, base = trial.outcome()  # log_tail: the rank the reason blames (the root cause)
        return self._finish(run, status, reason, base)

    def _finish(self, run: _Run, status: str, reason: str | None, base: TrialResult | None) -> TrialResult:
        trial = run.trial
        trial.result = trial.final_result(self.name, status, reason, base)
        write_json_atomic(trial.trial_dir / "trial_result.json", trial.result)
        return trial.result

    def cancel(self, handle: Handle) -> None:
        run: _Run = handle.token
        if run.trial.result is not None:
            return
        run.kill()
        run.trial.returncodes = [p.returncode for p in run.procs]
        run.trial.killed_by_us.update(range(len(run.procs)))
        base = TrialResult(study=run.trial.spec.study, number=run.trial.spec.number, status="crash",
                           reason="cancelled", steps=run.trial._steps())
        self._finish(run, "crash", "cancelled", base)

    def wait(self, handle: Handle, interval: float = 0.2) -> TrialResult:
        """Block until the trial ends (for the CLI and tests); Ctrl-C cancels it."""
        try:
            while (result := self.poll(handle)) is None:
                time.sleep(interval)
            return result
        except KeyboardInterrupt:
            self.cancel(handle)
            raise
