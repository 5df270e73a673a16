"""Weights, gradients and optimizer state per GPU and pipeline stage: what each training framework keeps.

`state_terms` returns the memory model's "weights", "grads" and "optimizer" terms (bytes, (n, S)) for the Workload's
`framework` (catalog.workload.FRAMEWORKS). P is a stage's parameters on one GPU (dense / TP + experts / (EP x ETP)),
O the share whose optimizer state the GPU owns (dense / (DP x CP) + experts / expert-DP under a sharding optimizer),
a "unit" one decoder layer (FSDP's wrapping unit in every framework here):

  megatron    Megatron-core: BF16 parameters P x 2 B, plus Transformer Engine's low-precision copies of the linear
              weights (1 B each: the row-wise one, and a column-wise one where the GEMMs need it, _quant.lowp_copies;
              with --fp8-param-gather the parameter itself is the low-precision copy, no BF16 one); main
              gradients P x 4 B (fp32) or 2 B; fp32 master + Adam m, v O x 12 B. Megatron-FSDP with PP 1 shards the
              parameters and gradients too, two units gathered at once (the running one, the prefetched one).
              NVFP4 is counted at FP8's bytes: its FP4 copies (0.5 B + an E4M3 scale per 16 values, row- and
              column-wise) come to ~1.1 B per weight.
  torchtitan  torch FSDP2 (fully_shard) on an fp32 model with MixedPrecisionPolicy(param bf16, reduce fp32)
              (torchtitan/distributed/utils.py, parallelize_llama.apply_fsdp): the sharded parameter is the fp32
              master (O x 4 B), gradients are sharded fp32 (O x 4 B), Adam's m, v fp32 (O x 8 B); no BF16 shard. BF16
              (FP8 with float8 all-gather) copies exist only gathered: two units with PP 1 (resharded after forward),
              the whole stage with PP > 1 (reshard_after_forward = not pp_enabled), where torch.distributed.pipelining
              also delays the gradient reduce-scatter to the last micro-batch (set_requires_gradient_sync(False)):
              the stage's unsharded gradients accumulate in the reduce dtype, fp32 (FSDPParam.to_accumulated_grad).
  automodel   torch FSDP2 on a BF16 model (NeMo AutoModel: from_config's torch_dtype "auto" is bfloat16; optimizer
              torch.optim.Adam, whose m, v take the parameter's dtype): sharded parameters, gradients and m, v in BF16,
              O x (2 + 2 + 4) B. MoE blocks are not resharded after forward (moe/parallelizer.apply_fsdp default, the
              benchmark YAMLs' moe.reshard_after_forward: false; Nemotron 3 Super's and Ultra's set it true:
              Workload.fsdp_reshard_moe, two units gathered as with a dense model) and pipeline stages keep their
              layers gathered: the stage's gathered BF16 copy; experts sharded by EP alone (expert-DP 1) are no FSDP parameters at all, so
              they have no gathered copy. Unsharded gradients as torchtitan's.
  llama3      Meta's FSDP for Llama 3 (arXiv:2407.21783 sec. 3.3.2): "shards optimizer states and gradients, but for
              model shards we do not reshard after forward"; FP32 gradient accumulation and FP32 reduce-scatter: fp32
              master, m, v and gradients sharded (O x 16 B), the stage's BF16 parameters gathered throughout, one
              unit's fp32 gradients unsharded while they are reduce-scattered.

Embedding and output layer are counted like any unit. Workload.optimizer_state_bytes, when set, replaces the
optimizer's bytes per owned parameter (NeMo's distributed_fused_adam with dtype bf16: m, v only, 4 B). No torch, no ray.
"""

from __future__ import annotations

import numpy as np

from ..catalog import ModelSpec, Workload
from ..layout import LayoutTable
from .layers import layer_tables, stage_sums

__all__ = ["state_terms"]


def _units(model: ModelSpec, t: LayoutTable, S: int) -> np.ndarray:
    return np.maximum(1.0, stage_sums(np.ones(layer_tables(model).n_layers), t.pp, t.vpp, S, t.split))


def state_terms(model: ModelSpec, workload: Workload, t: LayoutTable, S: int, p_dense: np.ndarray, p_exp: np.ndarray,
                owned: np.ndarray, keep: np.ndarray, emb: np.ndarray, coef, lowp: int) -> tuple:
    """(weights, grads, optimizer) bytes per GPU per stage (n, S) for the workload's framework (module docstring).
    `emb`: the stage's embedding and output-layer parameters (no low-precision copy); `keep`: (n, 1) share of the
    optimizer state left on the GPU (the rest offloaded to the host); `lowp`: the low-precision copies Transformer
    Engine keeps of each linear weight (_quant.lowp_copies). LoRA (Workload.lora): the frozen base has
    weights only; the adapters' gradients and optimizer state are left out (under 1% of the parameters)."""
    w_bytes, g_bytes, o_bytes = _framework_state(model, workload, t, S, p_dense, p_exp, owned, keep, emb, coef, lowp)
    if workload.lora:
        return w_bytes, np.zeros_like(w_bytes), np.zeros_like(w_bytes)
    return w_bytes, g_bytes, o_bytes


def _framework_state(model, workload, t, S, p_dense, p_exp, owned, keep, emb, coef, lowp) -> tuple:
    params = p_dense + p_exp
    fw = workload.framework
    if fw == "megatron":
        w_bytes = 2.0 * params
        if workload.quantized:  # the linear weights' low-precision copies, beside the BF16 ones or instead of them
            w_bytes = w_bytes + (params - emb) * (lowp - (2.0 if workload.fp8_param_gather else 0.0))
        g_bytes = (coef.grad_bytes if workload.grads_fp32 else 2.0) * params
        if t.fsdp.any():  # Megatron-FSDP: a 1 / DP shard of each, plus the gathered units in flight
            per_layer = params / _units(model, t, S)
            shard = owned / np.maximum(params, 1.0)
            shard = np.where(t.dist_opt[:, None], shard, 1.0 / np.maximum(t.dp * t.cp, 1)[:, None])
            f = (t.fsdp & (t.pp == 1))[:, None]  # with PP the stage's parameters stay gathered (see _raw.step_pieces)
            w_bytes = np.where(f, w_bytes * shard + 2 * coef.fsdp_layers_in_flight * per_layer, w_bytes)
            g_bytes = np.where(f, g_bytes * shard + 4.0 * per_layer, g_bytes)
        return w_bytes, g_bytes, owned * ((workload.optimizer_state_bytes or coef.optim_bytes) * keep)
    # torch FSDP2 flavours and Llama 3's: per-parameter bytes of the shards (param, grad, optimizer)
    shard_p, shard_g, shard_o = {"torchtitan": (4.0, 4.0, 8.0), "automodel": (2.0, 2.0, 4.0),
                                 "llama3": (4.0, 4.0, 8.0)}[fw]
    gather_b = 1.0 if workload.fp8_param_gather else 2.0
    dp_on = (t.dp * t.cp > 1)[:, None]
    gathered_stage = p_dense * dp_on + p_exp * (t.edp > 1)[:, None]  # FSDP parameters of the stage (groups of 1 are not)
    per_layer = gathered_stage / _units(model, t, S)
    pp1 = (t.pp == 1)[:, None]
    if fw == "llama3":
        stays, unsharded_grads = np.ones_like(pp1), 4.0 * per_layer
    else:
        stays = ~pp1 | (model.is_moe and fw == "automodel" and not workload.fsdp_reshard_moe)
        unsharded_grads = np.where(pp1, 4.0 * per_layer, 4.0 * gathered_stage)
    gathered = np.where(stays, gathered_stage, coef.fsdp_layers_in_flight * per_layer) * gather_b
    return owned * shard_p + gathered, owned * shard_g + unsharded_grads, owned * ((workload.optimizer_state_bytes
                                                                                 or shard_o) * keep)
