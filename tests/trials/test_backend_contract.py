"""One contract for every trial backend (simulate, local, ray), run against each for real:

- a trial finishes with a result that poll() keeps returning, written to trial_result.json and
  steps.jsonl in the trial folder it was given;
- cancel() stops it, leaves no process behind, and poll() then answers a `crash` result that says so;
- an out-of-memory trial is a result (status oom, not retried), not an exception.

Backend-specific behaviour (Ray's retry of a dead worker, the local backend's root-cause blame, timeouts
with the real runner) stays in test_local.py and test_ray.py.
"""

from __future__ import annotations

import textwrap
import time

import pytest

from autotune.layout import Layout
from autotune.trials.backends import get_backend
from autotune.trials.spec import StepRecord, TrialResult, read_model
from trial_helpers import wait_result

pytestmark = pytest.mark.slow

# a stand-in runner that reports an OOM the way the real one does (the real one cannot be made to OOM on
# cue on a CPU): rank 0 writes an oom result and exits non-zero, the other rank waits to be stopped
OOM_RUNNER = textwrap.dedent('''\
    import json, os, sys, time
    from pathlib import Path
    spec_path = Path(sys.argv[1])
    spec = json.loads(spec_path.read_text())
    if int(os.environ["RANK"]) == 0:
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", flush=True)
        result = {"study": spec["study"], "number": spec["number"], "status": "oom",
                  "reason": "CUDA out of memory on rank 0"}
        (spec_path.parent / "trial_result.json").write_text(json.dumps(result))
        sys.exit(1)
    time.sleep(30)
''')


@pytest.fixture(scope="module", params=["simulate", "local", "ray"])
def backend(request):
    name = request.param
    if name == "ray":
        pytest.importorskip("ray")
        b = get_backend("ray", num_cpus=2, grace_s=3.0)
    elif name == "local":
        b = get_backend("local", grace_s=3.0)
    else:
        b = get_backend("simulate", delay_s=3.0)
    yield b
    b.close()


def _spec(backend, make_spec, number: int, **over):
    if backend.name == "simulate":  # the simulator predicts the catalog model the spec names
        over = {"model": "Qwen3.5-122B-A10B", "gpu": "H200", "count": 32, "gpus_per_node": 8,
                "layout": Layout(world=32, pp=4, ep=8).to_dict(), **over}
    return make_spec(number, **over)


def test_a_trial_finishes_with_its_result_on_disk(backend, make_spec, tmp_trial):
    spec = _spec(backend, make_spec, 0)
    handle = backend.submit(spec, tmp_trial)
    res = wait_result(backend, handle, limit=180)
    assert res.status == "ok", (res.reason, res.log_tail)
    assert res.number == 0 and res.backend == backend.name
    assert res.source == ("predicted" if backend.name == "simulate" else "measured")
    assert res.tokens_per_s_per_gpu and res.tokens_per_s_per_gpu > 0
    assert backend.poll(handle) == res  # finished is final
    assert read_model(TrialResult, tmp_trial / "trial_result.json") == res
    lines = (tmp_trial / "steps.jsonl").read_text().splitlines()
    assert [StepRecord.model_validate_json(x).step for x in lines] == list(range(spec.steps))


def test_cancel_stops_the_trial_and_says_so(backend, make_spec, tmp_trial, proc_scan):
    handle = backend.submit(_spec(backend, make_spec, 1, steps=10_000), tmp_trial)
    if backend.name != "simulate":
        deadline = time.monotonic() + 90
        while len(proc_scan(tmp_trial / "trial_spec.json")) < 2:  # both ranks are up
            assert backend.poll(handle) is None and time.monotonic() < deadline
            time.sleep(0.1)
    backend.cancel(handle)
    assert not proc_scan(tmp_trial)
    res = backend.poll(handle)
    assert res is not None and res.status == "crash" and "cancel" in res.reason
    assert read_model(TrialResult, tmp_trial / "trial_result.json") == res


def test_oom_is_a_result_not_an_error(backend, make_spec, tmp_trial, tmp_path, monkeypatch):
    if backend.name == "simulate":
        # 2 H200 cannot hold Qwen3.5-122B-A10B: the model predicts the OOM
        spec = make_spec(2, model="Qwen3.5-122B-A10B", gpu="H200", count=2, gpus_per_node=8,
                         layout=Layout(world=2, ep=2).to_dict())
    else:
        (tmp_path / "oom_runner.py").write_text(OOM_RUNNER)
        monkeypatch.setattr(backend, "runner_module", "oom_runner")
        spec = make_spec(2, env={"PYTHONPATH": str(tmp_path)})
    res = wait_result(backend, backend.submit(spec, tmp_trial), limit=120)
    assert res.status == "oom" and res.attempts == 1
    assert "oom" in (res.reason or "").lower() or "memory" in (res.reason or "").lower()
    assert not (tmp_trial / "logs" / "attempt1").exists()  # not retried
