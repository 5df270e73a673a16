"""RayBackend on a real local Ray (one per module, 2 CPUs): a real tiny-moe trial through the runner,
a worker killed mid-trial (retried once), a trial past its timeout (stopped, nothing left behind),
and the failure paths with a small stand-in runner where the real one cannot be made to fail on cue."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from autotune.trials.spec import TrialResult, TrialSpec, read_model

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def backend():
    """A RayBackend that starts (and at the end stops) its own local Ray."""
    from autotune.trials.backends import get_backend

    b = get_backend("ray", num_cpus=2, grace_s=3.0)
    yield b
    b.close()
    assert not ray.is_initialized()


def _wait(backend, handle, limit: float = 90.0) -> TrialResult:
    deadline = time.monotonic() + limit
    while (res := backend.poll(handle)) is None:
        assert time.monotonic() < deadline, "the trial did not finish"
        time.sleep(0.2)
    return res


def parent_pid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _groups_state() -> set[str]:
    return {g["state"] for g in ray.util.placement_group_table().values()}


def _wait_for_runners(backend, handle, proc_scan, n: int = 2, limit: float = 60.0) -> list[int]:
    marker = handle.trial_dir / "trial_spec.json"
    deadline = time.monotonic() + limit
    while len(pids := proc_scan(marker)) < n:
        assert backend.poll(handle) is None, "the trial ended before its runners were seen"
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return pids


def test_real_tiny_moe_trial(backend, make_spec, tmp_trial):
    handle = backend.submit(make_spec(0), tmp_trial)
    res = _wait(backend, handle)
    assert res.status == "ok", (res.reason, res.log_tail)
    assert res.backend == "ray" and res.attempts == 1
    assert [s.step for s in res.steps] == list(range(6))
    assert res.tokens_per_s_per_gpu and res.tokens_per_s_per_gpu > 0
    spec = read_model(TrialSpec, tmp_trial / "trial_spec.json")
    assert spec.command[1:3] == ["-m", "autotune.runner"] and spec.env["WORLD_SIZE"] == "2"
    assert (tmp_trial / "logs" / "rank0.log").exists() and (tmp_trial / "logs" / "rank1.log").exists()
    assert "REMOVED" in _groups_state() and "CREATED" not in _groups_state()


@pytest.mark.parametrize("victim", ["actor", "runner"])
def test_worker_killed_mid_trial_is_retried_once(backend, make_spec, tmp_trial, proc_scan, victim):
    """kill -9 one rank's Ray actor (Ray reports it dead) or its runner process (an exit by SIGKILL
    while the peer fails in gloo): both are infra, retried once; the second attempt's result returns."""
    handle = backend.submit(make_spec(1, steps=12), tmp_trial)
    pids = _wait_for_runners(backend, handle, proc_scan)
    steps = tmp_trial / "steps.jsonl"
    deadline = time.monotonic() + 60
    while not steps.exists() or len(steps.read_text().splitlines()) < 2:  # mid-trial: steps are running
        assert backend.poll(handle) is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(parent_pid(pids[-1]) if victim == "actor" else pids[-1], signal.SIGKILL)
    res = _wait(backend, handle, limit=150)
    assert res.status == "ok", (res.reason, res.log_tail)
    assert res.attempts == 2 and [s.step for s in res.steps] == list(range(12))  # the second attempt's result
    assert len((tmp_trial / "logs" / "attempt1" / "steps.jsonl").read_text().splitlines()) >= 2
    reason = (tmp_trial / "logs" / "attempt1" / "reason.txt").read_text()
    assert ("ActorDiedError" in reason) if victim == "actor" else ("killed by SIGKILL from outside" in reason)
    assert not proc_scan(tmp_trial)


def test_trial_past_its_timeout_is_stopped_and_cleaned_up(backend, make_spec, tmp_trial, proc_scan):
    handle = backend.submit(make_spec(2, steps=10_000, timeout_s=6.0), tmp_trial)
    _wait_for_runners(backend, handle, proc_scan)
    res = _wait(backend, handle)
    assert res.status == "timeout" and res.attempts == 1
    assert not proc_scan(tmp_trial)  # no runner, no child of one
    assert "CREATED" not in _groups_state()


def test_cancel_stops_the_trial(backend, make_spec, tmp_trial, proc_scan):
    handle = backend.submit(make_spec(3, steps=10_000), tmp_trial)
    _wait_for_runners(backend, handle, proc_scan)
    backend.cancel(handle)
    assert not proc_scan(tmp_trial) and "CREATED" not in _groups_state()
    assert backend.poll(handle).status == "crash"


# --- failure paths with a stand-in runner (fast, and fails on cue) ------------------------------
STANDIN = textwrap.dedent('''\
    """Stands in for autotune.runner: reports where it runs, then fails as STANDIN_MODE says."""
    import json, os, signal, sys, time
    from pathlib import Path
    spec_path = Path(sys.argv[1])
    d, spec = spec_path.parent, json.loads(spec_path.read_text())
    rank, mode = int(os.environ["RANK"]), os.environ.get("STANDIN_MODE", "ok")
    marker = d / f"standin-rank{rank}"
    first = not marker.exists()
    marker.touch()
    print("rank", rank, "local", os.environ["LOCAL_RANK"], "of", os.environ["WORLD_SIZE"],
          os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], flush=True)
    result = {"study": spec["study"], "number": spec["number"], "status": "ok"}
    if mode == "oom" and rank == 0:
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", flush=True)
        result.update(status="oom", reason="CUDA out of memory on rank 0")
        (d / "trial_result.json").write_text(json.dumps(result))
        sys.exit(1)
    if mode == "signal" and rank == 1 and first:
        os.kill(os.getpid(), signal.SIGKILL)  # a rank killed from outside, not by an OOM
    time.sleep(1.0)
    if rank == 0:
        (d / "trial_result.json").write_text(json.dumps(result))
''')


def _standin(backend, tmp_path: Path, mode: str, make_spec, number: int) -> TrialSpec:
    (tmp_path / "standin_runner.py").write_text(STANDIN)
    backend.runner_module = "standin_runner"
    return make_spec(number, env={"PYTHONPATH": str(tmp_path), "STANDIN_MODE": mode})


@pytest.fixture
def standin(backend):
    yield
    backend.runner_module = "autotune.runner"


def test_rank_killed_by_a_signal_is_infra_and_retried(backend, make_spec, tmp_path, tmp_trial, standin):
    handle = backend.submit(_standin(backend, tmp_path, "signal", make_spec, 10), tmp_trial)
    res = _wait(backend, handle)
    assert res.status == "ok" and res.attempts == 2
    assert "local 1 of 2" in (tmp_trial / "logs" / "attempt1" / "rank1.log").read_text()
    assert "rank 1 killed by SIGKILL" in (tmp_trial / "logs" / "attempt1" / "reason.txt").read_text()


def test_oom_is_a_result_and_not_retried(backend, make_spec, tmp_path, tmp_trial, standin):
    handle = backend.submit(_standin(backend, tmp_path, "oom", make_spec, 11), tmp_trial)
    res = _wait(backend, handle)
    assert res.status == "oom" and res.attempts == 1
    assert "out of memory" in res.log_tail
    assert not (tmp_trial / "logs" / "attempt1").exists()
