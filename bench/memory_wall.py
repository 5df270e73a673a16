"""What an OOM teaches the search: the memory wall (search/candidates.py learn_oom) against a search that only
skips the layout that ran out.

The cluster is the simulator (the cost model's throughput) with a memory model that under-predicts by a factor:
a layout whose predicted peak x factor exceeds the GPU's memory runs out (reported as an OOM after the start-up,
which costs the seed page's start-up time in GPU-hours). The driver, planner and study are the product's. Per
model/cluster pair and factor: trials that ran out of memory, the GPU-hours they cost, and the best layout found
against the best that fits this cluster (the simulator's throughput is the prediction, so the best that fits is
the best candidate under predicted peak x factor <= capacity).

    python bench/memory_wall.py [--trials 15] [--factors 1.05,1.10,1.15,1.20] [--pairs all|qwen]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.search import candidates as candidates_mod
from autotune.search.driver import SearchConfig, SearchDriver
from autotune.search.study import StudyDir
from autotune.space import load_space
from autotune.trials.backends.simulate import SimulateBackend
from autotune.trials.spec import TrialResult

PAIRS = [("Qwen3.5-122B-A10B", "H200", 32), ("Qwen3-235B-A22B", "H100", 64), ("Llama-3.1-70B", "H100", 32)]


class TightMemory(SimulateBackend):
    """The simulator, with every layout needing `factor` x its predicted peak: those above the HBM run out."""

    name = "tight-memory"

    def __init__(self, factor: float, capacity: float, startup_s: float = 600.0):
        super().__init__(startup_s=startup_s)
        self.factor, self.capacity = factor, capacity
        self.ran: list[tuple[int, str, int, float]] = []  # (trial, status, predicted peak, GPU-hours)

    def _simulate(self, spec) -> TrialResult:
        res = super()._simulate(spec)
        predicted = int(res.peak_memory_bytes or 0)
        if res.status == "ok" and res.peak_memory_bytes * self.factor > self.capacity:
            gpu_h = self.startup_s * spec.count / 3600.0  # it ran out while starting up: the start-up is spent
            res = TrialResult(study=res.study, number=res.number, status="oom", source="measured", backend=self.name,
                              peak_memory_bytes=int(res.peak_memory_bytes * self.factor), gpu_hours=gpu_h,
                              reason="CUDA out of memory (simulated: memory model x factor)")
        self.ran.append((spec.number, res.status, predicted, float(res.gpu_hours or 0.0)))
        return res


def run(pair, factor: float, trials: int, wall: bool, runs_dir: Path):
    name, gpu, count = pair
    model, cluster, w = load_model(name), ClusterSpec.of(gpu, count), Workload()
    backend = TightMemory(factor, cluster.gpu.memory_bytes)
    original = candidates_mod.Candidates.learn_oom
    if not wall:  # the comparison arm: the OOM'd layout is skipped (tried), nothing else is learnt
        candidates_mod.Candidates.learn_oom = lambda self, lay, number: None
    try:
        d = SearchDriver(model, cluster, w, load_space(None, model), backend, StudyDir(runs_dir, "wall"),
                         SearchConfig(trials=trials, planner="model"))
        out = d.run()
        c = d.candidates
        fits = c.peak * factor <= cluster.gpu.memory_bytes
        best_fit = float(np.max(np.where(fits, c.base_pred, 0.0)))
        d.close()
    finally:
        candidates_mod.Candidates.learn_oom = original
    ooms = [r for r in backend.ran if r[1] == "oom"]
    return len(ooms), sum(r[3] for r in ooms), (out.best.value if out.best else 0.0), best_fit


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--factors", default="1.05,1.10,1.15,1.20")
    ap.add_argument("--pairs", default="all", choices=("all", "qwen"))
    args = ap.parse_args(argv)
    pairs = PAIRS if args.pairs == "all" else PAIRS[:1]
    print(f"model-guided planner, {args.trials} trials; memory model under-predicting by each factor; an OOM costs "
          "the start-up (600 s x GPUs)")
    print(f"{'model / cluster':<32}{'factor':>7}  {'arm':<8}{'OOM trials':>11}{'OOM GPU-h':>10}{'best found':>11}"
          f"{'best fits':>10}{'found/fits':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for pair in pairs:
            for f in (float(x) for x in args.factors.split(",")):
                for wall in (True, False):
                    n, gh, best, fit = run(pair, f, args.trials, wall, Path(tmp) / f"{pair[0]}-{f}-{wall}")
                    print(f"{pair[0] + ' / ' + str(pair[2]) + ' x ' + pair[1]:<32}{f:>7.2f}  "
                          f"{'wall' if wall else 'no wall':<8}{n:>11d}{gh:>10.1f}{best:>11,.1f}{fit:>10,.1f}"
                          f"{best / fit if fit else float('nan'):>11.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
