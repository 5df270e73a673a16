"""Activation memory parity: bytes one real megatron-core layer saves for backward, against autotune.

For each layer type megatron-core 0.16.1 runs on a CPU (local layer spec, no Transformer Engine), one
TransformerLayer at real widths (bf16, TP1, one gloo rank) runs a forward pass under
`torch.autograd.graph.saved_tensors_hooks`; every saved tensor is counted once per untyped storage
(views and aliases of one buffer count once) and parameters (and views of them) are left out. The
prediction is the sum of autotune's per-layer activation parts (cost/layers.py) at TP1, in bytes per
token.

Three measured numbers per layer (bytes per token):
  raw     everything the layer saves on this CPU. The local DotProductAttention saves the s x s scores,
          the fp32 softmax probabilities and GQA-expanded K/V (so `raw` grows with the sequence), torch's
          RMSNorm saves fp32 copies of its input and output, and the unfused rope its cos/sin tables.
          SwiGLU runs as on GPUs: megatron's fused SwiGLU autograd functions (bias_activation_fusion),
          and megatron's @jit_fuser functions (the output gate) are torch.compile'd as there.
  flash   `raw` with the attention kernel's own saves (everything saved inside core_attention) swapped
          for what TE's fused/flash attention keeps (FusedAttnFunc save_for_backward): q, k, v (bf16,
          K/V not expanded), its output (one buffer with linear_proj's saved input: counted once) and
          the fp32 softmax statistics (one per head per token).
  gpu-eq  `flash` with the other two CPU-only kernels swapped as well: torch RMSNorm -> a fused RMSNorm
          (TE/Apex: its bf16 input and fp32 rstd per row), unfused rope -> TE's fused rope (it saves only
          the frequencies, one table for all layers). This is the number compared with autotune
          (ratio gpu-eq / predicted; tests/parity/test_activations.py), which models the GPU kernels.
Gated DeltaNet and Mamba2 run as megatron's own modules with their GPU kernels' saves (see _gdn_kernels,
_mamba_kernels); MLA as megatron's MLASelfAttention with a core attention that takes its head widths (_mla_spec).

    python bench/activation_parity.py [--seq 256] [--json] [--case NAME ...] [--detail]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from autotune.catalog import Workload, load_model  # noqa: E402
from autotune.catalog.model import FULL, LINEAR, MAMBA, ModelSpec  # noqa: E402
from autotune.cost.layers import GDN_CHUNK, PARTS, layer_tables  # noqa: E402
from autotune.layout import Layout  # noqa: E402

SEQ = 256  # tokens of the micro-batch (one row)
TOLERANCE = 0.15  # tests/parity/test_activations.py: |gpu-eq / predicted - 1| within this


def _one_layer(name: str, *, experts: int | None = None, full_attention: bool = False, **changes) -> ModelSpec:
    """A catalog model cut to one layer at its real widths (experts cut to `experts`)."""
    m = load_model(name)
    ch: dict = dict(num_layers=1, layer_types=(FULL,) if full_attention else m.layer_types[:1], mtp_layers=0)
    if full_attention:
        ch["linear"] = None
    if m.moe is not None and experts:
        ch["moe"] = replace(m.moe, num_experts=experts, top_k=min(m.moe.top_k, experts), dense_layers=())
    ch.update(changes)
    return replace(m, **ch)


# name -> (model, dispatcher, what it covers)
CASES: dict[str, tuple] = {
    "dense-gqa": (lambda: _one_layer("Qwen3-30B-A3B", moe=None, qk_norm=False), "alltoall",
                  "GQA attention (32 heads / 4 KV, head dim 128) + dense SwiGLU MLP 6144, hidden 2048"),
    "dense-gqa-qknorm": (lambda: _one_layer("Qwen3-30B-A3B", moe=None), "alltoall",
                         "as dense-gqa with qk-layernorm"),
    "gated-attn-qknorm": (lambda: _one_layer("Qwen3.5-2B", full_attention=True), "alltoall",
                          "Qwen3.5-2B full attention: output gate, qk-norm, head dim 256, 8/2 heads; dense MLP 6144"),
    "moe-alltoall": (lambda: _one_layer("Qwen3-30B-A3B", experts=32), "alltoall",
                     "Qwen3-30B-A3B layer, 32 experts top-8 (expert FFN 768), alltoall dispatcher"),
    "moe-allgather": (lambda: _one_layer("Qwen3-30B-A3B", experts=32), "allgather",
                      "as moe-alltoall, allgather dispatcher"),
    "moe-shared-alltoall": (lambda: _one_layer("Qwen3.5-35B-A3B", experts=32, full_attention=True), "alltoall",
                            "Qwen3.5-35B-A3B full-attention layer, 32 experts top-8 (FFN 512) + gated shared expert 512"),
    "moe-shared-allgather": (lambda: _one_layer("Qwen3.5-35B-A3B", experts=32, full_attention=True), "allgather",
                             "as moe-shared-alltoall, allgather dispatcher"),
    "gdn-dense": (lambda: _one_layer("Qwen3.5-2B"), "alltoall",
                  "Qwen3.5-2B Gated DeltaNet layer (16 key / 16 value heads of 128, no repeat); dense MLP 6144"),
    "mamba": (lambda: _one_layer("NVIDIA-Nemotron-3-Nano-30B-A3B"), "alltoall",
              "Nemotron 3 Nano's Mamba2 layer (64 heads of 64, state 128, 8 groups, hidden 2688; no FFN)"),
    "mla-moe": (lambda: _one_layer("DeepSeek-V3", experts=8), "alltoall",
                "DeepSeek-V3 MLA layer (128 heads, q / kv latents 1536 / 512, rope 64), 8 experts top-8 (FFN 2048) + shared"),
    "gpt-oss-moe": (lambda: _one_layer("gpt-oss-20b", experts=8), "alltoall",
                    "gpt-oss-20b sliding-window layer (64 heads of 64 / 8 KV, sinks), 8 experts top-4 (FFN 2880): "
                    "quick-GeGLU with its clamp and offset"),
    "gdn-moe": (lambda: _one_layer("Qwen3.5-122B-A10B", experts=32), "alltoall",
                "Qwen3.5-122B-A10B Gated DeltaNet layer (16 key / 64 value heads: q, k repeated 4x), 32 experts "
                "top-8 (FFN 1024) + gated shared expert"),
}

# Gated DeltaNet on a CPU. megatron-core 0.16.1 builds GDN only from a TE block spec, and its three kernels are GPU
# kernels: FLA's chunked gated delta rule and l2norm (Triton) and the causal_conv1d CUDA extension. Here the layer is
# megatron's own GatedDeltaNet with its real forward (the in_proj split, the copies it makes, the repeat of q and k
# over value heads, the gates, the @jit_fuser gated norm) built with local linears, and each GPU kernel replaced by
# an autograd function that computes in PyTorch and saves for backward what the GPU kernel saves, read from their
# source:
#   causal_conv1d   CausalConv1dFn (causal_conv1d_interface.py): x, weight, bias; the activation is recomputed
#   l2norm          fla/modules/l2norm.py L2NormFunction: its output y and an fp32 rstd per row
#   delta rule      fla/ops/gated_delta_rule/chunk.py ChunkGatedDeltaRuleFunction (FLA 0.4): q, k, v, the
#                   chunk-local cumulative g (fp32), beta and A, the WY matrix [B, T, H, 64] in k's dtype
#   out_norm        TENorm: TE's RMSNorm saves its bf16 input and an fp32 rstd per row; torch.compile cannot trace
#                   into it, so @jit_fuser's graph breaks there and the gate product is compiled on its own
# GDN_CHUNK (cost/layers.py): FLA's chunk size (chunk_gated_delta_rule_fwd: chunk_local_cumsum(g, chunk_size=64))


def _causal_conv_silu(x, weight, bias):
    """SiLU of the depthwise causal convolution of x [b, channels, l] (what causal_conv1d and mamba_ssm's fused
    conv-scan compute), weight [channels, width]."""
    import torch.nn.functional as F

    return F.silu(F.conv1d(x, weight.unsqueeze(1), bias, padding=weight.shape[-1] - 1,
                           groups=x.shape[1])[..., : x.shape[-1]])


def _rms_norm_standin():
    """One stand-in for the GPU RMSNorms the mixers build (GDN's out_norm, TE's TENorm; Mamba2's gated norm,
    mamba_ssm's RMSNormGated with z None): it saves its input and an fp32 rstd per row and group, as both kernels do,
    and torch.compile cannot trace into it (TE's cannot be traced, so @jit_fuser breaks its graph there)."""
    import torch

    class GroupRMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, group, eps):
            xg = x.float().reshape(*x.shape[:-1], -1, group)
            rstd = torch.rsqrt(xg.pow(2).mean(-1) + eps)  # (rows, groups)
            ctx.save_for_backward(x, w, rstd)
            ctx.group = group
            return (xg * rstd.unsqueeze(-1)).reshape(x.shape).mul(w.float()).to(x.dtype)

        @staticmethod
        def backward(ctx, dy):
            x, w, rstd = ctx.saved_tensors
            xh = x.float().reshape(*x.shape[:-1], -1, ctx.group) * rstd.unsqueeze(-1)
            g = (dy.float() * w.float()).reshape(xh.shape)
            dx = rstd.unsqueeze(-1) * (g - xh * (g * xh).mean(-1, keepdim=True))
            dw = (dy.float() * xh.reshape(x.shape)).reshape(-1, x.shape[-1]).sum(0)
            return dx.reshape(x.shape).to(x.dtype), dw.to(w.dtype), None, None

    class RMSNorm(torch.nn.Module):
        """Built as GDN builds its out_norm (config=, hidden_size=, eps=) and as MambaMixer builds its norm
        (hidden_size, eps=, group_size=, norm_before_gate=, device=, dtype=)."""

        def __init__(self, hidden_size: int, eps: float = 1e-6, group_size: int | None = None, config=None,
                     dtype=None, **_):
            super().__init__()
            self.eps, self.group_size = eps, group_size or hidden_size
            self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=dtype or config.params_dtype))

        @torch.compiler.disable
        def forward(self, x, z=None):
            assert z is None
            return GroupRMSNorm.apply(x, self.weight, self.group_size, self.eps)

    return RMSNorm


def _gdn_kernels():
    """Autograd functions with the GPU kernels' saves (above): (causal_conv1d_fn, l2norm, chunk_gated_delta_rule)."""
    import torch
    from megatron.core.ssm.gated_delta_net import torch_chunk_gated_delta_rule

    class CausalConv1d(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight, bias)
            return _causal_conv_silu(x, weight, bias)

        @staticmethod
        def backward(ctx, dy):
            saved = [t if t is None else t.detach().requires_grad_() for t in ctx.saved_tensors]  # bias may be None
            ins = [t for t in saved if t is not None]
            with torch.enable_grad():
                grads = iter(torch.autograd.grad(_causal_conv_silu(*saved), ins, dy))
            return tuple(None if t is None else next(grads) for t in saved)

    class L2Norm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            rstd = torch.rsqrt(x.float().pow(2).sum(-1) + 1e-6)
            y = (x.float() * rstd[..., None]).to(x.dtype)
            ctx.save_for_backward(y, rstd)
            return y

        @staticmethod
        def backward(ctx, dy):
            y, rstd = ctx.saved_tensors
            yf, dyf = y.float(), dy.float()
            return ((dyf - (dyf * yf).sum(-1, keepdim=True) * yf) * rstd[..., None]).to(dy.dtype)

    def rule(q, k, v, g, beta):
        return torch_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=GDN_CHUNK)[0].to(q.dtype)

    class DeltaRule(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, g, beta):
            b, t, h = g.shape
            assert t % GDN_CHUNK == 0, f"{t} tokens: a multiple of the {GDN_CHUNK}-token chunk"
            g_cum = g.float().view(b, t // GDN_CHUNK, GDN_CHUNK, h).cumsum(2).view(b, t, h)
            wy = torch.zeros(b, t, h, GDN_CHUNK, dtype=k.dtype)  # the kernel's A (its values play no part here)
            ctx.save_for_backward(q, k, v, g_cum, beta, wy)
            with torch.no_grad():
                return rule(q, k, v, g, beta)

        @staticmethod
        def backward(ctx, do):
            q, k, v, g_cum, beta, _ = ctx.saved_tensors
            b, t, h = g_cum.shape
            c = g_cum.view(b, t // GDN_CHUNK, GDN_CHUNK, h)
            g = torch.cat([c[:, :, :1], c[:, :, 1:] - c[:, :, :-1]], 2).view(b, t, h)
            ins = [x.detach().requires_grad_() for x in (q, k, v, g, beta)]
            with torch.enable_grad():
                return torch.autograd.grad(rule(*ins), ins, do)

    def causal_conv1d_fn(x, weight, bias=None, activation=None, **_):
        assert activation in ("silu", "swish")
        return CausalConv1d.apply(x, weight, bias)

    def chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, **_):
        assert initial_state is None and not output_final_state and not use_qk_l2norm_in_kernel
        return DeltaRule.apply(q, k, v, g, beta), None

    return causal_conv1d_fn, L2Norm.apply, chunk_gated_delta_rule


def _gdn_spec(config, layer_spec, model: ModelSpec):
    """`layer_spec` with megatron's GatedDeltaNet as its mixer (local linears, the stand-ins above); sets the
    config's GDN fields as runner.build does on a GPU."""
    import megatron.core.ssm.gated_delta_net as gdn
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.spec_utils import ModuleSpec

    la = model.linear
    for k, v in dict(linear_conv_kernel_dim=la.conv_kernel, linear_key_head_dim=la.key_head_dim,
                     linear_value_head_dim=la.value_head_dim, linear_num_key_heads=la.num_key_heads,
                     linear_num_value_heads=la.num_value_heads).items():
        setattr(config, k, v)
    gdn.causal_conv1d_fn, gdn.l2norm, gdn.chunk_gated_delta_rule = _gdn_kernels()
    gdn.HAVE_FLA = True
    mixer = ModuleSpec(module=gdn.GatedDeltaNet, submodules=gdn.GatedDeltaNetSubmodules(
        in_proj=ColumnParallelLinear, out_norm=_rms_norm_standin(), out_proj=RowParallelLinear))
    return replace(layer_spec, submodules=replace(layer_spec.submodules, self_attention=mixer))


# Mamba2 on a CPU, the same way: megatron's own MambaMixer (its memory-efficient training path, the one Megatron
# trains with) inside a MambaLayer, local linears, and mamba_ssm's two GPU kernels replaced by functions that save
# what they save, read from mamba_ssm's source (ops/triton/ssd_combined.py, ops/triton/layernorm_gated.py):
#   mamba_split_conv1d_scan_combined  MambaSplitConv1dScanCombinedFn: zxbcdt (the whole in_proj output), the conv's
#                   weight and bias, out_x (the scan's output before the z gate), A, D, dt_bias; the gated output
#                   is computed here with an SSD reference in its quadratic form (the values play no part in the count)
#   RMSNormGated    LayerNormFn (z None): its input and an fp32 rstd per row and group
def _mamba_kernels():
    """mamba_split_conv1d_scan_combined with the GPU kernel's saves (above; the gated norm: _rms_norm_standin)."""
    import torch
    import torch.nn.functional as F

    def ssd(zxbcdt, conv_w, conv_b, dt_bias, A, D, ngroups, headdim):
        """(out, out_x): the gated output and the scan output of Mamba2's SSD, from its definition."""
        b, l, _ = zxbcdt.shape
        H = A.shape[0]
        d_inner = H * headdim
        N = (zxbcdt.shape[-1] - 2 * d_inner - H) // (2 * ngroups)
        z, xbc, dt = torch.split(zxbcdt, [d_inner, d_inner + 2 * ngroups * N, H], dim=-1)
        xbc = _causal_conv_silu(xbc.transpose(1, 2), conv_w, conv_b).transpose(1, 2)
        x, B, C = torch.split(xbc, [d_inner, ngroups * N, ngroups * N], dim=-1)
        x = x.reshape(b, l, H, headdim).float()
        B = B.reshape(b, l, ngroups, N).float().repeat_interleave(H // ngroups, dim=2)
        C = C.reshape(b, l, ngroups, N).float().repeat_interleave(H // ngroups, dim=2)
        dt = F.softplus(dt.float() + dt_bias)  # (b, l, H)
        cum = torch.cumsum(dt * A, dim=1)  # (b, l, H)
        seg = cum.transpose(1, 2).unsqueeze(-1) - cum.transpose(1, 2).unsqueeze(-2)  # (b, H, t, s)
        mask = torch.ones(l, l, dtype=torch.bool).tril()
        L = torch.where(mask, torch.exp(seg.masked_fill(~mask, 0.0)), 0.0)
        scores = torch.einsum("bthn,bshn->bhts", C, B) * L
        y = torch.einsum("bhts,bsh,bshp->bthp", scores, dt, x) + x * D.view(1, 1, H, 1)
        out_x = y.to(zxbcdt.dtype)
        return (y * F.silu(z.float()).reshape(b, l, H, headdim)).reshape(b, l, d_inner).to(zxbcdt.dtype), out_x

    class SplitConvScan(torch.autograd.Function):
        @staticmethod
        def forward(ctx, zxbcdt, conv_w, conv_b, dt_bias, A, D, ngroups, headdim):
            with torch.no_grad():
                out, out_x = ssd(zxbcdt, conv_w, conv_b, dt_bias, A, D, ngroups, headdim)
            ctx.save_for_backward(zxbcdt, conv_w, conv_b, out_x, A, D, dt_bias)
            ctx.shape = (ngroups, headdim)
            return out

        @staticmethod
        def backward(ctx, dout):
            zxbcdt, conv_w, conv_b, _, A, D, dt_bias = ctx.saved_tensors
            ins = [t.detach().requires_grad_() for t in (zxbcdt, conv_w, conv_b, dt_bias, A, D)]
            with torch.enable_grad():
                out, _ = ssd(*ins, *ctx.shape)
                grads = torch.autograd.grad(out, ins, dout)
            return (*grads, None, None)

    def mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size=None,
                                         activation="silu", headdim=None, ngroups=1, norm_before_gate=False,
                                         seq_idx=None, **_):
        assert activation in ("silu", "swish") and seq_idx is None and headdim is not None
        return SplitConvScan.apply(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, ngroups, headdim)

    return mamba_split_conv1d_scan_combined


def _import_without_triton(name: str):
    """Import `name` where Triton is not installed (a CPU torch): megatron's mamba_mixer imports its inference
    contexts' Triton kernels at module level, which training never calls. Stand-in modules answer the import alone
    and are taken out of sys.modules again, so nothing else (torch.compile's backend choice) sees a Triton."""
    import importlib
    from unittest.mock import MagicMock

    if importlib.util.find_spec("triton") is not None:
        return importlib.import_module(name)
    stubs = {k: MagicMock() for k in ("triton", "triton.language")}
    sys.modules.update(stubs)
    try:
        return importlib.import_module(name)
    finally:
        for k, v in stubs.items():
            if sys.modules.get(k) is v:
                del sys.modules[k]


def _mamba_spec(config, model: ModelSpec):
    """A MambaLayer spec (local norm and linears, the stand-ins above); sets the config's Mamba fields."""
    mm = _import_without_triton("megatron.core.ssm.mamba_mixer")
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.spec_utils import ModuleSpec

    mb = model.mamba
    for k, v in dict(mamba_state_dim=mb.state_dim, mamba_head_dim=mb.head_dim, mamba_num_groups=mb.num_groups,
                     mamba_num_heads=mb.num_heads, use_mamba_mem_eff_path=True).items():
        setattr(config, k, v)
    mm.mamba_split_conv1d_scan_combined, mm.ExtendedRMSNorm = _mamba_kernels(), _rms_norm_standin()
    mm.HAVE_MAMBA_SSM = True
    norm = get_gpt_layer_local_spec().submodules.input_layernorm  # the local RMSNorm the other cases use
    return ModuleSpec(module=MambaLayer, submodules=MambaLayerSubmodules(
        norm=norm, mixer=ModuleSpec(module=mm.MambaMixer, submodules=mm.MambaMixerSubmodules(
            in_proj=ColumnParallelLinear, out_proj=RowParallelLinear)), mamba_bda=get_bias_dropout_add))


# MLA on a CPU: megatron's MLASelfAttention with its latent norms and local linears, and a core attention that takes
# the k_channels / v_channels MLA passes (megatron-core 0.16.1's local DotProductAttention takes neither; TE's does).
# Its own saves do not matter: the swap below replaces whatever core_attention saves by the flash kernel's.
def _mla_core_attention():
    import torch
    import torch.nn.functional as F

    class CoreAttention(torch.nn.Module):
        def __init__(self, config, layer_number, attn_mask_type, attention_type, softmax_scale=None, k_channels=None,
                     v_channels=None, **_):
            super().__init__()
            self.softmax_scale = softmax_scale

        def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [s, b, n, d] -> [b, n, s, d]
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
            return out.permute(2, 0, 1, 3).reshape(out.shape[2], out.shape[0], -1)  # [s, b, n * v_dim]

    return CoreAttention


def _mla_spec(config, use_te: bool):
    """The local MLA layer spec, with the latent norms megatron's DeepSeek recipes run (--qk-layernorm) and the core
    attention above."""
    import megatron.core.transformer.multi_latent_attention as mla

    from autotune.runner.build import _layer_spec

    if not isinstance(mla.TELinear, type):  # no TE: its `isinstance(linear_proj, TELinear)` check needs a type to be False
        mla.TELinear = type("NoTELinear", (), {})
    config.qk_layernorm = True
    spec = _layer_spec(config, use_te, None).layer_specs[0]
    attn = spec.submodules.self_attention
    sub = replace(attn.submodules, core_attention=_mla_core_attention())
    return replace(spec, submodules=replace(spec.submodules, self_attention=replace(attn, submodules=sub)))


def predicted(model: ModelSpec) -> dict[str, float]:
    """autotune's activation bytes per token of layer 0 at TP1 (every divisor is 1), by part."""
    act = layer_tables(model).act[0]
    return {p: float(act[j]) for j, p in enumerate(PARTS) if act[j]}


def _plan(model: ModelSpec, dispatcher: str, seq: int):
    from autotune.trials.plan import TrialPlan

    class _Spec:
        steps = 2

    lay = Layout(world=1, dispatcher=dispatcher)
    workload = Workload(seq_len=-(-seq // 128) * 128, global_batch=1, steps=2, window=(1, 1))
    return TrialPlan(spec=_Spec(), model=model, layout=lay, workload=workload,  # type: ignore[arg-type]
                     rows_per_microbatch=1, num_microbatches=1)


def measure(name: str, seq: int = SEQ) -> dict:
    """Build case `name` as one layer on this rank (megatron parallel state at TP1 must be set up), run a
    forward pass, count the saved bytes. Returns per-token numbers and a per-module breakdown."""
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.transformer.spec_utils import build_module

    from autotune.runner.build import _layer_spec, transformer_config

    make, dispatcher, _ = CASES[name]
    model = make()
    config, use_te = transformer_config(_plan(model, dispatcher, seq), False, torch.bfloat16, [])
    # The GPU run's activation kernel: megatron's fused SwiGLU autograd functions (they save only their
    # input, and the weighted one the routing probabilities), pure PyTorch, so they run here as well.
    # The runner turns the fusion off without TE (bias_activation_fusion=use_te).
    config.bias_activation_fusion = True
    spec = _mla_spec(config, use_te) if model.mla else _layer_spec(config, use_te, None).layer_specs[0]
    extra = {}
    if model.layer_types[0] == LINEAR:
        spec = _gdn_spec(config, spec, model)
    elif model.layer_types[0] == MAMBA:
        from megatron.core.process_groups_config import ProcessGroupCollection

        spec = _mamba_spec(config, model)
        extra["pg_collection"] = ProcessGroupCollection.use_mpu_process_groups()  # MambaStack passes them on a GPU
    layer = build_module(spec, config=config, layer_number=1, **extra)
    layer.train()
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}

    stack: list[str] = []
    hooks = []
    swapped: dict[str, list] = defaultdict(list)  # module -> tensors its GPU kernel saves instead
    for mname, mod in layer.named_modules():
        hooks.append(mod.register_forward_pre_hook(lambda m, a, n=mname: stack.append(n)))
        hooks.append(mod.register_forward_hook(lambda m, a, o: None if stack.pop() else None))
        if mname.endswith("core_attention"):
            hooks.append(mod.register_forward_pre_hook(lambda m, a, n=mname: swapped[n].extend(a[:3])))
            hooks.append(mod.register_forward_hook(lambda m, a, o, n=mname: swapped[n].append(o)))
        elif (mname.endswith("layernorm") or mname == "norm") and any(True for _ in mod.parameters()):  # not an IdentityOp
            hooks.append(mod.register_forward_pre_hook(lambda m, a, n=mname: swapped[n].append(a[0])))

    saved: dict[int, dict] = {}  # untyped storage -> what first saved it

    def pack(t):
        st = t.untyped_storage()
        key = st.data_ptr()
        if st.nbytes() and key not in params and key not in saved:
            saved[key] = {"bytes": st.nbytes(), "module": stack[-1] if stack else "<input>", "dtype": str(t.dtype),
                          "shape": tuple(t.shape), "leaf": t.grad_fn is None}
        return t

    torch.manual_seed(0)
    x = torch.randn(seq, 1, model.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    rope = RotaryEmbedding(kv_channels=model.head_dim, rotary_percent=model.rotary_fraction,
                           rotary_base=10000)(seq)
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(hidden_states=x, attention_mask=None, rotary_pos_emb=None if model.mla else rope)  # MLA: its own
        out = out[0] if isinstance(out, tuple) else out  # a TransformerLayer returns (output, context)
    fwd_s = time.perf_counter() - t0
    for h in hooks:
        h.remove()
    out.float().sum().backward()  # the graph is whole: every saved tensor was usable
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()

    raw = sum(r["bytes"] for r in saved.values())
    flash = _swap(saved, swapped, model, seq, kinds=("attention",))
    gpu = _swap(saved, swapped, model, seq, kinds=("attention", "norm", "rope"))
    by_module: dict[str, float] = defaultdict(float)
    for r in saved.values():
        by_module[f"{r['module']} [{r['dtype'].replace('torch.', '')}]"] += r["bytes"] / seq
    pred = predicted(model)
    return {
        "case": name, "dispatcher": dispatcher, "seq": seq, "forward_s": round(fwd_s, 3),
        "raw": raw / seq, "flash": flash / seq, "gpu": gpu / seq, "predicted": sum(pred.values()),
        "predicted_parts": pred, "by_module": dict(sorted(by_module.items())),
        "saved": [{**r, "bytes": r["bytes"] / seq} for r in saved.values()],
    }


def _kind(module: str) -> str | None:
    """Which CPU-only kernel a module is, or is inside: the local (unfused) attention, a torch RMSNorm."""
    for part in module.split("."):
        if part == "core_attention":
            return "attention"
        if part.endswith("layernorm"):
            return "norm"
    return "norm" if module == "norm" else None  # a MambaLayer's own input norm


def _is_rope_table(r: dict, module: str) -> bool:
    # megatron's unfused rope (models/common/embeddings/rope_utils.py _apply_rotary_pos_emb_bshd)
    # builds cos/sin tables [s, 1, 1, rotary dim] from the frequencies in the attention module itself,
    # for q and for k; they carry no grad_fn. TE's fused rope saves only the frequencies, shared by
    # every layer.
    return module.endswith("self_attention") and r["leaf"] and len(r["shape"]) == 4 and r["shape"][1:3] == (1, 1)


def _swap(saved: dict, swapped: dict, model: ModelSpec, seq: int, kinds: tuple[str, ...]) -> float:
    """Saved bytes with the named CPU kernels' saves replaced by what their GPU kernels save:
    attention  TE's fused/flash attention (FusedAttnFunc: q, k, v, out and the fp32 softmax statistics,
               one per head and token); q, k, v, out count as whole tensors unless their storage is
               saved anyway (the output is linear_proj's input: one buffer)
    norm       TE's / Apex's fused RMSNorm: its bf16 input and fp32 rstd per row
    rope       TE's fused rope: nothing per layer"""
    keep = {}
    for key, r in saved.items():
        kind = _kind(r["module"])
        if kind in kinds or ("rope" in kinds and _is_rope_table(r, r["module"])):
            continue
        keep[key] = r["bytes"]
    extra = 0
    for module, tensors in swapped.items():
        if _kind(module) not in kinds:
            continue
        for t in tensors:
            key = t.untyped_storage().data_ptr()
            if key not in keep:
                keep[key] = t.numel() * t.element_size()
        if _kind(module) == "attention":
            extra += 4 * model.num_heads * seq
        else:
            extra += 4 * tensors[0].numel() // tensors[0].shape[-1]
    return sum(keep.values()) + extra


def _init_world_of_one() -> None:
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from autotune.runner import cpu_patches

    cpu_patches.apply()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    ps.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(1234)


def table(rows: list[dict]) -> str:
    head = f"{'layer type':<22} {'disp.':<9} {'raw':>9} {'flash':>9} {'gpu-eq':>9} {'predicted':>9} " \
           f"{'raw/pred':>8} {'flash/pred':>10} {'gpu-eq/pred':>11}"
    lines = [head, "-" * len(head)]
    for r in rows:
        p = r["predicted"]
        lines.append(f"{r['case']:<22} {r['dispatcher']:<9} {r['raw']:>9,.0f} {r['flash']:>9,.0f} {r['gpu']:>9,.0f} "
                     f"{p:>9,.0f} {r['raw'] / p:>8.3f} {r['flash'] / p:>10.3f} {r['gpu'] / p:>11.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=SEQ, help="tokens per micro-batch (one row)")
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="run only these (repeatable)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--detail", action="count", default=0,
                    help="also print saved bytes/token per module (twice: per saved tensor)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    _init_world_of_one()
    rows = [measure(c, args.seq) for c in (args.case or CASES)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"megatron-core one layer, bf16, TP1, {args.seq} tokens; bytes saved for backward per token\n")
    print(table(rows))
    print("\nflash: core_attention's saves swapped for TE flash attention's (q, k, v, out, softmax stats); "
          "gpu-eq: also torch RMSNorm -> fused norm (input, rstd) and unfused rope -> fused rope (nothing); "
          "gpu-eq/pred is the compared ratio")
    if args.detail:
        for r in rows:
            print(f"\n{r['case']}: predicted parts {json.dumps({k: round(v) for k, v in r['predicted_parts'].items()})}")
            for k, v in r["by_module"].items():
                print(f"  {v:>10,.1f}  {k}")
            if args.detail > 1:
                for t in r["saved"]:
                    print(f"    {t['bytes']:>10,.1f}  {t['module']} {t['dtype']} {t['shape']}{' leaf' if t['leaf'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
