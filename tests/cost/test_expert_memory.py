"""The routed experts' FFN-width traffic as its own time term (expert_memory), fitted with a wide prior and a floor."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.catalog import GPUS, ClusterSpec, Workload, load_model
from autotune.cost import Calibration, TimeCoefficients, evaluate
from autotune.cost._fit import LOWER_BOUND, WIDE_PRIOR
from autotune.cost.calibrate import fit, predict
from autotune.cost.measurements import Measurement
from autotune.layout import Layout, LayoutTable, Recompute


def test_expert_memory_is_the_routed_copies_ffn_width_traffic():
    """Per routed copy the experts save fc1's output (gate and up) and the activation's output, BF16; the term
    moves those bytes mem_touch times per pass, over forward and two backward passes, at the HBM bandwidth."""
    m, c = load_model("Qwen3-30B-A3B"), TimeCoefficients()
    lay = Layout(world=8, ep=8, micro_batch_size=1)
    ev = evaluate(m, Workload(seq_len=4096, global_batch=64), ClusterSpec.of("H100", 8), LayoutTable.from_layouts([lay]),
                  Calibration("H100"))
    e = m.moe
    per_token = e.top_k * 2 * (2 * e.ffn_hidden_size + e.ffn_hidden_size) * m.num_layers  # every layer is MoE
    want = per_token * 4096 * 3 * c.mem_touch / (GPUS["H100"].hbm_gbps * 1e9)
    assert ev.time.mb_terms["expert_memory"][0, 0] == pytest.approx(want, rel=1e-9)
    dense = evaluate(load_model("Llama-3.1-8B"), Workload(), ClusterSpec.of("H100", 8),
                     LayoutTable.from_layouts([Layout(world=8)]), Calibration("H100"))
    assert dense.time.mb_terms["expert_memory"].max() == 0


def _rows(expert_factor: float):
    rc = Recompute("full", "uniform", 1)
    spec = [("Qwen3-30B-A3B", dict(ep=8)), ("Qwen3-30B-A3B", dict(ep=16)), ("Qwen3-30B-A3B", dict(pp=2, ep=8)),
            ("Mixtral-8x7B-v0.1", dict(pp=4, ep=8, recompute=rc)), ("Llama-3.1-70B", dict(tp=8, pp=2, recompute=rc)),
            ("Llama-3.1-70B", dict(tp=4, pp=4, recompute=rc))]
    rows = [Measurement(model, "B200", 64, Layout(world=64, **kw), 1000.0, source="synthetic", seq_len=4096,
                        global_batch=256) for model, kw in spec]
    truth = Calibration("B200", TimeCoefficients(scale={"expert_memory": expert_factor}))
    return [replace(r, tokens_per_s_per_gpu=float(p)) for r, p in zip(rows, predict(rows, truth))]


def test_the_fit_can_move_expert_memory_far_and_never_below_its_bound(monkeypatch):
    from autotune.cost import _fit

    assert WIDE_PRIOR["expert_memory"] > 1 and "expert_memory" in LOWER_BOUND
    loose = fit(_rows(4.0), base=Calibration("B200"), terms=("expert_memory",), prior_sigma=1.0)
    assert loose.factors["expert_memory"] == pytest.approx(4.0, rel=0.05)  # the data alone recover the truth
    wide = fit(_rows(4.0), base=Calibration("B200"), terms=("expert_memory",)).factors["expert_memory"]
    monkeypatch.setitem(_fit.WIDE_PRIOR, "expert_memory", 1.0)
    narrow = fit(_rows(4.0), base=Calibration("B200"), terms=("expert_memory",)).factors["expert_memory"]
    assert wide > 1.3 and narrow < 1.1  # six rows move the wide prior; the other terms' width would hold it at 1
    monkeypatch.undo()
    fast = fit(_rows(0.3), base=Calibration("B200"), terms=("expert_memory",), prior_sigma=1.0)
    assert fast.factors["expert_memory"] == pytest.approx(1.0)  # HBM bandwidth is the floor
