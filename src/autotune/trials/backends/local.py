"""LocalBackend: real trials on this machine, one subprocess per rank, as torchrun would start them.

`submit()` writes the spec (with the exact command and environment) to `<trial_dir>/trial_spec.json`
and starts WORLD_SIZE processes of `python -m autotune.runner <trial_dir>/trial_spec.json` with
torchrun's variables and a free port, each rank's output in `<trial_dir>/logs/rank<r>.log`. All ranks
share one process group, so cancel, the spec's timeout and a failed rank's stuck peers are stopped
with one killpg and nothing is left behind. `poll()` never blocks. Reading a finished trial back and
classifying a failure is the same bookkeeping as for Ray trials (`_ray_trial.Trial`, no ray in it).

Ranks die with their driver, however it ends: each gets a parent-death signal (prctl, Linux) and the
driver's pid in AUTOTUNE_WATCH_PARENT, which the runner's watchdog compares with its parent pid (see
runner/env.py: watch_parent); `close()` stops every live trial. A CPU trial whose predicted host memory
(per-rank peak x ranks) exceeds MemAvailable is refused before any process starts (status infra).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..spec import TrialResult, TrialSpec, write_json_atomic
from ._ray_trial import Trial
from .base import Backend, Handle

__all__ = ["LocalBackend", "host_memory_refusal", "mem_available_bytes", "RUNTIME_BYTES_PER_RANK"]

# What one rank holds besides the model's terms: the interpreter with torch and megatron-core imported
# and gloo's buffers (about 0.5 GiB resident per rank on this CPU build).
RUNTIME_BYTES_PER_RANK = 0.5 * 2**30
PR_SET_PDEATHSIG = 1


def mem_available_bytes() -> float | None:
    """MemAvailable from /proc/meminfo (what the kernel can hand out without swapping), or None off Linux."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _predicted_rank_bytes(spec: TrialSpec) -> float | None:
    """The model's peak bytes per rank for this trial: the spec's prediction, else the memory model's."""
    if spec.predicted is not None:
        return float(spec.predicted.peak_bytes)
    from ...cost import estimate_memory
    from ...errors import AutotuneError
    from ...layout import LayoutTable
    from ..plan import plan_trial

    try:  # a hand-written spec (`autotune trial run`): evaluate the memory model for its one layout
        plan = plan_trial(spec)
        cluster = spec.cluster()
    except AutotuneError:  # a spec the runner will reject with its own one-line reason
        return None
    mem = estimate_memory(plan.model, plan.workload, cluster, LayoutTable.from_layouts([plan.layout]))
    return float(mem.peak[0])


def host_memory_refusal(spec: TrialSpec, available: float | None = None) -> str | None:
    """Why a CPU trial cannot start on this host's free memory (one line with the numbers), or None."""
    if spec.gpu.lower() != "cpu":
        return None  # GPU trials hold their model in HBM; the memory model screens that
    available = mem_available_bytes() if available is None else available
    per_rank = _predicted_rank_bytes(spec)
    if available is None or per_rank is None:
        return None
    need = spec.count * (per_rank + RUNTIME_BYTES_PER_RANK)
    if need <= available:
        return None
    gib = 2**30
    return (f"host memory: {spec.count} rank(s) x ({per_rank / gib:.2f} GiB predicted + "
            f"{RUNTIME_BYTES_PER_RANK / gib:.1f} GiB runtime) = {need / gib:.2f} GiB, but MemAvailable is "
            f"{available / gib:.2f} GiB; not started (use fewer ranks, a smaller --proxy or free memory)")


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - not a dynamic libc
        return None


_LIBC = _libc()  # loaded here, not in the forked child, where loading a library may deadlock


def _die_with(parent: int):
    """preexec_fn for a rank: SIGKILL when the thread that started it dies, and exit at once if the
    driver died before the signal was armed (the child's parent is then init or a subreaper)."""

    def arm() -> None:
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm


def _free_port() -> int:
    with socket.socket() as s:  # the OS picks a free port, as torchrun does for a single node
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Run:
    """One local trial: the Trial bookkeeping plus the rank processes and their process group."""

    def __init__(self, trial: Trial, procs: list[subprocess.Popen], logs: list):
        self.trial, self.procs, self.logs = trial, procs, logs
        self.pgid = procs[0].pid if procs else None

    def kill(self) -> None:
        """SIGKILL the ranks' process group (every rank and anything they started), then reap."""
        if self.pgid is None:  # refused before any rank started
            return
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
        self._live: dict[int, _Run] = {}  # id -> run, for close()

    def command(self, trial_dir: Path) -> list[str]:
        return [self.python, "-m", self.runner_module, str(Path(trial_dir).resolve() / "trial_spec.json")]

    def submit(self, spec: TrialSpec, trial_dir: Path) -> Handle:
        trial = Trial(spec=spec, trial_dir=Path(trial_dir).resolve(), submitted=time.monotonic(), runner=self.runner_module)
        trial.clear_outputs()
        argv = self.command(trial.trial_dir)
        n = spec.count
        refusal = host_memory_refusal(spec)
        if refusal is not None:
            run = _Run(trial, [], [])
            write_json_atomic(trial.spec_path, spec)
            self._finish(run, "infra", refusal, TrialResult(study=spec.study, number=spec.number, status="infra",
                                                           reason=refusal))
            return Handle(spec, trial.trial_dir, token=run)
        common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(n),
                  "LOCAL_WORLD_SIZE": str(n), "PYTHONUNBUFFERED": "1"}
        trial.spec = spec.model_copy(update={"command": argv, "env": {**spec.env, **common}})
        write_json_atomic(trial.spec_path, trial.spec)
        threads = str(max(1, (os.cpu_count() or 1) // n))
        me = os.getpid()
        # The parent-death signal follows the forking thread, so arm it only from the main thread (a
        # driver thread that ends would take the ranks with it); the runner's watchdog covers the rest.
        preexec = _die_with(me) if threading.current_thread() is threading.main_thread() else None
        procs, logs = [], []
        try:
            for r in range(n):
                env = {**os.environ, "OMP_NUM_THREADS": threads, **trial.spec.env, "RANK": str(r), "LOCAL_RANK": str(r),
                       "AUTOTUNE_WATCH_PARENT": str(me)}
                log = open(trial.log_path(r), "wb")
                logs.append(log)
                # Rank 0 leads a new process group (in our session, so Ctrl-C of a CLI stays ours to
                # handle); the other ranks join it.
                procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              env=env, cwd=trial.trial_dir, preexec_fn=preexec,
                                              process_group=0 if r == 0 else procs[0].pid))
        except BaseException:
            if procs:
                _Run(trial, procs, logs).kill()
            else:
                for fh in logs:
                    fh.close()
            raise
        trial.started = time.monotonic()
        run = _Run(trial, procs, logs)
        self._live[id(run)] = run
        return Handle(trial.spec, trial.trial_dir, token=run)

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
        self._live.pop(id(run), None)
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
                           reason="cancelled", steps=run.trial._steps(), cancelled=True)
        self._finish(run, "crash", "cancelled", base)

    def close(self) -> None:
        """Stop every trial still running (the driver is leaving: an interrupt, SIGTERM or an error)."""
        for run in list(self._live.values()):
            self.cancel(Handle(run.trial.spec, run.trial.trial_dir, token=run))
        self._live.clear()

    def wait(self, handle: Handle, interval: float = 0.2) -> TrialResult:
        """Block until the trial ends (for the CLI and tests); Ctrl-C cancels it."""
        try:
            while (result := self.poll(handle)) is None:
                time.sleep(interval)
            return result
        except KeyboardInterrupt:
            self.cancel(handle)
            raise
