"""The timed training steps of a trial, when to stop them early, and their summary.

Each step: the DP rank's rows as micro-batches, megatron's forward_backward_func (1F1B, interleaved
with VPP, or no pipelining), the optimizer step and the LR schedule. Then, outside the timed part, a
few small collectives put the global lm loss, the slowest rank's step time and every rank's peak memory
on all ranks, so that every rank sees a NaN at the same step and rank 0 can write the StepRecord.

With spec.early_stop set, a trial ends before its step cap (spec.steps) when (steady_window) the mean
step time over every scored step so far is known, with 95% confidence, to within +-accuracy_percent (default
1%) of the mean the full trial would score (steps warmup..cap-1, N of them): the Student-t interval
t(0.975, n-1) x CV / sqrt(n) x sqrt(1 - n / N) after at least `window` (3) scored steps. The last factor is the
finite-population correction: the n steps seen are part of the N the full trial would average, so only the
N - n steps not yet run can still move it (the early mean's difference from the full one has variance
CV^2 (1/n - 1/N)). With `reference="mean"` the factor is 1: the mean step time itself (the true one, not the
full trial's estimate) known to +-accuracy_percent, which takes (t CV / accuracy)^2 steps whatever the cap. A
steady GPU step (the seed's CV of 0.57%) stops after 4 scored steps either way; at a 1.8% CV (this machine's
steadiest CPU trials) the window rule stops after 8 scored steps of 15, the mean rule runs to the cap.
Or it ends when (clearly_losing) its scored steps so far put it below the incumbent with probability
`confidence`. Both read the slowest rank's step time, which every rank holds
after the all-reduce, so every rank stops at the same step.
"""

from __future__ import annotations

import gc
import math
import resource
import statistics
import sys
import time
from contextlib import contextmanager
from typing import Callable

import torch

from ..trials.failure import NonFiniteLoss
from ..trials.spec import StepRecord, TrialResult
from .build import Built
from ..trials.plan import TrialPlan

__all__ = ["train", "manual_gc", "summarize", "peak_memory_bytes", "steady_window", "mean_half_width_percent", "clearly_losing", "early_stop_reason"]

_Z = {0.9: 1.2816, 0.95: 1.6449, 0.975: 1.96, 0.99: 2.3263, 0.995: 2.5758, 0.999: 3.0902}


def _z(confidence: float) -> float:
    """One-sided normal quantile (a few tabulated levels; others by the nearest lower one)."""
    return _Z[max((c for c in _Z if c <= confidence), default=0.9)]


# Student t quantiles t(0.975, df) for df = 1..30; above 30 the normal's 1.96 is within 2%
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def mean_half_width_percent(times: list[float], total: int | None = None) -> float:
    """Half the 95% confidence interval of the mean of `times`, in percent of that mean (inf below 2); with
    `total` (the steps the full mean will average, these among them), of the difference from that full mean."""
    n = len(times)
    mean = statistics.fmean(times) if n else 0.0
    if n < 2 or mean <= 0:
        return float("inf")
    t = _T975[n - 2] if n - 1 <= len(_T975) else 1.96
    left = math.sqrt(max(0.0, 1.0 - n / total)) if total and total > 0 else 1.0
    return t * statistics.stdev(times) / math.sqrt(n) * left / mean * 100


def steady_window(times: list[float], warmup: int, window: int, accuracy_percent: float,
                  cap: int | None = None) -> tuple[int, int] | None:
    """(warmup, last) when at least `window` steps are scored (after `warmup`) and their mean step time is
    known to +-accuracy_percent (95%): of the mean over steps warmup..cap-1 when `cap` is given, else of the
    true mean; else None. `times[i]` is step i's time."""
    scored = times[warmup:]
    if len(scored) < max(window, 2):
        return None
    total = cap - warmup if cap else None
    return (warmup, len(times) - 1) if mean_half_width_percent(scored, total) <= accuracy_percent else None


def clearly_losing(times: list[float], warmup: int, tokens_per_step: int, count: int, incumbent: float,
                   min_steps: int = 3, confidence: float = 0.99) -> float | None:
    """The trial's optimistic tokens/s/GPU (the mean step time minus z standard errors) when even that is
    below `incumbent`, else None. Needs `min_steps` scored steps."""
    scored = times[warmup:]
    if len(scored) < max(min_steps, 2):
        return None
    mean = statistics.fmean(scored)
    se = statistics.stdev(scored) / math.sqrt(len(scored))
    fastest = max(mean - _z(confidence) * se, 1e-12)
    best_case = tokens_per_step / fastest / count
    return best_case if best_case < incumbent else None


def early_stop_reason(plan: TrialPlan, times: list[float]) -> tuple[str, tuple[int, int]] | None:
    """Why to stop after the steps timed so far (with the window to score), or None to go on."""
    rule = plan.spec.early_stop
    if rule is None or len(times) >= plan.spec.steps:
        return None
    warm = plan.spec.warmup_steps
    cap = rule.cap(plan.spec.steps)
    win = steady_window(times, warm, rule.window, rule.accuracy_percent, cap)
    if win is not None:
        of = f"the {plan.spec.steps}-step trial's" if cap else "the true"
        half = mean_half_width_percent(times[warm:], cap - warm if cap else None)
        return (f"steady: mean step time within +-{half:.2f}% "
                f"of {of} (95%; rule {rule.accuracy_percent:g}%) over steps {win[0]}..{win[1]}, "
                f"stopped at {len(times)} of {plan.spec.steps} steps"), win
    if rule.incumbent_tokens_per_s_per_gpu:
        best = clearly_losing(times, warm, plan.tokens_per_step, plan.spec.count, rule.incumbent_tokens_per_s_per_gpu,
                              rule.min_steps, rule.confidence)
        if best is not None:
            why = (f"losing: at best {best:,.1f} tokens/s/GPU ({rule.confidence:.0%} bound) against the incumbent's "
                   f"{rule.incumbent_tokens_per_s_per_gpu:,.1f}, stopped at {len(times)} of {plan.spec.steps} steps")
            return why, (warm, len(times) - 1)
    return None


def peak_memory_bytes(cuda: bool) -> int:
    """Peak device memory of this rank: the CUDA allocator's peak, or on CPU the process's max RSS."""
    if cuda:
        return int(torch.cuda.max_memory_allocated())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


def _microbatches(plan: TrialPlan, rows, device) -> list[dict]:
    from megatron.core import parallel_state as ps

    seq, mbs = plan.workload.seq_len, plan.rows_per_microbatch
    out = []
    for i in range(plan.num_microbatches):
        chunk = torch.as_tensor(rows[i * mbs:(i + 1) * mbs])
        batch = {
            "tokens": chunk[:, :-1].contiguous(), "labels": chunk[:, 1:].contiguous(),
            "loss_mask": torch.ones(chunk.shape[0], seq, dtype=torch.float32),
            "position_ids": torch.arange(seq).unsqueeze(0).expand(chunk.shape[0], seq).contiguous(),
        }
        if plan.layout.cp > 1:  # each CP rank keeps its two (load-balanced) sequence chunks
            from megatron.core.utils import get_batch_on_this_cp_rank

            batch["attention_mask"] = None
            batch = get_batch_on_this_cp_rank(batch, cp_group=ps.get_context_parallel_group())
        out.append({k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()})
    return out


def _forward_step(data_iterator, model):
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])

    def loss_func(losses):
        mask = batch["loss_mask"]
        total = (losses.float() * mask).sum()
        count = mask.sum()
        # The schedule divides the returned loss by the micro-batch count in place: report a copy.
        return total / count, {"lm loss": torch.stack([total.detach().clone(), count.detach().clone()])}

    return output, loss_func


@contextmanager
def manual_gc():
    """Python's collector off while steps are timed; the young generations collected by hand between steps and
    everything once before the first (Megatron's --manual-gc, for the same reason: a collection that lands inside
    a step stretches that step alone, on one rank, and the slowest rank's time is the step's)."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def train(plan: TrialPlan, built: Built, source, cuda: bool, on_step: Callable[[StepRecord], None],
          stopped: dict | None = None) -> list[StepRecord]:
    """Run the timed steps; with spec.early_stop, `stopped` receives {"reason", "window"} on an early end."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    forward_backward = get_forward_backward_func()
    vpp = plan.layout.vpp
    per_rank = plan.num_microbatches * plan.rows_per_microbatch
    dp_rank = ps.get_data_parallel_rank()
    counts_loss = ps.is_pipeline_last_stage(ignore_virtual=True) and ps.get_tensor_model_parallel_rank() == 0
    world = torch.distributed.get_world_size()
    records = []
    with manual_gc():
        for step in range(plan.spec.steps):
            rows = source.rows(step, dp_rank * per_rank, per_rank)
            micro = _microbatches(plan, rows, device)
            data = [iter(micro) for _ in range(vpp)] if vpp > 1 else iter(micro)
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            for chunk in built.chunks:
                chunk.zero_grad_buffer()
            built.optimizer.zero_grad()
            losses = forward_backward(
                forward_step_func=_forward_step, data_iterator=data,
                model=built.chunks if vpp > 1 else built.chunks[0], num_microbatches=plan.num_microbatches,
                # The full row length: the schedule divides by CP (and by TP under SP) itself.
                seq_length=plan.workload.seq_len, micro_batch_size=plan.rows_per_microbatch, forward_only=False)
            _, grad_norm, _ = built.optimizer.step()
            built.scheduler.step(increment=1)
            if cuda:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            gc.collect(1)  # untimed; ranks realign in the collectives below before the next step's clock starts

            # Outside the timed part: global loss, slowest rank, every rank's peak memory.
            local = torch.zeros(2, dtype=torch.float64)
            if counts_loss and losses:
                local = torch.stack([d["lm loss"].double().cpu() for d in losses]).sum(0)
            on_dev = local.to(device)
            torch.distributed.all_reduce(on_dev)
            slowest = torch.tensor([elapsed], dtype=torch.float64, device=device)
            torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
            peaks = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
            torch.distributed.all_gather(peaks, torch.tensor([peak_memory_bytes(cuda)], dtype=torch.int64, device=device))
            total, count = on_dev.tolist()
            loss = total / count if count else float("nan")
            norm = None if grad_norm is None else float(grad_norm)
            record = StepRecord(step=step, time_s=float(slowest.item()), tokens=plan.tokens_per_step, lm_loss=loss,
                                grad_norm=norm, peak_memory_bytes=[int(p.item()) for p in peaks])
            records.append(record)
            on_step(record)
            if not math.isfinite(loss) or (norm is not None and not math.isfinite(norm)):
                raise NonFiniteLoss(f"step {step}: lm loss {loss}, grad norm {norm}")
            early = early_stop_reason(plan, [r.time_s for r in records])
            if early is not None:
                if stopped is not None:
                    stopped.update(reason=early[0], window=early[1])
                break
    return records


def summarize(plan: TrialPlan, records: list[StepRecord], window: tuple[int, int] | None = None,
              stopped_early: str | None = None, **fields) -> TrialResult:
    """An ok TrialResult: tokens/s/GPU and step-time CV over the window after the warm-up steps (or the
    window an early stop used)."""
    lo, hi = window or plan.window
    window = [r for r in records if lo <= r.step <= hi]
    times = [r.time_s for r in window]
    mean = statistics.fmean(times)
    cv = statistics.stdev(times) / mean * 100 if len(times) > 1 and mean > 0 else 0.0
    tokens = sum(r.tokens for r in window)
    peak = max((max(r.peak_memory_bytes) for r in records if r.peak_memory_bytes), default=None)
    spec = plan.spec
    return TrialResult(
        study=spec.study, number=spec.number, status="ok", tokens_per_s_per_gpu=tokens / sum(times) / spec.count,
        step_time_s=mean, step_time_cv_percent=cv, peak_memory_bytes=peak, window=(lo, hi), steps=records,
        proxy=spec.proxy, stopped_early=stopped_early, **fields)
