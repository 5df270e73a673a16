"""Reading a training log back into StepRecords: Megatron-LM's and slime's own per-step lines.

Megatron-LM (`megatron/training/training.py: training_log`, printed by the last rank):
    ` [2025-08-01 07:19:50] iteration        2/    5000 | consumed samples:          256 | elapsed time
    per iteration (ms): 12936.1 | ... | global batch size:   128 | lm loss: 1.044022E+01 | loss scale:
    1.0 | grad norm: 26.305 | number of skipped iterations:   0 | number of nan iterations:   0 |`
  and its memory report (`report_memory`, after the first iterations, per DP-rank-0):
    `[Rank 0] (after 1 iterations) memory (MB) | allocated: 10770.37 | max allocated: 15754.88 |
    reserved: 16334.0 | max reserved: 16334.0`
  Iterations count from 1; a trial's steps count from 0, so iteration N is step N-1. With
  --log-interval above 1 the time is the interval's mean, recorded on the logged iteration only.

slime (its own train loop, `slime/backends/megatron_utils/model.py` and
`slime/observability/train_metric_utils.py: log_perf_data`), under its logger's
`[%(asctime)s] file:line - ` prefix and often Ray's `(ActorName pid=N) ` prefix:
    `step 3: {'train/loss': 1.02, 'train/grad_norm': 0.4, ..., 'train/global_batch_size': 128, 'train/step': 3}`
    `perf 3: {'perf/train_wait_time': 0.01, 'perf/actor_train_time': 12.1, 'perf/train_time': 12.3, 'perf/step_time': 12.31, ...}`
  `step` is the accumulated train step (from 0); `perf` is per rollout, whose time is split evenly over
  that rollout's train steps (one per rollout when rollout batch = global batch, as in the seed).
The dict reprs are read with a regex, never evaluated: a log is data.
"""

from __future__ import annotations

import math
import re
import statistics

from ..spec import StepRecord

__all__ = ["parse_training_log", "window_metrics"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ITER = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|(.*)$")
_MEM = re.compile(
    r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: ([\d.]+) \| max allocated: ([\d.]+)"
    r" \| reserved: ([\d.]+) \| max reserved: ([\d.]+)"
)
_SLIME_STEP = re.compile(r"(?:^|\s|- )(step|perf) (\d+): (\{.*\})\s*$")
_SLIME_MEM = re.compile(r"\[Rank (\d+)\] Memory-Usage .*?: (\{.*\})\s*$")
_PAIR = re.compile(r"'([^']+)':\s*([^,}]+)")
MB = 1024 * 1024


def _num(text: str) -> float | None:
    try:
        return float(text.strip().strip("'\""))
    except ValueError:
        return None


def _fields(rest: str) -> dict[str, float]:
    out = {}
    for part in rest.split("|"):
        key, sep, value = part.rpartition(":")
        if sep and (v := _num(value)) is not None:
            out[key.strip()] = v
    return out


def parse_training_log(text: str, seq_len: int, global_batch: int) -> tuple[list[StepRecord], dict[int, int]]:
    """Steps (ascending, from 0) and peak memory per rank in bytes, from Megatron's or slime's lines."""
    mega: dict[int, dict] = {}
    slime: dict[int, dict] = {}
    perf: dict[int, float] = {}
    peak: dict[int, int] = {}
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        if m := _ITER.search(line):
            f = _fields(m.group(3))
            t = f.get("elapsed time per iteration (ms)")
            if t is not None:
                mega[int(m.group(1)) - 1] = {
                    "time_s": t / 1000.0,
                    "rows": int(f.get("global batch size", global_batch)),
                    "lm_loss": f.get("lm loss"),
                    "grad_norm": f.get("grad norm"),
                }
        elif mems := _MEM.findall(line):  # ranks printing at once can share a line
            for rank, _it, _alloc, max_alloc, _res, _max_res in mems:
                peak[int(rank)] = max(peak.get(int(rank), 0), int(float(max_alloc) * MB))
        elif m := _SLIME_STEP.search(line):
            d = {k: _num(v) for k, v in _PAIR.findall(m.group(3))}
            if m.group(1) == "step":
                slime[int(m.group(2))] = d
            else:
                t = d.get("perf/step_time") or d.get("perf/train_time") or d.get("perf/actor_train_time")
                if t is not None:
                    perf[int(m.group(2))] = t
        elif m := _SLIME_MEM.search(line):
            # slime prints current (not peak) usage: the largest reserved figure seen is a lower bound.
            gb = {k: _num(v) for k, v in _PAIR.findall(m.group(2))}.get("reserved_GB")
            if gb is not None:
                peak[int(m.group(1))] = max(peak.get(int(m.group(1)), 0), int(gb * 1024**3))
    rows = mega or _from_slime(slime, perf, global_batch)  # Megatron's own lines win when both exist
    per_rank = [peak[r] for r in sorted(peak)]
    return [
        StepRecord(step=s, time_s=v["time_s"], tokens=v["rows"] * seq_len, lm_loss=v["lm_loss"],
                   grad_norm=v["grad_norm"], peak_memory_bytes=per_rank)
        for s, v in sorted(rows.items())
    ], peak


def _from_slime(steps: dict[int, dict], perf: dict[int, float], global_batch: int) -> dict[int, dict]:
    if not steps or not perf:
        return {}
    per_rollout = max(1, round(len(steps) / len(perf)))
    out = {}
    for s, d in steps.items():
        t = perf.get(s // per_rollout)
        if t is None:
            continue
        out[s] = {
            "time_s": t / per_rollout,
            "rows": int(d.get("train/global_batch_size") or global_batch),
            "lm_loss": d.get("train/loss"),
            "grad_norm": d.get("train/grad_norm"),
        }
    return out


def window_metrics(steps: list[StepRecord], window: tuple[int, int], gpus: int) -> dict | None:
    """tokens/s/GPU (window tokens / window time / GPUs), mean step time and step-time CV (%) over the
    inclusive window; None when a step of the window is missing or not finite."""
    lo, hi = window
    by_step = {s.step: s for s in steps}
    inside = [by_step.get(i) for i in range(lo, hi + 1)]
    if any(s is None or not math.isfinite(s.time_s) or s.time_s <= 0 for s in inside):
        return None
    times = [s.time_s for s in inside]
    mean = statistics.fmean(times)
    cv = statistics.stdev(times) / mean * 100 if len(times) > 1 else 0.0  # sample stdev, as the runner
    return {
        "tokens_per_s_per_gpu": sum(s.tokens for s in inside) / sum(times) / gpus,
        "step_time_s": mean,
        "step_time_cv_percent": cv,
        "window": (lo, hi),
    }
