"""Enumerate, screen and evaluate the whole default search space for Qwen3.5-122B-A10B on H200 clusters of
32 to 4096 GPUs: layouts enumerated, legal, evaluated, and the wall time (target: under 1 s at 1024).

    python bench/space_speed.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.space import explore, load_space


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    m, w = load_model("Qwen3.5-122B-A10B"), Workload()
    space = load_space(None, m)
    explore(space, m, w, ClusterSpec.of("H200", 32))  # warm the per-model tables
    print(f"{'GPUs':>6} {'enumerated':>11} {'legal':>7} {'evaluated':>10} {'fits':>7} {'kept':>6} {'best s':>8} {'median s':>9}")
    for count in (32, 256, 1024, 4096):
        cluster = ClusterSpec.of("H200", count)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            res = explore(space, m, w, cluster)
            times.append(time.perf_counter() - t0)
        f = dict(res.funnel)
        print(f"{count:6d} {f['enumerated']:11,d} {f['legal']:7,d} {f['supported and practical']:10,d} {f['fits']:7,d} "
              f"{f['kept']:6,d} {min(times):8.3f} {sorted(times)[len(times) // 2]:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
