"""`python -m autotune.runner SPEC.json`: one rank of a trial.

Started once per rank with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT). Writes next to the spec: rank 0 `steps.jsonl` (a StepRecord per step, as it goes) and
`trial_result.json`. Exit codes: 0 ok, 2 bad input (one line on stderr, before any process group
starts), 1 a failed trial. A failing rank prints a marker line (see trials/failure.py); rank 0 writes
the failed TrialResult itself unless its error is only the echo of a peer's failure (a communication
error), which the backend then classifies from every rank's log.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

from ..errors import BadInput, MissingExtra, require
from ..trials.failure import classify_exception, marker
from ..trials.spec import TrialResult, TrialSpec, read_model, write_json_atomic
from ..trials.plan import TrialPlan, plan_trial
from .env import RankEnv, rank_env, watch_parent

__all__ = ["main", "run_rank"]

USAGE = "usage: python -m autotune.runner SPEC.json"


def _dtype_name(cuda: bool) -> str:
    """bf16 as the workload says on GPUs; fp32 on CPU, where bf16 matmuls are slow and noisy.
    AUTOTUNE_RUNNER_DTYPE=bf16|fp32 overrides either."""
    forced = os.environ.get("AUTOTUNE_RUNNER_DTYPE", "").strip().lower()
    if forced in ("bf16", "fp32"):
        return forced
    return "bf16" if cuda else "fp32"


def run_rank(plan: TrialPlan, env: RankEnv, out_dir: Path) -> int:
    """Run this rank of the trial; returns the exit code (or leaves with os._exit(1) on failure)."""
    import torch

    from .build import build
    from .data import make_source
    from .env import detect_stack, init_distributed
    from .loop import summarize, train

    rank, started = env.rank, time.monotonic()
    steps_path = out_dir / "steps.jsonl"
    records, notes, stack = [], [], {}
    if rank == 0:
        steps_path.unlink(missing_ok=True)

    def on_step(record):
        records.append(record)
        if rank == 0:
            with steps_path.open("a") as fh:
                fh.write(record.model_dump_json() + "\n")
            print(f"step {record.step}: {record.time_s:.3f} s, lm loss {record.lm_loss:.4f}, "
                  f"grad norm {record.grad_norm}", flush=True)

    try:
        cuda = init_distributed(env, plan, plan.spec.timeout_s)
        stack = detect_stack(cuda)
        dtype_name = _dtype_name(cuda)
        if not cuda and dtype_name == "fp32":
            notes.append("fp32 on CPU (set AUTOTUNE_RUNNER_DTYPE=bf16 for bf16)")
        dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
        built = build(plan, cuda, dtype)
        notes += built.notes
        if rank == 0:
            print(f"rank 0: {plan.layout.label(plan.model.is_moe)} of {plan.model.name}, "
                  f"{'TE' if built.use_te else 'local'} layer spec, {dtype_name}; " + "; ".join(notes), flush=True)
        stopped: dict = {}
        train(plan, built, make_source(plan), cuda, on_step, stopped)
        if rank == 0:
            result = summarize(plan, records, stopped.get("window"), stopped.get("reason"), stack=stack,
                               reason="; ".join(notes) or None, wall_s=round(time.monotonic() - started, 3))
            write_json_atomic(out_dir / "trial_result.json", result)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a classified result
        status, reason = classify_exception(exc)
        if isinstance(exc, KeyboardInterrupt):
            status, reason = "crash", "interrupted"
        traceback.print_exc()
        print(marker(status, rank, reason), file=sys.stderr, flush=True)
        if rank == 0 and status != "nccl":
            result = TrialResult(study=plan.spec.study, number=plan.spec.number, status=status, reason=reason,
                                 steps=records, stack=stack, proxy=plan.spec.proxy,
                                 log_tail="".join(traceback.format_exception(exc))[-4000:],
                                 wall_s=round(time.monotonic() - started, 3))
            write_json_atomic(out_dir / "trial_result.json", result)
        sys.stdout.flush()
        sys.stderr.flush()
        # Peers may be stuck in a collective with us: leave without tearing the process group down.
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    path = Path(argv[0])
    watch_parent()  # before the slow imports: a rank whose driver is gone leaves at once
    try:
        spec = read_model(TrialSpec, path)
        env = rank_env(spec.count)
        plan = plan_trial(spec, world_size=env.world_size)
        require("torch", "trials")
        require("megatron.core", "trials")
    except (BadInput, MissingExtra) as exc:
        print(f"error: {exc}", file=sys.stderr)
        rank = os.environ.get("RANK", "")
        if rank.isdigit() and "WORLD_SIZE" in os.environ:  # launched by a backend: give it the reason too
            print(marker("crash", int(rank), f"{type(exc).__name__}: {exc}"), file=sys.stderr)
        return 2 if isinstance(exc, BadInput) else 1
    return run_rank(plan, env, path.resolve().parent)
