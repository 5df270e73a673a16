"""LoRA fine-tuning (Workload.lora): the base weights frozen, as Megatron-Bridge's "[LoRA (fine-tuning)]" rows run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cli.main import main
from autotune.cost import Calibration, evaluate
from autotune.cost.measurements import published_measurements
from autotune.layout import Layout, LayoutTable, Recompute

M = load_model("Llama-3.1-70B")
C = ClusterSpec.of("H100", 16)


def _pair(lay: Layout, **kw):
    t = LayoutTable.from_layouts([lay])
    return {lora: evaluate(M, Workload(seq_len=4096, global_batch=32, lora=lora, **kw), C, t, Calibration("H100"))
            for lora in (False, True)}


def test_frozen_linears_run_forward_and_data_gradient_only():
    """The linears' GEMM terms are forward x 3 (forward, dgrad, wgrad) for training and x 2 for a frozen base;
    attention's core and the elementwise traffic are the same work either way."""
    ev = _pair(Layout(world=16, tp=2, pp=4, vpp=5))
    full, lora = ev[False].time.mb_terms, ev[True].time.mb_terms
    assert lora["compute_dense"][0] == pytest.approx(2 / 3 * full["compute_dense"][0], rel=1e-9)
    # the output layer's GEMMs too; its loss's logit traffic (last stage) is the same
    assert lora["compute_output"][0, 3] < full["compute_output"][0, 3]
    for term in ("compute_attention", "memory_bound", "tp_comm"):
        assert np.allclose(lora[term], full[term])
    assert ev[True].time.tokens_per_s_per_gpu[0] > ev[False].time.tokens_per_s_per_gpu[0]


def test_no_gradients_optimizer_or_gradient_traffic_for_frozen_weights():
    ev = _pair(Layout(world=16, tp=2, pp=2), grads_fp32=True)
    full, lora = ev[False], ev[True]
    assert full.memory.terms["grads"].max() > 0 and full.memory.terms["optimizer"].max() > 0
    assert lora.memory.terms["grads"].max() == 0 and lora.memory.terms["optimizer"].max() == 0
    assert np.allclose(lora.memory.terms["weights"], full.memory.terms["weights"])
    assert lora.memory.peak[0] < full.memory.peak[0]
    assert full.time.step_terms["optimizer"][0] > 0 and lora.time.step_terms["optimizer"][0] == 0
    assert full.time.step_terms["dp_comm"][0] > 0 and lora.time.step_terms["dp_comm"][0] == 0


def test_recompute_reruns_the_same_forward():
    """Full recompute re-runs each layer's forward: the same seconds whether its weights train or not."""
    ev = _pair(Layout(world=16, tp=2, pp=4, recompute=Recompute.parse("full:uniform:1")))
    assert ev[True].time.mb_terms["recompute"][0, 0] == pytest.approx(ev[False].time.mb_terms["recompute"][0, 0], rel=1e-9)
    assert ev[True].time.mb_terms["recompute"][0, 0] > 0


def test_mfu_counts_forward_and_data_gradient():
    ev = _pair(Layout(world=16, tp=2, pp=4))
    per_tps = {k: e.time.mfu[0] / e.time.tokens_per_s_per_gpu[0] for k, e in ev.items()}
    assert per_tps[True] == pytest.approx(per_tps[False] * 4 / 6, rel=1e-9)


def test_published_lora_rows_are_read_as_lora():
    kept, skipped = published_measurements()
    lora = [m for m in kept if m.lora]
    assert len(lora) == 5 and {m.model for m in lora} == {"Llama-3.1-70B"}
    assert all(m.workload.lora for m in lora)
    assert not [r for r, _ in skipped if "lora" in (r.get("model") or "").lower()]


def test_estimate_lora_flag(capsys):
    argv = ["estimate", "--model", "Llama-3.1-70B", "--gpu", "H100", "--count", "8", "--layout", "TP2 PP4 VPP20",
            "--seq-len", "4096", "--global-batch", "32", "--precision", "fp8-tensorwise", "--json"]
    outs = {}
    for lora in (False, True):
        assert main(argv + (["--lora"] if lora else [])) == 0
        outs[lora] = json.loads(capsys.readouterr().out)
    assert outs[True]["lora"] is True and outs[False]["lora"] is False
    assert not outs[False]["memory"]["fits"] and outs[True]["memory"]["fits"]  # 70B's Adam state needs more than 8 H100
    assert all(s["grads"] == 0 and s["optimizer"] == 0 for s in outs[True]["memory"]["stages"])
    assert outs[True]["throughput"]["tokens_per_s_per_gpu"] > outs[False]["throughput"]["tokens_per_s_per_gpu"]
