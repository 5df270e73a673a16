"""Build the training step of a trial: TransformerConfig, GPTModel chunks, Megatron DDP, optimizer.

`build(plan, cuda, dtype)` returns the model chunks (one per virtual pipeline stage), the optimizer
and its LR scheduler, and `notes`: every place where the run departs from what the layout asked for
because of this machine (no Transformer Engine, no FLA, no CUDA); they go into TrialResult.reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..catalog.model import FULL, LINEAR, SLIDING
from ..catalog.params import padded_vocab
from ..launch import AUX_LOSS_ON, mlp_activation, norm_epsilon
from ..layout.core import dispatcher_config
from ..layout.splits import split_config
from ..trials.plan import TrialPlan, gdn_blocker, has_module

__all__ = ["Built", "build", "gdn_blocker"]  # gdn_blocker lives in plan.py (no torch)


@dataclass
class Built:
    config: object
    chunks: list  # DDP-wrapped GPTModel chunks, one per virtual pipeline stage
    optimizer: object
    scheduler: object
    use_te: bool
    notes: list[str] = field(default_factory=list)


def _recompute(plan: TrialPlan, moe_grouped_gemm: bool, notes: list[str]) -> dict:
    rc = plan.layout.recompute
    if rc.granularity == "none":
        return {}
    if rc.granularity == "full":
        return dict(recompute_granularity="full", recompute_method=rc.method, recompute_num_layers=rc.num_layers)
    modules = list(rc.modules) or ["core_attn"]
    dropped = [m for m in modules if (m == "moe_act" and not moe_grouped_gemm) or (m == "mla_up_proj" and not plan.model.mla)
               or (m == "mhc" and plan.model.hc_streams <= 1)]
    if dropped:
        notes.append(f"selective recompute without {', '.join(dropped)} (needs grouped GEMM / MLA / hyper-connections)")
    return dict(recompute_granularity="selective", recompute_modules=[m for m in modules if m not in dropped])


def transformer_config(plan: TrialPlan, cuda: bool, dtype: torch.dtype, notes: list[str]):
    """The TransformerConfig of the plan's model and layout, and whether TE layers are used. Appends to
    `notes` what this machine changes (a TE- or CUDA-only feature that falls back)."""
    from megatron.core.activations import squared_relu
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    m, lay, w = plan.model, plan.layout, plan.workload
    # the MLP as MODEL_ARGS say it (Megatron-LM's core_transformer_config_from_args): SwiGLU and gpt-oss's
    # (clamp(up) + 1) * quick_gelu(clamp(gate)) are GLUs; Nemotron's squared ReLU and GPT-3's GeLU have no gate
    act = mlp_activation(m)
    gated = act.gated
    act_func = {"swiglu": torch.nn.functional.silu, "quick_geglu": quick_gelu, "squared_relu": squared_relu,
                "gelu": torch.nn.functional.gelu}[act.name]
    use_te = cuda and has_module("transformer_engine")
    bias_everywhere = m.attention_bias and m.moe is not None and m.moe.expert_bias
    if bias_everywhere and not use_te:
        # megatron-core 0.16.1's MLP.forward adds an expert's bias in place (`output += ...`) to the
        # view its RowParallelLinear returns: autograd refuses it in the local SequentialMLP path.
        notes.append("biases on QKV only: megatron-core adds expert biases in place, which fails without TE")
        bias_everywhere = False
    kw: dict = dict(
        num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_heads,
        num_query_groups=m.num_kv_heads, kv_channels=m.head_dim, ffn_hidden_size=m.ffn_hidden_size,
        # LayerNorm (with its bias) where the model has one: torch's LayerNorm in the local spec (WrappedTorchNorm)
        normalization="LayerNorm" if m.norm_bias else "RMSNorm", layernorm_epsilon=norm_epsilon(m),
        gated_linear_unit=gated, activation_func=act_func,
        glu_linear_offset=act.glu_offset, activation_func_clamp_value=act.clamp or None,
        # gpt-oss has biases on every linear (attention, router, experts); Qwen2-style models on QKV only.
        add_bias_linear=bias_everywhere, add_qkv_bias=m.attention_bias and not bias_everywhere,
        # MLA's latent norms (DeepSeek's q_a/kv_a layernorms) exist only with qk_layernorm in megatron.
        qk_layernorm=m.qk_norm or m.mla is not None, attention_output_gate=m.attn_output_gate,
        hidden_dropout=0.0, attention_dropout=0.0,  # deterministic, layout-comparable loss curves
        tensor_model_parallel_size=lay.tp, pipeline_model_parallel_size=lay.pp,
        virtual_pipeline_model_parallel_size=lay.vpp if lay.vpp > 1 else None,
        # as megatron's training arguments set them: the interleaved schedule overlaps its p2p (one
        # isend/irecv per direction, the two directions on different groups when PP is 2); batched p2p
        # with PP 2 posts both directions to one peer on one group, where gloo pairs a forward activation
        # with a backward gradient of the same shape (a silently different loss curve, measured)
        overlap_p2p_comm=lay.vpp > 1, batch_p2p_comm=lay.vpp == 1,
        context_parallel_size=lay.cp, expert_model_parallel_size=lay.ep, expert_tensor_parallel_size=lay.etp,
        sequence_parallel=lay.sp, params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16,
        # On CPU, initialise full matrices and slice them: TP1 and TP2 start from the same weights.
        use_cpu_initialization=not cuda, perform_initialization=True,
        # megatron-core fuses bias + GLU, or bias + GeLU where the MLP has a bias (TransformerConfig.__post_init__)
        bias_activation_fusion=use_te and (gated or (act.name == "gelu" and bias_everywhere)),
        masked_softmax_fusion=use_te, bias_dropout_fusion=use_te,
        apply_rope_fusion=use_te, gradient_accumulation_fusion=use_te, persist_layer_norm=False,
        cross_entropy_loss_fusion=lay.cross_entropy_fusion and use_te,
    )
    kw.update(split_config(lay.layer_split, m.num_layers, lay.pp, lay.vpp))  # an uneven split, as Megatron builds it
    if use_te and lay.cross_entropy_fusion:
        kw["cross_entropy_fusion_impl"] = "te"
    if m.sliding_window and SLIDING in m.layer_types:  # HF's window counts the query itself, Megatron's does not
        kw.update(window_size=(m.sliding_window - 1, 0),
                  window_attn_skip_freq=[int(t == SLIDING) for t in m.layer_types])
    if m.attention_sinks:
        kw["softmax_type"] = "learnable"
    if m.moe:
        grouped = use_te  # TEGroupedMLP; without TE experts run as a SequentialMLP
        kw.update(
            num_moe_experts=m.moe.num_experts, moe_router_topk=m.moe.top_k, moe_ffn_hidden_size=m.moe.ffn_hidden_size,
            moe_layer_freq=[int(i not in m.moe.dense_layers) for i in range(m.num_layers)],
            **dispatcher_config(lay.dispatcher), moe_router_dtype="fp32", moe_grouped_gemm=grouped,
            moe_permute_fusion=use_te, moe_aux_loss_coeff=AUX_LOSS_ON if w.load_balancing_loss else 0.0,
            moe_router_load_balancing_type="aux_loss" if w.load_balancing_loss else "none",
            moe_shared_expert_overlap=lay.moe_shared_expert_overlap and cuda,
        )
        if lay.moe_shared_expert_overlap and not cuda:
            notes.append("no shared-expert overlap on CPU (it needs a second CUDA stream)")
        if m.moe.shared_ffn_hidden_size:
            kw.update(moe_shared_expert_intermediate_size=m.moe.shared_ffn_hidden_size,
                      moe_shared_expert_gate=m.moe.shared_expert_gate)
        kw.update(_recompute(plan, grouped, notes))
    else:
        kw.update(_recompute(plan, False, notes))
    if m.mtp_layers and w.train_mtp:
        notes.append(f"no MTP layers: the trial times the main model ({m.mtp_layers} MTP layer(s) left out)")
    if lay.offload_modules:  # megatron-core asserts Transformer Engine for it (training/arguments.py)
        if use_te and cuda:
            kw.update(fine_grained_activation_offloading=True, offload_modules=list(lay.offload_modules))
        else:
            notes.append(f"no fine-grained activation offloading of {', '.join(lay.offload_modules)} here (it needs "
                         "Transformer Engine on a GPU): the trial keeps those activations on the device")
    if m.is_hybrid:
        blocker = gdn_blocker(cuda)
        if blocker is None:
            la = m.linear
            kw.update(experimental_attention_variant="gated_delta_net",
                      linear_attention_freq=[int(t == LINEAR) for t in m.layer_types],
                      linear_conv_kernel_dim=la.conv_kernel, linear_key_head_dim=la.key_head_dim,
                      linear_value_head_dim=la.value_head_dim, linear_num_key_heads=la.num_key_heads,
                      linear_num_value_heads=la.num_value_heads)
        else:
            notes.append(f"{m.count(LINEAR)} Gated DeltaNet layers ran as standard attention: {blocker}")
    if m.mla:
        a = m.mla
        kw.update(q_lora_rank=a.q_lora_rank, kv_lora_rank=a.kv_lora_rank, qk_head_dim=a.qk_nope_head_dim,
                  qk_pos_emb_head_dim=a.qk_rope_head_dim, v_head_dim=a.v_head_dim, rope_type="rope")
        return MLATransformerConfig(**kw), use_te
    return TransformerConfig(**kw), use_te


def _layer_spec(config, use_te: bool, vp_stage: int | None):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    if config.experimental_attention_variant:
        from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
            get_transformer_block_with_experimental_attention_variant_spec,
        )

        return get_transformer_block_with_experimental_attention_variant_spec(config, vp_stage=vp_stage)
    return get_gpt_decoder_block_spec(config, use_transformer_engine=use_te, normalization=config.normalization,
                                      vp_stage=vp_stage)


def _reduce_replicated_experts(chunks: list, layout) -> None:
    """megatron-core 0.16 marks expert weights `allreduce = not (is_expert and EP > 1)` (experts.py,
    tensor_parallel/layers.py), so with EP 1 DDP reduces them over DP only. With ETP < TP the experts
    are replicated on TP ranks that route different tokens (sequence parallel): each replica would
    keep its own shard's gradient and the replicas drift apart. Mark them expert-parallel, so DDP
    reduces them over expert-DP as it does for EP > 1. (TP2 EP1 ETP1 then matches TP1 exactly.)"""
    if layout.ep > 1 or layout.etp >= layout.tp:
        return
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            if ".experts." in name:  # routed experts; shared experts are TP-split like dense MLPs
                param.allreduce = False


def build(plan: TrialPlan, cuda: bool, dtype: torch.dtype) -> Built:
    """This rank's model chunks wrapped in Megatron DDP, the optimizer and the LR schedule."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    notes: list[str] = []
    if plan.model.csa is not None:
        # DeepSeek-V4's dsv4_hybrid attention and hyper-connections exist only in Megatron-LM's dev branch (2026-08 on),
        # not in the megatron-core this runner builds on: its layers stand in as standard attention, one stream
        notes.append("DeepSeek-V4's attention ran as standard attention, without hyper-connections: this megatron-core "
                     "has no dsv4_hybrid variant (a later Megatron-LM does); the trial times a stand-in of its layers")
        m = plan.model
        plan = replace(plan, model=replace(m, csa=None, hc_streams=1, hash_layers=0, layer_types=(FULL,) * m.num_layers))
    if plan.model.mla and not (cuda and has_module("transformer_engine")):
        # megatron-core 0.16.1 builds MLASelfAttention only with TE: the local DotProductAttention
        # takes no k_channels / v_channels (TypeError when the layer is built).
        notes.append("MLA ran as standard attention: megatron-core builds MLA only with Transformer Engine")
        plan = replace(plan, model=replace(plan.model, mla=None))
    config, use_te = transformer_config(plan, cuda, dtype, notes)
    m, lay, w = plan.model, plan.layout, plan.workload
    if lay.cp > 1 and not use_te:
        raise RuntimeError(f"CP {lay.cp} needs Transformer Engine attention on CUDA: megatron's local "
                           "DotProductAttention has no context parallelism")
    vocab = padded_vocab(m, lay.tp)
    chunks = []
    for v in range(lay.vpp):
        vp = v if lay.vpp > 1 else None
        model = GPTModel(
            config, _layer_spec(config, use_te, vp), vocab_size=vocab, max_sequence_length=w.seq_len,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            share_embeddings_and_output_weights=m.tie_embeddings,
            position_embedding_type="rope" if m.rotary_fraction else "none",
            rotary_percent=m.rotary_fraction or 1.0, vp_stage=vp)
        if cuda:
            model.cuda(torch.cuda.current_device())
        chunks.append(model)
    if not cuda:
        # every layout of a CPU trial starts from the same weights, so the convergence gate compares math,
        # not initialisations (megatron draws parameters in build order, which EP and PP change). On GPUs
        # the full tensors this draws per rank would not fit; real runs load a checkpoint instead.
        from .component import layout_invariant_init

        layout_invariant_init(chunks, plan.spec.seed)
    _reduce_replicated_experts(chunks, lay)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=w.grads_fp32, overlap_grad_reduce=lay.overlap_grad_reduce,
        overlap_param_gather=lay.overlap_param_gather and lay.distributed_optimizer,
        use_distributed_optimizer=lay.distributed_optimizer, check_for_nan_in_grad=False)
    chunks = [DistributedDataParallel(config, ddp_config, c, disable_bucketing=i > 0) for i, c in enumerate(chunks)]
    # What megatron's training loop wires up: grads are reduced once per step, after the last
    # micro-batch (no_sync), overlapped with backward when asked, and finalised (DP, TP-norm, PP-embedding).
    one = len(chunks) == 1
    config.no_sync_func = chunks[0].no_sync if one else [c.no_sync for c in chunks]
    config.finalize_model_grads_func = finalize_model_grads
    if ddp_config.overlap_grad_reduce:
        config.grad_sync_func = chunks[0].start_grad_sync if one else [c.start_grad_sync for c in chunks]
    if ddp_config.overlap_param_gather:
        config.param_sync_func = chunks[0].start_param_sync if one else [c.start_param_sync for c in chunks]

    precision_aware = lay.precision_aware_optimizer and use_te
    if lay.precision_aware_optimizer and not precision_aware:
        notes.append("plain distributed optimizer: the precision-aware one needs TE's FusedAdam")
    offload = lay.optimizer_offload if cuda else 0.0
    if lay.optimizer_offload and not cuda:
        notes.append("no optimizer offload on CPU (the optimizer already lives in host memory)")
    opt_config = OptimizerConfig(
        optimizer="adam", lr=w.lr, min_lr=w.min_lr, weight_decay=w.weight_decay, adam_beta1=w.adam_beta1,
        adam_beta2=w.adam_beta2, clip_grad=1.0, bf16=dtype == torch.bfloat16, params_dtype=dtype,
        use_distributed_optimizer=lay.distributed_optimizer, use_precision_aware_optimizer=precision_aware,
        optimizer_cpu_offload=offload > 0, optimizer_offload_fraction=offload or 1.0,
        overlap_cpu_optimizer_d2h_h2d=offload > 0)
    optimizer = get_megatron_optimizer(opt_config, chunks)
    steps = plan.spec.steps
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=w.lr, min_lr=w.min_lr, lr_warmup_steps=int(w.warmup_fraction * steps),
        lr_decay_steps=steps, lr_decay_style="cosine", start_wd=w.weight_decay, end_wd=w.weight_decay,
        wd_incr_steps=steps, wd_incr_style="constant")
    return Built(config=config, chunks=chunks, optimizer=optimizer, scheduler=scheduler, use_te=use_te, notes=notes)
