"""Recipe files: parse-then-dump keeps every byte, writes are atomic, recipes are found where users keep them."""

from __future__ import annotations

import os

import pytest
import yaml

from autotune.errors import ConfigError
from autotune.recipes import dump_recipe, find_recipes, load_recipe, parse_recipe, recipe_dirs, write_recipe
from autotune.recipes.io import write_text_atomic

from recipe_seeds import SEED_DIR


def test_parse_then_dump_preserves_the_file(seed_path):
    text = seed_path.read_text()
    recipe = parse_recipe(text)
    out = dump_recipe(recipe, seed_path.stem)
    assert out == text
    assert yaml.safe_load(out) == yaml.safe_load(text)


def test_dump_keeps_content_and_key_order_without_header(seed):
    body = dump_recipe(seed)
    assert not body.startswith("#")
    assert parse_recipe(body) == seed

    def keys(node):
        if isinstance(node, dict):
            return [(k, keys(v)) for k, v in node.items()]
        if isinstance(node, list):
            return [keys(v) for v in node]
        return None

    assert keys(yaml.safe_load(body)) == keys(seed.model_dump(mode="python"))
    assert "run: |\n" in body  # the command stays a readable literal block


def test_write_recipe_names_header_after_the_recipe_not_the_rank(tmp_path, seed_path):
    recipe = load_recipe(seed_path)
    dest = write_recipe(recipe, tmp_path / "runs" / "s" / "recipes" / f"rank-01-{seed_path.stem}.yaml")
    assert dest.read_text() == seed_path.read_text()


def _old(tmp_path):
    target = tmp_path / "r.yaml"
    target.write_text("old content\n")
    return target


def test_interrupted_write_leaves_the_old_file(tmp_path, monkeypatch):
    target = _old(tmp_path)
    recipe = load_recipe(SEED_DIR / "attune-tp1-pp4-ep8.yaml")

    def crash(*a, **k):
        raise KeyboardInterrupt("killed before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        write_recipe(recipe, target)
    assert target.read_text() == "old content\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.yaml"]  # no temp file left behind


def test_failed_flush_leaves_the_old_file(tmp_path, monkeypatch):
    target = _old(tmp_path)

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError):
        write_text_atomic(target, "new content that never lands\n")
    assert target.read_text() == "old content\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.yaml"]


def test_atomic_write_replaces_and_sets_mode(tmp_path):
    target = _old(tmp_path)
    write_text_atomic(target, "new\n", mode=0o755)
    assert target.read_text() == "new\n"
    assert os.access(target, os.X_OK)


def test_recipes_are_found_in_cwd_then_repo(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTOTUNE_RECIPES", raising=False)
    monkeypatch.chdir(tmp_path)
    repo_only = recipe_dirs()
    assert [d.resolve() for d in repo_only] == [SEED_DIR.parents[1].resolve()]
    (tmp_path / "recipes").mkdir()
    assert [d.resolve() for d in recipe_dirs()][0] == (tmp_path / "recipes").resolve()
    monkeypatch.setenv("AUTOTUNE_RECIPES", str(tmp_path / "recipes"))
    assert find_recipes() == []


def test_find_recipes_dedupes_and_sorts():
    files = find_recipes([SEED_DIR, SEED_DIR / "attune-tp1-pp4-ep8.yaml"])
    assert [f.name for f in files] == sorted(p.name for p in SEED_DIR.glob("*.yaml"))


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such recipe file"):
        load_recipe(tmp_path / "nope.yaml")
