"""Build the `Prediction` record (trials/spec.py) for one row of a cost-model Evaluation.

The record is what crosses into trial files, the dashboard and the planners' context: named memory terms
per pipeline stage and step-time terms, never a bare number. MFU and $ per 1M tokens come from
cost/flops.py, the one place they are computed.
"""

from __future__ import annotations

from ..catalog import ClusterSpec, ModelSpec
from ..cost import Evaluation, mfu, usd_per_million_tokens
from .spec import Prediction

__all__ = ["prediction_of"]


def prediction_of(ev: Evaluation, i: int, model: ModelSpec, cluster: ClusterSpec,
                  tokens_per_s_per_gpu: float | None = None, uncertainty: float | None = None) -> Prediction:
    """Row `i` of `ev` as a Prediction. `tokens_per_s_per_gpu` overrides the model's number (the search's
    residual-corrected value); MFU and $ follow the value recorded."""
    base = float(ev.time.tokens_per_s_per_gpu[i])
    tps = base if tokens_per_s_per_gpu is None else float(tokens_per_s_per_gpu)
    mem = ev.memory
    S = int(mem.n_stages[i])
    usd = float(usd_per_million_tokens(cluster.gpu.usd_per_hour, tps))
    return Prediction(
        tokens_per_s_per_gpu=tps,
        model_tokens_per_s_per_gpu=base,
        uncertainty=uncertainty,
        peak_bytes=float(mem.peak[i]),
        capacity_bytes=float(mem.capacity_bytes),
        host_bytes=float(mem.host_bytes[i]),
        step_time_s=float(ev.time.step_time[i]),
        mfu=float(mfu(model, tps, cluster.gpu.bf16_tflops)),
        usd_per_million_tokens=usd if usd != float("inf") else None,
        memory_terms={k: [float(x) for x in v[i, :S]] for k, v in mem.terms.items()},
        time_terms=ev.time.breakdown(i),
    )
