"""`python -m ep_runner SPEC.json`: autotune's trial runner, with the routed experts initialised by global
expert index (runner.component.experts_by_global_index) right after the model is built.

Megatron's CPU initialisation gives each EP rank the same local experts, so EP1 and EP2 trials start
from different models and their loss curves cannot be compared step for step. Until build.py makes
that call itself, the EP1-vs-EP2 convergence test runs both arms through this module.
"""

from __future__ import annotations

import sys

from autotune.runner import build as _build
from autotune.runner.component import experts_by_global_index
from autotune.runner.main import main

_upstream = _build.build


def build(plan, cuda, dtype):
    built = _upstream(plan, cuda, dtype)
    experts_by_global_index(built.chunks, plan.spec.seed)
    return built


_build.build = build

if __name__ == "__main__":
    sys.exit(main())
