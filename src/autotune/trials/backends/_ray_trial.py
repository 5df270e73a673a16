"""The run state of one Ray trial: bundles, per-rank environment, attempts, outcome. No ray import.

Kept apart from `ray.py` (which drives Ray) so that the bookkeeping is plain Python: which bundle each
rank lands in, the torchrun variables each rank gets, how a finished attempt is read back and
classified, how a failed attempt's files are set aside before the retry, and the /proc sweep that
kills a trial's leftover processes on a node.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..spec import StepRecord, TrialResult, TrialSpec, read_model

__all__ = ["Trial", "reap", "oom_kill_count"]

_OUTPUTS = ("trial_result.json", "steps.jsonl")


@dataclass
class Trial:
    spec: TrialSpec
    trial_dir: Path
    submitted: float
    runner: str = "autotune.runner"  # the module run with `python -m`
    attempt: int = 1
    phase: str = "placing"
    phase_since: float = 0.0
    started: float | None = None  # when the runner processes of this attempt started
    pg: Any = None
    workers: list = field(default_factory=list)
    pending: list = field(default_factory=list)  # ObjectRefs the current phase waits on
    nodes: set = field(default_factory=set)  # Ray node ids the ranks ran on
    returncodes: list = field(default_factory=list)
    killed_by_us: set = field(default_factory=set)  # survivors stopped after another rank failed
    oom_killed: set = field(default_factory=set)  # ranks whose node's OOM-kill counter rose while they ran
    first_failure: float | None = None
    result: TrialResult | None = None
    short: str | None = None  # what the cluster lacks for this trial (waiting on an autoscaler)
    said_at: float = 0.0  # seconds into placing of the last progress line

    def __post_init__(self):
        self.returncodes = [None] * self.spec.count
        self.oom_baseline = oom_kill_count()  # this host's, for ranks that ran here (LocalBackend)

    @property
    def spec_path(self) -> Path:
        return self.trial_dir / "trial_spec.json"

    def log_path(self, rank: int) -> Path:
        return self.trial_dir / "logs" / f"rank{rank}.log"

    @property
    def accelerator(self) -> bool:
        try:
            return self.spec.gpu_of().is_accelerator
        except ValueError:  # a GPU the catalog does not know is still a GPU
            return self.spec.gpu.lower() != "cpu"

    # --- placement -------------------------------------------------------------------------------
    def bundles(self, largest_node_cpus: float) -> tuple[list[dict], str]:
        """CPU: one {"CPU": 1} bundle per rank, packed onto one node when one node has room.
        GPU: one bundle per node holding that node's GPUs (and a CPU per GPU), one node each."""
        n = self.spec.count
        if not self.accelerator:
            return [{"CPU": 1.0} for _ in range(n)], "STRICT_PACK" if n <= largest_node_cpus else "PACK"
        per = self.spec.gpus_per_node
        sizes = [min(per, n - i * per) for i in range(math.ceil(n / per))]
        return [{"GPU": float(s), "CPU": float(s)} for s in sizes], "STRICT_SPREAD" if len(sizes) > 1 else "STRICT_PACK"

    def bundle_of(self, rank: int) -> int:
        return rank // self.spec.gpus_per_node if self.accelerator else rank

    def launch(self, where: list[dict], port: int) -> tuple[list[str], list[dict[str, str]]]:
        """The runner command and each rank's environment; records them in the spec."""
        argv = [where[0]["python"], "-m", self.runner, str(self.spec_path)]
        by_node: dict[str, list[int]] = {}
        for r, w in enumerate(where):
            by_node.setdefault(w["node_id"], []).append(r)
        # AUTOTUNE_TRIAL tags every process of the trial (children inherit it) for the /proc sweep.
        common = {"MASTER_ADDR": where[0]["ip"], "MASTER_PORT": str(port), "WORLD_SIZE": str(self.spec.count),
                  "PYTHONUNBUFFERED": "1", "AUTOTUNE_TRIAL": str(self.spec_path)}
        envs = []
        for r, w in enumerate(where):
            peers = by_node[w["node_id"]]
            env = {**self.spec.env, **common, "RANK": str(r), "LOCAL_WORLD_SIZE": str(len(peers))}
            if w["gpus"]:
                # Each actor sees only its own GPU; the runner wants the node's GPUs with LOCAL_RANK
                # indexing them (and NVLink peers visible), as under torchrun.
                visible = sorted({g for p in peers for g in where[p]["gpus"]}, key=lambda g: (len(g), g))
                env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
                env["LOCAL_RANK"] = str(visible.index(w["gpus"][0]))
            else:
                env["LOCAL_RANK"] = str(peers.index(r))
            envs.append(env)
        self.nodes = set(by_node)
        self.spec = self.spec.model_copy(update={"command": argv, "env": {**self.spec.env, **common}})
        return argv, envs

    # --- attempts --------------------------------------------------------------------------------
    def clear_outputs(self) -> None:
        (self.trial_dir / "logs").mkdir(parents=True, exist_ok=True)
        for name in _OUTPUTS:
            (self.trial_dir / name).unlink(missing_ok=True)
        for log in (self.trial_dir / "logs").glob("rank*.log"):
            log.unlink()

    def next_attempt(self, reason: str | None) -> None:
        """Set this attempt's files aside in logs/attempt<n>/ and reset for the retry."""
        dest = self.trial_dir / "logs" / f"attempt{self.attempt}"
        dest.mkdir(parents=True, exist_ok=True)
        for p in [*(self.trial_dir / n for n in _OUTPUTS), *(self.trial_dir / "logs").glob("rank*.log")]:
            if p.exists():
                shutil.move(str(p), dest / p.name)
        (dest / "reason.txt").write_text(f"infra failure, retried: {reason}\n")
        self.attempt += 1
        self.started, self.first_failure = None, None
        self.returncodes = [None] * self.spec.count
        self.killed_by_us, self.oom_killed = set(), set()
        self.oom_baseline = oom_kill_count()

    def output_names(self, rank: int) -> list[str]:
        return [*_OUTPUTS, "logs/rank0.log"] if rank == 0 else [f"logs/rank{rank}.log"]

    # --- outcome ---------------------------------------------------------------------------------
    def outcome(self) -> tuple[str, str | None, TrialResult | None]:
        """Status, reason and a base result once every rank has exited."""
        own = {r: rc for r, rc in enumerate(self.returncodes) if r not in self.killed_by_us and rc is not None}
        runner = self._runner_result()
        if runner is not None and (runner.status != "ok" or all(rc == 0 for rc in own.values())):
            return runner.status, runner.reason, runner
        from ..failure import classify, signal_name

        status, reason = classify(list(own.values()), self.log_text())
        # A rank killed from outside is the root cause; its peers' communication errors are echoes.
        # The kernel's OOM killer is a result (oom); any other outside kill is a lost worker (infra).
        killed = sorted(r for r, rc in own.items() if rc < 0 and -rc in _OUTSIDE_SIGNALS)
        if killed and status not in ("oom", "nan"):
            r = killed[0]
            name = signal.Signals(-own[r]).name
            if r in self.oom_killed or oom_kill_count() > self.oom_baseline:
                status, reason = "oom", f"rank {r} killed by {name}: the kernel's OOM killer (host memory)"
            else:
                status, reason = "infra", f"rank {r} killed by {name} from outside, not by an OOM: a lost worker"
        died = sorted(r for r, rc in own.items() if rc < 0 and -rc not in _OUTSIDE_SIGNALS)
        if died and status == "nccl":  # a rank crashed in native code (no marker of its own): its peers' errors echo it
            r = died[0]
            status, reason = "crash", (f"rank {r} died of {signal_name(own[r])} in native code (its peers then lost "
                                       f"their connection: {reason})")
        if status == "ok":
            status, reason = "crash", "every rank exited 0 but rank 0 wrote no trial_result.json"
        base = TrialResult(study=self.spec.study, number=self.spec.number, status=status, reason=reason,
                           steps=self._steps())
        return status, reason, base

    def final_result(self, backend: str, status: str, reason: str | None, base: TrialResult | None) -> TrialResult:
        wall = time.monotonic() - (self.started or self.submitted)
        res = base or TrialResult(study=self.spec.study, number=self.spec.number, status=status, reason=reason)
        upd: dict = {"backend": backend, "attempts": self.attempt, "status": status, "reason": reason or res.reason}
        upd["wall_s"] = res.wall_s if res.wall_s is not None else round(wall, 3)
        if self.accelerator and res.gpu_hours is None:
            upd["gpu_hours"] = self.spec.count * upd["wall_s"] / 3600
        if res.log_tail is None:
            upd["log_tail"] = self.log_tail(reason=upd["reason"])
        return res.model_copy(update=upd)

    def _runner_result(self) -> TrialResult | None:
        path = self.trial_dir / "trial_result.json"
        try:
            return read_model(TrialResult, path) if path.exists() else None
        except ConfigError:  # half a file from a killed rank 0: fall back to classifying the exit
            return None

    def _steps(self) -> list[StepRecord]:
        path = self.trial_dir / "steps.jsonl"
        out = []
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                out.append(StepRecord.model_validate(json.loads(line)))
            except ValueError:
                continue
        return out

    def log_text(self, limit: int = 200_000) -> str:
        parts = []
        for r in range(self.spec.count):
            p = self.log_path(r)
            if p.exists():
                parts.append(f"==> rank {r} <==\n" + p.read_text(errors="replace")[-limit:])
        return "\n".join(parts)

    def log_tail(self, lines: int = 40, reason: str | None = None) -> str | None:
        """The last lines of the rank the reason blames ("rank 1: ..."), else of the first rank that
        failed on its own, else of rank 0."""
        blamed = re.match(r"rank (\d+)\b", reason or "")
        failing = [r for r, rc in enumerate(self.returncodes) if rc not in (None, 0) and r not in self.killed_by_us]
        rank = int(blamed.group(1)) if blamed and int(blamed.group(1)) < self.spec.count else (failing or [0])[0]
        p = self.log_path(rank)
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) if p.exists() else None


# Signals that come from outside a process (a kill, a node going down), unlike SIGSEGV or SIGABRT.
_OUTSIDE_SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}


def oom_kill_count() -> int:
    """OOM kills so far on this host (/proc/vmstat) plus this cgroup's (cgroup v2); 0 where unknown."""
    total = 0
    for path, key in (("/proc/vmstat", "oom_kill"), ("/sys/fs/cgroup/memory.events", "oom_kill")):
        try:
            for line in Path(path).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    total += int(value)
        except (OSError, ValueError):
            continue
    return total


def reap(marker: str) -> int:
    """Kill every process on this node of the trial whose spec path is `marker`: its command line
    mentions it, or its environment carries AUTOTUNE_TRIAL=marker (a runner's children: compile
    workers, data loaders), with its process group when it leads one. Runs as a Ray task per node."""
    killed = 0
    tag = f"AUTOTUNE_TRIAL={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if tag in env or any(marker.encode() in a for a in argv):
            pid = int(entry.name)
            try:
                os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed
