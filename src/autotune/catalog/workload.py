"""Workload: what is trained, independent of how it is laid out.

Defaults are the seed page's SFT setting: 8,192-token rows, global batch 128 rows, BF16, Adam (lr 1e-5
cosine to 1e-6, warmup 0.1, wd 0.1, betas 0.9/0.98), 20 steps scored over steps 5..19, the MoE
load-balancing loss off. `precision` picks BF16, one of Transformer Engine's FP8 recipes (`FP8_RECIPES`) or
NVFP4 (`FP4_RECIPES`); `QUANT` says, per precision, which tensor-core peak the TE linears' GEMMs run at and
whether the recipe reads each tensor once more for an amax. `train_mtp` adds the multi-token-prediction
block's forward and backward (`mtp_passes` times: Megatron's --mtp-num-layers, which with a repeated layer
runs one block several times) to the step. `framework` says whose memory behaviour applies (FRAMEWORKS): autotune
runs Megatron-core; the other values describe published measurements of other stacks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadInput

__all__ = ["Workload", "PRECISIONS", "FP8_RECIPES", "FP4_RECIPES", "QUANT", "FRAMEWORKS", "QUANT_MODULES",
           "recipe_precision", "precision_of_class", "ROWS_FIELDS", "MAX_ROWS", "routing_of", "rows_of"]

# what `estimate`, `space`, `search` and the dashboard state of a run's rows (rows_of), with its routing
ROWS_FIELDS = ("seq_len", "global_batch", "precision")
MAX_ROWS = 2**24  # the largest sequence length or global batch read from a user or a table


def _field(workload: "Workload | dict", key: str):
    return workload.get(key) if isinstance(workload, dict) else getattr(workload, key)


def routing_of(workload: "Workload | dict") -> str:
    """How a run's MoE router spreads tokens (the CLI's --routing): natural (the load-balancing loss off, the seed's),
    aux-loss (the loss on) or forced (--moe-router-force-load-balancing); a stored study's workload dict too."""
    return ("forced" if _field(workload, "force_balance") else "aux-loss" if _field(workload, "load_balancing_loss")
            else "natural")


def rows_of(workload: "Workload | dict") -> dict:
    """The rows a run trains on, as the CLI's JSON states them: {seq_len, global_batch, precision, routing}; of a
    Workload or a stored study's workload dict."""
    return {**{k: _field(workload, k) for k in ROWS_FIELDS}, "routing": routing_of(workload)}

# the training framework whose memory behaviour the cost model applies (cost/_state.py, cost/_sac.py): Megatron-core
# (what autotune emits and runs); the others describe published measurements: torchtitan (torch FSDP2 on an fp32 model,
# per-op selective activation checkpointing), NeMo AutoModel (torch FSDP2 on a BF16 model), Meta's Llama 3 stack
FRAMEWORKS = ("megatron", "torchtitan", "automodel", "llama3")
# whose attention kernel runs: "te" (Transformer Engine's fused attention, cuDNN's Hopper/Blackwell kernels, as
# Megatron runs it) or "sdpa" (PyTorch's scaled_dot_product_attention on its flash backend, FlashAttention-2, as
# torchtitan and NeMo AutoModel's TorchSDPA runs do; cost/_terms.py SDPA_SLOWDOWN)
ATTENTION_KERNELS = ("te", "sdpa")
# TE linears a low-precision recipe may keep in another format (`quant_overrides`, cost/_quant.py): attention's QKV and
# output projections, LatentMoE's latent projections, Mamba's out_proj; the formats they may keep
QUANT_MODULES = ("attention", "latent_proj", "mamba_out_proj")
QUANT_OVERRIDE_FORMATS = ("bf16", "mxfp8")

# precision -> (Megatron --fp8-format, --fp8-recipe); None: BF16 everywhere. Transformer Engine quantises the
# inputs of every TE linear (QKV, projections, MLP, grouped experts); attention's core and the output layer
# (a plain ColumnParallelLinear) stay BF16. Formats: hybrid (E4M3 forward, E5M2 gradients) for the per-tensor
# recipes, as Megatron-Bridge's bf16_with_fp8_*_mixed presets; E4M3 with block scales for blockwise and MXFP8.
FP8_RECIPES: dict[str, tuple[str, str] | None] = {
    "bf16": None,
    "fp8-delayed": ("hybrid", "delayed"),  # amax history, scales from past iterations
    "fp8-tensorwise": ("hybrid", "tensorwise"),  # per-tensor current scaling (an amax pass per tensor)
    "fp8-blockwise": ("e4m3", "blockwise"),  # 128x128 weight / 1x128 activation blocks (DeepSeek-V3 style)
    "mxfp8": ("e4m3", "mxfp8"),  # 32-element blocks with E8M0 scales, Blackwell tensor cores only
}
# precision -> (Megatron --fp4-format, --fp4-recipe). TE's NVFP4BlockScaling (Megatron-Bridge bf16_with_nvfp4_mixed,
# the recipe of its NVFP4 perf rows): E2M1 values with E4M3 scales per 16 elements and an FP32 per-tensor scale
# (two-level scaling, so an amax per tensor as current scaling has); the fprop, dgrad and wgrad GEMMs of every TE
# linear run in NVFP4 (random Hadamard transforms on wgrad inputs, stochastic rounding of gradients); attention's
# core, the embedding and the output layer stay BF16 (arXiv:2509.25149, "Pretraining LLMs with NVFP4").
FP4_RECIPES: dict[str, tuple[str, str]] = {"nvfp4": ("e2m1", "nvfp4")}
PRECISIONS = tuple(FP8_RECIPES) + tuple(FP4_RECIPES)
# precision -> (GEMM format of the TE linears: "bf16" | "fp8" | "fp4", amax pass over each cast tensor)
QUANT: dict[str, tuple[str, bool]] = {
    "bf16": ("bf16", False), "fp8-delayed": ("fp8", False), "fp8-tensorwise": ("fp8", True),
    "fp8-blockwise": ("fp8", False), "mxfp8": ("fp8", False), "nvfp4": ("fp4", True),
}
# a recipe's workload section names the precision class (the TE linears' GEMM format: bf16, fp8, fp4); the recipe
# within it (delayed, tensorwise, blockwise, mxfp8, nvfp4) is in its run block's --fp8-recipe / --fp4-recipe. A
# class with no such flags is Megatron's default recipe for it (--fp8-recipe delayed, --fp4-recipe nvfp4)
_CLASS_DEFAULT = {"bf16": "bf16", "fp8": "fp8-delayed", "fp4": "nvfp4"}


def recipe_precision(precision: str) -> str:
    """The recipe's precision class of a workload precision: bf16, fp8 or fp4."""
    return QUANT[precision][0] if precision in QUANT else precision


def precision_of_class(cls: str) -> str:
    """The workload precision a recipe's precision class means without recipe flags (fp16 / fp32 stay as they are)."""
    return _CLASS_DEFAULT.get(cls, cls)


@dataclass(frozen=True)
class Workload:
    seq_len: int = 8192  # tokens per row
    global_batch: int = 128  # rows per optimizer step
    precision: str = "bf16"
    optimizer: str = "adam"
    lr: float = 1e-5
    min_lr: float = 1e-6
    warmup_fraction: float = 0.1
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    steps: int = 20
    window: tuple[int, int] = (5, 19)  # steps scored for tokens/s (inclusive)
    load_balancing_loss: bool = False
    # --moe-router-force-load-balancing (benchmarks): every expert gets the same tokens, no routing imbalance;
    # it replaces the router's choice, so it changes the math (published MoE benchmarks run it)
    force_balance: bool = False
    train_mtp: bool = False
    mtp_passes: int = 0  # MTP block passes per step when train_mtp (0: the model's MTP layer count)
    task: str = "sft"
    # gradient buffers and their DP reduction in fp32 (--accumulate-allreduce-grads-in-fp32, as the seed);
    # False: bf16, Megatron-core's default and what Megatron-Bridge's performance recipes use
    grads_fp32: bool = True
    # FP8 recipes only: parameters kept and all-gathered in FP8 (--fp8-param-gather): half the bytes of the
    # distributed optimizer's parameter all-gather and no BF16 weight copy
    fp8_param_gather: bool = False
    # FP8 recipes only: attention's core in FP8 (--fp8-dot-product-attention: cuDNN's FP8 fused attention; its
    # matrix products at the FP8 rate, its softmax exponentials as before)
    fp8_attention: bool = False
    # MXFP8 only: the output layer (LM head) as a TE linear under MXFP8 (megatron-core's fp8_output_proj)
    fp8_output_proj: bool = False
    framework: str = "megatron"  # FRAMEWORKS: whose weights, gradients, optimizer state and "selective" recompute
    # NeMo AutoModel's FSDP2 with moe.reshard_after_forward: true (its Nemotron 3 Super and Ultra benchmark YAMLs):
    # MoE blocks resharded after forward like any unit; False: they stay gathered until backward (cost/_state.py)
    fsdp_reshard_moe: bool = False
    # optimizer state per parameter a rank owns, bytes; 0: the framework's own (Megatron: fp32 master + Adam m, v, 12)
    optimizer_state_bytes: float = 0.0
    # low-precision recipes only: the last N decoder layers' linears in BF16 (--first-last-layers-bf16
    # --num-layers-at-end-in-bf16 N), and (module, format) pairs a recipe keeps out of its format (QUANT_MODULES)
    bf16_layers_end: int = 0
    quant_overrides: tuple = ()
    # torchtitan without torch.compile: its Llama's RMSNorm, rotary embedding and SwiGLU run op by op in eager PyTorch
    # (fp32 round trips through HBM) rather than fused (cost/_terms.py EAGER_*_BYTES)
    eager: bool = False
    attention_kernel: str = "te"  # ATTENTION_KERNELS
    # LoRA fine-tuning: the base weights are frozen (no weight-gradient GEMMs, no gradients, no optimizer state and
    # no DP gradient traffic for them); only the adapters train. The adapters themselves (rank 8-64 on a few
    # linears: well under 1% of the GEMM work and of the parameters) are not counted
    lora: bool = False
    # fine-tuning on packed sequences (THD with cu_seqlens, Megatron's packed_sequence_specs): each row holds several
    # documents of about this many tokens and attention runs within each; 0: every row is one document
    packed_doc_len: int = 0

    def __post_init__(self):
        if self.seq_len <= 0 or self.seq_len % 128:
            raise BadInput(f"--seq-len {self.seq_len}: must be a positive multiple of 128 (e.g. 4096, 8192)")
        if self.global_batch <= 0:
            raise BadInput(f"--global-batch {self.global_batch}: must be a positive number of rows")
        if self.precision not in QUANT:
            raise BadInput(f"--precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if isinstance(self.mtp_passes, bool) or not isinstance(self.mtp_passes, int) or self.mtp_passes < 0:
            raise BadInput(f"mtp_passes {self.mtp_passes!r}: must be a non-negative integer (0: the model's MTP layers)")
        if self.fp8_param_gather and not self.fp8:
            raise BadInput("--fp8-param-gather needs an FP8 precision (e.g. --precision fp8-tensorwise); "
                           "drop it for bf16")
        if self.fp8_attention and not self.fp8:
            raise BadInput("--fp8-attention needs an FP8 precision (e.g. --precision mxfp8); drop it for "
                           f"{self.precision}")
        if self.fp8_output_proj and self.precision != "mxfp8":
            raise BadInput(f"--fp8-output-proj runs the output layer under MXFP8 only, not {self.precision}; use "
                           "--precision mxfp8 or drop it")
        if isinstance(self.optimizer_state_bytes, bool) or not 0 <= self.optimizer_state_bytes <= 32:
            raise BadInput(f"optimizer_state_bytes {self.optimizer_state_bytes!r}: bytes per owned parameter, 0 to 32 "
                           "(0: the framework's own, e.g. 12 for fp32 master + Adam m, v)")
        if isinstance(self.bf16_layers_end, bool) or not isinstance(self.bf16_layers_end, int) or self.bf16_layers_end < 0:
            raise BadInput(f"bf16_layers_end {self.bf16_layers_end!r}: a non-negative number of decoder layers")
        bad = [o for o in self.quant_overrides if not (isinstance(o, (tuple, list)) and len(o) == 2
                                                       and o[0] in QUANT_MODULES and o[1] in QUANT_OVERRIDE_FORMATS)]
        if bad:
            raise BadInput(f"quant_overrides {bad!r}: (module, format) pairs, module one of {', '.join(QUANT_MODULES)}, "
                           f"format one of {', '.join(QUANT_OVERRIDE_FORMATS)}")
        if self.framework not in FRAMEWORKS:
            raise BadInput(f"framework {self.framework!r}: choose one of {', '.join(FRAMEWORKS)}")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise BadInput(f"attention_kernel {self.attention_kernel!r}: choose one of {', '.join(ATTENTION_KERNELS)}")
        if self.optimizer != "adam":
            raise BadInput(f"optimizer {self.optimizer!r}: only adam is modelled; use adam")
        if isinstance(self.packed_doc_len, bool) or not isinstance(self.packed_doc_len, int) or self.packed_doc_len < 0:
            raise BadInput(f"--packed-doc-len {self.packed_doc_len!r}: the mean document length of packed rows in tokens, "
                           "a non-negative integer (0: each row is one document)")
        lo, hi = self.window
        if not 0 <= lo <= hi < self.steps:
            raise BadInput(f"window {self.window}: must satisfy 0 <= first <= last < steps ({self.steps})")

    def check_gpu(self, gpu) -> None:
        """BadInput when the GPU cannot run this precision (no FP8 tensor cores; MXFP8 before Blackwell)."""
        if self.fp8 and not gpu.fp8_tflops:
            raise BadInput(f"--precision {self.precision}: {gpu.name} has no FP8 tensor cores; use bf16")
        if self.precision == "mxfp8" and not gpu.mxfp8:
            raise BadInput(f"--precision mxfp8: {gpu.name} has no MXFP8 tensor cores (Blackwell only); "
                           "use fp8-tensorwise or fp8-blockwise")
        if self.fp4 and not gpu.fp4_tflops:
            raise BadInput(f"--precision {self.precision}: {gpu.name} has no FP4 tensor cores (Blackwell only); "
                           + ("use fp8-tensorwise" if gpu.fp8_tflops else "use bf16"))

    def check_model(self, model) -> None:
        """BadInput when the model cannot take rows this long: a learned absolute position table has one row per
        position, and Megatron asserts --max-position-embeddings >= --seq-length (training/arguments.py)."""
        if model.learned_positions and self.seq_len > model.learned_positions:
            raise BadInput(f"--seq-len {self.seq_len}: {model.name} has learned position embeddings for "
                           f"{model.learned_positions:,} positions only; use --seq-len {model.learned_positions} or less")

    def rows(self) -> dict:
        """rows_of(self): {seq_len, global_batch, precision, routing}."""
        return rows_of(self)

    @property
    def attention_span(self) -> int:
        """Tokens one attention call spans: the row, or a packed row's document."""
        return min(self.seq_len, self.packed_doc_len) if self.packed_doc_len else self.seq_len

    @property
    def fp8(self) -> bool:
        return FP8_RECIPES.get(self.precision) is not None

    @property
    def fp4(self) -> bool:
        return self.precision in FP4_RECIPES

    @property
    def quantized(self) -> bool:
        """The TE linears run low-precision GEMMs (an FP8 or FP4 recipe) and pay for the casts."""
        return QUANT[self.precision][0] != "bf16"

    @property
    def amax_pass(self) -> bool:
        """The recipe reads each cast tensor once more for its amax (per-tensor current scaling, NVFP4)."""
        return QUANT[self.precision][1]

    def linear_peak_tflops(self, gpu) -> float:
        """Dense peak of the TE linears' GEMMs on `gpu` under this precision."""
        fmt = QUANT[self.precision][0]
        return {"bf16": gpu.bf16_tflops, "fp8": gpu.fp8_tflops, "fp4": gpu.fp4_tflops}[fmt]

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    @property
    def window_tokens(self) -> int:
        lo, hi = self.window
        return (hi - lo + 1) * self.tokens_per_step
