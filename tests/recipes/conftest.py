"""Shared fixtures for the recipe tests: the three seed recipes and an in-process CLI runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli.main import main
from autotune.recipes import load_recipe
from recipe_seeds import SEED_DIR, SEED_NAMES


@pytest.fixture(params=SEED_NAMES)
def seed_path(request) -> Path:
    return SEED_DIR / f"{request.param}.yaml"


@pytest.fixture
def seed(seed_path):
    return load_recipe(seed_path)


@pytest.fixture
def run_cli(capsys):
    """Run the real CLI entry point in-process; returns (exit code, stdout, stderr)."""

    def _run(*argv: str):
        code = main(list(argv))
        out = capsys.readouterr()
        return code, out.out, out.err

    return _run
