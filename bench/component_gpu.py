"""Issue 13's GPU component test: the flex dispatcher (DeepEP) against alltoall on one MoE layer at
Qwen3.5-122B-A10B's shape, against an FP32 reference, as the seed recipes' component test reports it.

Shape (REFERENCE.md): hidden 3072, 256 experts, top-8, expert FFN 1024, ETP 1, TP 1, EP = the GPUs
used (the seed: EP 8 on one H200 node); 4,096, 8,192 and 16,384 tokens per rank; bf16 layers, FP32
reference. Each size runs `python -m autotune.runner.component` on EP ranks (NCCL) through
autotune.gates.component, which judges: routing identical to alltoall's, worst relative L2 error of the
output and input gradient within 2 x alltoall's error + 1e-3, a bitwise-identical rerun, and the
negative controls (a perturbed expert weight, a dropped token) failing. Prints one table row per size.

    python bench/component_gpu.py --dry-run                 # any machine: the plan and memory, starts nothing
    python bench/component_gpu.py                           # a GPU node with DeepEP: flex vs alltoall, EP = GPUs
    python bench/component_gpu.py --dispatcher allgather    # without DeepEP: the same test for allgather

Options: --ep N (default: the GPU count), --tokens 4096,8192,16384, --json PATH (raw numbers),
--timeout S per size (default 600). With one GPU (EP 1) no token crosses a rank: --ep 1 still runs the
numerics of the dispatcher's permutation, and the gate reports not_run for its communication.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from autotune.gates.component import ComponentSpec, flex_blocker, judge, run_component  # noqa: E402
from autotune.layout import DISPATCHERS  # noqa: E402

SEED_SHAPE = dict(hidden=3072, experts=256, topk=8, ffn=1024)


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def memory_gb(spec: ComponentSpec) -> float:
    """Rough peak per rank: fp32 full weights (kept for the reference), bf16 local experts x 4 layers
    built in turn (default, candidate, rerun, controls; freed between), activations of top-k copies."""
    full = spec.experts * 3 * spec.ffn * spec.hidden * 4 + spec.experts * spec.hidden * 4
    local = full / 2 / spec.ep
    act = spec.tokens * spec.topk * (spec.hidden + 2 * spec.ffn) * 4 * 3
    return (full + 2 * local + act) / 2**30


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dispatcher", default="flex", choices=list(DISPATCHERS))
    p.add_argument("--reference-dispatcher", default="alltoall")
    p.add_argument("--ep", type=int, default=None)
    p.add_argument("--tokens", default="4096,8192,16384")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    gpus = _gpus() if not (a.dry_run and a.ep) else 0  # a dry run with --ep imports no torch
    ep = a.ep or max(1, gpus)
    sizes = [int(t) for t in a.tokens.split(",") if t]
    specs = [ComponentSpec(dispatcher=a.dispatcher, reference_dispatcher=a.reference_dispatcher, tokens=t, ep=ep,
                           dtype="bf16", timeout_s=a.timeout, **SEED_SHAPE) for t in sizes]
    blocker = flex_blocker(gpus > 0, a.dispatcher) or flex_blocker(gpus > 0, a.reference_dispatcher)
    print(f"# component test: {a.dispatcher} vs {a.reference_dispatcher}, {specs[0].shape_text().split(';')[0]}; " +
          ("" if a.dry_run and a.ep else f"{gpus} GPU(s) here"))
    if a.dry_run or blocker:
        for s in specs:
            argv_s = " ".join(s.argv(Path("component.json")))
            print(f"{s.tokens:>6} tokens/rank  ~{memory_gb(s):5.1f} GiB/rank  {ep} x python -m autotune.runner.component {argv_s}")
        if blocker:
            print(f"not run: {blocker}")
        return 0 if a.dry_run else 1
    rows, raw = [], []
    print(f"{'tokens/rank':>11}  {'default err':>11}  {'candidate err':>13}  {'bound':>9}  {'routing':>9}  "
          f"{'rerun':>9}  {'controls':>9}  result")
    for s in specs:
        try:
            numbers = run_component(s)
        except RuntimeError as exc:
            print(f"{s.tokens:>11}  failed: {exc}")
            raw.append({"spec": asdict(s), "error": str(exc)})
            continue
        status, text, d = judge(numbers)
        worst = max(d["tensors"], key=lambda r: r["ratio"])
        dflt = numbers["runs"]["default"]["output_error" if worst["tensor"] == "output" else "input_grad_error"]
        rows.append(status)
        print(f"{s.tokens:>11}  {dflt:>11.3e}  {worst['error']:>13.3e}  {worst['bound']:>9.3e}  "
              f"{'same' if d['routing_identical'] else 'differs':>9}  {'bitwise' if d['rerun_bitwise_identical'] else 'differs':>9}  "
              f"{'fail' if all(d['controls_failed'].values()) else 'MISSED':>9}  {status}")
        raw.append({"spec": asdict(replace(s)), "status": status, "detail": text, "numbers": numbers})
    if a.json:
        a.json.write_text(json.dumps(raw, indent=2))
    return 0 if rows and all(r == "pass" for r in rows) and len(rows) == len(specs) else 1


if __name__ == "__main__":
    sys.exit(main())
