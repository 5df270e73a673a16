"""How many trials does each planner need to find a layout within 2% of the best, when reality differs
from the model?

"Reality" is the cost model with every time term multiplied by its own random factor (uniform in
[1 - spread, 1 + spread], spread 0.3 by default) and 2% multiplicative noise on each measured trial. The
real search driver runs against it (the same loop, study and calibration refits as on a cluster); a trial
"reaches" the goal when its noise-free reality throughput is within 2% of reality's best over the
candidates the model keeps. Prints, per model/cluster pair and planner, the median, mean and 90th
percentile of trials needed and the share of runs that got there within the trial cap.

    python bench/search_efficiency.py [--seeds 30] [--cap 20] [--planners model,random,optuna]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import STEP_TERMS, evaluate, load_calibration
from autotune.layout import Layout, LayoutTable
from autotune.search.driver import SearchConfig, SearchDriver
from autotune.search.study import StudyDir
from autotune.space import explore, load_space
from autotune.trials.backends.base import Backend, Handle
from autotune.trials.spec import TrialResult, TrialSpec

PAIRS = [("Qwen3.5-122B-A10B", "H200", 32), ("Qwen3-235B-A22B", "H100", 64), ("Llama-3.1-70B", "H100", 32)]


class RealityBackend(Backend):
    """A cluster whose throughput is the model with perturbed terms, plus per-trial noise."""

    name = "reality"
    measured = True

    def __init__(self, model, cluster, workload, scale: dict, noise: float, rng: np.random.Generator,
                 feature_spread: float = 0.0):
        self.model, self.cluster, self.workload = model, cluster, workload
        # "feature" reality: one more factor per value of each layout feature, so layouts are not all
        # perturbed alike (the model's error then depends on the layout, as on a real cluster)
        frng = np.random.default_rng(rng.integers(1 << 31))
        self.features = {f: {} for f in ("tp", "pp", "vpp", "ep", "etp", "dispatcher", "rc_gran", "rc_layers", "max_tokens")}
        self.feature_spread, self._frng = feature_spread, frng
        base = load_calibration(cluster.gpu.name)
        merged = {k: base.time.scale.get(k, 1.0) * v for k, v in scale.items()}
        self.cal = dataclasses.replace(base, time=dataclasses.replace(base.time, scale=merged))
        self.noise, self.rng = noise, rng

    def truth(self, table: LayoutTable) -> np.ndarray:
        tps = evaluate(self.model, self.workload, self.cluster, table, self.cal).time.tokens_per_s_per_gpu
        if self.feature_spread:
            for f, seen in self.features.items():
                col = getattr(table, f)
                for v in np.unique(col):
                    if v not in seen:
                        seen[v] = float(self._frng.uniform(1 - self.feature_spread, 1 + self.feature_spread))
                tps = tps * np.array([seen[v] for v in col])
        return tps

    def submit(self, spec: TrialSpec, trial_dir: Path) -> Handle:
        return Handle(spec, trial_dir)

    def poll(self, handle: Handle) -> TrialResult:
        lay = Layout.from_dict(handle.spec.layout)
        tps = float(self.truth(LayoutTable.from_layouts([lay]))[0]) * (1 + self.noise * self.rng.standard_normal())
        step = self.workload.tokens_per_step / tps / self.cluster.count
        return TrialResult(study=handle.spec.study, number=handle.spec.number, status="ok", source="measured",
                           backend=self.name, tokens_per_s_per_gpu=tps, step_time_s=step,
                           gpu_hours=(step * 20 + 600) * self.cluster.count / 3600)

    def cancel(self, handle: Handle) -> None:
        pass


def one_run(pair, seed: int, planner: str, cap: int, spread: float, noise: float, root: Path,
            feature_spread: float = 0.0) -> tuple[int | None, int]:
    name, gpu, count = pair
    model, cluster, workload = load_model(name), ClusterSpec.of(gpu, count), Workload()
    rng = np.random.default_rng(seed)
    scale = {t: float(rng.uniform(1 - spread, 1 + spread)) for t in STEP_TERMS}
    backend = RealityBackend(model, cluster, workload, scale, noise, np.random.default_rng(seed + 10_000), feature_spread)
    space = load_space(None, model)
    res = explore(space, model, workload, cluster)
    truth = backend.truth(res.table.take(res.kept))
    goal = 0.98 * truth.max()
    sd = StudyDir(root, f"{name}-{seed}-{planner}")
    cfg = SearchConfig(trials=cap, planner=planner, seed=seed, poll_s=0.0, noise=noise, sampler="tpe")
    driver = SearchDriver(model, cluster, workload, space, backend, sd, cfg)
    out = driver.run()
    dispatched = [r for r in out.records if r.status != "screened"]
    for k, r in enumerate(dispatched, 1):
        if float(backend.truth(LayoutTable.from_layouts([r.layout]))[0]) >= goal:
            return k, len(dispatched)
    return None, len(dispatched)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--cap", type=int, default=20, help="trial budget per run")
    ap.add_argument("--spread", type=float, default=0.3)
    ap.add_argument("--noise", type=float, default=0.02)
    ap.add_argument("--planners", default="model,random,optuna")
    ap.add_argument("--pairs", type=int, default=len(PAIRS), help="how many model/cluster pairs to run")
    ap.add_argument("--feature-spread", type=float, default=0.0,
                    help="also perturb per layout feature value (harder: layouts no longer err alike), e.g. 0.1")
    args = ap.parse_args(argv)
    planners = args.planners.split(",")
    print(f"reality: each of {len(STEP_TERMS)} time terms x U[{1 - args.spread:.1f}, {1 + args.spread:.1f}], "
          f"{args.noise:.0%} noise per trial" + (f", x U[+/-{args.feature_spread:.0%}] per layout feature value" if args.feature_spread else "") + f"; goal: within 2% of reality's best; cap {args.cap} trials; {args.seeds} seeds")
    print(f"{'model / cluster':34s} {'planner':8s} {'median':>7s} {'mean':>6s} {'p90':>5s} {'reached':>8s} {'s/run':>6s}")
    with tempfile.TemporaryDirectory() as tmp:
        for pair in PAIRS[: args.pairs]:
            for planner in planners:
                needed, t0 = [], time.time()
                for seed in range(args.seeds):
                    k, _ = one_run(pair, seed, planner, args.cap, args.spread, args.noise, Path(tmp), args.feature_spread)
                    needed.append(k if k is not None else args.cap + 1)
                arr = np.array(needed)
                reached = float(np.mean(arr <= args.cap))
                label = f"{pair[0]} / {pair[2]} x {pair[1]}"
                print(f"{label:34s} {planner:8s} {np.median(arr):7.1f} {arr.mean():6.1f} {np.percentile(arr, 90):5.1f} "
                      f"{reached:8.0%} {(time.time() - t0) / args.seeds:6.2f}", flush=True)
    print("(a run that never reached the goal counts as cap + 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
