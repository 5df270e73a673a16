"""How many steps does a trial need? The early-stop rules (runner/loop.py) on the runner's own CPU trials.

Each layout (tiny-moe on CPU ranks over gloo, megatron-core, through the local backend) runs the seed's
full 20 steps with 5 warm-up steps, and its tokens/s/GPU over steps 5..19 is the reference. The steady
rule (the mean step time within +-1% of the full trial's with 95% confidence, after at least 3 scored steps;
--reference mean: of the true mean) is then
replayed on the recorded step times (the same run, so only the rule differs): the step it stops at, its
window and its tokens/s/GPU against the reference. With --live, each layout also runs once more with the
rule switched on (a second run: run-to-run noise included). Prints one row per layout and the means
(target: mean steps <= 12, tokens/s within 1% of the 20-step window), then the same runs replayed at
looser accuracies, then the rule replayed on `--synthetic` sequences whose scored steps vary by the seed
page's measured step-time CV (0.57% on 32 H200): what a steady GPU trial would cost.

    python bench/trial_length.py [--live] [--layouts tp1,ep2,...] [--accuracy 1.0] [--window 3]
        [--synthetic 2000] [--skip-cpu] [--reference window|mean]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

from autotune.catalog import Workload
from autotune.layout import Layout
from autotune.trials.backends.local import LocalBackend
from autotune.trials.spec import EarlyStop, TrialSpec

from autotune.runner.loop import steady_window

LAYOUTS = {
    "tp1": Layout(world=1, micro_batch_size=1),
    "dp2": Layout(world=2, micro_batch_size=1, distributed_optimizer=True),
    "tp2": Layout(world=2, tp=2, micro_batch_size=1),
    "ep2": Layout(world=2, ep=2, micro_batch_size=1, distributed_optimizer=False),
    "pp2": Layout(world=2, pp=2, micro_batch_size=1),
}
STEPS, WARMUP = 20, 5


def spec_for(lay: Layout, number: int, early: EarlyStop | None) -> TrialSpec:
    wl = dataclasses.asdict(Workload(seq_len=256, global_batch=8, steps=STEPS, window=(WARMUP, STEPS - 1)))
    return TrialSpec(study="trial-length", number=number, model="tiny-moe", gpu="cpu", count=lay.world,
                     gpus_per_node=2, layout=lay.to_dict(), workload=wl, steps=STEPS, warmup_steps=WARMUP,
                     timeout_s=600.0, early_stop=early)


def run(spec: TrialSpec, d: Path):
    backend = LocalBackend(grace_s=5.0)
    res = backend.wait(backend.submit(spec, d))
    if res.status != "ok":
        raise SystemExit(f"trial {spec.number} ({spec.layout}) failed: {res.status}: {res.reason}")
    return res


def tps(steps, lo: int, hi: int, count: int) -> float:
    w = [s for s in steps if lo <= s.step <= hi]
    return sum(s.tokens for s in w) / sum(s.time_s for s in w) / count


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--accuracy", type=float, default=EarlyStop().accuracy_percent,
                    help="the rule's 95%% half-width of the mean step time, percent")
    ap.add_argument("--window", type=int, default=EarlyStop().window, help="scored steps before it may fire")
    ap.add_argument("--reference", choices=("window", "mean"), default=EarlyStop().reference,
                    help="window: the full trial's mean step time (the default rule); mean: the true mean")
    ap.add_argument("--live", action="store_true", help="also run each layout with early stop on")
    ap.add_argument("--synthetic", type=int, default=2000, help="synthetic steady sequences to replay (0: none)")
    ap.add_argument("--skip-cpu", action="store_true", help="only the synthetic replay")
    ap.add_argument("--synthetic-cv", type=float, nargs="+", default=[SEED_CV],
                    help="scored-step CVs (percent) of the synthetic sequences (default: the seed page's)")
    args = ap.parse_args(argv)
    rule = EarlyStop(accuracy_percent=args.accuracy, window=args.window, reference=args.reference)
    of = f"of the full {STEPS}-step trial's" if rule.reference == "window" else "of the true mean"
    print(f"rule: mean step time within +-{args.accuracy:g}% {of} (95%) after >= {args.window} scored steps, "
          f"{WARMUP} warm-up; cap {STEPS} steps")
    if not args.skip_cpu:
        cpu_trials(args, rule)
    for cv in args.synthetic_cv if args.synthetic else ():
        synthetic(rule, args.synthetic, cv)
    return 0


def cpu_trials(args, rule: EarlyStop) -> None:
    print(f"\nCPU trials on this machine (load average {os.getloadavg()[0]:.1f})")
    print(f"{'layout':8s} {'full tok/s':>11s} {'CV% 5..19':>9s} {'stop at':>8s} {'window':>8s} {'tok/s':>9s} "
          f"{'diff':>7s}" + (f" {'live steps':>10s} {'live tok/s':>10s} {'diff':>7s}" if args.live else ""))
    used, diffs, runs = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for n, name in enumerate(args.layouts.split(",")):
            lay = LAYOUTS[name]
            full = run(spec_for(lay, n, None), Path(tmp) / f"full-{n}")
            ref = tps(full.steps, WARMUP, STEPS - 1, lay.world)
            lo, hi = stop_of([s.time_s for s in full.steps], rule)
            got = tps(full.steps, lo, hi, lay.world)
            used.append(hi + 1)
            diffs.append(got / ref - 1)
            row = (f"{name:8s} {ref:11,.1f} {full.step_time_cv_percent:9.2f} {hi + 1:8d} {f'{lo}..{hi}':>8s} "
                   f"{got:9,.1f} {100 * (got / ref - 1):+6.2f}%")
            if args.live:
                live = run(spec_for(lay, 100 + n, rule), Path(tmp) / f"live-{n}")
                got = live.tokens_per_s_per_gpu
                row += f" {len(live.steps):10d} {got:10,.1f} {100 * (got / ref - 1):+6.2f}%"
            print(row, flush=True)
            runs.append((lay.world, full.steps, ref))
    print(f"mean steps per trial {statistics.fmean(used):.1f} (cap {STEPS}); tokens/s vs the 20-step window: "
          f"mean |diff| {100 * statistics.fmean(abs(d) for d in diffs):.2f}%, "
          f"worst {100 * max(abs(d) for d in diffs):.2f}%")
    print("\nthe same runs replayed at other accuracies, against the full trial's mean (window) and the true mean "
          "(mean):")
    print(f"{'+-':>7s} {'reference':>9s} {'mean steps':>10s} {'mean |diff|':>11s} {'worst':>7s}")
    for acc in (1.0, 2.0, 5.0, 10.0, 20.0, 50.0):
        for ref_kind in ("window", "mean"):
            n, d = [], []
            for world, steps, ref in runs:
                lo, hi = stop_of([x.time_s for x in steps],
                                 rule.model_copy(update={"accuracy_percent": acc, "reference": ref_kind}))
                n.append(hi + 1)
                d.append(abs(tps(steps, lo, hi, world) / ref - 1))
            print(f"{acc:6g}% {ref_kind:>9s} {statistics.fmean(n):10.1f} {100 * statistics.fmean(d):10.2f}% "
                  f"{100 * max(d):6.2f}%")


SEED_CV = 0.57  # percent: the seed page's measured step-time CV (TP1 PP4 EP8 DP8 on 32 H200, steps 5..19)


def synthetic(rule: EarlyStop, n: int, cv: float = SEED_CV) -> None:
    """The rule replayed on sequences like a steady GPU trial's: warm-up steps slower (allocator, NCCL and
    kernel autotuning), scored steps normal around one mean with the seed's CV. Not a measurement: what the
    rule would cost where steps are as steady as the seed page measured them."""
    rng = random.Random(0)
    used, diffs = [], []
    for _ in range(n):
        times = [3.0, 1.5, 1.1, 1.02, 1.01] + [rng.gauss(1.0, cv / 100) for _ in range(STEPS - WARMUP)]
        lo, hi = stop_of(times, rule)
        ref = statistics.fmean(times[WARMUP:])
        used.append(hi + 1)
        diffs.append(statistics.fmean(times[lo:hi + 1]) / ref - 1)  # tokens/s is the inverse: same |diff| to first order
    within = sum(abs(d) <= 0.01 for d in diffs) / n
    what = "as measured on the seed page" if cv == SEED_CV else "given"
    print(f"\nsynthetic steady trials ({n}, scored-step CV {cv:g}% {what}): mean steps "
          f"{statistics.fmean(used):.1f} (cap {STEPS}); vs the 20-step window mean |diff| "
          f"{100 * statistics.fmean(abs(d) for d in diffs):.2f}%, worst {100 * max(abs(d) for d in diffs):.2f}%, "
          f"within 1%: {within:.1%}")


def stop_of(times: list[float], rule: EarlyStop) -> tuple[int, int]:
    """The window the steady rule would have scored, replayed step by step (the full window if never)."""
    for k in range(WARMUP + 1, STEPS):
        win = steady_window(times[: k + 1], WARMUP, rule.window, rule.accuracy_percent, rule.cap(STEPS))
        if win:
            return win
    return WARMUP, STEPS - 1


if __name__ == "__main__":
    sys.exit(main())
