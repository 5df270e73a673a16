"""Without processes: the trial plan's checks, proxies of every shipped model, token rows, failure classes."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
from runner_helpers import cpu_spec

from autotune.catalog import load_model, model_names
from autotune.catalog.model import FULL
from autotune.errors import BadInput, ConfigError, IllegalLayout
from autotune.layout import Layout, Recompute, violations
from autotune.runner.data import NpyRows, SyntheticRows
from autotune.trials.plan import plan_trial
from autotune.trials.failure import classify, classify_exception, marker
from autotune.trials.proxy import make_proxy, proxy_model
from autotune.trials.spec import TrialSpec


def test_import_autotune_runner_needs_no_torch():
    import subprocess
    import sys

    code = "import autotune.runner, autotune.trials.proxy, autotune.trials.failure, sys; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_plan_batches_and_window():
    plan = plan_trial(cpu_spec(Layout(world=2, micro_batch_size=1)))
    assert (plan.num_microbatches, plan.rows_per_microbatch, plan.rows_per_step) == (2, 1, 4)
    assert plan.tokens_per_step == 4 * 128 and plan.window == (2, 5)


@pytest.mark.parametrize("change, words", [
    (dict(count=4), "count 4"),  # layout.world 2 against count 4
    (dict(layout=Layout(world=2, tp=4).to_dict()), "TP x PP x CP = 4"),
    (dict(layout=Layout(world=2, ep=3).to_dict()), "EP x ETP x PP = 3"),
    (dict(warmup_steps=6), "no steps to score"),
    (dict(workload={"seq_len": 128, "bogus": 1}), "bogus"),
    (dict(data={"kind": "pretokenized", "path": "/nonexistent/tokens.npy"}), "does not exist"),
])
def test_plan_rejects_bad_specs_with_one_line(change, words):
    spec = TrialSpec.model_validate({**cpu_spec(Layout(world=2)).model_dump(), **change})
    with pytest.raises(BadInput) as exc:  # ConfigError, or IllegalLayout for broken degrees
        plan_trial(spec)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_plan_rejects_an_illegal_layout_and_a_wrong_world_size():
    with pytest.raises(IllegalLayout, match="heads"):
        plan_trial(cpu_spec(Layout(world=8, tp=8)))  # tiny-moe has 4 heads
    with pytest.raises(ConfigError, match="launched with 3 ranks"):
        plan_trial(cpu_spec(Layout(world=2)), world_size=3)


@pytest.mark.parametrize("name", model_names())
@pytest.mark.parametrize("layout", [
    Layout(world=2, tp=2), Layout(world=2, pp=2), Layout(world=8, tp=2, pp=2, vpp=2, ep=2),
    Layout(world=4, tp=4, recompute=Recompute("full", "uniform", 2)),
], ids=["tp2", "pp2", "tp2pp2vpp2ep2", "tp4-full2"])
def test_cpu_proxy_is_small_legal_and_rebuilds_from_its_json(name, layout):
    model = load_model(name)
    if not model.is_moe:
        layout = layout.with_(ep=1)
    if {"gate_query_groups_tp", "csa_tp"} & {v.code for v in violations(model, plan_workload(), layout)}:
        pytest.skip("the layout itself is illegal for this model (output gate with TP above the query groups, "
                    "DeepSeek-V4's attention at TP > 1)")
    small, proxy = make_proxy(model, layout, "cpu")
    assert proxy["of"] == name and small.name.endswith("-proxy")
    assert proxy_model(model, json.loads(json.dumps(proxy))) == small  # TrialSpec.proxy round trip
    shape_rules = [v for v in violations(small, plan_workload(), layout) if v.code not in {"dp_batch", "microbatch_divides"}]
    assert not shape_rules
    assert small.hidden_size <= 64 and small.num_layers <= 2 * layout.pp * layout.vpp
    assert small.num_layers % (layout.pp * layout.vpp) == 0
    if FULL in model.layer_types:
        assert FULL in small.layer_types
    if not model.mla:  # query groups below TP take megatron's KV-replication path: only if the model does
        assert (small.num_kv_heads >= layout.tp) == (model.num_kv_heads >= layout.tp)
    if model.is_moe:
        assert small.moe.num_experts % layout.ep == 0 and small.moe.top_k < small.moe.num_experts or model.moe.num_experts <= 2
        assert len(small.moe.dense_layers) < small.num_layers


def plan_workload():
    from autotune.catalog import Workload

    return Workload(seq_len=256, global_batch=64)


def test_gpu_proxy_keeps_widths_and_cuts_depth_and_experts():
    model = load_model("Qwen3.5-122B-A10B")
    small, proxy = make_proxy(model, Layout(world=8, pp=2, ep=4), "H200")
    assert (small.hidden_size, small.head_dim, small.moe.ffn_hidden_size) == (3072, 256, 1024)
    assert small.num_layers == 2 and small.moe.num_experts == 16 and small.moe.top_k == 8
    assert "hidden_size" not in proxy["overrides"]


def test_proxy_cannot_fix_a_layout_that_breaks_the_world_size():
    with pytest.raises(IllegalLayout, match="does not divide"):
        make_proxy(load_model("tiny-moe"), Layout(world=6, tp=4), "cpu")
    with pytest.raises(ConfigError, match="trial's model"):
        proxy_model(load_model("tiny-moe"), {"of": "Qwen3.5-9B", "overrides": {}})


def test_synthetic_rows_are_seeded_learnable_and_layout_independent():
    src = SyntheticRows(vocab_size=512, seq_len=128, seed=3)
    rows = src.rows(step=1, first=0, count=4)
    assert rows.shape == (4, 129) and rows.min() >= 0 and rows.max() < 512
    assert np.array_equal(np.concatenate([src.rows(1, 0, 2), src.rows(1, 2, 2)]), rows)  # DP split
    follows = (src.a * rows[:, :-1] + src.b) % 512 == rows[:, 1:]
    assert 0.8 < follows.mean() < 0.95  # the rule, with one token in eight random
    assert not np.array_equal(src.rows(2, 0, 4), rows) and not np.array_equal(SyntheticRows(512, 128, 4).rows(1, 0, 4), rows)


def test_npy_rows_wrap_and_reject_out_of_vocabulary_tokens(tmp_path):
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(3 * 129, dtype=np.int32) % 100)
    src = NpyRows(path, seq_len=128, vocab_size=100, rows_per_step=2)
    assert src.rows(0, 0, 2).shape == (2, 129)
    assert np.array_equal(src.rows(1, 1, 1)[0], src.rows(0, 0, 1)[0])  # row 3 wraps to row 0
    np.save(path, np.full(100, 7, dtype=np.int64))
    with pytest.raises(ValueError, match="fewer than 129"):
        NpyRows(path, seq_len=128, vocab_size=100, rows_per_step=2)
    np.save(path, np.full((4, 50), 7, dtype=np.int64))
    with pytest.raises(ValueError, match="at least 129"):
        NpyRows(path, seq_len=128, vocab_size=100, rows_per_step=2)
    np.save(path, np.full((2, 129), 500))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        NpyRows(path, seq_len=128, vocab_size=100, rows_per_step=2).rows(0, 0, 1)


def test_classify_exception_names_the_failure_class():
    class OutOfMemoryError(RuntimeError):
        pass

    class DistBackendError(RuntimeError):
        pass

    assert classify_exception(OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))[0] == "oom"
    assert classify_exception(RuntimeError("DefaultCPUAllocator: can't allocate memory"))[0] == "oom"
    assert classify_exception(DistBackendError("NCCL error in: ..."))[0] == "nccl"
    assert classify_exception(RuntimeError("[../third_party/gloo/...] Connection closed by peer"))[0] == "nccl"
    assert classify_exception(ValueError("token id 700 outside the vocabulary"))[0] == "crash"


def test_classify_prefers_the_root_cause_marker():
    log = "\n".join([
        "==> rank 0 <==", marker("nccl", 0, "RuntimeError: Connection closed by peer"),
        "==> rank 1 <==", marker("oom", 1, "OutOfMemoryError: CUDA out of memory"),
    ])
    assert classify([1, 1], log) == ("oom", "rank 1: OutOfMemoryError: CUDA out of memory")
    assert classify([1, 1], marker("crash", 1, "ValueError: bad\nrow") + "\n" + marker("nccl", 0, "gloo"))[0] == "crash"


def test_classify_without_markers_reads_exit_codes_and_tracebacks():
    assert classify([0, 0], "all fine") == ("ok", "")
    status, reason = classify([-signal.SIGKILL, 0], "")
    assert status == "crash" and "SIGKILL" in reason
    assert classify([1, 1], "Traceback...\ntorch.OutOfMemoryError: CUDA out of memory.")[0] == "oom"
    assert classify([124, 1], "")[0] == "timeout"
    status, reason = classify([1, 0], "Traceback (most recent call last):\nKeyError: 'x'\n")
    assert (status, reason) == ("crash", "KeyError: 'x'")
    assert classify([1, 1], "RuntimeError: [gloo] Connection reset by peer")[0] == "nccl"
