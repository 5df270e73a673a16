"""optuna-dashboard opens a study autotune wrote, with its trials, params and user attributes."""

import json
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from autotune.cli.main import main

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


@pytest.mark.skipif(shutil.which("optuna-dashboard") is None, reason="optuna-dashboard not installed (extra: dashboard)")
def test_dashboard_serves_the_study(tmp_path, capsys):
    assert main(["search", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32", "--trials", "2",
                 "--runs-dir", str(tmp_path), "--study", "dash", "--json"]) == 0
    capsys.readouterr()
    port = _free_port()
    proc = subprocess.Popen([shutil.which("optuna-dashboard"), f"sqlite:///{tmp_path / 'dash' / 'study.db'}",
                             "--port", str(port), "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}/api"
        deadline = time.time() + 30
        studies = None
        while time.time() < deadline:
            try:
                studies = _get(f"{base}/studies")
                break
            except OSError:
                time.sleep(0.3)
        assert studies is not None, proc.stderr.read().decode() if proc.poll() is not None else "no answer"
        (study,) = [s for s in studies["study_summaries"] if s["study_name"] == "dash"]
        detail = _get(f"{base}/studies/{study['study_id']}")
        assert len(detail["trials"]) == 2
        trial = detail["trials"][0]
        assert {p["name"] for p in trial["params"]} >= {"tp", "pp", "ep", "recompute", "dispatcher"}
        attrs = {a["key"] for a in trial["user_attrs"]}
        assert {"layout", "label", "predicted", "status"} <= attrs
    finally:
        proc.terminate()
        proc.wait(timeout=10)
