"""gpt-oss as Megatron-LM 1dcf0daf (slime's pin) builds it from MODEL_ARGS, and what its recipes must add.

The model is Megatron-Bridge's gpt_oss provider: quick-GELU GLU with the linear half offset by 1 and both halves
clamped (swiglu_limit 7), learnable softmax (attention sinks), sliding-window layers (HF's window of 128 counts the
query, Megatron's left window 127 does not) alternating with full ones, sliding first. Its YaRN rope scaling has no
flag at that commit, so the recipe says so in its notes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.catalog.model import FULL, SLIDING
from autotune.launch import mlp_activation, model_notes, slime_model_args
from autotune.layout import Layout
from autotune.recipes.emit import recipe_from_candidate

FLAGS = {ln.strip() for ln in Path(__file__).with_name("megatron_flags.txt").read_text().splitlines()
         if ln.strip() and not ln.startswith("#")}
_STACK = {"framework": "x", "megatron_lm": "x", "pytorch": "x", "python": "x", "network": "x"}


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("name, layers", [("gpt-oss-120b", 36), ("gpt-oss-20b", 24)])
def test_gpt_oss_model_args_are_the_bridge_model(name, layers):
    args = slime_model_args(load_model(name))
    assert "--swiglu" not in args and "--quick-geglu" in args
    assert _value(args, "--glu-linear-offset") == "1" and _value(args, "--activation-func-clamp-value") == "7"
    assert _value(args, "--softmax-type") == "learnable"
    assert _value(args, "--window-size") == "127,0"
    assert _value(args, "--window-attn-skip-freq") == "2"  # layer 1 sliding, layer 2 full, ...
    assert _value(args, "--num-layers") == str(layers)
    assert _value(args, "--position-embedding-type") == "rope"  # YaRN has no flag here: see the recipe's note
    unknown = [a for a in args if a.startswith("--") and a not in FLAGS]
    assert not unknown, f"not in Megatron-LM 1dcf0daf's or slime's parser: {unknown}"


def test_the_activation_is_decided_once_from_the_model():
    oss = load_model("gpt-oss-20b")
    assert mlp_activation(oss) == ("quick_geglu", 1.0, 7.0)
    assert mlp_activation(load_model("Qwen3-30B-A3B")) == ("swiglu", 0.0, 0.0)
    assert mlp_activation(load_model("Nemotron-4-340B")) == ("squared_relu", 0.0, 0.0)
    assert mlp_activation(load_model("NeMo-GPT3-175B")) == ("gelu", 0.0, 0.0)
    no_clamp = dataclasses.replace(oss, moe=dataclasses.replace(oss.moe, activation_clamp=0.0))
    args = slime_model_args(no_clamp)
    assert "--quick-geglu" in args and "--activation-func-clamp-value" not in args


def _skip_freq_layers(value: str, n: int) -> list[int]:
    """Which layers Megatron makes sliding for a --window-attn-skip-freq value (transformer/utils.py
    is_layer_window_attention: an int N leaves every N-th layer full; a list says 1 for each sliding layer)."""
    if value.isdigit():
        return [int((i + 1) % int(value) != 0) for i in range(n)]
    got = eval(value, {"__builtins__": {}})  # noqa: S307 (as Megatron's parser evaluates it)
    assert len(got) == n
    return got


@pytest.mark.parametrize("types, expected", [
    ((SLIDING, FULL) * 12, "2"),
    ((SLIDING, SLIDING, SLIDING, FULL) * 6, "4"),
    ((SLIDING,) * 24, "[1]*24"),
    ((FULL, SLIDING) * 12, "+".join(["[0]*1+[1]*1"] * 12)),  # full first: no N says it
    ((SLIDING,) * 3 + (FULL,) * 2 + (SLIDING,) * 19, "[1]*3+[0]*2+[1]*19"),
])
def test_a_sliding_pattern_is_an_int_only_when_every_nth_layer_is_full(types, expected):
    model = dataclasses.replace(load_model("gpt-oss-20b"), layer_types=types)
    value = _value(slime_model_args(model), "--window-attn-skip-freq")
    assert value == expected
    assert _skip_freq_layers(value, 24) == [int(t == SLIDING) for t in types]


def test_models_without_sliding_layers_or_sinks_get_none_of_the_flags():
    for name in ("Qwen3.5-122B-A10B", "Llama-3.1-8B", "DeepSeek-V3", "Mixtral-8x7B-v0.1"):
        args = slime_model_args(load_model(name))
        assert not {"--quick-geglu", "--glu-linear-offset", "--activation-func-clamp-value", "--softmax-type",
                    "--window-size", "--window-attn-skip-freq"} & set(args), name


def _recipe(name: str, notes: list[str] | None = None):
    model = load_model(name)
    return recipe_from_candidate(model, ClusterSpec.of("H100", 16), Layout(world=16, ep=8, max_tokens_per_gpu=8192),
                                 Workload(), status="predicted", tokens_per_s_per_gpu=1000.0, step_time_cv_percent=None,
                                 gpu_hours=None, window=(5, 19), steps_per_run=20, stack=_STACK, measured="2026-01-01",
                                 notes=notes)


@pytest.mark.parametrize("name", ["gpt-oss-120b", "gpt-oss-20b"])
def test_gpt_oss_recipes_say_that_yarn_is_not_on_the_command_line(name):
    (note,) = model_notes(load_model(name))
    assert "YaRN rope scaling (factor 32 from 4096 positions)" in note and "1dcf0daf" in note
    assert "yarn_*" in note and "plain RoPE" in note
    assert _recipe(name).notes == [note]
    assert _recipe(name, ["why: a guess"]).notes == ["why: a guess", note]  # the caller's notes first


def test_no_rope_note_where_the_command_line_says_it_all():
    for name in ("Qwen3.5-122B-A10B", "DeepSeek-V3", "Llama-3.1-8B"):  # DeepSeek-V3: YaRN on MLA is settable
        assert model_notes(load_model(name)) == [], name
    assert _recipe("Qwen3.5-122B-A10B").notes is None
