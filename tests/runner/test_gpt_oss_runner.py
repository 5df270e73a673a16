"""The CPU runner builds gpt-oss as MODEL_ARGS describe it: quick-GELU GLU with offset 1 and the clamp, learnable
softmax, a left window of sliding_window - 1 on the sliding layers; and a tiny gpt-oss proxy trains on CPU."""

from __future__ import annotations

import math

import pytest
from runner_helpers import cpu_spec, losses, run_local

from autotune.catalog import load_model
from autotune.catalog.model import SLIDING
from autotune.launch import slime_model_args
from autotune.layout import Layout
from autotune.trials.plan import plan_trial
from autotune.trials.proxy import make_proxy

pytest.importorskip("megatron.core")


def _config(model: str, proxy: dict | None = None):
    import torch

    from autotune.runner.build import transformer_config

    spec = cpu_spec(Layout(world=1, micro_batch_size=1), model=model, proxy=proxy)
    notes: list[str] = []
    config, _ = transformer_config(plan_trial(spec, 1), False, torch.float32, notes)
    return config


def test_gpt_oss_config_is_the_bridge_model():
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.transformer.utils import is_layer_window_attention

    c = _config("gpt-oss-120b")
    assert c.activation_func is quick_gelu and c.gated_linear_unit
    assert c.glu_linear_offset == 1.0 and c.activation_func_clamp_value == 7.0
    assert c.window_size == (127, 0) and c.softmax_type == "learnable"
    model = load_model("gpt-oss-120b")
    sliding = [int(t == SLIDING) for t in model.layer_types]
    assert c.window_attn_skip_freq == sliding
    # MODEL_ARGS' --window-attn-skip-freq picks the same layers in Megatron
    args = slime_model_args(model)
    freq = int(args[args.index("--window-attn-skip-freq") + 1])
    assert [int(is_layer_window_attention((127, 0), freq, i + 1)) for i in range(model.num_layers)] == sliding


def test_other_models_keep_swiglu_without_offset_clamp_or_window():
    import torch

    c = _config("tiny-moe")
    assert c.activation_func is torch.nn.functional.silu and c.glu_linear_offset == 0.0
    assert c.activation_func_clamp_value is None and c.window_size is None and c.softmax_type == "vanilla"


@pytest.mark.slow
def test_a_gpt_oss_proxy_trains_on_cpu(tmp_path):
    """Two layers (sliding, full) with sinks, 8 biased experts under the clamp and offset; megatron-core's unfused
    GLU (transformer/moe/experts.py SequentialMLP via mlp.py) applies both."""
    layout = Layout(world=1, micro_batch_size=1)
    small, proxy = make_proxy(load_model("gpt-oss-20b"), layout, "cpu")
    assert small.model_type == "gpt_oss" and small.sliding_window == 64 and small.moe.activation_clamp == 7.0
    res = run_local(cpu_spec(layout, number=40, model="gpt-oss-20b", proxy=proxy), tmp_path)
    assert res.status == "ok", (res.reason, res.log_tail)
    ls = losses(res)
    assert all(math.isfinite(x) for x in ls) and ls[-1] < ls[0] - 0.1, ls


@pytest.mark.slow
def test_a_deepseek_v4_proxy_trains_on_cpu_as_a_stand_in_and_says_so(tmp_path):
    """megatron-core 0.16 has no dsv4_hybrid attention or hyper-connections: the runner builds the layers as
    standard attention with one residual stream, drops the recompute modules that then have nothing to act on, and
    the result's notes say both; the trial still trains (its timing is a stand-in's)."""
    from autotune.layout import Recompute
    layout = Layout(world=2, ep=2, micro_batch_size=1, recompute=Recompute("selective", modules=("mla_up_proj", "mhc")))
    small, proxy = make_proxy(load_model("DeepSeek-V4-Flash"), layout, "cpu")
    assert small.csa is not None and small.hc_streams == 4
    res = run_local(cpu_spec(layout, number=41, model="DeepSeek-V4-Flash", proxy=proxy), tmp_path)
    assert res.status == "ok", (res.reason, res.log_tail)
    assert "ran as standard attention, without hyper-connections" in res.reason
    assert "without mla_up_proj, mhc" in res.reason
    ls = losses(res)
    assert all(math.isfinite(x) for x in ls) and ls[-1] < ls[0], ls
