"""How far to trust a prediction: a relative standard deviation of tokens/s for every layout.

Two parts, added in quadrature (log space, so a relative std):
  - the calibration's residual: the RMS log error of the rows it was fitted on (`rms_log_error_after` in
    its report), inflated by HELD_OUT for layouts unlike those rows (bench/throughput_accuracy.py: the
    leave-one-model-out error runs at about 1.5x the in-sample error), floored at the rows' own noise;
  - each step-time term no calibration row constrained (not in the report's `fitted_terms`: no row spends 1% of
    its step there, e.g. activation offload or CUDA-graph host time on a kind whose rows never use them)
    contributes its share of the step time x the fit's prior width (0.2 in log-factor: what an unconstrained
    factor may be off).
A GPU kind that borrows a sibling's calibration (no rows of its own) adds BORROWED. The search can use
`uncertainty(...)` as its prior sigma per candidate. No torch, no ray.
"""

from __future__ import annotations

import numpy as np

from ..catalog import Workload
from .calibrate import FIT_PRECISIONS, Calibration
from .time import STEP_TERMS, TimeResult

__all__ = ["uncertainty", "HELD_OUT", "PRIOR", "BORROWED", "FLOOR"]

# held-out / in-sample error ratio: bench/throughput_accuracy.py's LOMO against in-sample MAPE, 11.9 / 7.8% = 1.5
# (12.7 / 9.0% = 1.4 before). With it the printed interval holds 69% of the rows' leave-one-model-out predictions
# within 1 sigma and 94% within 2 (the bench's coverage line; 2.0, used until 5 December, gave 82% and 97%: too wide)
HELD_OUT = 1.5
PRIOR = 0.2  # log-factor prior width of calibrate.fit: one sigma for a term no row has constrained
BORROWED = 0.10  # a kind on a sibling's factors (same SM, other memory / network): measured nothing itself
FLOOR = 0.07  # calibrate.fit's row noise: run-to-run and software-version spread
# terms whose factors no row of an unfitted precision (NVFP4: calibrate.FIT_PRECISIONS) has constrained
UNFITTED_PRECISION_TERMS = ("compute_dense", "compute_experts", "quantize")


def uncertainty(time: TimeResult, calibration: Calibration, workload: Workload | None = None) -> np.ndarray:
    """Relative standard deviation of each layout's predicted tokens/s (n,)."""
    rep = calibration.report or {}
    rms = float(rep.get("rms_log_error_after") or 0.0)
    base = max(FLOOR, HELD_OUT * rms) if rep else PRIOR  # uncalibrated: every term at its prior width
    fitted = set(rep.get("fitted_terms") or [])
    if workload is not None and workload.precision not in FIT_PRECISIONS:  # NVFP4 rows are never fitted
        fitted -= set(UNFITTED_PRECISION_TERMS)
    total = np.maximum(time.step_time, 1e-12)
    free = np.zeros(len(total))
    for k in STEP_TERMS:
        if k not in fitted:
            free += (time.step_terms[k] / total * PRIOR) ** 2
    borrowed = BORROWED if "has none of its own" in calibration.provenance else 0.0
    return np.sqrt(base ** 2 + free + borrowed ** 2)
