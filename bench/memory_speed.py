"""Speed of the vectorised memory (and time) model over a large layout space.

Builds >= 100,000 layouts of Qwen3.5-122B-A10B on 1024 H200 with LayoutTable.from_columns (the cross
product of TP, PP, VPP, EP, ETP, recompute, dispatcher, tokens per GPU, optimizer options; legality is
not filtered, the models must cope with any row) and prints layouts/s for estimate_memory, the time
model and the whole `evaluate`. Targets: > 100,000 layouts/s for the memory model and for the whole evaluation
(memory, time and their breakdowns) on a 2-core machine. Both models price a table this large in groups of equal PP
(cost/_groups.py).

    python bench/memory_speed.py [--n 200000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import estimate_memory, estimate_time, evaluate, load_calibration
from autotune.layout import LayoutTable


def space(world: int, n_min: int) -> LayoutTable:
    grid = itertools.product(
        [1, 2, 4, 8],  # tp
        [1, 2, 4, 6, 8, 12, 16],  # pp
        [1, 2, 3],  # vpp
        [1, 2, 4, 8, 16, 32, 64],  # ep
        [1, 2],  # etp
        [(0, 0, 0), (1, 0, 0), (2, 0, 1), (2, 0, 2), (2, 1, 4)],  # recompute gran, method, layers
        [0, 1, 2],  # dispatcher
        [8192, 16384, 32768],  # max tokens per GPU
        [False, True],  # precision-aware optimizer
    )
    rows = np.array([(tp, pp, vpp, ep, etp, g, m, nl, d, mt, pa)
                     for tp, pp, vpp, ep, etp, (g, m, nl), d, mt, pa in grid])
    reps = -(-n_min // len(rows))
    rows = np.tile(rows, (reps, 1))
    c = rows.T
    return LayoutTable.from_columns(
        world, len(rows), tp=c[0], pp=c[1], vpp=c[2], ep=c[3], etp=c[4], sp=c[0] > 1, rc_gran=c[5],
        rc_method=c[6], rc_layers=c[7], dispatcher=c[8], max_tokens=c[9], precision_aware=c[10].astype(bool),
        dist_opt=True, shared_overlap=(c[8] == 0) & (c[3] > 1))


def bench(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    model = load_model("Qwen3.5-122B-A10B")
    cluster = ClusterSpec.of("H200", 1024)
    wl = Workload()
    cal = load_calibration("H200")
    t0 = time.perf_counter()
    table = space(cluster.count, args.n)
    build = time.perf_counter() - t0
    n = len(table)
    estimate_memory(model, wl, cluster, table.take(slice(0, 100)), cal.memory)  # warm caches (layer tables)
    mem_s = bench(lambda: estimate_memory(model, wl, cluster, table, cal.memory), args.repeat)
    mem = estimate_memory(model, wl, cluster, table, cal.memory)
    time_s = bench(lambda: estimate_time(model, wl, cluster, table, cal.time, cal.memory, mem), args.repeat)
    eval_s = bench(lambda: evaluate(model, wl, cluster, table, cal), args.repeat)
    print(f"Qwen3.5-122B-A10B on 1024 x H200: {n:,} layouts (built in {build:.2f} s), best of {args.repeat}")
    print(f"{'model':<16}{'seconds':>10}{'layouts/s':>14}")
    for name, s in (("memory", mem_s), ("time", time_s), ("evaluate", eval_s)):
        print(f"{name:<16}{s:>10.3f}{n / s:>14,.0f}")
    print(f"fits in memory: {int(mem.fits.sum()):,} of {n:,}; targets (> 100,000 layouts/s): memory "
          f"{'met' if n / mem_s > 100_000 else 'NOT met'}, full evaluation (issue 11) "
          f"{'met' if n / eval_s > 100_000 else 'NOT met'}")


if __name__ == "__main__":
    main()
