"""`autotune dashboard --optuna`: optuna-dashboard serves the study on 127.0.0.1 (its API lists it), Ctrl-C
stops it cleanly, and a kill -9 of autotune still takes the server down (the child dies with its parent)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = [pytest.mark.slow]
pytest.importorskip("optuna_dashboard")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(study, port):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # a shell's background job (`pytest ... &` without job control) runs with SIGINT ignored, and a Python started
    # so never raises KeyboardInterrupt: restore the default, as a terminal's autotune has it
    proc = subprocess.Popen([sys.executable, "-m", "autotune.cli.main", "dashboard", "--optuna", str(study),
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    line = proc.stdout.readline()  # printed once the server answers
    assert f"http://127.0.0.1:{port}/" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc


def _studies(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as r:
        return [s["study_name"] for s in json.loads(r.read())["study_summaries"]]


def _closed(port, within_s=15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            _studies(port)
        except OSError:
            return True
        time.sleep(0.2)
    return False


def test_serves_the_study_and_stops_on_ctrl_c(sim_study):
    port = _free_port()
    proc = _start(sim_study, port)
    try:
        assert _studies(port) == ["sim"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        assert "stopped optuna-dashboard" in proc.stderr.read()
        assert _closed(port)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_server_dies_with_autotune(sim_study):
    port = _free_port()
    proc = _start(sim_study, port)
    try:
        assert _studies(port) == ["sim"]
        proc.kill()  # no chance to clean up: the kernel's parent-death signal must stop the child
        proc.wait(timeout=10)
        assert _closed(port)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_port_in_use_is_bad_input(sim_study):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        run = subprocess.run([sys.executable, "-m", "autotune.cli.main", "dashboard", "--optuna", str(sim_study),
                              "--port", str(port)], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().count("\n") == 0 and f"--port {port}" in run.stderr and "in use" in run.stderr
