"""Checks a schema-valid recipe cannot pass by shape alone: its derived numbers are recomputed, not trusted.

- MFU = tokens/s/GPU x 6 x N / dense BF16 peak (N: result.active_params.count, itself checked against the
  catalog's exact active count); $ / 1M tokens = GPU $/hour / (tokens/s/GPU x 3600) x 1e6; window tokens =
  (last - first + 1) x global batch x row tokens. Each is compared at the precision the recipe prints it
  (0.134 is right for 0.13392); money to the cent at least.
- The label, DP and rows per micro-batch follow from the degrees (Layout derives them), and the layout
  obeys Megatron-core's rules for the model (layout.rules).
- The layout the `run:` command sets (layout_from_args) agrees with the `layout:` section: degrees,
  effective sequence parallelism (Megatron ignores --sequence-parallel at TP 1, so the seed's
  `sequence_parallel: false` with the flag passed is consistent), recompute, dispatcher, token cap and the
  optimizer options the summary names; the run's steps, batch, loss mask and env exports match too.
- A `verified` recipe passed its gates.
- The run block holds env exports, comments and the one launcher command, nothing else (run_block.py).

`check_recipe` returns Problems (path, message); it never raises on a schema-valid recipe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ..catalog import get_gpu, param_counts
from ..cost.flops import mfu_of, usd_per_million_tokens
from ..errors import AutotuneError
from ..layout import violations
from .convert import PHRASE, layout_of, model_of, run_flags, run_layout, workload_of
from .run_block import run_block_problems
from .schema import Recipe

__all__ = ["Problem", "check_recipe", "agrees", "printed_decimals"]


@dataclass(frozen=True)
class Problem:
    path: str
    message: str
    level: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def printed_decimals(x: float) -> int:
    """Decimals a number was written with (0.134 -> 3, 9.0 -> 1, 1.5e-05 -> 6)."""
    text = repr(float(x))
    mantissa, _, exp = text.partition("e")
    dec = len(mantissa.partition(".")[2])
    return max(0, dec - int(exp)) if exp else dec


def agrees(printed: float, exact: float, decimals: int | None = None) -> bool:
    """Whether `printed` is `exact` rounded to the precision it is printed at (half a unit in the last place)."""
    d = printed_decimals(printed) if decimals is None else decimals
    return abs(printed - exact) <= 0.5 * 10.0**-d * (1 + 1e-9)


_DEGREES = re.compile(r"^TP (\d+), PP (\d+)(?:, VPP (\d+))?, CP (\d+), EP (\d+), ETP (\d+), DP (\d+)")

# Layout field -> how the run block spells it, for messages.
_RUN_FIELDS = {
    "tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size",
    "vpp": "--num-virtual-stages-per-pipeline-rank (or the --pipeline-model-parallel-layout stages)",
    "cp": "--context-parallel-size",
    "ep": "--expert-model-parallel-size", "etp": "--expert-tensor-parallel-size",
    "sp": "--sequence-parallel (effective at TP > 1)", "recompute": "--recompute-*",
    "dispatcher": "--moe-token-dispatcher-type (and --moe-flex-dispatcher-backend)", "max_tokens_per_gpu": "--max-tokens-per-gpu",
    "micro_batch_size": "--micro-batch-size", "distributed_optimizer": "--use-distributed-optimizer",
    "precision_aware_optimizer": "--use-precision-aware-optimizer", "optimizer_offload": "--optimizer-offload-fraction",
    "moe_shared_expert_overlap": "--moe-shared-expert-overlap", "cross_entropy_fusion": "--cross-entropy-loss-fusion",
}


def check_recipe(recipe: Recipe) -> list[Problem]:
    """Every inconsistency between a recipe's fields and the numbers and layout they derive from."""
    out: list[Problem] = []
    _check_result(recipe, out)
    _check_layout(recipe, out)
    _check_run(recipe, out)
    _check_gates(recipe, out)
    return out


def _check_result(r: Recipe, out: list[Problem]) -> None:
    res, w = r.result, r.workload
    lo, hi = res.window
    if not lo <= hi < res.steps_per_run:
        out.append(Problem("result.window", f"{res.window} must satisfy first <= last < steps_per_run ({res.steps_per_run})"))
    expect = (hi - lo + 1) * w.global_batch * w.row_tokens
    if res.window_tokens != expect:
        out.append(Problem("result.window_tokens", f"{res.window_tokens:,} but ({hi} - {lo} + 1) steps x "
                           f"{w.global_batch} rows x {w.row_tokens:,} tokens = {expect:,}"))
    if w.dataset is not None and w.dataset.build.row_tokens != w.row_tokens:
        out.append(Problem("workload.dataset.build.row_tokens",
                           f"{w.dataset.build.row_tokens} but workload.row_tokens is {w.row_tokens}"))
    model = model_of(r)
    n = res.active_params.count
    if model is not None and param_counts(model).active != n:
        out.append(Problem("result.active_params.count",
                           f"{n:,} but {model.name} has {param_counts(model).active:,} active parameters per token"))
    try:
        gpu = get_gpu(r.gpu.type)
    except AutotuneError:
        out.append(Problem("gpu.type", f"{r.gpu.type!r} is not in the GPU catalog; MFU and $ not recomputed", "warning"))
        return
    if r.gpu.memory_gb != gpu.memory_gb_nominal:
        out.append(Problem("gpu.memory_gb", f"{r.gpu.memory_gb} but an {gpu.name} has {gpu.memory_gb_nominal} GB"))
    tps = res.tokens_per_s_per_gpu
    mfu = float(mfu_of(tps, n, gpu.bf16_tflops))
    if not agrees(res.mfu, mfu):
        out.append(Problem("result.mfu", f"{res.mfu} but tokens/s/GPU x 6 x N / peak = {tps:,} x 6 x {n:,} / "
                           f"{gpu.bf16_tflops:g} TFLOP/s = {mfu:.4f}"))
    usd = float(usd_per_million_tokens(gpu.usd_per_hour, tps))
    if not agrees(res.usd_per_million_tokens, usd, max(2, printed_decimals(res.usd_per_million_tokens))):
        out.append(Problem("result.usd_per_million_tokens", f"{res.usd_per_million_tokens} but ${gpu.usd_per_hour:g}/GPU-hour"
                           f" / ({tps:,} tokens/s x 3600) x 1e6 = {usd:.4f}"))


def _check_layout(r: Recipe, out: list[Problem]) -> None:
    s = r.layout
    if r.gpu.count > r.gpu.per_node and r.gpu.count % r.gpu.per_node:
        out.append(Problem("gpu.count", f"{r.gpu.count} GPUs do not fill nodes of {r.gpu.per_node} (gpu.per_node)"))
    try:
        lay = layout_of(r)
    except AutotuneError as exc:
        out.append(Problem("layout", str(exc)))
        return
    model = model_of(r)
    if lay.dp == 0:
        out.append(Problem("layout", f"TP x PP x CP = {lay.model_parallel} does not divide gpu.count {r.gpu.count}"))
        return
    if s.dp != lay.dp:
        out.append(Problem("layout.dp", f"{s.dp} but gpu.count / (TP x PP x CP) = {r.gpu.count} / {lay.model_parallel} = {lay.dp}"))
    if s.sequence_parallel != lay.sp:
        out.append(Problem("layout.sequence_parallel", "true at TP 1, where Megatron ignores --sequence-parallel; "
                           "the field records the effective value: write false"))
    label = lay.label(model.is_moe if model else s.ep > 1)
    if s.label != label:
        out.append(Problem("layout.label", f"{s.label!r} but the degrees give {label!r}"))
    rows = lay.rows_per_microbatch(r.workload.row_tokens)
    if s.rows_per_microbatch != rows:
        out.append(Problem("layout.rows_per_microbatch", f"{s.rows_per_microbatch} but the token cap and row length give {rows}"))
    m = _DEGREES.match(s.summary)
    if m is None:
        out.append(Problem("layout.summary", "does not start with the degrees ('TP 1, PP 4, CP 1, EP 8, ETP 1, DP 8; ...')", "warning"))
    else:
        said = dict(zip(("tp", "pp", "vpp", "cp", "ep", "etp", "dp"), (int(g) if g else 1 for g in m.groups())))
        wrong = [f"{k.upper()} {v} (layout.{k} is {getattr(s, k)})" for k, v in said.items() if v != getattr(s, k)]
        if wrong:
            out.append(Problem("layout.summary", "says " + ", ".join(wrong)))
    if s.layer_split is not None:
        if len(s.layer_split) != s.pp * s.vpp:
            out.append(Problem("layout.layer_split", f"{len(s.layer_split)} stages but PP x VPP = {s.pp * s.vpp}"))
        if model is not None and sum(s.layer_split) != model.num_layers:
            out.append(Problem("layout.layer_split", f"sums to {sum(s.layer_split)} but {model.name} has {model.num_layers} layers"))
    if model is not None:
        try:
            work = workload_of(r)
        except AutotuneError as exc:
            out.append(Problem("workload", str(exc)))
            return
        out.extend(Problem("layout", f"illegal for {model.name}: {v.message}") for v in violations(model, work, lay))


# layout options a recipe states twice: as a run-block flag (what runs) and in the summary's words
_OPTION_FLAGS = {
    "precision_aware_optimizer": "--use-precision-aware-optimizer",
    "moe_shared_expert_overlap": "--moe-shared-expert-overlap",
    "cross_entropy_fusion": "--cross-entropy-loss-fusion",
}


def _check_run(r: Recipe, out: list[Problem]) -> None:
    out.extend(Problem("run", f"line {n}: {msg}") for n, msg in run_block_problems(r.run))
    try:
        ran, lay = run_layout(r), layout_of(r)
    except AutotuneError as exc:
        out.append(Problem("run", str(exc)))
        return
    flags = run_flags(r.run)
    summary = r.layout.summary
    for field, flag in _OPTION_FLAGS.items():
        said = PHRASE[field] in summary
        if said != (flag in flags):
            out.append(Problem("run", f"the layout summary {'names' if said else 'does not name'} {PHRASE[field]!r} "
                               f"but the run block {'lacks' if said else 'sets'} {flag}"))
    if ran.world != r.gpu.count:
        out.append(Problem("run", f"launches {ran.world} GPUs (--actor-num-nodes x --actor-num-gpus-per-node) but gpu.count is {r.gpu.count}"))
    per_node = flags.get("--actor-num-gpus-per-node")
    if per_node is not None and r.gpu.count >= r.gpu.per_node and per_node != str(r.gpu.per_node):
        out.append(Problem("run", f"--actor-num-gpus-per-node {per_node} but gpu.per_node is {r.gpu.per_node}"))
    for name, flag in _RUN_FIELDS.items():
        a, b = getattr(ran, name), getattr(lay, name)
        if a != b:
            out.append(Problem("run", f"{flag}: the command sets {_show(a)} but the layout section says {_show(b)}"))
    expect = {
        "--num-rollout": (str(r.result.steps_per_run), "result.steps_per_run"),
        "--global-batch-size": (str(r.workload.global_batch), "workload.global_batch"),
    }
    if r.workload.dataset is not None:
        expect["--loss-mask-type"] = (r.workload.dataset.build.loss_mask, "workload.dataset.build.loss_mask")
    for flag, (want, where) in expect.items():
        if flag in flags and flags[flag] != want:
            out.append(Problem("run", f"{flag} {flags[flag]} but {where} is {want}"))
        elif flag not in flags and flag != "--loss-mask-type":
            out.append(Problem("run", f"no {flag} (expected {want}, from {where})"))
    lines = set(r.run.splitlines())
    for key, value in r.env.items():
        if f"export {key}={value}" not in lines:
            out.append(Problem(f"env.{key}", f"not exported in run (expected a line 'export {key}={value}')"))


def _show(v) -> str:
    return str(v) if not isinstance(v, bool) else ("on" if v else "off")


def _check_gates(r: Recipe, out: list[Problem]) -> None:
    c = r.correctness
    failed = [f"component test {t.test!r}" for t in c.component_tests if t.result != "pass"]
    if c.convergence is not None and c.convergence.result != "pass":
        failed.append("convergence")
    if c.configuration == "fail":
        failed.append("configuration")
    if c.result == "pass" and failed:
        out.append(Problem("correctness.result", "pass but " + ", ".join(failed) + " failed"))
    if r.status == "verified" and (c.result != "pass" or c.convergence is None):
        out.append(Problem("status", f"verified needs correctness.result pass with a convergence check (got {c.result})"))
    if r.status == "predicted" and r.result.runs != 0:
        out.append(Problem("result.runs", f"{r.result.runs} but a predicted recipe has no measured runs (0)", "warning"))
