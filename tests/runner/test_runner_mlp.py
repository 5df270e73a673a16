"""The CPU runner's TransformerConfig has the model's MLP and norm, as MODEL_ARGS say them (launch.mlp_activation,
launch.norm_epsilon): Nemotron's squared ReLU and GPT-3's GeLU without a gate, LayerNorm (with its bias, torch's in the
local spec) where the model has one, and the config's epsilon. These models are still refused by plan_trial
(model_blocker), so the config is built from a tiny-moe plan with the model swapped in."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
from runner_helpers import cpu_spec

from autotune.catalog import load_model
from autotune.launch import slime_model_args
from autotune.layout import Layout
from autotune.trials.plan import plan_trial

pytest.importorskip("megatron.core")

NEMOTRON_H = "NVIDIA-Nemotron-3-Nano-30B-A3B"


def _config(model: str):
    import torch

    from autotune.runner.build import transformer_config

    plan = plan_trial(cpu_spec(Layout(world=1, micro_batch_size=1)), 1)
    notes: list[str] = []
    config, _ = transformer_config(dataclasses.replace(plan, model=load_model(model)), False, torch.float32, notes)
    return config


def test_nemotron_h_has_squared_relu_without_a_gate():
    from megatron.core.activations import squared_relu

    c = _config(NEMOTRON_H)
    assert c.activation_func is squared_relu and not c.gated_linear_unit
    assert c.normalization == "RMSNorm" and c.layernorm_epsilon == 1e-5  # its config's layer_norm_epsilon
    args = slime_model_args(load_model(NEMOTRON_H))
    assert "--squared-relu" in args and "--swiglu" not in args  # what its MODEL_ARGS say


def test_gpt3_has_gelu_without_a_gate_and_layernorm():
    import torch

    c = _config("Megatron-GPT-7.1B")
    assert c.activation_func is torch.nn.functional.gelu and not c.gated_linear_unit
    assert c.normalization == "LayerNorm"


def test_swiglu_models_keep_their_gate_and_take_their_epsilon():
    import torch

    for name, eps in (("Llama-3.1-8B", 1e-5), ("tiny-moe", 1e-6), ("Qwen3-30B-A3B", 1e-6)):
        c = _config(name)
        assert c.activation_func is torch.nn.functional.silu and c.gated_linear_unit, name
        assert c.normalization == "RMSNorm" and c.layernorm_epsilon == eps, name


def test_layernorm_models_get_torch_layernorm_with_a_bias_in_the_local_spec():
    """megatron-core 0.16.1's local spec builds WrappedTorchNorm, which picks torch's LayerNorm (weight and bias) from
    config.normalization: the runner's layer spec passes the model's normalization through."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.spec_utils import build_module

    from autotune.runner.build import _layer_spec

    c = _config("Nemotron-3-8B")
    assert c.normalization == "LayerNorm"
    with mock.patch.object(ps, "get_pipeline_model_parallel_rank", return_value=0), \
            mock.patch.object(ps, "get_pipeline_model_parallel_world_size", return_value=1):
        spec = _layer_spec(c, False, None)
    for module in (spec.layer_specs[0].submodules.input_layernorm, spec.layer_norm):
        norm = build_module(module, config=c, hidden_size=c.hidden_size, eps=c.layernorm_epsilon)
        assert isinstance(norm, torch.nn.LayerNorm) and norm.bias is not None and norm.eps == c.layernorm_epsilon


def test_fine_grained_offloading_is_said_not_silently_dropped_on_cpu():
    """The CPU runner has no Transformer Engine: a trial of a layout with --offload-modules runs without it and its
    notes say so (on a GPU with TE the config carries the modules)."""
    import torch

    from autotune.runner.build import transformer_config

    plan = plan_trial(cpu_spec(Layout(world=1, micro_batch_size=1, offload_modules=("core_attn",))), 1)
    notes: list[str] = []
    config, _ = transformer_config(plan, False, torch.float32, notes)
    assert not config.fine_grained_activation_offloading
    assert any("no fine-grained activation offloading of core_attn" in n for n in notes)
