"""How a recipe is launched: the slime run block, the flags and environment it carries, and slime's model
arguments (MODEL_ARGS). Shared by recipes (which write it), the gates (which compare it) and the slime
trial backend (which runs it); imports none of them."""

from .model_args import (AUX_LOSS_ON, Activation, mlp_activation, model_notes, norm_epsilon, rope_args,
                         slime_model_args)
from .run_block import ENTRY_PLACEHOLDER, SEED_ENV, build_run_block, loss_mask_for, num, run_env, workload_args

__all__ = ["SEED_ENV", "ENTRY_PLACEHOLDER", "run_env", "build_run_block", "workload_args", "num", "loss_mask_for",
           "slime_model_args", "AUX_LOSS_ON", "Activation", "mlp_activation", "model_notes", "norm_epsilon",
           "rope_args"]
