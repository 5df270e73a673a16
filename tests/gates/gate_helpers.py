"""Shared bits of the gate tests: the seed recipes, the CLI runner, loss curves."""

from __future__ import annotations

from pathlib import Path

from autotune.cli.main import main

REPO = Path(__file__).resolve().parents[2]
SEED_DIR = REPO / "recipes" / "qwen3.5-122b-a10b" / "h200"
BASE, RC2, FLEX = (SEED_DIR / f"attune-tp1-pp4-ep8{s}.yaml" for s in ("", "-rc2", "-flex"))

# A falling 20-step curve with some step-to-step noise, like a short SFT run (losses in nats).
CURVE = {s: 2.4 - 0.8 * (1 - 0.9 ** s) + 0.01 * ((s * 7919) % 5 - 2) / 2 for s in range(20)}


def cli(capsys, *argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err
