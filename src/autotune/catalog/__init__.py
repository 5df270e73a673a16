"""What we tune for: models (ModelSpec from HF config.json), GPUs and clusters, workloads.

Pure Python and numpy: no torch, no ray.
"""

from .hardware import GPUS, ClusterSpec, GpuSpec, get_gpu
from .model import LinearAttentionSpec, MambaSpec, MlaSpec, ModelSpec, MoeSpec, from_hf_config
from .params import ParamCounts, ParamItem, layer_items, padded_vocab, param_counts
from .registry import load_model, model_names
from .workload import (FP4_RECIPES, FP8_RECIPES, FRAMEWORKS, PRECISIONS, QUANT, Workload, precision_of_class,
                       recipe_precision)

__all__ = [
    "GPUS",
    "ClusterSpec",
    "GpuSpec",
    "get_gpu",
    "LinearAttentionSpec",
    "MambaSpec",
    "MlaSpec",
    "ModelSpec",
    "MoeSpec",
    "from_hf_config",
    "ParamCounts",
    "ParamItem",
    "layer_items",
    "padded_vocab",
    "param_counts",
    "load_model",
    "model_names",
    "Workload",
    "FP8_RECIPES",
    "FP4_RECIPES",
    "QUANT",
    "PRECISIONS",
    "FRAMEWORKS",
    "recipe_precision",
    "precision_of_class",
]
