"""The time model's physics coefficients (`TimeCoefficients`): efficiencies and fixed costs of an ideal Megatron-core
+ Transformer Engine implementation, each with its source, plus the calibrated factors (`scale`). time.py and
_terms.py read them; calibrate.py fits only `scale`. No torch, no ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TimeCoefficients"]


@dataclass(frozen=True)
class TimeCoefficients:
    """Efficiencies of an ideal implementation (Hopper, Megatron-core + TE), and the calibrated factors.

    The physics uses the efficiencies; calibration never changes them, it multiplies whole terms
    (`scale`: term name -> factor, missing = 1), so a fitted factor reads as "this term is x% off"."""

    gemm: float = 0.75  # dense BF16 GEMM at large shapes, fraction of peak (cuBLAS ~740 TF/s on H100 at 8k^3)
    gemm_width: float = 160.0  # narrowest GEMM side at which efficiency halves (tile/wave quantisation)
    gemm_rows: float = 256.0  # tokens per GEMM at which efficiency halves
    grouped: float = 0.85  # grouped GEMM relative to one dense GEMM of the same per-expert shape
    attention: float = 0.45  # flash attention at head dim 128, fraction of peak (backward ~2.5x forward FLOPs)
    attention_exp: float = 0.42  # exp (SFU) cost per score relative to the d = 128 MMA work (_terms.attention_efficiency)
    linear_attention: float = 0.12  # Gated DeltaNet chunked kernels (Triton), fraction of peak
    mem_touch: float = 2.0  # times each saved activation byte crosses HBM in elementwise kernels per pass
    nvlink_eff: float = 0.70  # achieved fraction of NVLink bandwidth (NCCL busbw ~320 of 450 GB/s on H100)
    net_eff: float = 0.70  # achieved fraction of the network bandwidth
    flex_nvl: float = 0.85  # DeepEP intra-node throughput relative to NCCL all-to-all
    # the flex dispatcher's achieved share of the network's line rate: DeepEP's normal kernels run at 43-58 GB/s
    # RDMA bottleneck bandwidth on ~50 GB/s CX7 (deepseek-ai/DeepEP docs/legacy.md, EP 16-64), where NCCL's
    # all-to-all gets `net_eff`
    flex_net: float = 0.9
    # HybridEP's NVLink dispatch + combine throughput relative to DeepEP's, each at megatron-core 0.16's default SM
    # count (moe_hybridep_num_sms 16, moe_deepep_num_sms 20): DeepEP's hybrid-ep branch, docs/README_Hybrid-EP.md,
    # 8 ranks, BF16, 4,096 tokens of hidden 7,168, top-8, Torch API. B200: HybridEP 535.9 / 530.9 GB/s (dispatch /
    # combine) against DeepEP 421 / 361 (interpolated between its 16- and 24-SM rows, 348 / 302 and 494 / 420):
    # (1/421 + 1/361) / (1/535.9 + 1/530.9) = 1.37. GB200: 550.1 / 538.4 against 437 / 368 (from 362 / 310 and
    # 513 / 426): 1.36. The network leg is the same RDMA path as DeepEP's (HybridEP's H100 IB table: 41-58 GB/s at
    # 16-64 ranks, DeepEP's 43-58), so `flex_net` serves both
    hybridep_nvl_gain: float = 1.36
    cp_hidden: float = 0.5  # share of the CP ring exchange hidden behind attention
    p2p_hidden_vpp: float = 0.8  # share of PP sends hidden when interleaved (Megatron overlaps p2p with VPP)
    launch_s: float = 1.0e-4  # per layer per pass: launches the GPU work does not hide
    moe_sync_s: float = 8.0e-4  # per MoE layer per forward pass: host sync on token counts drains the launch queue
    # per recompute region per micro-batch: re-entrant backward, RNG save/restore, a sync at the region edge;
    # the seed measured 2-layer regions 3.5% faster than 1-layer ones at the same recompute FLOPs
    recompute_group_s: float = 2.5e-3
    dp_overlap: float = 1.0  # DP traffic hides behind this many micro-batch stage times (first fwd, last bwd)
    optimizer_bytes: float = 40.0  # HBM bytes per locally held parameter in the optimizer step
    step_overhead_s: float = 0.15  # per step: data, logging, loss reduction, schedule setup
    # optimizer offload: torch's fused CPU AdamW reads param, grad, m, v and writes param, m, v (fp32): 28 B per
    # parameter of DRAM traffic. Measured on this project's CPU machine (torch 2.13, 64M parameters): fused
    # AdamW runs at 1.6-1.7 G params/s against a 29-33 GB/s triad, i.e. bandwidth-bound at ~19 triad-bytes
    # per parameter (triad counts no write-allocate, so ~25 real bytes): the 28 B traffic model holds.
    cpu_adam_bytes: float = 28.0
    offload_copy_bytes: float = 8.0  # fp32 gradient down (4 B) and updated fp32 parameter up (4 B)
    host_mem_eff: float = 0.6  # achieved share of the node's DRAM bandwidth with every rank stepping at once
    host_link_eff: float = 0.8  # achieved share of PCIe bandwidth for pinned copies
    shared_overlap_gain: float = 0.8  # share of shared-expert compute hidden by --moe-shared-expert-overlap
    # FP8: an FP8 GEMM's achieved share of the FP8 peak relative to a BF16 GEMM's share of the BF16 peak.
    # cuBLAS on H100 SXM at 8k^3: ~1,300-1,450 TF/s FP8 (66-73% of 1,979) against ~740 BF16 (75% of 989)
    # (NVIDIA's "H100 Tensor Core GPU" whitepaper plots; TE's own GEMM benchmarks): ~0.9
    fp8_gemm: float = 0.9
    # blockwise scaling (1x128 / 128x128 scales) rescales partial sums inside the GEMM: ~80% of per-tensor
    # FP8 speed. FBGEMM's H100 kernels (pytorch/FBGEMM#2546, 500 W, 8k^3 to 65k x 8k x 7k, quantization excluded):
    # block 828-870 TF/s against row-wise 1,083-1,141, 0.73-0.77. (DeepGEMM's 1,350-1,550 TF/s on H800 is its best
    # shapes. The one same-page pair, DeepSeek-V3 on 1,024 H100 in Megatron-Bridge 25.09, measured blockwise 1.02x
    # tensorwise over the whole step where the model says 0.97x: one pair, not enough to move it)
    fp8_blockwise: float = 0.8
    quant_bytes: float = 4.0  # per quantised element: read BF16 (2 B), write FP8 row-wise and column-wise (2 x 1 B)
    # host launches, per layer per forward + backward: PyTorch eager dispatch costs ~10-20 us of host time per
    # kernel (Python, autograd, the dispatcher); a dense layer (norms, projections, attention, MLP) launches ~100
    # kernels forward and backward, an MoE block (router, permute, all-to-all, grouped GEMMs, unpermute, the
    # token-count sync) ~300 more: ~1.5 ms and ~4.5 ms. The fit scales both (`host_bound`)
    host_layer_s: float = 1.5e-3
    host_moe_s: float = 4.5e-3
    # share of those launches CUDA graphs replay: the attention scope (norm, QKV, attention, projection: ~3/4 of a
    # dense layer's kernels), the router scopes (router, top-k, permutation preprocessing: ~1/3 of an MoE block's)
    host_graph_attn: float = 0.75
    host_graph_router: float = 0.33
    # compute lost per second of communication hidden beside it: HybridEP / DeepEP / NCCL all-to-all kernels hold
    # ~32 of 132-148 SMs (Megatron-Bridge's moe_hybridep_num_sms = 32) while they run: ~0.22; userbuffers'
    # reduce-scatter runs on SMs (the all-gather on copy engines): ~0.1
    ep_overlap_sm: float = 0.22
    tp_overlap_sm: float = 0.1
    amax_bytes: float = 2.0  # per-tensor current scaling: an extra BF16 read for the amax before the cast
    # MXFP8's block-scaled GEMMs against per-tensor FP8's on Blackwell, kernels alone: Transformer Engine's GEMM
    # profiling guide (docs/examples/gemm_profiling/gemm_profiling.rst, B300, 5B-model shapes, --pre-quantize):
    # 6.812 ms per layer FP8 current scaling vs 7.161 ms MXFP8 (the E8M0 scale loads): 0.95
    mxfp8_gemm: float = 0.95
    # NVFP4's GEMMs run at the FP4 peak x fp8_gemm. Measured and not adopted (3 and 4 December): capping them at the
    # same guide's B300 kernel speed-up over FP8 current scaling (1.81x, 3.764 vs 6.812 ms per layer) moved
    # Llama-3.1-70B's NVFP4 / MXFP8 ratio on 64 GB300 from 1.73 to 1.41 (measured 1.50) but the NVFP4 rows'
    # leave-one-source-out MAPE from 7.4% to 12.4%: the guide's 5B-model shapes are smaller than the published models'
    # fixed GPU time of one local expert's GEMM: Transformer Engine's grouped linear issues one cuBLAS GEMM per expert
    # over a few streams (transformer_engine/common/gemm/cublaslt_gemm.cu, multi-stream cuBLAS); each kernel pays a
    # launch gap (~3-5 us) and a partly filled last wave (half a wave of a 20-60 us expert GEMM): ~10 us
    expert_gemm_s: float = 1e-5
    # share of a GEMM's shape loss (gemm_efficiency below its large-shape value: the operand and result traffic a
    # narrow or short GEMM cannot hide) that is low-precision operands, which shrink with the format's bytes
    # (_terms.OPERAND_BYTES: FP8 about half of BF16's, NVFP4 with its scales 0.28); the rest stays. Read as HBM
    # traffic (gemm_rows = 256 is H100's ridge point for reading the weights: peak x gemm / HBM bandwidth = 989 x
    # 0.75 / 3,350 = 221) and counted per pass: the forward and data-gradient GEMMs read the weights in FP8, the
    # weight-gradient GEMM accumulates into FP32 main_grad (Megatron's gradient-accumulation fusion): 2 of 3; the
    # activations are read in FP8 (forward and data-gradient inputs, both weight-gradient operands) and written in
    # BF16 (forward and data-gradient outputs): again about 2 of 3. Speeding all of it up with the peak overstated
    # FP8's gain on small-expert MoE models: pairs of one layout and source in BF16 and FP8 (Megatron-LM's
    # moe_recipes README) measured Qwen3-30B-A3B at 0.99x on 32 H100 (blockwise) and 0.97x on 16 GB200 (MXFP8),
    # predicted 1.06x and 1.11x
    lowp_overhead_share: float = 2.0 / 3.0
    # fixed GPU time of one quantize kernel per local expert: Transformer Engine's GroupedLinear splits its input per
    # expert and quantizes the splits one kernel each (split_quantize -> multi_tensor_quantize_impl,
    # transformer_engine/pytorch/csrc/extensions/cast.cpp, v2.8 to v2.16: "Currently only have fused kernel for FP8
    # delayed scaling"; NVFP4's splits are grouped from v2.11: _terms.GROUPED_CASTS); per-tensor current scaling
    # runs an amax, a scale and a cast kernel (quantizer.cpp). Four casts per expert per MoE layer and micro-batch
    # (fc1 and fc2 inputs, their output gradients); each small bandwidth-bound kernel pays a launch gap (~3-5 us,
    # as `expert_gemm_s`'s) on top of its bytes, which `quantize` already counts
    quant_kernel_s: float = 4e-6
    scale: dict = field(default_factory=dict)  # term -> calibrated factor (missing = 1)

    def physics_key(self) -> tuple:
        """Everything but the factors: the cache key of unscaled terms."""
        return tuple(getattr(self, f) for f in self.__dataclass_fields__ if f != "scale")
