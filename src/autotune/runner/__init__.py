"""The program that runs ON the GPUs (or this CPU): a megatron-core model and N timed training steps.

`python -m autotune.runner SPEC.json`, once per rank with torchrun's variables. The only package in
autotune that imports torch and megatron.core, and only inside functions: `import autotune.runner`
stays light, and a machine without them gets MissingExtra naming the `trials` extra.

Modules: plan (the resolved, checked trial; no torch), env (ranks, process groups, stack), build
(config, model, DDP, optimizer), data (token rows), loop (timed steps, summary), main (entry and
failure handling), cpu_patches (megatron-core on CPU over gloo).
"""

from ..trials.plan import TrialPlan, plan_trial

__all__ = ["TrialPlan", "plan_trial"]
