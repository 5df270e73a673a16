"""A real simulator study, made once through the CLI, that the report tests read (and copy before changing)."""

import json
import shutil

import pytest

from autotune.cli.main import main

SEARCH = ["search", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32", "--trials", "20"]


@pytest.fixture(scope="session")
def sim_study(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    rc = main([*SEARCH, "--runs-dir", str(runs), "--study", "sim", "--json"])
    assert rc == 0
    return runs / "sim"


@pytest.fixture
def study_copy(sim_study, tmp_path):
    """A private copy to break or trim."""
    dst = tmp_path / "runs" / sim_study.name
    shutil.copytree(sim_study, dst)
    return dst


@pytest.fixture
def summary(sim_study):
    return json.loads((sim_study / "summary.json").read_text())
