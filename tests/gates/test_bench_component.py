"""bench/component_gpu.py --dry-run works on a machine without GPUs: the plan at the model's shape."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_dry_run_prints_the_seed_shape_and_commands():
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([sys.executable, str(REPO / "bench" / "component_gpu.py"), "--dry-run", "--ep", "8"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "one Qwen3.5-122B-A10B MoE layer: hidden 3072, 256 experts, top-8, expert FFN 1024, EP 8" in text
    lines = [ln for ln in text.splitlines() if "tokens/rank" in ln]
    assert [ln.split()[0] for ln in lines] == ["4096", "8192", "16384"]
    assert all("8 x python -m autotune.runner.component --dispatcher flex" in ln for ln in lines)
