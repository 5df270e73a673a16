"""The one table of searched dimensions: every dimension round-trips Layout -> table -> params -> Layout,
distinct layouts get distinct keys, and the study's trial params name every dimension."""

from __future__ import annotations

import json

import numpy as np
import optuna

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cli.main import main
from autotune.layout import Layout, LayoutTable
from autotune.layout.dimensions import (DIMENSIONS, PARAM_NAMES, feature_columns, layout_from_params, layout_key,
                                        layout_params, table_keys, table_params)
from autotune.space import Dimensions, enumerate_space, explore, load_space


def _space(tmp_path, **dims):
    p = tmp_path / "space.yaml"
    p.write_text("extends: default\ndimensions:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in dims.items()))
    return load_space(str(p))


def test_the_space_schema_is_the_table():
    assert list(Dimensions.model_fields) == [d.key for d in DIMENSIONS]
    assert len(set(PARAM_NAMES)) == len(PARAM_NAMES) == len(DIMENSIONS)


def test_every_dimension_round_trips(tmp_path):
    model, cluster, w = load_model("Qwen3-30B-A3B"), ClusterSpec.of("H200", 16), Workload()
    space = _space(tmp_path, distributed_optimizer=[True, False], precision_aware_optimizer=[True, False],
                   rows_per_microbatch=[1, 2], optimizer_offload=[0.0, 0.5], cp=[1],
                   dispatcher=["alltoall", "flex", "hybridep"])  # (under the 5M cap)
    t = enumerate_space(space, model, w, cluster)
    rng = np.random.default_rng(0)
    uneven = np.flatnonzero(t.split > 0)  # 48 layers over PP 3 x VPP 3, ...: every split Megatron accepts
    assert len(uneven)
    idx = np.concatenate([rng.choice(len(t), size=300, replace=False), rng.choice(uneven, size=100, replace=False)])
    sub = t.take(idx)
    params = table_params(sub)
    keys = table_keys(sub)
    for j in range(len(sub)):
        lay = sub.row(j)
        p = layout_params(lay)
        assert set(p) == set(PARAM_NAMES)
        assert p == {k: (v[j].item() if hasattr(v[j], "item") else v[j]) for k, v in params.items()}
        back = layout_from_params(lay.world, p)
        assert layout_params(back) == p and layout_key(back) == keys[j] == layout_key(lay)
        again = LayoutTable.from_layouts([back])
        assert [int(c[0]) for c in feature_columns(again)] == [int(c[j]) for c in feature_columns(sub)]


def test_distinct_layouts_get_distinct_keys(tmp_path):
    """Qwen3-30B-A3B on 16 x H200 with distributed_optimizer [true, false]: every candidate its own key
    (before the table, 103,348 candidates shared 54,823 keys)."""
    model, cluster, w = load_model("Qwen3-30B-A3B"), ClusterSpec.of("H200", 16), Workload()
    space = _space(tmp_path, distributed_optimizer=[True, False], precision_aware_optimizer=[False],
                   dispatcher=["alltoall", "flex", "hybridep"])
    space.prune.keep_within = 0.0  # every layout that fits, not only those that can win
    t = explore(space, model, w, cluster).table
    keys = table_keys(t)
    assert len(t) > 40_000 and len(set(keys)) == len(t)  # (offload needs the precision-aware optimizer)
    assert {bool(v) for v in t.dist_opt} == {True, False}


def test_study_params_name_every_dimension(tmp_path, capsys):
    sp = _space(tmp_path, distributed_optimizer=[True, False], dispatcher=["alltoall", "flex", "hybridep"])
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(sp.model_dump(exclude={"source"})))
    assert main(["search", "--model", "Qwen3-30B-A3B", "--gpu", "H200", "--count", "16", "--space", str(path),
                 "--trials", "3", "--runs-dir", str(tmp_path), "--study", "d", "--json"]) == 0
    capsys.readouterr()
    study = optuna.load_study(study_name="d", storage=f"sqlite:///{tmp_path / 'd' / 'study.db'}")
    for t in study.trials:
        assert set(t.params) == set(PARAM_NAMES)
        assert t.params == layout_params(Layout.from_dict(t.user_attrs["layout"]))
