"""`autotune recipes list|show|validate` through the real entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from recipe_seeds import PUBLISHED, SEED_DIR


def test_list_ranks_as_the_seed_page(run_cli):
    code, out, _ = run_cli("recipes", "list", "--dir", str(SEED_DIR))
    assert code == 0
    positions = [out.index(PUBLISHED[name]["tps"]) for name in PUBLISHED]
    assert positions == sorted(positions)  # 2,451.4 before 2,366.7 before 2,289.7
    for name, row in PUBLISHED.items():
        assert row["usd"] in out
    assert "Training Qwen3.5-122B-A10B on H200" in out and "ATTUNE" in out and "2026-10-11" in out


def test_list_json_rows(run_cli):
    code, out, _ = run_cli("recipes", "list", "--json", "--dir", str(SEED_DIR), "--model", "qwen3.5-122b-a10b", "--gpu", "h200")
    rows = json.loads(out)
    assert code == 0
    assert [r["name"] for r in rows] == sorted(PUBLISHED, key=lambda n: PUBLISHED[n]["rank"])
    assert [r["rank"] for r in rows] == [1, 2, 3]
    assert [f"{r['tokens_per_s_per_gpu']:,.1f}" for r in rows] == [PUBLISHED[r["name"]]["tps"] for r in rows]
    assert all(r["gpus"] == 32 and r["label"] == "TP1 PP4 EP8 DP8" and r["author"] == "ATTUNE" for r in rows)
    assert "flex dispatcher" in rows[2]["highlights"]


def test_list_filters(run_cli):
    code, out, _ = run_cli("recipes", "list", "--json", "--dir", str(SEED_DIR), "--gpu", "H100")
    assert code == 0 and json.loads(out) == []


def test_list_by_default_finds_the_repository_recipes(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOTUNE_RECIPES", raising=False)
    code, out, _ = run_cli("recipes", "list", "--json")
    assert code == 0 and {r["name"] for r in json.loads(out)} >= set(PUBLISHED)


def test_show(run_cli):
    code, out, _ = run_cli("recipes", "show", "attune-tp1-pp4-ep8", "--dir", str(SEED_DIR))
    assert code == 0
    assert "14-step run scored over steps 4–13" in out
    assert "12.9% (N = 9,008,136,192 active parameters per token)" in out
    assert "${MODEL_ARGS[@]} \\" in out and "--moe-shared-expert-overlap" in out
    code, out, _ = run_cli("recipes", "show", "attune-tp1-pp4-ep8-flex", "--json", "--dir", str(SEED_DIR))
    assert json.loads(out)["correctness"]["component_tests"][0]["date"] == "2026-10-13"


def test_show_unknown_name_suggests(run_cli):
    code, _, err = run_cli("recipes", "show", "attune-tp1-pp4-ep9", "--dir", str(SEED_DIR))
    assert code == 2 and "did you mean" in err


def test_validate_seeds(run_cli):
    code, out, _ = run_cli("recipes", "validate", str(SEED_DIR))
    assert code == 0 and out.count("ok ") == 3


def _bad(tmp_path, name, mutate):
    data = yaml.safe_load((SEED_DIR / "attune-tp1-pp4-ep8-rc2.yaml").read_text())
    mutate(data)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_validate_reports_every_bad_field_and_exits_2(run_cli, tmp_path):
    files = [
        _bad(tmp_path, "negative", lambda d: d["result"].update(tokens_per_s_per_gpu=-2451.44)),
        _bad(tmp_path, "typed", lambda d: d["gpu"].update(count="32")),
        _bad(tmp_path, "missing", lambda d: d["layout"].pop("dispatcher")),
        _bad(tmp_path, "unknown", lambda d: d["result"].update(tokens_per_gpu=1.0)),
        _bad(tmp_path, "derived", lambda d: d["result"].update(mfu=0.2)),
    ]
    code, out, err = run_cli("recipes", "validate", *map(str, files), str(SEED_DIR / "attune-tp1-pp4-ep8.yaml"))
    assert code == 2
    for path in ("result.tokens_per_s_per_gpu: ", "gpu.count: ", "layout.dispatcher: ", "result.tokens_per_gpu: ", "result.mfu: "):
        assert f"  {path}" in out, path
    assert out.count("invalid ") == 5 and out.count("ok ") == 1
    assert "5 of 6 recipes invalid" in err


def test_validate_json_names_each_files_errors_and_keeps_the_exit_code(run_cli, tmp_path):
    bad = _bad(tmp_path, "derived", lambda d: d["result"].update(mfu=0.2))
    good = SEED_DIR / "attune-tp1-pp4-ep8.yaml"
    code, out, err = run_cli("recipes", "validate", "--json", str(bad), str(good))
    assert code == 2 and "1 of 2 recipes invalid" in err
    doc = json.loads(out)  # stdout is the JSON alone: no per-file lines around it
    assert doc["checked"] == 2 and doc["invalid"] == 1
    by = {r["path"]: r for r in doc["recipes"]}
    assert by[str(bad)]["status"] == "invalid" and any(e.startswith("result.mfu: ") for e in by[str(bad)]["errors"])
    assert by[str(good)] == {"path": str(good), "status": "ok", "errors": [], "warnings": []}
    code, out, _ = run_cli("recipes", "validate", "--json", str(good))
    assert code == 0 and json.loads(out)["invalid"] == 0


def test_validate_exit_code_in_a_real_process(tmp_path):
    bad = _bad(tmp_path, "neg", lambda d: d["result"].update(tokens_per_s_per_gpu=-1.0))
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "autotune.cli.main", "recipes", "validate", str(bad)],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert "result.tokens_per_s_per_gpu: Input should be greater than 0" in proc.stdout


def test_validate_nothing_found(run_cli, tmp_path):
    code, _, err = run_cli("recipes", "validate", str(tmp_path))
    assert code == 2 and "no recipe files" in err


def test_a_searched_recipe_with_an_uneven_split_validates_and_reads_back(run_cli, tmp_path):
    """Qwen3-235B-A22B's 94 layers over PP 8 x VPP 4: the search tries the split, its recipe writes it in
    layout.layer_split and the run block's flags, and reading the recipe back gives the same split."""
    from autotune.layout.splits import legal_splits, split_text
    from autotune.recipes import load_recipe
    from autotune.recipes.convert import layout_of

    space = tmp_path / "s.yaml"
    space.write_text("extends: default\ndimensions:\n  tp: [2]\n  pp: [8]\n  vpp: [4]\n  cp: [1]\n  ep: [8]\n"
                     "  etp: [1]\n  recompute: [full:uniform:2]\n  dispatcher: [alltoall]\n  optimizer_offload: [0.0]\n"
                     "  ep_overlap: [false]\n  moe_shared_expert_overlap: [false]\n")
    code, out, err = run_cli("search", "--model", "Qwen3-235B-A22B", "--gpu", "H100", "--count", "64", "--space",
                             str(space), "--trials", "2", "--runs-dir", str(tmp_path), "--study", "u", "--json")
    assert code == 0, err
    paths = sorted((tmp_path / "u" / "recipes").glob("*.yaml"))
    assert paths
    for p in paths:
        lay = layout_of(load_recipe(p))
        assert lay.layer_split in legal_splits(94, 8, 4)
        code, out, err = run_cli("recipes", "validate", str(p))
        assert code == 0, out + err
    code, out, _ = run_cli("dashboard", str(tmp_path / "u"), "--json")
    assert code == 0 and {t["layer_split"] for t in json.loads(out)["trials"]} <= {split_text(s) for s in legal_splits(94, 8, 4)}
    code, out, _ = run_cli("dashboard", str(tmp_path / "u"))  # the ranked trials show which split each ran
    assert code == 0 and "split" in out and split_text(lay.layer_split) in out
    code, _, err = run_cli("dashboard", str(tmp_path / "u"), "--html", str(tmp_path / "r.html"))
    assert code == 0, err
    assert f"split {split_text(lay.layer_split)}" in (tmp_path / "r.html").read_text()
