"""`python -m ep_runner SPEC.json`: autotune's trial runner, with the weights re-initialised by
runner.component.layout_invariant_init right after the model is built.

Megatron's CPU initialisation gives EP2 and PP2 trials other initial weights than EP1 PP1, so their loss
curves cannot be compared step for step. Until runner/build.py makes that call itself, the EP1-vs-EP2
convergence test runs both arms through this module.
"""

from __future__ import annotations

import sys

from autotune.runner import build as _build
from autotune.runner.component import layout_invariant_init
from autotune.runner.main import main

_upstream = _build.build


def build(plan, cuda, dtype):
    built = _upstream(plan, cuda, dtype)
    layout_invariant_init(built.chunks, plan.spec.seed)
    return built


_build.build = build

if __name__ == "__main__":
    sys.exit(main())
