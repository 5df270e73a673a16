"""LocalBackend and `autotune trial run` with the real runner: a tiny-moe trial on two CPU ranks, cancel and
timeout (the whole process group goes, nothing is left behind), a rank that fails on bad data (the root
cause wins over its peer's communication error), and bad input refused with exit 2 before any process."""

from __future__ import annotations

import json
import os
import re
import sys
import time

import numpy as np
import pytest

from autotune.cli.main import main as cli
from autotune.layout import Layout
from autotune.trials.backends import get_backend
from autotune.trials.backends.local import LocalBackend
from autotune.trials.spec import TrialResult, TrialSpec, read_model, write_json_atomic

pytest.importorskip("megatron.core")


def _wait_for_runners(backend, handle, proc_scan, n: int = 2, limit: float = 60.0) -> list[int]:
    deadline = time.monotonic() + limit
    while len(pids := proc_scan(handle.trial_dir / "trial_spec.json")) < n:
        assert backend.poll(handle) is None, "the trial ended before its runners were seen"
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return pids


@pytest.mark.slow
def test_a_real_trial_on_two_ranks(make_spec, tmp_trial):
    backend = get_backend("local")
    assert isinstance(backend, LocalBackend) and backend.name == "local"
    handle = backend.submit(make_spec(0), tmp_trial)
    res = backend.wait(handle)
    assert res.status == "ok", (res.reason, res.log_tail)
    assert backend.poll(handle) is res and read_model(type(res), tmp_trial / "trial_result.json") == res
    assert res.backend == "local" and res.attempts == 1 and res.wall_s > 0
    assert [s.step for s in res.steps] == list(range(6)) and res.tokens_per_s_per_gpu > 0
    assert res.window == (2, 5) and len(res.steps[0].peak_memory_bytes) == 2
    spec = read_model(TrialSpec, tmp_trial / "trial_spec.json")
    assert spec.command == [sys.executable, "-m", "autotune.runner", str(tmp_trial.resolve() / "trial_spec.json")]
    assert spec.env["WORLD_SIZE"] == "2" and spec.env["MASTER_ADDR"] == "127.0.0.1" and int(spec.env["MASTER_PORT"]) > 0
    for r in (0, 1):
        assert "AUTOTUNE_FAILURE" not in (tmp_trial / "logs" / f"rank{r}.log").read_text()
    assert "step 5:" in (tmp_trial / "logs" / "rank0.log").read_text()
    assert len((tmp_trial / "steps.jsonl").read_text().splitlines()) == 6


@pytest.mark.slow
def test_timeout_stops_the_trial_and_leaves_nothing(make_spec, tmp_trial, proc_scan):
    backend = LocalBackend()
    handle = backend.submit(make_spec(2, steps=10_000, timeout_s=8.0), tmp_trial)
    _wait_for_runners(backend, handle, proc_scan)
    res = backend.wait(handle)
    assert res.status == "timeout" and "timeout of 8 s" in res.reason
    assert not proc_scan(tmp_trial)


@pytest.mark.slow
def test_a_failing_rank_is_the_root_cause_not_its_peers_comm_error(make_spec, tmp_trial, tmp_path, proc_scan):
    # EP2 DP2, 2 rows per DP rank per step: rank 1 reads rows 2 and 3, whose token ids are out of range.
    rows = np.tile(np.arange(129, dtype=np.int64) % 512, (4, 1))
    rows[2:] = 9999
    np.save(tmp_path / "tokens.npy", rows)
    spec = make_spec(3, data={"kind": "pretokenized", "path": str(tmp_path / "tokens.npy")})
    backend = LocalBackend(grace_s=3.0)
    res = backend.wait(backend.submit(spec, tmp_trial))
    assert res.status == "crash", (res.status, res.reason)
    assert res.reason.startswith("rank 1:") and "outside the vocabulary" in res.reason
    assert "outside the vocabulary" in res.log_tail
    assert not proc_scan(tmp_trial)


def _spec_file(tmp_path, make_spec, **change) -> str:
    spec = make_spec(4)
    data = {**spec.model_dump(mode="json"), **change}
    path = tmp_path / "spec" / "trial_spec.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("change, argv_extra, words", [
    (dict(count="two"), [], "field count"),  # malformed TrialSpec
    (dict(count=4), [], "count 4"),  # layout for 2 GPUs, spec for 4
    (dict(data={"kind": "pretokenized", "path": "/nonexistent/rows.npy"}), [], "does not exist"),
    (dict(), ["--nproc", "3"], "does not divide"),  # EP2 cannot spread over 3 ranks
    (dict(layout={**Layout(world=2, ep=2).to_dict(), "tp": 8}), [], "TP x PP x CP = 8"),
])
def test_cli_bad_input_exits_2_before_any_process(tmp_path, make_spec, capsys, change, argv_extra, words):
    path = _spec_file(tmp_path, make_spec, **change)
    assert cli(["trial", "run", path, *argv_extra]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert not (tmp_path / "spec" / "logs").exists()  # no rank was started


def test_cli_refuses_to_run_over_a_finished_trial(tmp_path, make_spec, capsys):
    """`trial run` on a study's finished trial would overwrite what the study recorded: refused, untouched."""
    path = _spec_file(tmp_path, make_spec)
    done = tmp_path / "spec" / "trial_result.json"
    done.write_text('{"status": "ok"}')
    before = sorted(p.name for p in done.parent.iterdir())
    assert cli(["trial", "run", path]) == 2
    err = capsys.readouterr().err
    assert "already holds a finished trial" in err and "--out" in err and err.count("\n") == 1
    assert sorted(p.name for p in done.parent.iterdir()) == before and done.read_text() == '{"status": "ok"}'


@pytest.mark.slow
def test_cli_runs_a_one_rank_spec_on_two_ranks_and_prints_json(tmp_path, make_spec, capsys):
    spec = make_spec(5, count=1, layout=Layout(world=1, micro_batch_size=1).to_dict())
    write_json_atomic(tmp_path / "trial_spec.json", spec)
    assert cli(["trial", "run", str(tmp_path / "trial_spec.json"), "--nproc", "2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["status"] == "ok" and res["backend"] == "local" and len(res["steps"]) == 6
    ran = read_model(TrialSpec, tmp_path / "trial_spec.json")
    assert ran.count == 2 and Layout.from_dict(ran.layout).dp == 2


# --- ranks die with their driver; a CPU trial that cannot fit in host memory is refused ---------------------

_DRIVER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {src!r})
sys.path.insert(0, {tests!r})
from conftest import tiny_spec
from autotune.cli.main import main
from autotune.trials.backends.local import LocalBackend

trial_dir = Path(sys.argv[1])
if sys.argv[2] == "cli":  # through the CLI's signal handling: SIGTERM stops the trial like Ctrl-C
    from autotune.trials.spec import write_json_atomic
    write_json_atomic(trial_dir / "trial_spec.json", tiny_spec(7, steps=10_000))
    sys.exit(main(["trial", "run", str(trial_dir / "trial_spec.json")]))
backend = LocalBackend()
backend.submit(tiny_spec(7, steps=10_000), trial_dir)
time.sleep(600)
"""


def _start_driver(tmp_path, tmp_trial, mode: str):
    import subprocess
    from pathlib import Path

    import autotune

    script = tmp_path / "driver.py"
    script.write_text(_DRIVER.format(src=str(Path(autotune.__file__).parents[1]), tests=str(Path(__file__).parent)))
    return subprocess.Popen([sys.executable, str(script), str(tmp_trial), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _ranks_gone(proc_scan, marker, limit: float = 10.0) -> list[int]:
    deadline = time.monotonic() + limit
    while (left := proc_scan(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _wait_ranks(proc_scan, marker, driver, n: int = 2, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while len(proc_scan(marker)) < n:
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_ranks_die_with_their_driver(tmp_path, tmp_trial, proc_scan, sig):
    import signal

    driver = _start_driver(tmp_path, tmp_trial, "plain")
    marker = tmp_trial.resolve() / "trial_spec.json"
    try:
        _wait_ranks(proc_scan, marker, driver)
        driver.send_signal(getattr(signal, sig))
        driver.wait(timeout=30)
        assert _ranks_gone(proc_scan, marker) == [], "rank processes outlived their driver"
    finally:
        driver.kill()
        for pid in proc_scan(marker):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_sigterm_of_the_cli_cancels_the_trial_cleanly(tmp_path, tmp_trial, proc_scan):
    import signal

    driver = _start_driver(tmp_path, tmp_trial, "cli")
    marker = tmp_trial.resolve() / "trial_spec.json"
    try:
        _wait_ranks(proc_scan, marker, driver)
        driver.send_signal(signal.SIGTERM)
        _, err = driver.communicate(timeout=60)
        assert driver.returncode == 143, err
        assert "terminated" in err and "Traceback" not in err
        assert _ranks_gone(proc_scan, marker) == []
        res = read_model(TrialResult, tmp_trial / "trial_result.json")
        assert res.status == "crash" and res.reason == "cancelled"
    finally:
        driver.kill()
        for pid in proc_scan(marker):
            os.kill(pid, signal.SIGKILL)


def test_a_cpu_trial_beyond_host_memory_is_refused_before_any_process(make_spec, tmp_trial, monkeypatch):
    import autotune.trials.backends.local as local

    monkeypatch.setattr(local, "mem_available_bytes", lambda: 0.75 * 2**30)
    backend = LocalBackend()
    handle = backend.submit(make_spec(8), tmp_trial)
    res = backend.poll(handle)
    assert res is not None and res.status == "infra"
    assert "host memory: 2 rank(s)" in res.reason and "MemAvailable is 0.75 GiB" in res.reason
    assert read_model(TrialResult, tmp_trial / "trial_result.json") == res
    assert not (tmp_trial / "logs").exists() or not any((tmp_trial / "logs").iterdir())
    backend.close()  # nothing live: a no-op


def test_host_memory_check_uses_the_prediction_and_passes_when_it_fits(make_spec):
    from autotune.trials.backends.local import RUNTIME_BYTES_PER_RANK, host_memory_refusal
    from autotune.trials.spec import Prediction

    spec = make_spec(9, predicted=Prediction(tokens_per_s_per_gpu=1.0, peak_bytes=3 * 2**30))
    need = 2 * (3 * 2**30 + RUNTIME_BYTES_PER_RANK)
    assert host_memory_refusal(spec, available=need + 1) is None
    msg = host_memory_refusal(spec, available=need - 1)
    assert "3.00 GiB predicted" in msg and f"= {need / 2**30:.2f} GiB" in msg
    gpu = make_spec(9, gpu="H200", predicted=Prediction(tokens_per_s_per_gpu=1.0, peak_bytes=3 * 2**40))
    assert host_memory_refusal(gpu, available=1.0) is None  # HBM is the memory model's business
    # without a prediction the memory model is evaluated for the spec's one layout: tiny-moe fits easily
    assert host_memory_refusal(make_spec(9), available=64 * 2**30) is None
    msg = host_memory_refusal(make_spec(9), available=2**20)
    predicted = float(re.search(r"x \(([\d.]+) GiB predicted", msg).group(1))
    assert 0 < predicted < 3  # tiny-moe's peak per rank, from the memory model (not the 3 GiB above)


def test_a_rank_that_died_of_a_native_crash_is_blamed_not_its_peers_lost_connection(make_spec, tmp_trial):
    """Rank 0 died of SIGSEGV without a word (gloo's runloop crashed in libc once on this machine); rank 1 then
    reported the lost connection. The crash is the root cause; the peer's communication error is its echo. A rank
    killed from outside stays infra, and a communication error with no rank dead stays nccl."""
    import signal

    from autotune.trials.backends._ray_trial import Trial
    from autotune.trials.failure import marker

    trial = Trial(make_spec(7), tmp_trial, submitted=0.0)
    (tmp_trial / "logs").mkdir()
    trial.log_path(0).write_text("step 3: 0.097 s, lm loss 6.1522\n")
    trial.log_path(1).write_text(marker("nccl", 1, "RuntimeError: [gloo] Connection closed by peer") + "\n")
    trial.returncodes = [-signal.SIGSEGV, 1]
    status, reason, _ = trial.outcome()
    assert status == "crash" and reason.startswith("rank 0 died of SIGSEGV in native code")
    assert "Connection closed by peer" in reason
    trial.returncodes = [-signal.SIGKILL, 1]
    assert trial.outcome()[0] == "infra"
    trial.returncodes = [0, 1]
    assert trial.outcome()[0] == "nccl"
