"""How a recipe is launched: the slime run block and the flags and environment it carries. Shared by
recipes (which write it) and the slime trial backend (which runs it); imports neither."""

from .run_block import ENTRY_PLACEHOLDER, SEED_ENV, build_run_block, loss_mask_for, num, workload_args

__all__ = ["SEED_ENV", "ENTRY_PLACEHOLDER", "build_run_block", "workload_args", "num", "loss_mask_for"]
