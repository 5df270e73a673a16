"""RayBackend: real trials on a Ray cluster (or a local Ray), one placement group and worker per rank.

The only module in autotune that imports ray, and only lazily. Per trial: a placement group sized
nodes x GPUs (on CPU: one {"CPU": 1} bundle per rank), one `_RankWorker` actor per rank that runs
`python -m autotune.runner <trial_dir>/trial_spec.json` as a subprocess with torchrun's variables and
writes its output to `<trial_dir>/logs/rank<r>.log`. `poll()` never blocks on the trial: it moves a
small state machine (placing -> locating -> starting -> running) with `ray.wait(..., timeout=0)`.

A dead worker, actor or node, or a rank killed by a signal that is not an OOM, is an infra failure and
is retried (`retries`, default once); an OOM is a result and is not. Cancel and timeout kill the runner
process trees (process-group kill, a parent-death signal, a /proc sweep on each node), the actors and
the placement group. The run state of one trial is `Trial` (in `_ray_trial.py`, ray-free).

Before a placement group is asked for, the trial's demand (bundles x CPUs/GPUs) is compared with the
cluster's totals: a trial the cluster can never hold fails at once (infra, not retried) naming both,
unless an autoscaler may add nodes (`autoscale=True` or AUTOTUNE_RAY_AUTOSCALE=1), where it waits with
a progress line. An address is probed with a bounded TCP connect before `ray.init`, so an unreachable
one is a one-line BadInput, not an endless retry. SIGTERM after `ray.init` stops like Ctrl-C (the
driver's finally blocks run and shut Ray down) instead of Ray's exit mid-call and its stack dump.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ...errors import require
from ..spec import TrialResult, TrialSpec, write_json_atomic
from ._ray_checks import all_ready, demand_shortfall, keep_sigterm, last_line, probe_address, ray_failure
from ._ray_trial import Trial, oom_kill_count, reap
from .base import Backend, Handle

__all__ = ["RayBackend"]


def _ray():
    return require("ray", "ray")


TMP_PREFIX = "autotune-ray-"
OWNER_FILE = "owner.pid"  # in a private session folder under /tmp: "pid <pid> <start time>" of the driver that made it


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), which tells a reused
    pid from the original; None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
        return raw.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def make_own_tmp(base: str = "/tmp") -> str:
    """A private session folder for Ray under `base`, stamped with this process as its owner (OWNER_FILE), so
    that a later backend can remove it when this driver died without closing (kill -9)."""
    tmp = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=base)
    pid = os.getpid()
    fd = os.open(os.path.join(tmp, OWNER_FILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"pid {pid} {_start_time(pid) or '-'}\n")
    return tmp


def _owner_alive(text: str) -> bool:
    """Whether the driver an OWNER_FILE names still runs (unreadable contents count as alive: kept)."""
    parts = text.split()
    if len(parts) != 3 or parts[0] != "pid" or not parts[1].isdigit():
        return True
    pid = int(parts[1])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: some process has the pid; the start time decides when readable
        pass
    started = _start_time(pid)
    return started is None or parts[2] == "-" or started == parts[2]


def sweep_stale_tmp(base: str = "/tmp") -> list[str]:
    """Remove the session folders `base`/autotune-ray-* whose owner driver is dead (it was killed before it could
    remove its own): only real folders (never a symlink) owned by this user that carry OWNER_FILE as a regular
    file, whose pid is gone or reused. Returns the folders removed; errors leave a folder as it is."""
    removed: list[str] = []
    uid = os.getuid()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for e in entries:
        if not e.name.startswith(TMP_PREFIX):
            continue
        try:
            st = e.stat(follow_symlinks=False)
            if not e.is_dir(follow_symlinks=False) or st.st_uid != uid:
                continue
            fd = os.open(os.path.join(e.path, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                import stat as _stat

                ost = os.fstat(fd)
                if not _stat.S_ISREG(ost.st_mode) or ost.st_uid != uid:
                    continue
                text = os.read(fd, 200).decode("ascii", "replace")
            finally:
                os.close(fd)
        except OSError:
            continue
        if _owner_alive(text):
            continue
        shutil.rmtree(e.path, ignore_errors=True)  # rmtree does not follow symlinks inside
        removed.append(e.path)
    return removed


class _RankWorker:
    """One rank: the runner as a subprocess in its own session on the node Ray placed this actor on."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.oom_kills = 0

    def where(self) -> dict:
        ray = _ray()
        gpus = [str(g) for g in ray.get_gpu_ids()]
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "gpus": gpus, "python": sys.executable}

    def free_port(self) -> int:
        with socket.socket() as s:  # the OS picks a free port on rank 0's node, as torchrun does
            s.bind(("", 0))
            return s.getsockname()[1]

    def start(self, argv: list[str], env: dict[str, str], log_path: str, files: dict[str, str]) -> int:
        self.oom_kills = oom_kill_count()
        for path, text in files.items():  # the trial dir may not be on a shared filesystem
            if not Path(path).exists():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_text(text)
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, env={**os.environ, **env, "AUTOTUNE_WATCH_PARENT": str(os.getpid())}, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=str(Path(argv[-1]).parent), start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        return self.proc.pid

    def poll(self) -> tuple[int | None, bool]:
        """The exit code (None while running) and whether this node's OOM-kill counter rose since start."""
        rc = self.proc.poll() if self.proc else None
        return rc, rc is not None and rc < 0 and oom_kill_count() > self.oom_kills

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the whole tree: the runner leads its session
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)

    def read(self, root: str, names: list[str]) -> dict[str, str | None]:
        out = {}
        for n in names:
            p = Path(root) / n
            out[n] = p.read_text(errors="replace") if p.exists() else None
        return out


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it if the actor process dies (Linux prctl)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: teardown's /proc sweep is the fallback
        pass


class RayBackend(Backend):
    """Trials on Ray. With no address, starts a local Ray (reusing one already initialised)."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None, retries: int = 1,
                 runs_dir: str | Path | None = None, place_timeout_s: float = 600.0, grace_s: float = 10.0,
                 runtime_env: dict | None = None, runner_module: str = "autotune.runner",
                 autoscale: bool | None = None, progress=None):
        ray = _ray()
        self.retries, self.place_timeout_s, self.grace_s = retries, place_timeout_s, grace_s
        if autoscale is None:
            autoscale = os.environ.get("AUTOTUNE_RAY_AUTOSCALE", "") not in ("", "0")
        self.autoscale = autoscale  # an autoscaler may add nodes: wait for them instead of failing
        self.progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
        self.runner_module = runner_module  # a stand-in runner for tests or a site-specific one
        self._trials: list[Trial] = []
        self._owns_ray = False
        self._own_tmp: str | None = None  # a session folder this backend made, removed when it closes
        previous = signal.getsignal(signal.SIGTERM)
        if not ray.is_initialized():
            if address:
                probe_address(address)
                ray.init(address=address, runtime_env=runtime_env, logging_level="ERROR")
            else:
                # The session dir: $RAY_TMPDIR if set, else under the study's folder (`runs_dir`); Ray's unix
                # socket paths must stay short, so a long one falls back to a private folder under /tmp, removed
                # when the backend closes (Ray's shutdown leaves its session folders behind)
                tmp = os.environ.get("RAY_TMPDIR") or (str(Path(runs_dir).resolve() / ".ray") if runs_dir else "")
                if not tmp or (len(tmp) > 40 and "RAY_TMPDIR" not in os.environ):
                    sweep_stale_tmp("/tmp")  # what a killed driver (kill -9) left behind
                    tmp = self._own_tmp = make_own_tmp("/tmp")
                Path(tmp).mkdir(parents=True, exist_ok=True)
                ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=str(tmp), logging_level="ERROR")
            self._owns_ray = True
            keep_sigterm(previous)
        self._worker_cls = ray.remote(_RankWorker)
        self._reap = ray.remote(reap)

    # --- Backend API -----------------------------------------------------------------------------
    def submit(self, spec: TrialSpec, trial_dir: Path) -> Handle:
        trial = Trial(spec=spec, trial_dir=Path(trial_dir).resolve(), submitted=time.monotonic(), runner=self.runner_module)
        trial.clear_outputs()
        self._place(trial)
        self._trials.append(trial)
        return Handle(spec, trial.trial_dir, trial)

    def poll(self, handle: Handle) -> TrialResult | None:
        trial: Trial = handle.token
        if trial.result is None:
            ray = _ray()
            try:
                self._advance(trial)
            except ray.exceptions.RayTaskError as exc:  # our worker code raised (e.g. no python): a bug, not retried
                self._finish(trial, "crash", f"ray worker error: {last_line(exc)}", retry=False)
            except (ray.exceptions.RayError, TimeoutError) as exc:  # a dead actor, worker or node
                self._finish(trial, *ray_failure(exc))
        handle.spec = trial.spec
        return trial.result

    def cancel(self, handle: Handle) -> None:
        trial: Trial = handle.token
        if trial.result is None:
            self._teardown(trial, kill=True)
            self._finish(trial, "crash", "cancelled by the search driver", retry=False,
                         base=TrialResult(study=trial.spec.study, number=trial.spec.number, status="crash",
                                          cancelled=True))

    def close(self) -> None:
        for trial in self._trials:
            if trial.result is None:
                self._teardown(trial, kill=True)
        self._trials.clear()
        if self._owns_ray:
            _ray().shutdown()
            self._owns_ray = False
        if self._own_tmp:
            shutil.rmtree(self._own_tmp, ignore_errors=True)
            self._own_tmp = None

    # --- the state machine -----------------------------------------------------------------------
    def _place(self, trial: Trial) -> None:
        ray = _ray()
        largest = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")), default=0)
        bundles, strategy = trial.bundles(largest)
        alive = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        short = demand_shortfall(bundles, ray.cluster_resources(), alive)
        trial.short = short
        if short and not self.autoscale:
            trial.pg, trial.pending = None, []
            self._finish(trial, "infra", short, retry=False)
            return
        if short:
            self.progress(f"trial {trial.spec.number}: waiting for the autoscaler: {short}")
        trial.pg = ray.util.placement_group(bundles, strategy=strategy, name=f"autotune-{trial.spec.study}-{trial.spec.number}")
        trial.pending = [trial.pg.ready()]
        trial.phase, trial.phase_since = "placing", time.monotonic()

    def _advance(self, trial: Trial) -> None:
        ray = _ray()
        now = time.monotonic()
        ready = all_ready(ray, trial.pending)
        if trial.phase == "placing":
            if not ready:
                waited = now - trial.phase_since
                if trial.short and waited - trial.said_at >= 30:  # a progress line every 30 s
                    trial.said_at = waited
                    self.progress(f"trial {trial.spec.number}: still waiting for resources after {waited:.0f} s "
                                  f"(gives up at {self.place_timeout_s:g} s)")
                if waited > self.place_timeout_s:
                    b, strategy = trial.bundles(0)
                    self._finish(trial, "infra", f"placement group of {len(b)} x {b[0]} ({strategy}) not scheduled in "
                                 f"{self.place_timeout_s:g} s: the cluster lacks the resources", retry=False)
                return
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            gpus = 1 if trial.accelerator else 0
            trial.workers = [
                self._worker_cls.options(num_cpus=1, num_gpus=gpus, max_restarts=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                    trial.pg, placement_group_bundle_index=trial.bundle_of(r))).remote()
                for r in range(trial.spec.count)
            ]
            trial.pending = [w.where.remote() for w in trial.workers] + [trial.workers[0].free_port.remote()]
            trial.phase = "locating"
        elif trial.phase == "locating" and ready:
            *where, port = ray.get(trial.pending)
            argv, envs = trial.launch(where, port)  # also records spec.command and spec.env
            write_json_atomic(trial.spec_path, trial.spec)
            files = {str(trial.spec_path): trial.spec_path.read_text()}
            trial.pending = [w.start.remote(argv, envs[r], str(trial.log_path(r)), files) for r, w in enumerate(trial.workers)]
            trial.phase = "starting"
        elif trial.phase == "starting" and ready:
            ray.get(trial.pending)
            trial.phase, trial.started = "running", now
            trial.pending = [w.poll.remote() for w in trial.workers]
        elif trial.phase == "running":
            if now - trial.started > trial.spec.timeout_s:
                self._teardown(trial, kill=True)
                self._finish(trial, "timeout", f"ran past its timeout of {trial.spec.timeout_s:g} s; stopped", retry=False)
            elif ready:
                self._check_ranks(trial, ray.get(trial.pending), now)

    def _check_ranks(self, trial: Trial, polled: list[tuple[int | None, bool]], now: float) -> None:
        ray = _ray()
        for r, (rc, oom) in enumerate(polled):
            if rc is not None and trial.returncodes[r] is None:
                trial.returncodes[r] = rc
                if oom:
                    trial.oom_killed.add(r)
        live = [r for r, rc in enumerate(trial.returncodes) if rc is None]
        if live and any(rc not in (None, 0) for rc in trial.returncodes):
            trial.first_failure = trial.first_failure or now
            if now - trial.first_failure > self.grace_s:  # the survivors hang in collectives: stop them
                ray.get([trial.workers[r].kill.remote() for r in live], timeout=60)
                trial.killed_by_us.update(live)
                live = []
        if live:
            trial.pending = [w.poll.remote() for w in trial.workers]
            return
        # All ranks exited: bring back what they wrote if the trial dir is not shared, then classify.
        for r, w in enumerate(trial.workers):
            missing = [n for n in trial.output_names(r) if not (trial.trial_dir / n).exists()]
            if missing:
                for name, text in ray.get(w.read.remote(str(trial.trial_dir), missing), timeout=60).items():
                    if text is not None:
                        (trial.trial_dir / name).write_text(text)
        status, reason, base = trial.outcome()
        self._finish(trial, status, reason, base=base)

    def _finish(self, trial: Trial, status: str, reason: str | None, base: TrialResult | None = None,
                retry: bool = True) -> None:
        self._teardown(trial, kill=status != "ok")
        if status == "infra" and retry and trial.attempt <= self.retries:
            trial.next_attempt(reason)
            self._place(trial)
            return
        trial.result = trial.final_result(self.name, status, reason, base)
        write_json_atomic(trial.trial_dir / "trial_result.json", trial.result)

    def _teardown(self, trial: Trial, kill: bool) -> None:
        """Stop every process of the trial and free its placement group. Never raises."""
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if kill and trial.workers:
            ray.wait([w.kill.remote() for w in trial.workers], num_returns=len(trial.workers), timeout=30)
        for w in trial.workers:
            ray.kill(w, no_restart=True)
        if kill and trial.nodes:  # the sweep: a runner whose actor died before it could kill it
            refs = [self._reap.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=True))
                    .remote(str(trial.spec_path)) for n in trial.nodes]
            ray.wait(refs, num_returns=len(refs), timeout=30)
        if trial.pg is not None:
            try:
                ray.util.remove_placement_group(trial.pg)
            except Exception:  # noqa: BLE001 - already gone with its node
                pass
        trial.workers, trial.pending, trial.pg = [], [], None
