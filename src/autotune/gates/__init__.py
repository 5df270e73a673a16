"""Correctness gates: does a faster layout still train the same model?

- configuration: the candidate's arguments against the reference's, by the classes of
  skill/correctness/numerics_list.yaml (layout / performance pass, kernel needs a component test,
  numerics or unknown fails).
- convergence: loss curves step by step (Megatron-Bridge's validate_convergence plus NaN and coverage).
- component: one MoE layer with a candidate dispatcher against an FP32 reference (runner/component.py).
- section: the recipe's `correctness` section from the results, and the overall status.

Nothing here imports torch; the component gate starts runner processes for that.
"""

from .configuration import argument_differences, configuration_gate
from .convergence import PROFILES, LossCurve, Thresholds, convergence_gate, read_losses
from .arguments import candidate_arguments, recipe_arguments
from .result import GateResult
from .rules import load_rules
from .section import correctness_section, recipe_status, run_gates

__all__ = ["GateResult", "configuration_gate", "argument_differences", "convergence_gate", "read_losses",
           "LossCurve", "Thresholds", "PROFILES", "load_rules", "candidate_arguments", "recipe_arguments",
           "correctness_section", "recipe_status", "run_gates"]
