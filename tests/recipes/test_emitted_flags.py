"""Every command-line flag autotune emits exists in Megatron-LM's or slime's argument parser, with a value it accepts.

megatron_flags.txt is the parser's option strings at the audited commits (Megatron-LM 1dcf0daf, megatron-core
0.16.0rc0, which the seed recipes ran, and slime a897e1f, whose Dockerfile pins that Megatron-LM commit); regenerate
it with make_megatron_flags.py. slime parses with parse_known_args, so a flag neither parser knows is dropped
without a word: a misspelt or renamed flag would silently not apply. The outputs are built through autotune's own
functions (the slime run block with slime's MODEL_ARGS spliced in, `export --format megatron`, the layout's and the
precision's flags) over layouts that turn every setting on.

The last tests hold combinations Megatron-LM's validate_args (megatron/training/arguments.py), TransformerConfig's
__post_init__ (megatron/core/transformer/transformer_config.py) or the micro-batch calculator reject at 1dcf0daf
(line numbers at that commit): autotune's rules refuse the layout, or its outputs carry the flags that make it run.
"""

from __future__ import annotations

import shlex
from functools import lru_cache
from pathlib import Path

import pytest

from autotune.catalog import PRECISIONS, ClusterSpec, Workload, load_model
from autotune.layout import Layout, format_args, layout_args
from autotune.layout.args import precision_switches
from autotune.layout.core import Recompute
from autotune.layout.rules import violations
from autotune.launch import build_run_block, loss_mask_for, slime_model_args
from autotune.recipes.emit import recipe_from_candidate
from autotune.recipes.checks import check_recipe
from autotune.recipes.convert import layout_of, run_layout
from autotune.recipes.export import megatron_args

FLAGS_FILE = Path(__file__).with_name("megatron_flags.txt")

# Flags autotune emits that neither parser defines. Keep this short: each entry needs a reason.
ALLOWED = {
    # the seed recipes' switch to the launcher (`python3 -m <slime entry module> --async`): slime's parser does not
    # define it and its parse_known_args drops it; whatever reads it is the entry module, not slime or Megatron
    "--async": "entry-module switch of the seed's launcher",
    # added to Megatron-LM 1dcf0daf by slime's docker/patch/latest/megatron.patch (not upstream at 1dcf0daf nor at
    # Megatron-LM's HEAD, where the gate is --attention-output-gate, which autotune emits too)
    "--use-gated-attention": "slime's Megatron-LM patch",
}

# Values Megatron-LM 1dcf0daf accepts for the enumerated flags autotune emits (multi-word flags: each word).
CHOICES = {
    "--cuda-graph-impl": {"none", "local", "transformer_engine"},  # transformer_config.py:788
    # arguments.py:1453 type=CudaGraphScope[scope] (core/transformer/enums.py:70) or "full"
    "--cuda-graph-scope": {"full", "full_iteration", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"},
    "--recompute-granularity": {"full", "selective"},  # transformer_config.py:388
    "--recompute-method": {"uniform", "block"},  # transformer_config.py:399
    # transformer_config.py:1224 allowed_modules
    "--recompute-modules": {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"},
    "--moe-token-dispatcher-type": {"allgather", "alltoall", "flex"},  # transformer_config.py:687
    "--moe-flex-dispatcher-backend": {"deepep", "hybridep"},  # transformer_config.py:694
    "--fp8-format": {"e4m3", "hybrid"},  # transformer_config.py:434
    "--fp8-recipe": {"tensorwise", "delayed", "mxfp8", "blockwise", "custom"},  # transformer_config.py:441
    "--fp4-format": {"e2m1"},  # transformer_config.py:515
    "--fp4-recipe": {"nvfp4", "custom"},  # transformer_config.py:521
    "--cross-entropy-fusion-impl": {"native", "te", "linear"},  # model_parallel_config.py:249
    "--data-parallel-sharding-strategy": {"no_shard", "optim", "optim_grads", "optim_grads_params"},  # arguments.py:2340
    "--softmax-type": {"vanilla", "off-by-one", "learnable"},  # arguments.py choices (TransformerConfig.softmax_type)
    "--rope-type": {"rope", "yarn"},  # arguments.py:2074-2075
}
MULTI = {"--cuda-graph-scope", "--recompute-modules"}  # nargs='+'
INTS = {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--num-virtual-stages-per-pipeline-rank",
        "--context-parallel-size", "--expert-model-parallel-size", "--expert-tensor-parallel-size",
        "--recompute-num-layers", "--micro-batch-size", "--max-tokens-per-gpu", "--cpu-offloading-num-layers",
        "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--global-batch-size",
        "--seq-length", "--train-iters", "--distributed-timeout-minutes"}
FLOATS = {"--optimizer-offload-fraction", "--moe-expert-capacity-factor", "--lr", "--min-lr", "--weight-decay",
          "--glu-linear-offset", "--activation-func-clamp-value", "--rope-scaling-factor", "--rotary-scaling-factor",
          "--mscale", "--mscale-all-dim"}
# Megatron's tuple_type ("127,0") and its layer-frequency type (an int, or a Python list expression of 0/1 per layer)
TUPLES = {"--window-size"}
FREQS = {"--window-attn-skip-freq", "--linear-attention-freq", "--moe-layer-freq"}

_STACK = {"framework": "x", "megatron_lm": "x", "pytorch": "x", "python": "x", "network": "x"}


@lru_cache(maxsize=None)
def known_flags() -> frozenset[str]:
    return frozenset(line.strip() for line in FLAGS_FILE.read_text().splitlines()
                     if line.strip() and not line.startswith("#"))


def _rc(text: str) -> Recompute:
    return Recompute.parse(text)


# (model, gpu, count, Layout fields, Workload fields): every setting autotune can emit, on dense, MoE, MLA,
# Gated DeltaNet, hybrid Mamba, learned-position and MoE-bias models.
CASES = [
    ("Qwen3.5-122B-A10B", "H200", 32, dict(tp=1, pp=4, ep=8, recompute=_rc("full:uniform:2"), max_tokens_per_gpu=8192),
     dict()),
    ("Qwen3.5-122B-A10B", "H200", 32, dict(tp=2, pp=4, vpp=4, ep=8, recompute=_rc("selective:layernorm,moe_act"),
                                           dispatcher="hybridep", precision_aware_optimizer=True,
                                           optimizer_offload=0.5, ep_overlap=True, tp_comm_overlap=True,
                                           max_tokens_per_gpu=8192), dict()),
    ("Qwen3.5-122B-A10B", "H200", 32, dict(tp=1, pp=4, ep=8, dispatcher="flex", moe_shared_expert_overlap=False,
                                           recompute=_rc("selective:layernorm,moe"), micro_batch_size=1),
     dict(load_balancing_loss=True, grads_fp32=False)),
    ("Qwen3-30B-A3B", "B200", 16, dict(tp=2, pp=2, vpp=2, ep=4, cuda_graphs="attn", max_tokens_per_gpu=8192),
     dict(precision="mxfp8")),
    ("Qwen3-30B-A3B", "B200", 16, dict(tp=2, pp=2, vpp=2, ep=4, cuda_graphs="router", dispatcher="allgather",
                                       moe_capacity_factor=1.0, max_tokens_per_gpu=8192), dict(precision="nvfp4")),
    ("Qwen3-30B-A3B", "B200", 16, dict(tp=2, pp=2, vpp=2, ep=4, cuda_graphs="full", moe_capacity_factor=1.25,
                                       micro_batch_size=1), dict(precision="fp8-blockwise")),
    ("Qwen3-30B-A3B", "B200", 16, dict(tp=2, ep=4, activation_offload_layers=2, max_tokens_per_gpu=8192),
     dict(precision="fp8-tensorwise", fp8_param_gather=True)),
    ("Qwen3-30B-A3B", "B200", 16, dict(tp=1, pp=2, ep=4, fsdp=True, max_tokens_per_gpu=8192), dict()),
    ("Qwen3-30B-A3B", "B200", 16, dict(tp=2, pp=2, ep=4, offload_modules=("core_attn", "attn_proj", "expert_fc1"),
                                       max_tokens_per_gpu=8192), dict(precision="mxfp8")),
    ("DeepSeek-V3", "GB200", 256, dict(tp=4, pp=8, ep=8, recompute=_rc("selective:mla_up_proj"), dispatcher="flex",
                                       layer_split=(7, 8, 8, 8, 8, 8, 8, 6), max_tokens_per_gpu=16384),
     dict(precision="fp8-delayed", fp8_param_gather=True)),
    ("DeepSeek-V3", "GB200", 256, dict(tp=4, pp=8, ep=8, recompute=_rc("full:block:2"), micro_batch_size=1),
     dict(precision="fp8-blockwise")),
    ("Llama-3.1-70B", "H100", 32, dict(tp=4, pp=4, vpp=4, cp=2, precision_aware_optimizer=True, optimizer_offload=0.5,
                                       tp_comm_overlap=True, max_tokens_per_gpu=4096), dict()),
    ("Llama-3.1-8B", "H100", 16, dict(tp=2, pp=2, recompute=_rc("selective:core_attn,mlp"), cuda_graphs="attn",
                                      distributed_optimizer=False, cross_entropy_fusion=False, micro_batch_size=2),
     dict(precision="fp8-tensorwise")),
    # 126 layers over PP 4 x VPP 2: the first/last-stage flags, or the balanced --pipeline-model-parallel-layout split
    ("Llama-3.1-405B", "H100", 128, dict(tp=8, pp=4, vpp=2, layer_split=(16, 16, 16, 16, 16, 16, 15, 15),
                                         micro_batch_size=1), dict()),
    ("Llama-3.1-405B", "H100", 128, dict(tp=8, pp=4, layer_split=(30, 32, 32, 32), micro_batch_size=1), dict()),
    ("Llama-3.1-405B", "H100", 128, dict(tp=8, pp=4, layer_split=(31, 32, 32, 31), micro_batch_size=1), dict()),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B", "H100", 16, dict(tp=2, ep=8, max_tokens_per_gpu=8192), dict()),
    ("Megatron-GPT-7.1B", "H100", 16, dict(tp=2, pp=2, max_tokens_per_gpu=4096), dict(seq_len=4096)),
    ("gpt-oss-20b", "H100", 16, dict(tp=2, ep=8, dispatcher="alltoall", max_tokens_per_gpu=8192), dict()),
]


def _run_tokens(run: str, model_args: list[str]) -> list[str]:
    """The launcher's words with MODEL_ARGS spliced in (exports and comments dropped)."""
    lines = [ln for ln in run.replace("\\\n", " ").splitlines() if ln.strip() and not ln.lstrip().startswith(("export ", "#"))]
    words = shlex.split(" ".join(lines))
    i = words.index("${MODEL_ARGS[@]}")
    return words[:i] + model_args + words[i + 1:]


def _megatron_tokens(text: str) -> list[str]:
    """The words of `export --format megatron`'s MEGATRON_ARGS=( ... ) array."""
    body = text.split("MEGATRON_ARGS=(", 1)[1].rsplit(")", 1)[0]
    return shlex.split(body, comments=True)


def _build(model: str, gpu: str, count: int, lay: dict, wl: dict):
    m, c = load_model(model), ClusterSpec.of(gpu, count)
    return m, c, Layout(world=count, **lay), Workload(**wl)


@lru_cache(maxsize=None)
def emitted() -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """(case, output, words) for every output of every case."""
    out = []
    for model, gpu, count, lay, wl in CASES:
        m, c, layout, work = _build(model, gpu, count, lay, wl)
        name = f"{model}/{gpu}x{count} {layout.label(m.is_moe)}"
        margs = slime_model_args(m, aux_loss_coeff=0.001 if work.load_balancing_loss else 0.0)
        run = build_run_block(layout, work, c, loss_mask=loss_mask_for(m.name), moe=m.is_moe)
        out.append((name, "slime run block", tuple(_run_tokens(run, margs))))
        recipe = recipe_from_candidate(m, c, layout, work, status="predicted", tokens_per_s_per_gpu=1000.0,
                                       step_time_cv_percent=None, gpu_hours=None, window=(5, 19), steps_per_run=20,
                                       stack=_STACK, measured="2026-01-01")
        out.append((name, "export --format megatron", tuple(_megatron_tokens(megatron_args(recipe, "x")))))
        for style in ("slime", "megatron"):
            out.append((name, f"layout_args {style}",
                        tuple(format_args(layout_args(layout, style, work.seq_len, moe=m.is_moe)))))
    for p in (*PRECISIONS, "fp8", "fp4", "fp16"):
        for gather in (False, True):
            out.append((p, "precision_switches", tuple(format_args(precision_switches(p, gather)))))
    return tuple(out)


def _flag_values(words: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """(flag, the words after it up to the next flag)."""
    out: list[tuple[str, list[str]]] = []
    for w in words:
        if w.startswith("--"):
            out.append((w, []))
        elif out:
            out[-1][1].append(w)
    return out


def test_flags_file_is_a_parser_listing():
    text = FLAGS_FILE.read_text()
    assert "NVIDIA/Megatron-LM 1dcf0daf" in text and "THUDM/slime a897e1f" in text
    flags = known_flags()
    assert len(flags) > 500 and all(f.startswith("--") for f in flags)
    assert {"--tensor-model-parallel-size", "--actor-num-nodes", "--debug-train-only"} <= flags


def test_every_emitted_flag_is_in_megatron_or_slime():
    known = known_flags()
    unknown: dict[str, str] = {}
    for case, output, words in emitted():
        for w in words:
            if w.startswith("--") and w not in known and w not in ALLOWED:
                unknown.setdefault(w, f"{output} of {case}")
    assert not unknown, "flags neither Megatron-LM nor slime defines (slime would drop them silently): " + \
        "; ".join(f"{f} ({where})" for f, where in sorted(unknown.items()))


def test_the_allow_list_is_needed():
    """Each allowed flag is emitted and really unknown to the parsers (else it belongs nowhere or in the txt)."""
    seen = {w for _, _, words in emitted() for w in words}
    for flag in ALLOWED:
        assert flag in seen, f"{flag} is no longer emitted: drop it from ALLOWED"
        assert flag not in known_flags(), f"{flag} is in megatron_flags.txt: drop it from ALLOWED"


def _parses(flag: str, value: str) -> bool:
    """As Megatron-LM 1dcf0daf reads it: tuple_type's comma-separated ints, or a layer frequency (an int, or a list
    expression of 0 / 1 it evaluates)."""
    try:
        if flag in TUPLES:
            return len(tuple(int(x) for x in value.split(","))) == 2
        if value.isdigit():
            return int(value) > 0
        got = eval(value, {"__builtins__": {}})  # noqa: S307 (what Megatron's parser does with the string)
        return isinstance(got, list) and set(got) <= {0, 1}
    except (ValueError, SyntaxError, TypeError, NameError):
        return False


def test_emitted_values_are_ones_the_parser_accepts():
    bad: dict[str, str] = {}
    for case, output, words in emitted():
        for flag, values in _flag_values(words):
            if flag in CHOICES:
                if not values or (len(values) > 1 and flag not in MULTI) or any(v not in CHOICES[flag] for v in values):
                    bad.setdefault(f"{flag} {' '.join(map(shlex.quote, values))}", f"{output} of {case}")
            elif flag in INTS | FLOATS:
                try:
                    ok = len(values) == 1 and (int(values[0]) if flag in INTS else float(values[0])) is not None
                except ValueError:
                    ok = False
                if not ok:
                    bad.setdefault(f"{flag} {' '.join(values)}", f"{output} of {case}")
            elif flag in TUPLES | FREQS:
                if len(values) != 1 or not _parses(flag, values[0]):
                    bad.setdefault(f"{flag} {' '.join(values)}", f"{output} of {case}")
    assert not bad, "values Megatron-LM 1dcf0daf's parser refuses: " + \
        "; ".join(f"{v} ({where})" for v, where in sorted(bad.items()))


# --- combinations autotune accepts and Megatron-LM 1dcf0daf refuses -------------------------------------------------

def _accepted(model, gpu, count, lay, wl):
    m, c, layout, work = _build(model, gpu, count, lay, wl)
    assert violations(m, work, layout) == [], "autotune's rules refuse this layout: the combination cannot be emitted"
    margs = slime_model_args(m)
    run = build_run_block(layout, work, c, loss_mask=loss_mask_for(m.name), moe=m.is_moe)
    recipe = recipe_from_candidate(m, c, layout, work, status="predicted", tokens_per_s_per_gpu=1000.0,
                                   step_time_cv_percent=None, gpu_hours=None, window=(5, 19), steps_per_run=20,
                                   stack=_STACK, measured="2026-01-01")
    return run, _run_tokens(run, margs), _megatron_tokens(megatron_args(recipe, "x")) + margs


def _recipe(model, gpu, count, lay, wl):
    m, c, layout, work = _build(model, gpu, count, lay, wl)
    return layout, recipe_from_candidate(m, c, layout, work, status="predicted", tokens_per_s_per_gpu=1000.0,
                                         step_time_cv_percent=None, gpu_hours=None, window=(5, 19), steps_per_run=20,
                                         stack=_STACK, measured="2026-01-01")


def _values(words, flag):
    return dict(_flag_values(tuple(words))).get(flag)


def test_vpp_is_not_set_beside_a_pipeline_layout():
    """arguments.py:502-506: at most one of --num-layers-per-virtual-pipeline-stage,
    --num-virtual-stages-per-pipeline-rank, --pipeline-model-parallel-layout (the layout string already says VPP)."""
    _, run, meg = _accepted("Llama-3.1-405B", "H100", 128, dict(tp=8, pp=4, vpp=2, micro_batch_size=1,
                            layer_split=(16, 16, 16, 16, 16, 16, 15, 15)), dict())
    for words in (run, meg):
        assert "--pipeline-model-parallel-layout" in words
        assert "--num-virtual-stages-per-pipeline-rank" not in words
    # the recipe still reads back: its run block's layout string says VPP 2, and the checks find nothing
    layout, recipe = _recipe("Llama-3.1-405B", "H100", 128, dict(tp=8, pp=4, vpp=2, micro_batch_size=1,
                             layer_split=(16, 16, 16, 16, 16, 16, 15, 15)), dict())
    assert run_layout(recipe) == layout and layout_of(recipe).vpp == 2 and check_recipe(recipe) == []


def test_full_iteration_graphs_turn_off_the_nan_check():
    """arguments.py:724-727: --cuda-graph-impl local with full_iteration needs --no-check-for-nan-in-loss-and-grad."""
    _, run, meg = _accepted("Qwen3-30B-A3B", "B200", 16, dict(tp=2, pp=2, vpp=2, ep=4, cuda_graphs="full",
                            moe_capacity_factor=1.0, max_tokens_per_gpu=8192), dict())
    for words in (run, meg):
        assert "full_iteration" in words and "--no-check-for-nan-in-loss-and-grad" in words


def test_megatron_fsdp_gets_its_checkpoint_format_and_connections():
    """arguments.py:686-690: Megatron FSDP needs CUDA_DEVICE_MAX_CONNECTIONS != 1 and --ckpt-format fsdp_dtensor."""
    text, run, meg = _accepted("Qwen3-30B-A3B", "B200", 16, dict(tp=1, pp=2, ep=4, fsdp=True,
                               max_tokens_per_gpu=8192), dict())
    for words in (run, meg):
        assert "--use-megatron-fsdp" in words and _values(words, "--ckpt-format") == ["fsdp_dtensor"]
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1\n" not in text
    layout, recipe = _recipe("Qwen3-30B-A3B", "B200", 16, dict(tp=1, pp=2, ep=4, fsdp=True, max_tokens_per_gpu=8192),
                             dict())
    assert recipe.env["CUDA_DEVICE_MAX_CONNECTIONS"] != "1" and check_recipe(recipe) == []  # env agrees with run
    assert run_layout(recipe) == layout
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in megatron_args(recipe, "x").split("MEGATRON_ARGS=(")[0]  # said up front
    _, plain = _recipe("Qwen3-30B-A3B", "H100", 16, dict(tp=1, pp=2, ep=4, max_tokens_per_gpu=8192), dict())
    assert plain.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and "--ckpt-format" not in plain.run  # the seed's


def test_ep_overlap_and_blackwell_run_on_more_than_one_cuda_connection():
    """arguments.py: --overlap-moe-expert-parallel-comm "requires setting a larger CUDA_DEVICE_MAX_CONNECTIONS", and
    the one-connection requirement of TP and CP "no longer exists since the Blackwell architecture". The recipes
    that run the overlap set 32 (Megatron-LM's moe_recipes, TP2 on H100 included), as every Megatron-Bridge perf
    recipe on Blackwell does. The seed's 1 stays on Hopper where nothing overlaps on streams of its own."""
    lay = dict(tp=1, pp=1, ep=4, ep_overlap=True, max_tokens_per_gpu=8192)
    text, run, meg = _accepted("Qwen3-30B-A3B", "H100", 16, lay, dict())
    assert "--overlap-moe-expert-parallel-comm" in run and "export CUDA_DEVICE_MAX_CONNECTIONS=32\n" in text
    layout, recipe = _recipe("Qwen3-30B-A3B", "H100", 16, lay, dict())
    assert recipe.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "32" and check_recipe(recipe) == []
    assert "CUDA_DEVICE_MAX_CONNECTIONS=32" in megatron_args(recipe, "x").split("MEGATRON_ARGS=(")[0]  # said up front
    bare = recipe.model_copy(update={"env": {}})  # a recipe whose env names none: what its layout runs on
    assert "CUDA_DEVICE_MAX_CONNECTIONS=32" in megatron_args(bare, "x").split("MEGATRON_ARGS=(")[0]
    _, both = _recipe("Qwen3-30B-A3B", "H100", 16, {**lay, "fsdp": True}, dict())
    assert both.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"  # above 1: FSDP's assertion holds too
    tp2 = dict(tp=2, pp=1, ep=4, max_tokens_per_gpu=8192)
    _, hopper = _recipe("Qwen3-30B-A3B", "H100", 16, tp2, dict())
    _, blackwell = _recipe("Qwen3-30B-A3B", "B200", 16, tp2, dict())
    assert hopper.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and blackwell.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    assert check_recipe(blackwell) == [] and "export CUDA_DEVICE_MAX_CONNECTIONS=32" in blackwell.run
    # a recipe whose env names none is exported with the run block's value for its layout and GPU: FSDP gets 8 on
    # Hopper, 32 on Blackwell
    for gpu, want in (("H100", "8"), ("B200", "32")):
        _, fsdp = _recipe("Qwen3-30B-A3B", gpu, 16, {**tp2, "fsdp": True}, dict())
        assert f"sets {want});" in megatron_args(fsdp.model_copy(update={"env": {}}), "x"), gpu


def test_optimizer_offload_comes_with_the_precision_aware_optimizer():
    """arguments.py:1188-1192: --optimizer-cpu-offload asserts --use-precision-aware-optimizer."""
    m, _, layout, work = _build("Llama-3.1-70B", "H100", 32, dict(tp=4, pp=4, optimizer_offload=0.5,
                                max_tokens_per_gpu=8192), dict())
    if violations(m, work, layout):
        return  # refused up front: fine
    words = format_args(layout_args(layout, "megatron", work.seq_len))
    assert "--use-precision-aware-optimizer" in words


def test_fp8_param_gather_with_offload_is_delayed_scaling_only():
    """arguments.py:1193-1196: with --optimizer-cpu-offload, --fp8-param-gather needs --fp8-recipe delayed."""
    m, _, layout, work = _build("Llama-3.1-70B", "H100", 32, dict(tp=4, pp=4, optimizer_offload=0.5,
                                precision_aware_optimizer=True, max_tokens_per_gpu=8192),
                                dict(precision="fp8-tensorwise", fp8_param_gather=True))
    assert violations(m, work, layout), "autotune accepts FP8 param gather + optimizer offload on a non-delayed recipe"


@pytest.mark.parametrize("lay, why", [
    # transformer_config.py:1777-1780 'moe cuda graph is only supported for MoE'
    (dict(tp=2, pp=2, cuda_graphs="router"), "moe_router scope on a dense model"),
    # transformer_config.py:1805-1808 'full recompute is only supported with full iteration CUDA graph'
    (dict(tp=2, pp=2, cuda_graphs="attn", recompute=_rc("full:uniform:1")), "full recompute beside attn graphs"),
])
def test_dense_cuda_graph_combinations_megatron_refuses(lay, why):
    m, _, layout, work = _build("Llama-3.1-8B", "H100", 16, dict(lay, max_tokens_per_gpu=8192), dict())
    assert violations(m, work, layout), f"autotune accepts {why}, which megatron-core's TransformerConfig refuses"


@pytest.mark.parametrize("lay, why", [
    # transformer_config.py:1813-1819 'moe recompute is not supported with moe_router CUDA graph' (TE impl)
    (dict(cuda_graphs="router", recompute=_rc("selective:layernorm,moe")), "moe recompute beside router graphs"),
    # transformer_config.py:1805-1808
    (dict(cuda_graphs="router", recompute=_rc("full:uniform:1")), "full recompute beside router graphs"),
])
def test_moe_cuda_graph_combinations_megatron_refuses(lay, why):
    m, _, layout, work = _build("Qwen3-30B-A3B", "B200", 16, dict(tp=2, pp=2, vpp=2, ep=4, max_tokens_per_gpu=8192,
                                **lay), dict())
    assert violations(m, work, layout), f"autotune accepts {why}, which megatron-core's TransformerConfig refuses"


def test_moe_biases_need_etp_1():
    """transformer_config.py:1614-1617: MoE with add_bias_linear asserts expert_tensor_parallel_size == 1. For gpt-oss
    MODEL_ARGS say --add-qkv-bias without --disable-bias-linear, so every linear (the experts too) has a bias."""
    m, _, layout, work = _build("gpt-oss-20b", "H100", 16, dict(tp=2, pp=2, etp=2, max_tokens_per_gpu=8192), dict())
    assert "--disable-bias-linear" not in slime_model_args(m)
    assert violations(m, work, layout), "autotune accepts ETP 2 on an MoE model with biases"


def test_exported_micro_batch_divides_the_global_batch():
    """num_microbatches_calculator.py:340: global batch % (micro-batch size x DP) == 0. A dynamic-batching layout
    exports --micro-batch-size = the rows its max_tokens_per_gpu packs, or the largest micro-batch below that divides
    a DP rank's rows; the rules refuse a cap holding more rows than a DP rank gets, naming the value to use."""
    m, _, layout, work = _build("DeepSeek-V3", "GB200", 256, dict(tp=2, ep=16, max_tokens_per_gpu=16384), dict())
    assert [v.code for v in violations(m, work, layout)] == ["tokens_within_rows"]  # 2 rows; DP 128 gets 1 each
    assert "use at most 8,192" in violations(m, work, layout)[0].message
    _, _, meg = _accepted("DeepSeek-V3", "GB200", 256, dict(tp=2, ep=16, max_tokens_per_gpu=8192), dict())
    _, _, meg2 = _accepted("DeepSeek-V3", "GB200", 256, dict(tp=8, ep=16, max_tokens_per_gpu=16384), dict())
    for words, dp in ((meg, 128), (meg2, 32)):
        mbs, gb = int(_values(words, "--micro-batch-size")[0]), int(_values(words, "--global-batch-size")[0])
        assert gb % (mbs * dp) == 0, f"--micro-batch-size {mbs} x DP {dp} does not divide --global-batch-size {gb}"
    assert int(_values(meg2, "--micro-batch-size")[0]) == 2
    # a cap of 3 rows over a DP rank's 8 (slime packs 3, 3, 2): the export takes the largest divisor, 2
    _, _, meg3 = _accepted("Qwen3-30B-A3B", "H100", 16, dict(ep=8, max_tokens_per_gpu=24576), dict())
    mbs, gb = int(_values(meg3, "--micro-batch-size")[0]), int(_values(meg3, "--global-batch-size")[0])
    assert mbs == 2 and gb % (mbs * 16) == 0


def test_dense_models_get_no_moe_flags():
    """A dense model has no token dispatcher: no --moe-* flag in its run block or export, none in its summary."""
    m, c, layout, work = _build("Llama-3.1-70B", "H100", 32, dict(tp=4, pp=4, max_tokens_per_gpu=8192), dict())
    run, run_words, meg = _accepted("Llama-3.1-70B", "H100", 32, dict(tp=4, pp=4, max_tokens_per_gpu=8192), dict())
    for words in (run_words, meg, format_args(layout_args(layout, "megatron", work.seq_len, moe=False))):
        assert not [w for w in words if w.startswith("--moe-")], words
    recipe = recipe_from_candidate(m, c, layout, work, status="predicted", tokens_per_s_per_gpu=1000.0,
                                   step_time_cv_percent=None, gpu_hours=None, window=(5, 19), steps_per_run=20,
                                   stack=_STACK, measured="2026-01-01")
    assert "dispatcher" not in recipe.layout.summary and "load-balancing" not in recipe.layout.summary
    moe = format_args(layout_args(Layout(world=16, ep=8), "megatron", moe=True))
    assert moe[moe.index("--moe-token-dispatcher-type") + 1] == "alltoall"  # megatron-core's default is allgather
