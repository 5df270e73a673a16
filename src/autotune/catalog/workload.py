"""Workload: what is trained, independent of how it is laid out.

Defaults are the seed page's SFT setting: 8,192-token rows, global batch 128 rows, BF16, Adam
(lr 1e-5 cosine to 1e-6, warmup 0.1, wd 0.1, betas 0.9/0.98), 20 steps scored over steps 5..19, the
MoE load-balancing loss off.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadInput

__all__ = ["Workload"]


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
    train_mtp: bool = False
    task: str = "sft"
    # gradient buffers and their DP reduction in fp32 (--accumulate-allreduce-grads-in-fp32, as the seed);
    # False: bf16, Megatron-core's default and what Megatron-Bridge's performance recipes use
    grads_fp32: bool = True

    def __post_init__(self):
        if self.seq_len <= 0 or self.seq_len % 128:
            raise BadInput(f"--seq-len {self.seq_len}: must be a positive multiple of 128 (e.g. 4096, 8192)")
        if self.global_batch <= 0:
            raise BadInput(f"--global-batch {self.global_batch}: must be a positive number of rows")
        if self.precision != "bf16":
            raise BadInput(f"precision {self.precision!r}: only bf16 is modelled; use bf16")
        if self.optimizer != "adam":
            raise BadInput(f"optimizer {self.optimizer!r}: only adam is modelled; use adam")
        lo, hi = self.window
        if not 0 <= lo <= hi < self.steps:
            raise BadInput(f"window {self.window}: must satisfy 0 <= first <= last < steps ({self.steps})")

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    @property
    def window_tokens(self) -> int:
        lo, hi = self.window
        return (hi - lo + 1) * self.tokens_per_step
