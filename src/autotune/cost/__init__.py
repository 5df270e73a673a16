"""Pure, vectorised predictions: memory per stage and step time, as named breakdowns.

`evaluate` runs both models over a LayoutTable with the calibrated coefficients of the GPU kind; each
Evaluation carries its predictions' relative standard deviation (`sigma`, from the calibration's residuals and
the terms no calibration row constrained: `uncertainty`), so every tokens/s comes with an interval.
No torch, no ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..catalog import ClusterSpec, ModelSpec, Workload
from ..layout import LayoutTable
from ._comm import routing_summary
from .advice import LEVER_OPTIONS, MEMORY_LEVER_OPTIONS, lever_text, levers, memory_lever, shares_text, step_shares
from .calibrate import Calibration, load_calibration
from .flops import mfu, mfu_of, usd_per_million_tokens
from .memory import TERMS as MEMORY_TERMS
from .memory import MemoryCoefficients, MemoryResult, estimate_memory
from .time import MB_TERMS, STEP_TERMS, TERM_MEANINGS, TimeCoefficients, TimeResult, estimate_time
from .uncertainty import uncertainty

__all__ = [
    "Evaluation",
    "LEVER_OPTIONS",
    "MEMORY_LEVER_OPTIONS",
    "levers",
    "lever_text",
    "shares_text",
    "memory_lever",
    "step_shares",
    "evaluate",
    "MemoryCoefficients",
    "MemoryResult",
    "estimate_memory",
    "MEMORY_TERMS",
    "TimeCoefficients",
    "TimeResult",
    "estimate_time",
    "MB_TERMS",
    "STEP_TERMS",
    "TERM_MEANINGS",
    "Calibration",
    "load_calibration",
    "mfu",
    "mfu_of",
    "usd_per_million_tokens",
    "uncertainty",
    "routing_summary",
]


@dataclass
class Evaluation:
    table: LayoutTable
    memory: MemoryResult
    time: TimeResult
    calibration: Calibration | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.table)

    @cached_property
    def sigma(self) -> np.ndarray:
        """(n,) relative standard deviation of each predicted tokens/s (cost.uncertainty)."""
        return uncertainty(self.time, self.calibration or Calibration("unknown"))

    def interval(self, i: int, k: float = 1.0) -> tuple[float, float]:
        """tokens/s/GPU of layout i at -k and +k sigma (log-normal: x exp(-k sigma), x exp(k sigma))."""
        tps, s = float(self.time.tokens_per_s_per_gpu[i]), float(self.sigma[i])
        return tps * float(np.exp(-k * s)), tps * float(np.exp(k * s))


def evaluate(model: ModelSpec, workload: Workload, cluster: ClusterSpec, table: LayoutTable,
             calibration: Calibration | None = None, memory: MemoryResult | None = None) -> Evaluation:
    """Memory and time of every layout in `table`. `memory`: the memory model's result for exactly these rows,
    already computed with this calibration's memory coefficients (space.explore screens memory first), so it is
    not computed twice."""
    cal = calibration if calibration is not None else load_calibration(cluster.gpu.name)
    mem = memory if memory is not None else estimate_memory(model, workload, cluster, table, cal.memory)
    if len(mem.n_stages) != len(table):
        raise ValueError(f"evaluate: memory result has {len(mem.n_stages)} rows for {len(table)} layouts")
    tim = estimate_time(model, workload, cluster, table, cal.time, cal.memory, mem=mem)
    return Evaluation(table, mem, tim, cal)
