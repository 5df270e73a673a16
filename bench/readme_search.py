"""Time the README's main job (`autotune search --model Qwen3.5-122B-A10B --gpu H200 --count 32`) as a new
user runs it, and check its best layout against the seed page's best measured layout (2,451.4 tokens/s/GPU).

    python bench/readme_search.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

SEED_BEST = 2451.4
CMD = ["-m", "autotune.cli.main", "search", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32", "--json"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    walls, outs = [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, *CMD, "--runs-dir", tmp], capture_output=True, text=True)
            walls.append(time.perf_counter() - t0)
            if p.returncode:
                print(p.stderr)
                return 1
            outs.append(json.loads(p.stdout))
    o = outs[-1]
    best = o["best"]
    print(f"{'run':28s} {'wall s':>8s}")
    for i, w in enumerate(walls, 1):
        print(f"{'autotune search (README) #' + str(i):28s} {w:8.2f}")
    print(f"{'median':28s} {statistics.median(walls):8.2f}   (target: under 60 s)")
    print(f"trials {o['dispatched']}, stop: {o['stop_reason']}")
    print(f"best {best['layout']} {best['recompute']} {best['dispatcher']}: {best['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU "
          f"[{best['status']}] = {best['tokens_per_s_per_gpu'] / SEED_BEST:.3f} x the seed's best measured {SEED_BEST:,.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
