"""bench/gpu_validation.py (issue 5's GPU check): its --dry-run works without a GPU and writes nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_validation.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def _predictions(text: str) -> list[tuple[float, float, float]]:
    pat = r"predicted (?:as specified \(GDN\)|as run \(all full attention\)): step ([\d.]+) s, ([\d,]+) tokens/s/GPU, peak ([\d.]+) GiB"
    return [(float(a), float(b.replace(",", "")), float(c)) for a, b, c in re.findall(pat, text)]


def test_dry_run_plans_both_configurations_and_predicts_them(tmp_path):
    out = tmp_path / "validation.md"
    proc = _run("--dry-run", "--out", str(out), "--trial-dir", str(tmp_path / "trials"))
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    # The reduced model at real widths: 4 layers of the model's own pattern, 32 experts top-8.
    assert "Qwen3.5-122B-A10B-4L-32E" in text
    assert "3 Gated DeltaNet + 1 full attention" in text and "MoE 32 experts top-8 ffn 1024 + shared 1024" in text
    assert "hidden 3072" in text and "32 heads / 2 KV" in text
    assert "[full] full recompute (uniform, 1 layer): TP1 PP1 EP1 DP1, 8 micro-batches x 1 row, 65536 tokens/step" in text
    assert "[none] no recompute: TP1 PP1 EP1 DP1" in text
    assert text.count("would run: python -m autotune.runner") == 2
    preds = _predictions(text)
    assert len(preds) == 4  # two configurations x (as specified, as run)
    for step, tps, peak in preds:
        assert 0.1 < step < 100 and 100 < tps < 1e6 and 1 < peak < 139.8
        assert abs(65536 / step - tps) / tps < 0.01  # tokens/s is the step's 65,536 tokens over its time
    full_spec, full_run, none_spec, none_run = preds
    assert full_spec[0] > none_spec[0] and full_spec[2] < none_spec[2]  # recompute: slower, smaller
    assert "nothing written" in text
    assert not out.exists() and not (tmp_path / "trials").exists()


def test_dry_run_follows_layers_steps_and_configs(tmp_path):
    proc = _run("--dry-run", "--layers", "2", "--steps", "5", "--configs", "none", "--trial-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "Qwen3.5-122B-A10B-2L-32E" in proc.stdout and "1 Gated DeltaNet + 1 full attention" in proc.stdout
    assert "window 3..4" in proc.stdout and "[none]" in proc.stdout and "[full]" not in proc.stdout
    assert len(_predictions(proc.stdout)) == 2


@pytest.mark.parametrize("args, words", [(("--steps", "3"), "warm-up"), (("--layers", "0"), "--layers"),
                                         (("--configs", "selective"), "--configs")])
def test_bad_options_fail_with_a_message(args, words):
    proc = _run("--dry-run", *args)
    assert proc.returncode == 2 and words in proc.stderr


def test_without_cuda_and_without_dry_run_it_fails_fast_in_one_line(tmp_path):
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script would run the trials")
    out = tmp_path / "validation.md"
    proc = _run("--out", str(out), "--trial-dir", str(tmp_path / "trials"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "--dry-run" in lines[0]
    assert proc.stdout == "" and not out.exists()
