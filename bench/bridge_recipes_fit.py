"""Does every Megatron-Bridge performance recipe fit? The memory model against the recipes NVIDIA runs.

Every pretraining recipe of a catalog model on a catalog GPU, in every release bench/bridge_presets.py reads
(scripts/performance/configs/<family>/*workload_base_configs.py, v0.2.0 to v0.5.1; src/megatron/bridge/perf_recipes,
v0.6.0, read by bench/bridge_perf_recipes.py), becomes a row of the published
table at its own GPU count, layout, micro-batch and global batch, in the container that shipped its release
(cost/_presets.RELEASES), with force-balanced routing as the pages run it; the row reader then adds what the recipe
sets (recompute, dispatcher, overlaps, graphs, FSDP, offload, its pipeline layout, MTP). The recipes ran, or were
written to run, so a row predicted not to fit is a fault of the memory model or a recipe nobody published: the
script prints how many fit, why the others were not read, and each one predicted not to fit with its peak. A recipe
megatron-core would refuse at start-up (decoder layers that do not divide over PP x VPP with no pipeline layout set:
TransformerBlock's get_num_layers_to_build) is counted apart as not runnable as written, not as out of memory.

Sequence length: the perf scripts' (8,192 for Llama 3 / 3.1 and Nemotron 3, set in their *_llm_pretrain.py common
configs; 4,096 elsewhere). Nothing is executed from the checkout but the workload files' dataclass literals, read
as bridge_presets.py reads them.

    python bench/bridge_recipes_fit.py /path/to/Megatron-Bridge [--releases v0.4.0,v0.5.1]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bridge_perf_recipes as P  # noqa: E402  (v0.6.0's flat perf recipes)
import bridge_presets as B  # noqa: E402  (the recipe reader of the same checkout)

from autotune.cost import evaluate, load_calibration  # noqa: E402
from autotune.cost._presets import RELEASES  # noqa: E402
from autotune.cost.measurements import _represent  # noqa: E402
from autotune.layout import LayoutTable  # noqa: E402

GIB = 2**30
_PRECISION = {"bf16": "BF16", "fp8-tensorwise": "FP8-CS", "mxfp8": "MXFP8", "fp8-blockwise": "FP8-SC",
              "nvfp4": "NVFP4", "fp8-delayed": "FP8-DS"}
_SEQ_8K = {"Llama-3.1-70B", "Llama-3.1-405B", "Llama-3.1-8B", "NVIDIA-Nemotron-3-Super-120B-A12B",
           "NVIDIA-Nemotron-3-Nano-30B-A3B"}
_GPUS = ("H100", "B200", "B300", "GB200", "GB300")


def recipe_rows(repo: Path, releases: tuple[str, ...]):
    """(release, recipe name, published-style row) for each distinct recipe of each release."""
    container = {}
    for cont, rels in RELEASES.items():
        for r in rels:
            container.setdefault(r, cont)
    seen = set()
    for rel in releases:
        if rel in B.PERF_RECIPE_RELEASES:  # the flat perf_recipes functions (bench/bridge_perf_recipes.py)
            found = [(r["recipe"], r, int(P.NAME.match(r["recipe"]).group("n")))
                     for r in P.read_release(repo, rel, B._FAMILY_LAYOUTS, B._FAMILY_MTP)]
        else:
            files = [f for f in B._git(repo, "ls-tree", "-r", "--name-only", rel, "scripts/performance/configs").split()
                     if f.endswith("workload_base_configs.py")]
            found = [(name, B._row(rel, path, name, base), base.num_gpus) for path in files
                     for name, base in B._load(B._git(repo, "show", f"{rel}:{path}")).items()]
        for name, r, num_gpus in found:
            if not r or r["task"] != "pretrain" or r["gpu"] not in _GPUS or rel not in container:
                continue
            key = (r["model"], r["gpu"], r["precision"], r["tp"], r["pp"], r["cp"], r["vp"], r["ep"], r["mbs"],
                   r["gbs"], num_gpus, container[rel])
            if key in seen:
                continue
            seen.add(key)
            yield rel, name, r.get("pp_layout", ""), dict(
                source=f"Megatron-Bridge perf archive:{container[rel]}", model=r["model"], gpu=r["gpu"],
                num_gpus=str(num_gpus),
                seq_len=str(r.get("seq") or (8192 if r["model"] in _SEQ_8K else 4096)),
                global_batch=str(r["gbs"]), micro_batch=str(r["mbs"]), tp=str(r["tp"]), pp=str(r["pp"]),
                cp=str(r["cp"]), vp=str(r["vp"]) if r["vp"] > 1 else "", ep=str(r["ep"]), etp="",
                precision=_PRECISION[r["precision"]], recompute="", tokens_per_s_per_gpu="1000",
                tflops_per_gpu="", mfu="", notes=f"force-balanced; FSDP={r['fsdp']}")


def _megatron_refuses(m, layout: str) -> str | None:
    """Why megatron-core refuses the recipe's pipeline split, or None. With no pipeline layout (nor first / last
    stage sizes, which the readers turn into one), TransformerBlock's get_num_layers_to_build asserts the decoder
    layers (plus one each for an embedding and a loss counted by --account-for-*-in-pipeline-split, which a recipe
    may set) divide over PP, and each rank's over VPP. The row reader would give such a published row Megatron's
    nearest uneven split (_published's reading of a row that names no split); a recipe says what it sets."""
    pp, vpp = m.layout.pp, m.layout.vpp
    if layout or pp == 1:
        return None
    n = m.spec.num_layers
    if any((n + extra) % pp == 0 and ((n + extra) // pp) % vpp == 0 for extra in (0, 1, 2)):
        return None
    return (f"{n} decoder layers do not divide over PP {pp}" + (f" x VPP {vpp}" if vpp > 1 else "")
            + " and the recipe sets no pipeline layout")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path, help="a Megatron-Bridge git checkout with its release tags")
    ap.add_argument("--releases", default=",".join(B.RELEASES + B.PERF_RECIPE_RELEASES),
                    help="comma-separated tags (default: every one read)")
    args = ap.parse_args(argv)
    outcome: Counter = Counter()
    tight = []
    for rel, name, layout, row in recipe_rows(args.repo, tuple(args.releases.split(","))):
        m = _represent(row, 0)
        if isinstance(m, str):
            outcome["not read: " + m.split(" (")[0][:100]] += 1
            continue
        refused = _megatron_refuses(m, layout)
        if refused:
            outcome[f"not runnable as written: {refused}"] += 1
            continue
        ev = evaluate(m.spec, m.workload, m.cluster, LayoutTable.from_layouts([m.layout]), load_calibration(m.gpu))
        peak, cap = float(ev.memory.peak[0]), float(ev.memory.capacity_bytes)
        outcome["fits" if peak <= cap else "predicted not to fit"] += 1
        if peak > cap:
            tight.append(f"  {rel:8s} {name:55s} {m.layout.label(True):28s} {m.count:5d} GPUs  "
                         f"{peak / GIB:6.0f} of {cap / GIB:.0f} GiB")
    total = sum(outcome.values())
    print(f"{total} (recipe, release) rows from {args.repo}")
    for what, n in outcome.most_common():
        print(f"{n:6d}  {what}")
    if tight:
        print("\npredicted not to fit:")
        print("\n".join(tight))
    return 0


if __name__ == "__main__":
    sys.exit(main())
