"""`autotune export`: from a search's run directory or a recipe file, to a recipe, slime, Megatron or a script.
Shell output is checked by bash itself (`bash -n`, and the launch script is run with a stand-in for slime)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.layout import layout_from_args
from autotune.recipes import layout_of, load_recipe, parse_recipe, run_layout, write_recipe
from autotune.recipes.checks import check_recipe

from recipe_seeds import SEED_DIR

SECOND = SEED_DIR / "attune-tp1-pp4-ep8.yaml"


def _bash_n(path: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def study(tmp_path, monkeypatch):
    """A search's run directory with two ranked recipes, as the driver writes them."""
    monkeypatch.chdir(tmp_path)
    rec = tmp_path / "runs" / "qwen-h200" / "recipes"
    write_recipe(load_recipe(SEED_DIR / "attune-tp1-pp4-ep8-rc2.yaml"), rec / "rank-01-attune-tp1-pp4-ep8-rc2.yaml")
    write_recipe(load_recipe(SECOND), rec / "rank-02-attune-tp1-pp4-ep8.yaml")
    old = tmp_path / "runs" / "older"
    (old / "recipes").mkdir(parents=True)
    os.utime(old, (1, 1))
    return tmp_path


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_export_recipe_from_newest_run(run_cli, study):
    """Without --out the recipe is printed and nothing is written outside runs/; stderr names the catalogue's
    place for it, which --out takes as is."""
    before = _files(study)
    code, out, err = run_cli("export")
    rel = "recipes/qwen3.5-122b-a10b/h200/attune-tp1-pp4-ep8-rc2.yaml"
    assert code == 0 and _files(study) == before and f"--out {rel}" in err
    assert check_recipe(parse_recipe(out)) == []
    assert out == (SEED_DIR / "attune-tp1-pp4-ep8-rc2.yaml").read_text()
    code, _, _ = run_cli("export", "--out", rel)
    assert code == 0 and (study / rel).read_text() == out
    code, _, _ = run_cli("recipes", "validate", rel)
    assert code == 0


def test_export_rank_and_out(run_cli, study):
    out = study / "best2.yaml"
    code, _, _ = run_cli("export", "runs/qwen-h200", "--rank", "2", "--out", str(out))
    assert code == 0 and load_recipe(out) == load_recipe(SECOND)
    assert out.read_text().startswith("# recipes/qwen3.5-122b-a10b/h200/attune-tp1-pp4-ep8.yaml\n")


def test_export_errors_are_one_line(run_cli, study, tmp_path):
    code, _, err = run_cli("export", "runs/qwen-h200", "--rank", "3")
    assert code == 2 and "available: rank-01, rank-02" in err and err.count("\n") == 1
    code, _, err = run_cli("export", "runs/older")
    assert code == 2 and "no recipes/rank-NN-*.yaml" in err
    code, _, err = run_cli("export", "--format", "pdf", str(SECOND))
    assert code == 2 and "--format" in err


def test_export_without_runs_says_so(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("export")
    assert code == 2 and out == "" and "no run directory under ./runs" in err and err.count("\n") == 1


def test_export_refuses_an_inconsistent_recipe(run_cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SECOND.read_text().replace("mfu: 0.1293", "mfu: 0.2"))
    code, _, err = run_cli("export", str(bad), "--format", "slime")
    assert code == 2 and "result.mfu" in err


def test_export_slime_prints_the_run_block(run_cli):
    code, out, _ = run_cli("export", str(SECOND), "--format", "slime")
    recipe = load_recipe(SECOND)
    assert code == 0 and out == recipe.run
    assert layout_from_args(out) == layout_of(recipe)


def test_export_megatron_arguments(run_cli, tmp_path):
    code, out, _ = run_cli("export", str(SECOND), "--format", "megatron")
    assert code == 0
    script = tmp_path / "args.sh"
    script.write_text(out + 'printf "%s\\n" "${MEGATRON_ARGS[@]}"\n')
    _bash_n(script)
    argv = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True).stdout.split("\n")[:-1]
    want = run_layout(load_recipe(SECOND))
    got = layout_from_args(argv, world=32)
    for field in ("tp", "pp", "cp", "ep", "etp", "recompute", "dispatcher", "moe_shared_expert_overlap",
                  "precision_aware_optimizer", "distributed_optimizer", "cross_entropy_fusion"):
        assert getattr(got, field) == getattr(want, field), field
    assert got.micro_batch_size == 1  # one 8,192-token row per micro-batch under the 8,192-token cap
    assert argv[argv.index("--train-iters") + 1] == "14" and argv[argv.index("--seq-length") + 1] == "8192"


def test_export_megatron_carries_the_model_arguments(run_cli, tmp_path):
    """The megatron export's MODEL_ARGS array is slime's MODEL_ARGS for the recipe's model, exactly, as bash reads it
    (the seed's Qwen3.5-122B-A10B: its layer spec named, with the note that slime_plugins must be importable)."""
    from autotune.catalog import load_model
    from autotune.launch import slime_model_args

    code, out, _ = run_cli("export", str(SECOND), "--format", "megatron")
    assert code == 0 and out.index("MODEL_ARGS=(") < out.index("MEGATRON_ARGS=(") and "slime_plugins" in out
    script = tmp_path / "args.sh"
    script.write_text(out + 'printf "%s\\n" "${MODEL_ARGS[@]}"\n')
    _bash_n(script)
    argv = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True).stdout.split("\n")[:-1]
    assert argv == slime_model_args(load_model("Qwen3.5-122B-A10B"))  # the seed's load-balancing loss is off


def test_export_script_passes_bash_n_and_runs(run_cli, tmp_path):
    dest = tmp_path / "launch.sh"
    code, _, _ = run_cli("export", str(SECOND), "--format", "script", "--out", str(dest))
    assert code == 0 and os.access(dest, os.X_OK)
    text = dest.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail\n" in text
    _bash_n(dest)

    # Run it for real, with a stand-in for slime's entry module that records what it was given.
    (tmp_path / "fake_slime.py").write_text(
        "import json, os, sys\n"
        "env = {k: os.environ.get(k) for k in ('CUDA_DEVICE_MAX_CONNECTIONS', 'NCCL_NVLS_ENABLE')}\n"
        "json.dump({'argv': sys.argv[1:], 'env': env}, open(os.environ['RECORD'], 'w'))\n"
    )
    (tmp_path / "model.sh").write_text("MODEL_ARGS=(--num-layers 48 --hidden-size 3072)\n")
    env = dict(os.environ, SLIME_ENTRY="fake_slime", MODEL_ARGS_SCRIPT=str(tmp_path / "model.sh"), HF_CKPT="/ckpt",
               TORCH_DIST="/dist", SFT_DATA="/rows.parquet", NVLINK_COUNT="4", RECORD=str(tmp_path / "rec.json"),
               PYTHONPATH=str(tmp_path), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(dest)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert rec["env"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_NVLS_ENABLE": "1"}
    argv = rec["argv"]
    assert argv[:3] == ["--async", "--actor-num-nodes", "4"] and "--num-layers" in argv and "/ckpt" in argv
    assert layout_from_args(argv) == run_layout(load_recipe(SECOND))

    env.pop("HF_CKPT")
    proc = subprocess.run(["bash", str(dest)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode != 0 and "HF_CKPT" in proc.stderr


def test_export_script_without_out_is_printed(run_cli, study):
    before = _files(study)
    code, out, err = run_cli("export", "--format", "script")
    assert code == 0 and _files(study) == before and "--out attune-tp1-pp4-ep8-rc2.sh" in err
    (study / "printed.sh").write_text(out)
    _bash_n(study / "printed.sh")


def test_export_format_follows_the_out_suffix_unless_given(run_cli, study):
    """--out launch.sh without --format is the launch script; --format still wins; anything else is the recipe."""
    code, _, err = run_cli("export", "--out", "launch.sh")
    assert code == 0 and "set the variables it names" in err
    assert (study / "launch.sh").read_text().startswith("#!/usr/bin/env bash\n") and os.access(study / "launch.sh", os.X_OK)
    _bash_n(study / "launch.sh")
    code, _, _ = run_cli("export", "--out", "as-recipe.sh", "--format", "recipe")
    assert code == 0 and load_recipe(study / "as-recipe.sh") == load_recipe(SEED_DIR / "attune-tp1-pp4-ep8-rc2.yaml")
    code, _, _ = run_cli("export", "--out", "best.txt")
    assert code == 0 and (study / "best.txt").read_text().startswith("# recipes/")
