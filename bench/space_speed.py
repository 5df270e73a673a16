"""Enumerate, screen and evaluate the whole default search space for Qwen3.5-122B-A10B on H200 clusters of
32 to 4096 GPUs: layouts enumerated, legal, evaluated, and the wall time (target: under 1 s at 1024). Then the
default space (no per-model override) where it is several chunks of space.MAX_CHUNK rows: what screening a space
larger than one table costs, including models whose layers do not divide (Qwen3-235B-A22B's 94, DeepSeek-V3's 61),
where every uneven split Megatron accepts is a layout of its own. "evaluated" layouts go through the memory model,
"fits" through the time model.

    python bench/space_speed.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.layout.dimensions import grid_axes
from autotune.space import MAX_CHUNK, chunks, explore, load_space


def timed(space, model, workload, cluster, repeats: int):
    """explore() `repeats` times: (its funnel as a dict, best seconds, median seconds)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = explore(space, model, workload, cluster)
        times.append(time.perf_counter() - t0)
    return dict(res.funnel), min(times), sorted(times)[len(times) // 2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    m, w = load_model("Qwen3.5-122B-A10B"), Workload()
    space = load_space(None, m)
    explore(space, m, w, ClusterSpec.of("H200", 32))  # warm the per-model tables
    print("Qwen3.5-122B-A10B, its own space (search_spaces/Qwen3.5-122B-A10B.yaml)")
    print(f"{'GPUs':>6} {'enumerated':>11} {'legal':>7} {'evaluated':>10} {'fits':>7} {'kept':>6} {'best s':>8} {'median s':>9}")
    for count in (32, 256, 1024, 4096):
        f, best, median = timed(space, m, w, ClusterSpec.of("H200", count), args.repeats)
        print(f"{count:6d} {f['enumerated']:11,d} {f['legal']:7,d} {f['supported and practical']:10,d} {f['fits']:7,d} "
              f"{f['kept']:6,d} {best:8.3f} {median:9.3f}")
    print(f"\nthe default space, screened in chunks of {MAX_CHUNK:,} rows")
    print(f"{'model / cluster':<38} {'enumerated':>11} {'chunks':>7} {'legal':>8} {'evaluated':>10} {'fits':>8} "
          f"{'kept':>6} {'best s':>8} {'median s':>9}")
    for name, gpu, count, wl in (("Qwen3-30B-A3B", "H100", 64, w), ("Llama-4-Maverick-17B-128E", "B200", 256, w),
                                 ("tiny-moe", "cpu", 2, Workload(seq_len=256, global_batch=8)),
                                 ("Qwen3-235B-A22B", "H100", 64, w),
                                 ("DeepSeek-V3", "H800", 2048, Workload(seq_len=4096, global_batch=4096))):
        mm, cluster = load_model(name), ClusterSpec.of(gpu, count)
        sp = load_space(None, mm)
        f, best, median = timed(sp, mm, wl, cluster, args.repeats)
        n_chunks = sum(1 for _ in chunks(grid_axes(sp.dimensions.model_dump(), mm, cluster)))
        print(f"{name + ' / ' + str(count) + ' x ' + gpu:<38} {f['enumerated']:11,d} {n_chunks:>7} {f['legal']:8,d} "
              f"{f['supported and practical']:10,d} {f['fits']:8,d} {f['kept']:6,d} {best:8.3f} {median:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
