"""Mapping rows of the public throughput table (data/published_throughput.csv) onto the catalog.

One function, `map_row`, turns a CSV row into the keyword arguments of a Layout and a Measurement, or
returns the one-line reason the cost model cannot represent it. The rules, and why:
  - model names: the sources spell the same model many ways ('LLAMA3_70B', 'Llama3 70B', 'Llama 3.1 70B');
    anything not in the catalog is skipped. MTP training and LoRA fine-tuning are Workload settings
    (`training_of`): rows that say so, and the sources whose recipe trains MTP.
  - GPU: the kind before any parenthesis ('H100 (Grand Teton, ...)' -> H100); '(4 per node)' sets the
    node size; NVL72 kinds (GB200, GB300) are 4-GPU trays on one 72-GPU NVLink domain (the catalog's). A part
    the text says differs from the kind's catalog figures runs on its variant's (`gpu_variant`, catalog
    GPU_VARIANTS) under the kind's calibration: torchtitan's Grand Teton H100 "96GB HBM2e, 500W power limit"
    (2.4 TB/s HBM, peaks between H100 SXM's and NVL's, per the benchmark pages' Hardware section).
  - precision (`precision_of`): BF16; FP8 by its scaling recipe as the row names it. Ambiguous names are
    read as their source's default recipe and the reading is named in the provenance: Megatron-Bridge's
    plain "FP8" is its default current-scaling recipe (the 25.09 page says so, later pages call it FP8-CS);
    NeMo 24.07's and Megatron-LM examples/llama's plain "FP8" is delayed scaling (TE's default then, the
    scripts' --fp8-amax-history-len); torchtitan's Float8 tensorwise is per-tensor current scaling.
    "FP8 32x32 granularity (MX-style)" and FP8-MX are MXFP8; NVFP4 is Megatron-Bridge's bf16_with_nvfp4_mixed.
    FP8 rowwise (no TE recipe) and rows that name only "alternate granularity" are skipped with the reason.
  - layout: empty VP/CP/ETP mean 1 (Megatron's defaults); an empty EP on an MoE model, or an empty
    TP/PP/global batch/throughput, is a missing field. FSDP (alone or with TP/PP/EP) shards parameters,
    gradients and optimizer state over DP, the rest as its stack keeps them (_sources.py, _state.py).
  - layers that do not divide over PP x VPP (Llama 3.1 405B's 126, DeepSeek-V3's 61) get the first of
    `layout.core.legal_splits`: the embedding and loss counted as pipeline layers where that divides
    (Megatron-Bridge's Llama 3.1 405B recipes set both account-for flags), else full virtual stages with
    the last one short (the shape of Megatron-Bridge's DeepSeek-V3 pipeline layouts); the provenance
    names the split assumed.
  - settings the Layout cannot express and that move the step time a lot (async TP, EP communication
    overlap) skip the row rather than pretend.
  - throughput: tokens_per_s_per_gpu when given; else a per-GPU figure the table marks "derived" in the
    notes; else TFLOP/s/GPU converted with our FLOP count (the caller does it, and trusts it less).
  - settings a row leaves blank but its source's published recipe sets (`_PRESETS`) are taken from that
    recipe and named in the row's provenance, instead of assuming Megatron's defaults. What each source's stack
    keeps in memory (gradient dtype, FP8 parameter gather, optimizer state, the framework): _sources.py.
"""

from __future__ import annotations

import functools
import math
import re

from ..catalog import GPUS, load_model, model_names
from ..catalog.hardware import MAX_GPUS, VARIANT_KINDS
from ..catalog.workload import MAX_ROWS
from ..errors import BadInput
from ..layout import SELECTIVE_MODULES, Recompute
from ..layout.splits import layout_vpp, parse_pipeline_layout
from ._presets import row_settings
from ._sources import known_regression, source_settings, unpriced
from .flops import train_flops_per_token

__all__ = ["REQUIRED_COLUMNS", "map_row", "catalog_name", "gpu_kind", "gpu_variant", "precision_of",
           "train_flops_per_token"]

REQUIRED_COLUMNS = ("model", "gpu", "num_gpus", "seq_len", "global_batch", "micro_batch", "tp", "pp", "cp",
                    "vp", "ep", "etp", "precision", "recompute", "tokens_per_s_per_gpu", "tflops_per_gpu")

# normalised source name (lower case, runs of ' _-' as one space) -> catalog name
_NAMES = [
    # 'Llama 3.1' also as 'llama3_1' (the point spelt as a separator, as NeMo's config names write it)
    # Llama 3.3 70B is Llama 3.1 70B's network trained further (the same config.json: 80 layers, hidden 8,192)
    (r"^llama ?3(\.[13]| [13])?( style)? ?70b", "Llama-3.1-70B"),
    (r"^llama ?3(\.1| 1)? ?405b", "Llama-3.1-405B"),
    (r"^llama ?3(\.1| 1)? ?8b", "Llama-3.1-8B"),
    # KempnerForge's "Llama-3-style 7B (8.03B)": 8.03B is Llama 3 8B's count (8,030,261,248), read as that model
    (r"^llama 3 style 7b \(8\.03b\)", "Llama-3.1-8B"),
    # its "Llama-3-style 13B (14.84B)": KempnerForge's own M13B (no Llama 3 of that size), the catalog's Llama-3-Style-13B
    (r"^llama 3 style 13b", "Llama-3-Style-13B"),
    (r"^llama ?2 ?7b", "Llama-2-7b-hf"),
    (r"^llama ?2 ?13b", "Llama-2-13b-hf"),
    (r"^llama ?2 ?70b", "Llama-2-70b-hf"),
    # V3.1 and V3-0324 are V3's network; V3.2 adds a sparse-attention indexer (DSA) the catalog's V3 lacks
    (r"^deepseek ?v3(?! ?\.? ?2)", "DeepSeek-V3"),
    # DeepSeek-R1 is DeepSeek-V3's network trained further: the same config.json (DeepseekV3ForCausalLM, 61 layers,
    # hidden 7,168, 256 routed experts). Its "Distill" models are Qwen and Llama dense models: not read as V3
    (r"^deepseek ?r1(?! ?distill)(?!.*distill)", "DeepSeek-V3"),
    # Nemotron 3.5 Lightning: the network Megatron-Bridge's perf recipes train under that name (see the catalog README)
    (r"^(nvidia )?nemotron ?3 ?\.? ?5 ?lightning", "NVIDIA-Nemotron-3.5-Lightning-30B-A3B"),
    # Nemotron-H 56B (Megatron-Bridge's "NemotronH 56B", nemotronh_56b recipes): the base checkpoint's network
    (r"^nemotron ?h ?56b", "Nemotron-H-56B-Base-8K"),
    # DeepSeek-V4 Flash / Pro, and their -Base checkpoints (the same networks; Megatron-Bridge's page: "DeepSeekV4 Flash")
    (r"^deepseek ?v4 ?flash", "DeepSeek-V4-Flash"),
    (r"^deepseek ?v4 ?pro", "DeepSeek-V4-Pro"),
    # Kimi K2 (Base, Instruct, -0905, Thinking: one network, 1,026,408,232,448 parameters); K2.5 on adds a vision tower
    (r"^kimi ?k2(?! ?\.? ?[5-9])", "Kimi-K2-Instruct"),
    # GLM-4.6 and GLM-4.7 are GLM-4.5's network (358,337,791,296 tensors on the Hub for 4.5 and 4.7); GLM-4.7-Flash
    # (MLA), the V (vision) models and GLM-5 (sparse attention) are other networks
    (r"^glm ?4\.5 ?air", "GLM-4.5-Air"),
    (r"^glm ?4\.[567](?! ?(air|flash|v\b|v ))", "GLM-4.5"),
    (r"^qwen3 ?(moe )?30b", "Qwen3-30B-A3B"),
    (r"^qwen3 ?235b", "Qwen3-235B-A22B"),
    (r"^gpt ?oss ?120b", "gpt-oss-120b"),
    (r"^gpt ?oss ?20b", "gpt-oss-20b"),
    # NeMo's "LLAMA4-Scout-LLM" (the text model of Llama 4 Scout), torchtitan's "Llama4 Scout"
    (r"^llama ?4 ?scout", "Llama-4-Scout-17B-16E"),
    (r"^llama ?4 ?maverick", "Llama-4-Maverick-17B-128E"),
    (r"^mixtral ?8x7b", "Mixtral-8x7B-v0.1"),
    (r"^mixtral ?8x22b", "Mixtral-8x22B-v0.1"),
    (r"^qwen3 ?next", "Qwen3-Next-80B-A3B-Instruct"),
    (r"^qwen3\.5 ?122b", "Qwen3.5-122B-A10B"),
    (r"^nemotron ?v?3 nano", "NVIDIA-Nemotron-3-Nano-30B-A3B"),
    (r"^nemotron ?v?3 super", "NVIDIA-Nemotron-3-Super-120B-A12B"),
    (r"^nemotron ?v?3 ultra", "NVIDIA-Nemotron-3-Ultra-550B-A55B"),
    # NeMo 24.07's Nemotron-8B / -22B are NeMo's Nemotron3Config8B / 22B; Nemotron-340B and -15B are Nemotron-4's
    # (NeMo's later tables and config names write "Nemotron4 340B", "Nemotron4_15B")
    (r"^nemotron 8b", "Nemotron-3-8B"),
    (r"^nemotron 22b", "Nemotron-3-22B"),
    (r"^nemotron ?4? ?340b", "Nemotron-4-340B"),
    (r"^nemotron ?4? ?15b", "Nemotron-4-15B"),
    # NeMo's GPT3 configs (GPTConfig5B / 20B / 175B) and the Megatron-LM README's weak-scaling GPT models
    (r"^gpt3 5b", "NeMo-GPT3-5B"),
    (r"^gpt3 20b", "NeMo-GPT3-20B"),
    (r"^gpt3 175b", "NeMo-GPT3-175B"),
    *[(rf"^gpt {re.escape(size)}b \(dense\)", f"Megatron-GPT-{size}B")
      for size in ("1.7", "7.1", "16", "32", "70", "119", "177", "314", "462")],
]
# qualifiers read as a training setting (Workload fields), with how the row was read
_TRAINING = [
    # Megatron-Bridge's "[LoRA (fine-tuning)]" rows: the base frozen, adapters trained (its TFLOP/s column counts
    # forward + data-gradient FLOPs, 4 x N per token: no weight gradients, as Workload.lora models)
    (r"\blora\b", {"lora": True}, "LoRA fine-tuning: frozen base weights (the row's model says LoRA)"),
    (r"w/ mtp|with mtp|incl\. mtp", {"train_mtp": True}, "MTP layers trained (the row's model says so)"),
    (r"\bmtp 1\b", {"train_mtp": True}, "MTP layers trained (the row's notes say MTP 1)"),
]
# Megatron-Bridge's fine-tuning perf rows ("[SFT (fine-tuning)]", "[LoRA (fine-tuning)]") pack SQuAD examples into each
# row (its llama3 finetune perf configs: dataset.packed_sequence_specs.packed_sequence_size = seq_length; the finetune
# recipes' default dataset is SQuAD), and attention runs per example (THD, cu_seqlens). A SQuAD v1.1 example as the
# recipe prompts it (a context paragraph of ~120-140 words, the question, the answer) is ~200-250 Llama 3 tokens:
# read as 256 (at 4,096-token rows the attention left is then 1/16 of a whole row's; 128 or 512 move a Llama 3 70B
# prediction by under 1%, tests/cost/test_packed.py)
SQUAD_DOC_TOKENS = 256
_PACKED = [("Megatron-Bridge perf", r"fine tuning", SQUAD_DOC_TOKENS,
            "packed SQuAD fine-tuning rows: attention within each ~256-token example (Workload.packed_doc_len)")]
# (source prefix, catalog model) -> training settings the source's recipe sets that the row does not print.
# Megatron-Bridge's Nemotron 3 Super recipes (recipes/nemotronh/h100/nemotron_3_super.py, which the perf
# recipes build on; 067f987d) train the MTP block: mtp_num_layers=2 with mtp_use_repeated_layer (one block, run twice)
# Nemotron 3 Ultra's (recipes/nemotronh/h100/nemotron_3_ultra.py, mirror of 2026-08-22) do the same
_TRAINING_PRESETS = [
    ("Megatron-Bridge perf", "NVIDIA-Nemotron-3-Super-120B-A12B", {"train_mtp": True, "mtp_passes": 2},
     "MTP trained, the one MTP block run twice (Megatron-Bridge Super recipe: mtp_num_layers 2, repeated layer)"),
    ("Megatron-Bridge perf", "NVIDIA-Nemotron-3-Ultra-550B-A55B", {"train_mtp": True, "mtp_passes": 2},
     "MTP trained, the one MTP block run twice (Megatron-Bridge Ultra recipe: mtp_num_layers 2, repeated layer)"),
    ("Megatron-Bridge perf", "NVIDIA-Nemotron-3.5-Lightning-30B-A3B", {"train_mtp": True, "mtp_passes": 2},
     "MTP trained, the one MTP block run twice (Megatron-Bridge Lightning perf recipes: mtp_num_layers 2, repeated "
     "layer)"),
    # Qwen3-VL's perf recipes build on qwen3_vl_*_pretrain_mock_config, which freezes the language and vision models
    # and trains the vision projection alone (freeze_language_model=True, freeze_vision_model=True: recipes/qwen_vl/
    # qwen3_vl.py v0.4.2 to v0.5.1, recipes/qwen_vl/h100/qwen3_vl.py v0.6.0); no qwen3_vl perf config unfreezes them
    # (Qwen3.5-VL's do: _qwen35_vl_common). The projection's gradient crosses the whole language model: forward and
    # data gradient, no weight gradient, no gradients or optimizer state for its weights: Workload.lora's frozen base
    *[("Megatron-Bridge perf", vl, {"lora": True},
       "frozen language model, the vision projection trained (Megatron-Bridge's qwen3_vl pretrain mock config: "
       "freeze_language_model, freeze_vision_model)")
      for vl in ("Qwen3-VL-30B-A3B-Instruct", "Qwen3-VL-235B-A22B-Instruct")],
]


@functools.cache
def _moe(name: str) -> bool:
    """Whether the catalog model routes tokens to experts (its EP, dispatcher and routing columns mean something)."""
    return load_model(name).is_moe


_GPUS = ("H100", "H200", "H800", "B200", "B300", "GB200", "GB300")
_PLAIN_FP8 = (r"^((bf16|bfloat16) ?(\+|with|and) ?)?fp8( ?\(?(e4m3|hybrid e4m3/e5m2)\)?| e4m3)?( ?\(?per.tensor( scaling)?\)?)?"
              r"( mixed)?$")
# (pattern on the lower-cased precision text, pattern on the source or None, precision, how it was read)
_PRECISIONS = [
    (r"nvfp4|fp4", None, "nvfp4", "NVFP4 read as Megatron-Bridge's bf16_with_nvfp4_mixed (every TE linear in NVFP4)"),
    (r"rowwise", None, None, "FP8 rowwise scaling (torchao) has no Transformer Engine recipe"),
    (r"alternate granularity", None, None, "the row does not say which FP8 granularity it is"),
    (r"^(bf16|bfloat16)( \(.*\))?$|implies bf16", None, "bf16", ""),
    (r"mx.?fp8|fp8.mx|mx.style", None, "mxfp8", ""),
    # sub-channel scaling is blockwise FP8 (Megatron-Bridge's bf16_with_fp8_subchannel_scaling_mixed sets
    # fp8_recipe="blockwise"); its perf scripts call it fp8_sc
    (r"block.?wise|tile/block|block.scal|subchannel|sub.channel|fp8.sc\b|1x128|128x128", None, "fp8-blockwise", ""),
    (r"fp8.cs|current scaling|tensor.?wise|float8", None, "fp8-tensorwise", ""),
    # delayed scaling (bf16_with_fp8_delayed_scaling_mixed, fp8_ds); NeMo's "fp8 hybrid" is Transformer Engine's
    # DelayedScaling with the HYBRID format (E4M3 forward, E5M2 backward), NeMo 2's default FP8 recipe
    (r"fp8.ds\b|delayed", None, "fp8-delayed", ""),
    (r"fp8.hybrid", None, "fp8-delayed", "FP8 hybrid read as delayed scaling (NeMo's default FP8 recipe)"),
    # plain FP8: "FP8", "FP8 (E4M3)", "BF16 + FP8" (FP8 GEMMs in a BF16 run: every FP8 recipe is that), "FP8
    # per-tensor" (both of Transformer Engine's per-tensor recipes, delayed and current scaling, are that)
    (_PLAIN_FP8, r"^(megatron-bridge|nemo framework)", "fp8-tensorwise",
     "plain FP8 read as the source's default current scaling"),
    (_PLAIN_FP8, r"^(nemo 24|megatron-lm examples/llama)", "fp8-delayed", "plain FP8 read as delayed scaling"),
    (_PLAIN_FP8, None, "fp8-tensorwise", "plain FP8 read as per-tensor current scaling"),
]
# torchtitan pages measured before pytorch/torchtitan#1073 (5e2033c, 2025-04-07: "Add microbatch_size and remove
# num_microbatches config"): the local batch is split into experimental.pipeline_parallel_microbatches micro-batches,
# default the PP degree (torchtitan 9dec370, the 2024-12 page's commit: parallelisms/pipelining_utils.py
# build_pipeline_schedule `n_microbatches = ... pipeline_parallel_degree`; config_manager.py "The default value will be
# the number of pipeline stages"); later pages in micro-batches of pipeline_parallel_microbatch_size (default 1)
_TORCHTITAN_PP_BY_DEGREE = ("torchtitan benchmarks llama3_h100_202412",)
# a row's recompute in the published tables' words (lower case, runs of ' _-' as one space): none, selective (core
# attention, Megatron's default module) or full (one layer per region); Megatron's own 'full:block:4' is read as
# such, and 'selective: mlp, up_proj' by its module names (map_row)
_RECOMPUTE = ((r"^(none|no|off|no ac|n/?a|false|0|disabled|no (recompute|recomputation|activation checkpointing|"
               r"checkpointing))$", "none"),
              (r"^(full|ac ?full)( (ac|recompute|recomputation|activation (checkpointing|recompute)))?$", "full"),
              (r"^activation checkpointing \(?full\)?$", "full"),
              (r"^(selective|sac|per op sac|ac ?selective)( (ac|recompute|recomputation|activation "
               r"(checkpointing|recompute)))?$", "selective"),
              (r"^activation checkpointing \(?selective\)?$", "selective"),
              (r"^full:(uniform|block):[1-9]\d*$", None))  # None: the text itself


def _recompute_of(text: str) -> str | None:
    """A row's recompute as Recompute.parse reads it ('full' stands for full:uniform:1; a blank or a cell of dashes
    is none), or None when _RECOMPUTE does not name it."""
    words = re.sub(r"[\s_\-]+", " ", text).strip()
    if not words:
        return "none"
    for pattern, rc in _RECOMPUTE:
        if re.match(pattern, words if rc else text):
            return rc or text
    return None


# the sources' short names for Megatron's recompute modules (the MoE model zoo's tables write "norm, act")
_MODULE_NAMES = {"up_proj": "mla_up_proj", "mla_up": "mla_up_proj", "norm": "layernorm", "act": "moe_act",
                 "shared_expert": "shared_experts", "attn": "core_attn", "core_attention": "core_attn"}
# (source prefix, catalog model, GPU kinds) -> recompute the source's recipe sets where the row is blank.
# Megatron-Bridge's gpt-oss-120b BF16 perf presets for B200 and H100 set recompute_modules=["layernorm",
# "moe_act"] (selective) in every release behind the containers in the table (v0.2.0 to v0.4.2:
# scripts/performance/configs/gpt_oss/*workload_base_configs.py; utils/overrides.py makes it selective).
_PRESETS = [
    ("Megatron-Bridge perf", "gpt-oss-120b", ("B200", "H100"), "selective:layernorm,moe_act",
     "Megatron-Bridge gpt-oss perf preset"),
]


def _norm(text: str) -> str:
    return re.sub(r"[\s_\-]+", " ", text.strip().lower())


# 'Qwen3.5-VL 122B-A10B' (Megatron-Bridge's qwen35_vl recipes load Qwen/Qwen3.5-122B-A10B): every Qwen3.5 checkpoint is
# the vision-language model (its config.json has the vision tower), so VL names the catalog's own model
_QWEN35_VL = re.compile(r"^qwen3\.5 vl ")
# a Qwen3.5-VL or Qwen3-VL row (Megatron-Bridge's qwen3_vl recipes load Qwen/Qwen3-VL-*-Instruct, whose catalog entries
# are their language models): the vision encoder's work on the row's mock image is left out
_VL_ROW = re.compile(r"^qwen3(\.5)? vl ")


def _spelt(text: str) -> str:
    """A model name without its hub organisation ('deepseek-ai/DeepSeek-V3') or vendor prefix, separators as spaces."""
    n = _norm(text.rsplit("/", 1)[-1])
    n = re.sub(r"^(nvidia|meta) (?=\S)", "", n)
    return re.sub(r"^qwen3 5 ", "qwen3.5 ", n)  # 'Qwen3_5_27B': the point spelt as a separator


def _bare(text: str) -> str:
    """A model name without its hub organisation, vendor prefix or release suffix: 'NVIDIA-Nemotron-3-Nano-30B-A3B'
    and 'meta-llama/Meta-Llama-3.1-8B-Instruct' read as 'nemotron 3 nano 30b a3b' and 'llama 3.1 8b'."""
    n = _QWEN35_VL.sub("qwen3.5 ", _spelt(text))
    return re.sub(r" (instruct|hf|base|chat)$", "", n)


@functools.cache
def _catalog_bare() -> dict[str, str]:
    return {_bare(m): m for m in model_names()}


def catalog_name(source_name: str) -> tuple[str | None, str | None]:
    """(catalog name, None), or (None, reason): the catalog's own names first (vendor prefix, '-Instruct', '-hf'
    and '_' / '-' / ' ' ignored), then the spellings the published tables use (_NAMES)."""
    n, bare = _norm(source_name), _bare(source_name)
    if bare in _catalog_bare():
        return _catalog_bare()[bare], None
    for pattern, name in _NAMES:
        if re.search(pattern, n) or re.search(pattern, bare):
            return name, None
    # a name that stops at its total size ('Qwen3.5-VL 397B'): the one catalog model of that family and size (its
    # name that size, then at most the active size: 'qwen3.5 397b a17b'); none, or several, is no match
    sized = re.match(r"^(.*?\b\d+(?:\.\d+)?b)$", bare)
    if sized:
        found = {v for k, v in _catalog_bare().items() if k == sized.group(1) or k.startswith(sized.group(1) + " a")}
        if len(found) == 1:
            return found.pop(), None
    return None, f"model {source_name!r} is not in the catalog"


def gpu_kind(text: str) -> tuple[str | None, int | None]:
    """('H100', None) for 'H100 (Grand Teton, ...)'; the node size when the text says '(N per node)'."""
    # the first catalog kind named as a word of its own: 'H100 (Grand Teton)', 'NVIDIA H100 80GB HBM3',
    # 'H100-SXM5-80GB', 'GB200 NVL72' ('B200' inside 'GB200' is not a word of its own)
    found = re.search(r"(?<![A-Z0-9])(" + "|".join(sorted(_GPUS, key=len, reverse=True)) + r")(?![0-9])",
                      text.strip().upper())
    per = re.search(r"(\d+) per node", text)
    return (found.group(1) if found else None), (int(per.group(1)) if per else None)


# (pattern on the lower-cased GPU text, catalog.GPU_VARIANTS name; its kind: catalog.VARIANT_KINDS)
_VARIANT_GPUS = ((r"96 ?gb hbm2e", "H100-HBM2e-500W"),)


def gpu_variant(text: str, kind: str) -> str:
    """The catalog variant of `kind` the GPU text names ('H100 (Grand Teton, 96GB HBM2e, 500W power limit)' ->
    'H100-HBM2e-500W'), or "" for the kind's own figures."""
    t = text.strip().lower()
    return next((v for pat, v in _VARIANT_GPUS if VARIANT_KINDS[v] == kind and re.search(pat, t)), "")


def precision_of(text: str, source: str) -> tuple[str | None, str]:
    """(Workload precision, how an ambiguous name was read), or (None, the reason it is skipped)."""
    p, src = text.strip().lower(), source.strip().lower()
    if not p:
        return None, "missing field(s): precision"
    for pat, src_pat, prec, how in _PRECISIONS:
        if re.search(pat, p) and (src_pat is None or re.search(src_pat, src)):
            return prec, how
    return None, f"precision {text!r} is not a recipe autotune models"


def training_of(name: str, row: dict) -> tuple[dict, list[str]]:
    """Workload training settings of a row (MTP, LoRA, packed fine-tuning data), and how each was read."""
    out: dict = {}
    how: list[str] = []
    text = _norm(row.get("model", "")) + " " + (row.get("notes") or "").lower()
    for pattern, settings, why in _TRAINING:
        if re.search(pattern, text) and not settings.keys() & out.keys():  # the first reading of a setting
            out.update(settings)
            how.append(why)
    for src, pattern, tokens, why in _PACKED:
        if (row.get("source") or "").startswith(src) and re.search(pattern, text):
            out["packed_doc_len"] = tokens
            how.append(why)
    for src, model, settings, why in _TRAINING_PRESETS:
        if (row.get("source") or "").startswith(src) and name == model:
            out.update(settings)
            how.append(why)
    return out, how


def _int(row: dict, key: str, default: int | None = None) -> int | None:
    """An integer cell: thousands separators and '~' allowed; a sequence length may be written '4K' (4,096)."""
    v = (row.get(key) or "").strip()
    if not v:
        return default
    k = re.fullmatch(r"(\d+)\s*[kK]", v)
    if k and key == "seq_len":
        return int(k.group(1)) * 1024
    x = _float(v)
    return int(x) if x is not None and x == int(x) else default  # '2.5' GPUs or degrees: not a count


def _float(text: str | None) -> float | None:
    """A finite number cell: '2,451.4', '~13012' and '≈ 13,012' read as numbers; anything else ('inf', 'NaN',
    words) as None."""
    try:
        x = float(re.sub(r"^[~≈]\s*", "", (text or "").replace(",", "").strip()))
    except ValueError:
        return None
    return x if math.isfinite(x) else None


MAX_CHUNKS = 1024  # virtual pipeline chunks per stage: more than any catalog model has layers


def _out_of_range(row: dict, count: int, seq: int, gb: int, tp: int, pp: int, ep: int, mbs: int | None) -> str | None:
    """Why a row's counts cannot be a run (a parallel degree at most the GPUs; a micro-batch at most the global
    batch), or None. Checked before anything is sized by them: a PP of 1e9 would size stage arrays of 1e9."""
    if not 1 <= count <= MAX_GPUS:
        return f"num_gpus {row.get('num_gpus')!r} is not a GPU count (1 to {MAX_GPUS:,})"
    for key, v in (("seq_len", seq), ("global_batch", gb)):
        if not 1 <= v <= MAX_ROWS:
            return f"{key} {row.get(key)!r} is out of range (1 to {MAX_ROWS:,})"
    degrees = [("tp", tp), ("pp", pp), ("ep", ep), ("cp", _int(row, "cp", 1)), ("etp", _int(row, "etp", 1))]
    for key, v in degrees:
        if v is not None and not 1 <= v <= count:
            return f"{key} {row.get(key)!r} is not a parallel degree of {count:,} GPUs"
    vp = _int(row, "vp", 1)  # model chunks per pipeline stage: bounded by the layers, not the GPUs
    if vp is not None and not 1 <= vp <= MAX_CHUNKS:
        return f"vp {row.get('vp')!r} is out of range (1 to {MAX_CHUNKS:,} model chunks per stage)"
    if mbs is not None and not 1 <= mbs <= gb:
        return f"micro_batch {row.get('micro_batch')!r} is not between 1 and the global batch ({gb:,})"
    return None


def _pipeline_layout(notes: str, pp: int, vp: int | None) -> dict | str:
    """{"vpp", "layer_split"} of a row whose notes give Megatron's --pipeline-model-parallel-layout ('PP layout
    Et*4|(tttt|)*14tmL': 16 virtual stages, so VP 4 on PP 4), {} when they give none, or the reason to skip it."""
    m = re.search(r"(?:\bPP|\bpipeline(?:[ -]model[ -]parallel)?)[ -]layout[\s:=]*[\"']?([^\s;\"']+)", notes, re.I)
    text = m.group(1).rstrip(",.") if m else ""
    if not re.fullmatch(r"[EtmL|()*\d,]*E[EtmL|()*\d,]*", text):  # prose ("PP layout (see the page)"), not a string
        return {}
    try:
        stages, _ = parse_pipeline_layout(text)
        return {"vpp": layout_vpp(len(stages), pp, vp), "layer_split": stages}
    except BadInput as exc:
        return f"PP layout {text!r}: {exc}"


def _modules(text: str) -> list[str]:
    """Megatron's recompute module names of a list written with commas, spaces, '/' or '+' ('norm, act' ->
    layernorm, moe_act), in order, once each."""
    words = [w for w in re.split(r"[\s,/+]+", text.strip()) if w]
    return list(dict.fromkeys(_MODULE_NAMES.get(w, w) for w in words))


def map_row(row: dict) -> dict | str:
    name, why = catalog_name(row.get("model", ""))
    if name is None:
        return why or "unknown model"
    kind, per_node = gpu_kind(row.get("gpu", ""))
    if kind is None:
        return f"GPU {row.get('gpu')!r} is not a catalog kind ({', '.join(_GPUS)})"
    notes, source = row.get("notes") or "", row.get("source") or ""
    precision, prec_how = precision_of(row.get("precision") or "", source)
    if precision is None:
        return prec_how
    fsdp = re.search(r"FSDP=(\d+)", notes)
    fsdp_on = bool(fsdp and int(fsdp.group(1)) > 0) or "FSDP-style" in notes or "FSDP2" in source
    count, seq, gb = _int(row, "num_gpus"), _int(row, "seq_len"), _int(row, "global_batch")
    tp, pp = _int(row, "tp"), _int(row, "pp")
    assumed = []
    batch_tokens = re.search(r"Tokens/Batch=(\d+)M", notes)
    if gb is None and batch_tokens and seq:  # the Llama 3 paper gives tokens per batch (16M = 2^24)
        gb = int(batch_tokens.group(1)) * 2**20 // seq
        assumed.append("global batch from tokens/batch")
    mbs = _int(row, "micro_batch")
    if gb is None and fsdp and mbs and count and tp and pp:  # torchtitan: local batch x DP, no accumulation
        gb = mbs * count // (tp * pp * (_int(row, "cp", 1) or 1))
        assumed.append("global batch = local batch x DP (no accumulation)")
    ep = _int(row, "ep", None if _moe(name) else 1)
    missing = [k for k, v in (("num_gpus", count), ("seq_len", seq), ("global_batch", gb), ("tp", tp), ("pp", pp),
                              ("ep", ep)) if v is None]
    if missing:
        return f"missing field(s): {', '.join(missing)}"
    out_of_range = _out_of_range(row, count, seq, gb, tp, pp, ep, mbs)
    if out_of_range:
        return out_of_range
    rc_text = (row.get("recompute") or "").strip().lower()
    rc = _recompute_of(rc_text)
    mods = re.match(r"selective\s*(?::|\()\s*([^)]+)\)?$", rc_text)
    if rc is None and mods:  # "selective: mlp, up_proj" / "selective (mlp, up_proj)" names Megatron's modules
        names = _modules(mods.group(1))
        if not set(names) <= set(SELECTIVE_MODULES):
            return f"recompute {row.get('recompute')!r} names modules Megatron does not have"
        rc = "selective:" + ",".join(names)
    elif rc is None and rc_text and set(_modules(rc_text)) <= set(SELECTIVE_MODULES):
        rc = "selective:" + ",".join(_modules(rc_text))  # a bare module list ("norm, act"): selective recompute
    if rc is None:
        return f"recompute {row.get('recompute')!r} is not a Megatron setting we can map"
    recompute = Recompute("full", "uniform", 1) if rc == "full" else Recompute.parse(rc)
    preset = next((p for p in _PRESETS if source.startswith(p[0]) and name == p[1] and kind in p[2]), None)
    tps = _float(row.get("tokens_per_s_per_gpu"))
    derived = re.search(r"derived[^;]*?~=\s*([\d,]+(?:\.\d+)?)", notes)
    tflops = _float(row.get("tflops_per_gpu"))
    how = "tokens/s/GPU as published"
    if tps is None and derived:
        tps, how = _float(derived.group(1)), "tokens/s/GPU derived in the table's notes"
    elif tps is None:
        how = "TFLOP/s/GPU as published"
    mfu = _float((row.get("mfu") or "").replace("%", ""))
    if tps is None and tflops is None and mfu:
        # MFU alone: the share of the peak the publisher counted against, read as the GPU's dense BF16 peak (what
        # torchtitan and most pages use, FP8 runs included), in our FLOP count like a TFLOP/s figure
        tflops = (mfu / 100.0 if mfu > 1 else mfu) * GPUS[kind].bf16_tflops
        how = f"MFU as published ({mfu:g}{'%' if mfu > 1 else ''}), read against {kind}'s dense BF16 peak"
    if tps is None and tflops is None:
        return "missing field(s): tokens_per_s_per_gpu, tflops_per_gpu and mfu"
    if tps is None and source.startswith("Megatron-LM README"):
        # the README's TFLOP/s are Megatron-LM r0.8's num_floating_point_operations, which counts attention over
        # the whole row (12 x s x L x h per token); ours is causal, so the figure is restated in our count
        spec = load_model(name)
        tflops *= train_flops_per_token(spec, seq) / train_flops_per_token(spec, seq, causal=False)
        assumed.append("TFLOP/s restated from Megatron-LM r0.8's count (attention over the whole row) to the causal one")
    dispatcher = "hybridep" if re.search(r"HybridEP", notes) else "flex" if re.search(r"DeepEP", notes) else "alltoall"
    cp = _int(row, "cp", 1)
    micro = _int(row, "micro_batch", 1) or 1
    if source.startswith(_TORCHTITAN_PP_BY_DEGREE) and pp > 1 and micro % pp == 0:
        micro //= pp  # the local batch in PP-degree micro-batches (experimental.pipeline_parallel_microbatches unset)
        assumed.append(f"torchtitan PP: the local batch in {pp} micro-batches of {micro} rows (the PP degree: "
                       "experimental.pipeline_parallel_microbatches default before pytorch/torchtitan#1073)")
    elif source.startswith("torchtitan") and pp > 1:  # torchtitan splits the local batch into PP micro-batches of
        micro = 1  # parallelism.pipeline_parallel_microbatch_size (default 1)
        assumed.append("torchtitan PP micro-batches of 1 row (pipeline_parallel_microbatch_size default)")
    layout = dict(
        world=count, tp=tp, pp=pp, vpp=_int(row, "vp", 1) or 1, cp=cp or 1, ep=ep, etp=_int(row, "etp", 1) or 1,
        sequence_parallel=tp > 1,
        recompute=recompute,
        dispatcher=dispatcher if _moe(name) else "alltoall",
        micro_batch_size=micro,
        distributed_optimizer=True,
        fsdp=fsdp_on,
    )
    split = _pipeline_layout(notes, pp, _int(row, "vp", None))
    if isinstance(split, str):
        return split
    if split:
        layout.update(split)
        assumed.append(f"VP {split['vpp']} and the layer split of the row's PP layout")
    settings = row_settings(row, name, kind, precision, layout, gb, _moe(name))
    if isinstance(settings, str):
        return settings
    recipe_rc = "recompute" in settings["layout"]  # the source's recipe for this row names its recompute
    layout.update(settings["layout"])
    layout["recompute"] = Recompute.parse(str(layout["recompute"]))
    if preset and not row.get("recompute") and not recipe_rc:  # no recipe matched: the model's usual preset
        layout["recompute"] = Recompute.parse(preset[3])
        assumed.append(f"recompute {preset[3]} ({preset[4]})")
    fsdp_on = bool(layout["fsdp"])
    assumed += settings["read"] + ([row["_reading"]] if row.get("_reading") else [])
    if _VL_ROW.match(_spelt(row.get("model", ""))):
        assumed.append("the vision encoder's work (one mock image per row in Megatron-Bridge's MockVLMSFTDataset, "
                       "the rest of the row text and padding) not counted: the language model's alone")
    training, training_how = training_of(name, row)
    assumed += training_how
    stack, stack_how = source_settings(row, source, name, precision)
    assumed += [s for s, cond in (("recompute none", not row.get("recompute") and not preset and not recipe_rc),
                                  ("FSDP: parameters, gradients and optimizer sharded over DP", fsdp_on),
                                  (prec_how, bool(prec_how))) if cond] + stack_how
    src = f"{source}; {how}" + (f"; assumed {', '.join(assumed)}" if assumed else "")
    regression = known_regression(source, name, kind)
    src += f"; {regression}" if regression else ""
    variant = gpu_variant(row.get("gpu", ""), kind)
    src += f"; GPU figures of the {variant} variant under {kind}'s calibration" if variant else ""
    return {
        "model": name,
        "layout": layout,
        "measurement": dict(model=name, gpu=kind, gpu_variant=variant, count=count, gpus_per_node=per_node or 8,
                            seq_len=seq, global_batch=gb, load_balancing_loss=True, precision=precision,
                            tokens_per_s_per_gpu=tps or 1.0, regression=regression, unpriced=unpriced(name),
                            **{**stack, **training, **settings["workload"]}),
        "tflops": tflops if tps is None else None,
        "recipe_layout": settings.get("recipe_layout"),
        "source": src,
    }
