"""Issue 5's GPU check: one real trial of a reduced-depth Qwen3.5-122B-A10B on one GPU, against autotune's prediction.

The model keeps the real widths (hidden 3072, 32 heads / 2 query groups of dim 256, 16/64 Gated DeltaNet
heads of dim 128, expert FFN 1024, shared expert 1024, vocab 248,320) and cuts depth to a few layers
(default 4: 3 Gated DeltaNet + 1 gated full attention, the model's own pattern) and the routed experts to
32, top-8: what one EP8 rank of the seed layout (TP1 PP4 EP8 DP8) holds (256 / 8). On one GPU that is a
32-expert model at EP1, so the routing and expert work per GPU is one EP8 rank's without the all-to-all.
Batching as the seed: max 8,192 tokens per GPU (one 8,192-token row per micro-batch), here a global batch
of 8 rows (8 micro-batches per step), bf16, 10 steps scored after 3 warm-up steps. Two configurations:
full recompute (uniform, 1 layer; the seed's) and no recompute.

Each trial runs through LocalBackend (`python -m autotune.runner trial_spec.json`, one rank); the same
shrunk model (TrialSpec.proxy -> proxy_model) and layout are predicted by autotune.cost.evaluate on
`ClusterSpec.of("H200", 1)`. Without Transformer Engine and flash-linear-attention the runner builds the
Gated DeltaNet layers as standard (local, unfused) attention and says so in its notes; the script then
also predicts that as-run model (every layer full attention) and compares against it, and the page says so.

    python bench/gpu_validation.py --dry-run                 # any machine: specs + predictions, writes nothing
    python bench/gpu_validation.py --out docs/validation.md  # a CUDA machine with megatron-core: runs, writes the page

Options: --layers N (default 4), --steps N (default 10; 3 warm-up), --configs full,none, --json PATH (raw
results), --trial-dir DIR (default runs/gpu_validation), --timeout S (per trial, default 210).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from autotune.catalog import ClusterSpec, ModelSpec, Workload, load_model  # noqa: E402
from autotune.catalog.model import FULL, LINEAR  # noqa: E402
from autotune.cost import evaluate  # noqa: E402
from autotune.layout import Layout, LayoutTable, Recompute  # noqa: E402
from autotune.trials.plan import gdn_blocker, has_module, plan_trial  # noqa: E402
from autotune.trials.proxy import proxy_model  # noqa: E402
from autotune.trials.spec import TrialSpec  # noqa: E402

MODEL = "Qwen3.5-122B-A10B"
GPU = "H200"
SEED_EP = 8  # the seed layout's EP: one rank holds num_experts / 8 experts
SEQ = 8192
GLOBAL_BATCH = 8
WARMUP = 3
GiB = 2**30
CONFIGS = {
    "full": ("full recompute (uniform, 1 layer)", Recompute("full", "uniform", 1)),
    "none": ("no recompute", Recompute()),
}
GDN_FALLBACK = "Gated DeltaNet layers ran as standard attention"
WHEELS = ("megatron-core==0.16.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types "
          "typing-inspection typing-extensions")


def say(msg: str) -> None:
    print(msg, flush=True)


# --- what runs -----------------------------------------------------------------------------------------
def layer_types(model: ModelSpec, n: int) -> list[str]:
    """The model's first n layer types, the last one full attention if none is (make_proxy's rule)."""
    types = list(model.layer_types[:n])
    if FULL in model.layer_types and FULL not in types:
        types[-1] = FULL
    return types


def proxy_of(model: ModelSpec, layers: int) -> dict:
    experts = model.moe.num_experts // SEED_EP
    return {"of": model.name, "target": GPU, "overrides": {
        "name": f"{model.name}-{layers}L-{experts}E",
        "num_layers": layers, "layer_types": layer_types(model, layers), "mtp_layers": 0,
        "moe": {"num_experts": experts, "dense_layers": []},
    }}


def layout_for(recompute: Recompute) -> Layout:
    # The seed's options that mean something on one GPU. Shared-expert overlap is left off: it hides the
    # shared expert behind the EP all-to-all, which a single GPU does not have.
    return Layout(world=1, tp=1, pp=1, cp=1, ep=1, etp=1, recompute=recompute, dispatcher="alltoall",
                  max_tokens_per_gpu=SEQ, distributed_optimizer=True, precision_aware_optimizer=True,
                  cross_entropy_fusion=True, moe_shared_expert_overlap=False)


def workload(steps: int) -> Workload:
    return Workload(seq_len=SEQ, global_batch=GLOBAL_BATCH, steps=steps, window=(WARMUP, steps - 1))


def trial_spec(number: int, layout: Layout, wl: Workload, proxy: dict, steps: int, timeout_s: float) -> TrialSpec:
    pythonpath = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p)
    return TrialSpec(
        study="gpu_validation", number=number, model=MODEL, gpu=GPU, count=1, gpus_per_node=1,
        layout=layout.to_dict(), workload=dataclasses.asdict(wl), steps=steps, warmup_steps=WARMUP,
        proxy=proxy, timeout_s=timeout_s,
        env={"PYTHONPATH": pythonpath, "CUDA_DEVICE_MAX_CONNECTIONS": "1",
             "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})


# --- what the cost model says --------------------------------------------------------------------------
def as_run_without_gdn(model: ModelSpec) -> ModelSpec:
    """What the runner builds when GDN cannot run: every layer standard attention."""
    return dataclasses.replace(model, name=model.name + "-as-run", linear=None,
                               layer_types=tuple(FULL for _ in model.layer_types))


def as_run_layout(layout: Layout, te: bool) -> Layout:
    """The layout options the runner drops without Transformer Engine."""
    return layout if te else layout.with_(precision_aware_optimizer=False, cross_entropy_fusion=False)


def predict(model: ModelSpec, wl: Workload, layout: Layout) -> dict:
    ev = evaluate(model, wl, ClusterSpec.of(GPU, 1), LayoutTable.from_layouts([layout]))
    return {"step_time_s": float(ev.time.step_time[0]), "tokens_per_s_per_gpu": float(ev.time.tokens_per_s_per_gpu[0]),
            "peak_memory_gib": float(ev.memory.peak[0]) / GiB, "fits": bool(ev.memory.fits[0]),
            "mfu": float(ev.time.mfu[0]), "time_terms_s": ev.time.breakdown(0),
            "memory_terms_gib": {k: v / GiB for k, v in ev.memory.stage_breakdown(0)[0].items()}}


# --- running -------------------------------------------------------------------------------------------
def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def preflight() -> None:
    """One line on stderr and exit 2 if this machine cannot run the trials."""
    try:
        import torch
    except ImportError:
        _fail("torch is not installed here; run on a CUDA machine, or pass --dry-run")
    if not torch.cuda.is_available():
        _fail("CUDA is not available here; run on a CUDA machine, or pass --dry-run")
    if not has_module("megatron.core"):
        _fail(f"megatron.core is not importable; carry its wheels ({WHEELS}) and put them on PYTHONPATH")


def run_trial(spec: TrialSpec, trial_dir: Path):
    from autotune.trials.backends.local import LocalBackend

    backend = LocalBackend(grace_s=5.0)
    handle = backend.submit(spec, trial_dir)
    started, seen, last_beat = time.monotonic(), 0, 0.0
    steps_path = trial_dir / "steps.jsonl"
    while (result := backend.poll(handle)) is None:
        time.sleep(0.5)
        lines = steps_path.read_text().splitlines() if steps_path.exists() else []
        for line in lines[seen:]:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                break
            seen += 1
            peak = max(rec.get("peak_memory_bytes") or [0]) / GiB
            say(f"    step {rec['step']}: {rec['time_s']:.3f} s, lm loss {rec.get('lm_loss')}, peak {peak:.1f} GiB")
        now = time.monotonic() - started
        if seen == 0 and now - last_beat >= 15:
            last_beat = now
            say(f"    ... {now:.0f} s (importing megatron, building the model)")
    return result


# --- the page ------------------------------------------------------------------------------------------
def _f(x, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def _ratio(a, b) -> str:
    return "—" if a is None or b in (None, 0) else f"{a / b:.2f}"


def render(rows: list[dict], meta: dict) -> str:
    lines = [
        "# GPU validation: measured vs predicted (issue 5)", "",
        f"Measured {meta['date']} on {meta['device']} by `bench/gpu_validation.py`. The exact command:", "",
        "```", meta["command"], "```", "",
        f"**Model**: {meta['model_desc']} (`{meta['proxy_name']}`: {MODEL} at real widths, "
        f"{meta['layers']} layers, {meta['experts']} routed experts top-{meta['top_k']} = one EP8 rank's share "
        "of the seed's 256, here at EP1 on one GPU: the routing and expert work of an EP8 rank, no all-to-all). "
        f"**Workload**: {SEQ}-token rows, max {SEQ} tokens/GPU (one row per micro-batch), global batch "
        f"{GLOBAL_BATCH} rows ({GLOBAL_BATCH} micro-batches per step), bf16, synthetic tokens, {meta['steps']} steps, "
        f"scored over steps {WARMUP}..{meta['steps'] - 1}. **Layout**: TP1 PP1 EP1 DP1, alltoall dispatcher, "
        "distributed optimizer, no shared-expert overlap (nothing to overlap with on one GPU).", "",
        f"**Prediction**: `autotune.cost.evaluate` on `ClusterSpec.of(\"{GPU}\", 1)` with the calibration shipped "
        f"in the repo, for {meta['compared_to']}.", "",
    ]
    if meta["gdn_fallback"]:
        lines += [
            f"> **The comparison is of a different attention.** The runner's notes say: *{meta['gdn_note']}*. "
            "Every layer ran as megatron-core's local (unfused, non-flash) DotProductAttention, which materialises "
            "the 8192 x 8192 score matrix per head. The *as-run* prediction below counts every layer as full "
            "attention but still prices it as flash attention (the cost model knows no other kernel), so its "
            "attention time and activation memory are expected to be low against this run. The as-specified "
            "(Gated DeltaNet) prediction is listed for reference only.", "",
        ]
    lines += [
        "| configuration | status | measured step (s) | measured tokens/s/GPU | measured peak (GiB) "
        "| predicted step (s) | predicted tokens/s/GPU | predicted peak (GiB) "
        "| step meas/pred | tokens/s meas/pred | peak meas/pred |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        m, p = r["measured"], r["predicted_compared"]
        lines.append(
            f"| {r['label']} | {m['status']} | {_f(m['step_time_s'], '.3f')} | {_f(m['tokens_per_s_per_gpu'], ',.0f')} "
            f"| {_f(m['peak_memory_gib'], '.1f')} | {p['step_time_s']:.3f} | {p['tokens_per_s_per_gpu']:,.0f} "
            f"| {p['peak_memory_gib']:.1f} | {_ratio(m['step_time_s'], p['step_time_s'])} "
            f"| {_ratio(m['tokens_per_s_per_gpu'], p['tokens_per_s_per_gpu'])} "
            f"| {_ratio(m['peak_memory_gib'], p['peak_memory_gib'])} |")
    lines += ["", "Peak memory is `torch.cuda.max_memory_allocated()` as the runner reads it (max over steps); "
              "step time is the mean over the window, tokens/s/GPU the window's tokens over its time.", "",
              "## Both predictions", "",
              "| configuration | model predicted | step (s) | tokens/s/GPU | peak (GiB) | MFU |",
              "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        for name, p in (("as specified (Gated DeltaNet)", r["predicted_specified"]),
                        ("as run (all full attention)", r["predicted_as_run"])):
            lines.append(f"| {r['label']} | {name} | {p['step_time_s']:.3f} | {p['tokens_per_s_per_gpu']:,.0f} "
                         f"| {p['peak_memory_gib']:.1f} | {p['mfu']:.1%} |")
    lines += ["", "## Runner notes and per-step times", ""]
    for r in rows:
        m = r["measured"]
        lines.append(f"- **{r['label']}**: status {m['status']}"
                     + (f", step-time CV {m['cv_percent']:.1f}%" if m.get("cv_percent") is not None else "")
                     + (f", {m['elapsed_s']:.0f} s from launch to exit (imports and model build included)"
                        if m.get("elapsed_s") else "") + ".")
        lines.append(f"  - notes / reason: {m['reason'] or 'none'}")
        if m["step_times_s"]:
            lines.append("  - step times (s): " + ", ".join(f"{t:.3f}" for t in m["step_times_s"]))
        if m["losses"]:
            lines.append(f"  - lm loss: {m['losses'][0]:.4f} -> {m['losses'][-1]:.4f}")
    lines += ["", "## Stack", ""]
    stack = meta.get("stack") or {}
    lines += [f"- {k}: {v}" for k, v in stack.items()] or ["- (no trial reported its stack)"]
    lines.append("")
    return "\n".join(lines)


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def measured_of(result) -> dict:
    steps = result.steps
    return {
        "status": result.status, "step_time_s": result.step_time_s, "tokens_per_s_per_gpu": result.tokens_per_s_per_gpu,
        "peak_memory_gib": None if result.peak_memory_bytes is None else result.peak_memory_bytes / GiB,
        "cv_percent": result.step_time_cv_percent, "reason": result.reason, "wall_s": result.wall_s,
        "step_times_s": [s.time_s for s in steps], "losses": [s.lm_loss for s in steps if s.lm_loss is not None],
        "stack": dict(result.stack), "log_tail": result.log_tail,
    }


# --- main ----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="build the specs and predictions, print them, write nothing")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "validation.md", help="the page to write")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw results and predictions here")
    ap.add_argument("--layers", type=int, default=4, help="layers of the model's own pattern (default 4: 3 GDN + 1 full)")
    ap.add_argument("--steps", type=int, default=10, help=f"training steps per trial (default 10; {WARMUP} warm-up)")
    ap.add_argument("--configs", default="full,none", help="recompute configurations, in order: full, none")
    ap.add_argument("--trial-dir", type=Path, default=REPO / "runs" / "gpu_validation")
    ap.add_argument("--timeout", type=float, default=210.0, help="seconds per trial before it is stopped")
    args = ap.parse_args(argv)

    if args.steps <= WARMUP:
        ap.error(f"--steps {args.steps}: need more than the {WARMUP} warm-up steps")
    full_model = load_model(MODEL)
    if not 1 <= args.layers <= full_model.num_layers:
        ap.error(f"--layers {args.layers}: choose 1..{full_model.num_layers}")
    keys = [k.strip() for k in args.configs.split(",") if k.strip()]
    if not keys or any(k not in CONFIGS for k in keys):
        ap.error(f"--configs {args.configs!r}: a comma list of {', '.join(CONFIGS)}")
    if not args.dry_run:
        preflight()

    cuda = not args.dry_run
    te = has_module("transformer_engine") and cuda
    blocker = gdn_blocker(cuda)
    proxy = proxy_of(full_model, args.layers)
    model = proxy_model(full_model, proxy)
    as_run = as_run_without_gdn(model) if model.is_hybrid else model
    wl = workload(args.steps)
    command = shlex.join(["python", "bench/gpu_validation.py", *(sys.argv[1:] if argv is None else argv)])

    say(f"model: {model.name}: {model.describe()}")
    say(f"workload: {SEQ}-token rows, global batch {GLOBAL_BATCH}, {args.steps} steps, window {WARMUP}..{args.steps - 1}; "
        f"prediction on 1 x {GPU}")
    if blocker and model.is_hybrid:
        say(f"GDN {'on this machine' if cuda else 'in a dry run'}: {blocker} -> the runner would build "
            f"{model.count(LINEAR)} GDN layers as standard attention")

    planned = []
    for i, key in enumerate(keys):
        label, rc = CONFIGS[key]
        lay = layout_for(rc)
        spec = trial_spec(i, lay, wl, proxy, args.steps, args.timeout)
        plan = plan_trial(spec)  # the runner's own resolution and legality checks
        assert plan.model == model, "the runner's proxy model differs from the predicted one"
        pred_spec = predict(model, wl, lay)
        pred_run = predict(as_run, wl, as_run_layout(lay, te))
        trial_dir = (args.trial_dir / f"{i}-{key}").resolve()
        say(f"\n[{key}] {label}: {plan.layout.label(True)}, {plan.num_microbatches} micro-batches x "
            f"{plan.rows_per_microbatch} row, {plan.tokens_per_step} tokens/step")
        for name, p in (("as specified (GDN)", pred_spec), ("as run (all full attention)", pred_run)):
            say(f"  predicted {name}: step {p['step_time_s']:.3f} s, {p['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, "
                f"peak {p['peak_memory_gib']:.1f} GiB, MFU {p['mfu']:.1%}{'' if p['fits'] else ' (does NOT fit)'}")
        say(f"  would run: python -m autotune.runner {trial_dir / 'trial_spec.json'}")
        planned.append(dict(key=key, label=label, layout=lay, spec=spec, trial_dir=trial_dir,
                            predicted_specified=pred_spec, predicted_as_run=pred_run))

    if args.dry_run:
        say(f"\ndry run: nothing run, nothing written (a real run writes {args.out})")
        return 0

    rows, stack, t0 = [], {}, time.monotonic()
    for p in planned:
        say(f"\n[{p['key']}] running {p['label']} (timeout {args.timeout:.0f} s; logs in {p['trial_dir'] / 'logs'})")
        t_trial = time.monotonic()
        result = run_trial(p["spec"], p["trial_dir"])
        m = measured_of(result)
        m["elapsed_s"] = round(time.monotonic() - t_trial, 1)
        stack = stack or m["stack"]
        say(f"  -> {m['status']}: step {_f(m['step_time_s'], '.3f')} s, {_f(m['tokens_per_s_per_gpu'], ',.0f')} tokens/s/GPU, "
            f"peak {_f(m['peak_memory_gib'], '.1f')} GiB; {m['reason'] or 'no notes'} ({time.monotonic() - t0:.0f} s so far)")
        if not result.ok and m["log_tail"]:
            say("  log tail:\n" + "\n".join("    " + ln for ln in m["log_tail"].splitlines()[-25:]))
        rows.append({**{k: p[k] for k in ("key", "label", "predicted_specified", "predicted_as_run")}, "measured": m})

    notes = " ".join(r["measured"]["reason"] or "" for r in rows)
    fallback = GDN_FALLBACK in notes or (model.is_hybrid and blocker is not None)
    gdn_note = next((part.strip() for r in rows for part in (r["measured"]["reason"] or "").split(";")
                     if GDN_FALLBACK in part), blocker or "")
    for r in rows:
        r["predicted_compared"] = r["predicted_as_run"] if fallback else r["predicted_specified"]
    meta = dict(date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                device=stack.get("device", "a CUDA GPU"), command=command, model_desc=model.describe(),
                proxy_name=model.name, layers=args.layers, experts=model.moe.num_experts, top_k=model.moe.top_k,
                steps=args.steps, gdn_fallback=fallback, gdn_note=gdn_note, stack=stack,
                compared_to=("the as-run model (every layer full attention; TE-only options off), since the GDN "
                             "layers fell back" if fallback else "the model as specified"))
    write_atomic(args.out, render(rows, meta))
    say(f"\nwrote {args.out} ({time.monotonic() - t0:.0f} s of trials)")
    if args.json:
        write_atomic(args.json, json.dumps({"meta": meta, "proxy": proxy, "rows": rows}, indent=2, default=str) + "\n")
        say(f"wrote {args.json}")
    return 0 if all(r["measured"]["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
