"""Large tables are priced in groups of equal PP (cost/_groups.py): every row's memory and time are the numbers the
whole table gives, on spaces with uneven layer splits, FP8 / MXFP8, optimizer offload and every dispatcher."""

import numpy as np
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import _groups, estimate_memory, evaluate, load_calibration
from autotune.cost.time import MB_TERMS
from autotune.space import enumerate_space, load_space


def _whole(monkeypatch):
    monkeypatch.setattr(_groups, "GROUP_MIN_ROWS", 10**12)


def _grouped(monkeypatch, size: int = 1):
    monkeypatch.setattr(_groups, "GROUP_MIN_ROWS", 0)
    monkeypatch.setattr(_groups, "GROUP_MIN_SIZE", size)


CASES = [  # (model, GPU, GPUs, precision): uneven splits (94 layers), FP8 on a dense model, MXFP8 on an NVL72 rack
    ("Qwen3-235B-A22B", "H100", 64, "bf16"),
    ("Llama-3.1-70B", "H100", 32, "fp8-tensorwise"),
    ("Qwen3-30B-A3B", "GB200", 16, "mxfp8"),
]


@pytest.mark.parametrize("name,gpu,count,precision", CASES)
def test_grouped_pricing_gives_every_row_the_numbers_of_the_whole_table(monkeypatch, name, gpu, count, precision):
    m, c, w = load_model(name), ClusterSpec.of(gpu, count), Workload(precision=precision)
    space = load_space(None, m)
    d = space.dimensions  # fewer values per dimension (the whole default space is ~10^7 combinations)
    d.recompute, d.rows_per_microbatch, d.cp = ["none", "selective:layernorm,moe_act", "full:uniform:2"], [1, 2], [1, 2]
    d.cuda_graphs = ["none", "attn"]
    t = enumerate_space(space, m, w, c)  # every combination, legal or not: the models price any row
    rng = np.random.default_rng(0)
    t = t.take(np.sort(rng.choice(len(t), size=min(len(t), 6000), replace=False)))
    assert len(np.unique(t.pp)) >= 3
    cal = load_calibration(gpu)
    _whole(monkeypatch)
    a = evaluate(m, w, c, t, cal)
    _grouped(monkeypatch, 200)
    assert _groups.pp_groups(t.pp) is not None
    b = evaluate(m, w, c, t, cal)
    np.testing.assert_array_equal(b.memory.n_stages, t.pp)
    np.testing.assert_allclose(b.memory.total, a.memory.total, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(b.memory.fits, a.memory.fits)
    np.testing.assert_allclose(b.memory.host_bytes, a.memory.host_bytes, rtol=1e-12)
    np.testing.assert_allclose(b.time.step_time, a.time.step_time, rtol=1e-12)
    np.testing.assert_allclose(b.time.tokens_per_s_per_gpu, a.time.tokens_per_s_per_gpu, rtol=1e-12)
    np.testing.assert_allclose(b.time.mfu, a.time.mfu, rtol=1e-12)
    for k in a.time.step_terms:
        np.testing.assert_allclose(b.time.step_terms[k], a.time.step_terms[k], rtol=1e-12, atol=1e-15, err_msg=k)
    np.testing.assert_allclose(b.sigma, a.sigma, rtol=1e-12)
    valid = np.arange(int(t.pp.max()))[None, :] < t.pp[:, None]
    for k in MB_TERMS:  # per micro-batch and stage, where a stage exists
        x, y = np.broadcast_to(b.time.mb_terms[k], valid.shape), np.broadcast_to(a.time.mb_terms[k], valid.shape)
        np.testing.assert_allclose(x[valid], y[valid], rtol=1e-12, atol=1e-15, err_msg=k)
    i = int(np.flatnonzero(t.pp == t.pp.max())[0])  # a single row's stage breakdown, as `estimate` prints it
    for x, y in zip(b.memory.stage_breakdown(i), a.memory.stage_breakdown(i), strict=True):
        assert x == pytest.approx(y, rel=1e-12)


def test_groups_cover_every_row_once_shallowest_first_and_small_tables_stay_whole():
    pp = np.array([4, 1, 16, 1, 2, 4, 8, 16, 2, 1] * 50)
    groups = _groups.pp_groups(pp, min_rows=0, min_size=100)
    assert groups is not None
    rows = np.concatenate(groups)
    assert sorted(rows) == list(range(len(pp)))  # every row once
    assert all(np.all(np.diff(g) > 0) for g in groups)  # each group in table order
    deepest = [int(pp[g].max()) for g in groups]
    assert deepest == sorted(deepest) and all(len(g) >= 100 for g in groups)
    assert all(pp[g].min() > pp[h].max() for h, g in zip(groups, groups[1:]))  # no PP split across two groups
    assert _groups.pp_groups(pp, min_rows=len(pp) + 1) is None  # small: priced whole
    assert _groups.pp_groups(np.full(10_000, 4), min_rows=0) is None  # one PP: nothing to gain
    assert _groups.pp_groups(pp, min_rows=0, min_size=len(pp)) is None  # one group after merging


def test_scatter_keeps_per_row_terms_broadcast_and_pads_shallow_groups_with_zeros():
    groups = [np.array([0, 2]), np.array([1, 3])]
    per_row = [np.broadcast_to(np.array([[1.0], [2.0]]), (2, 1)), np.broadcast_to(np.array([[3.0], [4.0]]), (2, 3))]
    out = _groups.scatter_rows(per_row, groups, 4, 3)
    assert out.strides[1] == 0 and list(out[:, 0]) == [1.0, 3.0, 2.0, 4.0]
    full = [np.array([[5.0], [6.0]]), np.array([[7.0, 8.0, 9.0], [1.0, 2.0, 3.0]])]
    out = _groups.scatter_rows(full, groups, 4, 3)
    assert out.tolist() == [[5, 0, 0], [7, 8, 9], [6, 0, 0], [1, 2, 3]]
    assert _groups.scatter_rows([0.0, 0.0], groups, 4, 3) == 0.0  # a term no row has stays the scalar 0
    assert _groups.scatter_rows([0.0, np.ones((2, 3))], groups, 4, 3).tolist() == [[0] * 3, [1] * 3, [0] * 3, [1] * 3]


def test_a_large_table_is_priced_in_groups(monkeypatch):
    """The default thresholds group the bench's kind of table and leave a search's few hundred candidates whole."""
    m, c, w = load_model("Qwen3.5-122B-A10B"), ClusterSpec.of("H200", 32), Workload()
    t = enumerate_space(load_space(None, m), m, w, c)
    assert len(t) >= _groups.GROUP_MIN_ROWS and _groups.pp_groups(t.pp) is not None
    assert _groups.pp_groups(t.pp[:500]) is None
    calls = []
    real = _groups.pp_groups
    monkeypatch.setattr("autotune.cost.memory.pp_groups", lambda pp: calls.append(len(pp)) or real(pp))
    estimate_memory(m, w, c, t)
    assert calls == [len(t)]
