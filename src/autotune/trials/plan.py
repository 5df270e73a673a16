"""What one trial will run, resolved and checked before any process group starts. No torch here: the CLI
checks a spec with it before starting ranks, and the runner (src/autotune/runner) plans with it on every rank.

`plan_trial(spec)` turns a TrialSpec into the model (proxied if the spec says so), the Layout, the
Workload and the batching (rows per micro-batch, micro-batches per step), and raises a one-line
BadInput subclass for everything that is the user's mistake: a layout whose degrees do not match the
world size, a layout Megatron-core would reject for this model, a missing or malformed dataset, the
flex dispatcher without DeepEP. The CLI calls it before starting ranks; every rank calls it again.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, fields
from pathlib import Path

from ..catalog import ModelSpec, Workload, load_model
from ..errors import BadInput, ConfigError
from ..layout import FLEX_DISPATCHERS, Layout, validate
from .proxy import proxy_model
from .spec import TrialSpec

__all__ = ["TrialPlan", "plan_trial", "has_module", "model_blocker", "flex_backend_missing", "trials_missing",
           "local_software"]


def has_module(name: str) -> bool:
    """Whether `name` is importable here, without importing it (TE and DeepEP import CUDA)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def trials_missing() -> str | None:
    """Why real trials cannot run on this machine (torch or megatron-core not installed), or None."""
    for module, what in (("torch", "torch"), ("megatron.core", "megatron-core")):
        if not has_module(module):  # a missing parent package counts as missing too
            return f"{what} is not installed here (pip install torch==2.13.0 'autotune[trials]')"
    return None


def local_software() -> dict[str, bool]:
    """ClusterSpec keyword arguments for the kernels this machine lacks (trials run here: --backend local); the
    space's notes say what each removes."""
    kw = {} if has_module("transformer_engine") else {"has_te": False}
    if not megatron_has_paged_stash():
        kw["has_paged_stash"] = False
    kw.update({flag: False for flag, dispatcher in (("has_deepep", "flex"), ("has_hybridep", "hybridep"))
               if flex_backend_missing(dispatcher)})
    return kw


def local_gpus() -> int:
    """CUDA devices this machine has (0 without torch, CUDA or a GPU)."""
    if not has_module("torch"):
        return 0
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def local_capacity_refusal(gpu_name: str, accelerator: bool, count: int, gpus: int | None = None) -> str | None:
    """Why `--backend local` cannot host `count` ranks of `gpu_name` here (one line with the numbers), or None: GPU
    ranks need this machine's GPUs, one each (a CPU-only machine runs such a layout on its cores, every rank with
    its full shard of the model, and the kernel's OOM killer ends it); CPU ranks are screened per trial against free
    memory (backends/local.host_memory_refusal)."""
    if not accelerator:
        return None
    gpus = local_gpus() if gpus is None else gpus
    if count <= gpus:
        return None
    here = f"this machine has {gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "this machine has no GPU"
    return (f"--backend local runs one rank per GPU on this machine, but {count} x {gpu_name} needs {count} and "
            f"{here}: use --backend ray (a cluster), --backend simulate (predictions), or --gpu cpu with a --count "
            "this machine can host")


def megatron_has_paged_stash() -> bool:
    """Whether the installed megatron-core has the paged stash (TransformerConfig.moe_paged_stash, after 0.16): read
    from its transformer_config.py without importing megatron.core (which imports torch): find_spec of the package
    imports only its parent, `megatron`, while find_spec of a submodule would import megatron.core itself."""
    try:
        spec = importlib.util.find_spec("megatron.core")
    except (ImportError, ValueError):
        return False
    for root in (spec.submodule_search_locations or []) if spec else []:
        try:
            text = (Path(root) / "transformer" / "transformer_config.py").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        return "moe_paged_stash" in text
    return False


def flex_backend_missing(dispatcher: str) -> str | None:
    """Why the flex dispatcher's backend for `dispatcher` ("flex": DeepEP, "hybridep": HybridEP) cannot be loaded
    here, or None; found without importing it (deep_ep initialises CUDA). megatron-core imports DeepEP's Buffer for
    the deepep backend and `from deep_ep import HybridEPBuffer` for hybridep: HybridEP ships in DeepEP's hybrid-ep
    branch as deep_ep/hybrid_ep_buffer.py, which a main-branch DeepEP lacks."""
    if dispatcher not in FLEX_DISPATCHERS:
        return None
    if not has_module("deep_ep"):
        return (f"the {dispatcher} dispatcher needs DeepEP (deep_ep), which is not installed here; use alltoall or "
                "allgather")
    if dispatcher == "hybridep":
        where = [Path(p) for p in (importlib.util.find_spec("deep_ep").submodule_search_locations or [])]
        if not any((d / "hybrid_ep_buffer.py").exists() for d in where):
            return ("the hybridep dispatcher needs HybridEP (DeepEP's hybrid-ep branch: deep_ep.HybridEPBuffer), "
                    "which this DeepEP lacks; use flex (DeepEP), alltoall or allgather")
    return None


@dataclass(frozen=True)
class TrialPlan:
    spec: TrialSpec
    model: ModelSpec
    layout: Layout
    workload: Workload
    rows_per_microbatch: int
    num_microbatches: int  # per DP rank per step
    data_path: Path | None = None

    @property
    def rows_per_step(self) -> int:
        return self.layout.dp * self.num_microbatches * self.rows_per_microbatch

    @property
    def tokens_per_step(self) -> int:
        return self.rows_per_step * self.workload.seq_len

    @property
    def window(self) -> tuple[int, int]:
        """Steps scored for tokens/s (inclusive): everything after the warm-up steps."""
        return self.spec.warmup_steps, self.spec.steps - 1


def spec_workload(spec: TrialSpec) -> Workload:
    """The trial's Workload, checked (one-line ConfigError naming the trial)."""
    known = {f.name for f in fields(Workload)}
    unknown = sorted(set(spec.workload) - known)
    if unknown:
        raise ConfigError(f"trial {spec.number}: workload field(s) {unknown} unknown; known: {', '.join(sorted(known))}")
    kw = dict(spec.workload)
    if "window" in kw:
        kw["window"] = tuple(kw["window"])
    try:
        return Workload(**kw)
    except (TypeError, BadInput) as exc:
        raise ConfigError(f"trial {spec.number}: workload: {exc}") from None


def spec_layout(spec: TrialSpec) -> Layout:
    """The trial's Layout, checked against its world size (one-line ConfigError naming the trial)."""
    try:
        layout = Layout.from_dict(spec.layout)
    except (TypeError, BadInput) as exc:
        raise ConfigError(f"trial {spec.number}: layout: {exc}") from None
    if layout.world != spec.count:
        raise ConfigError(
            f"trial {spec.number}: layout {layout.label()} is for {layout.world} GPUs but the trial has "
            f"count {spec.count}; make layout.world and count agree")
    if layout.model_parallel * max(layout.dp, 1) != spec.count:
        raise ConfigError(
            f"trial {spec.number}: TP x PP x CP = {layout.model_parallel} does not divide the world size "
            f"{spec.count}; choose degrees whose product divides {spec.count}")
    return layout


def _data_path(spec: TrialSpec, model: ModelSpec) -> Path | None:
    if spec.data.kind == "synthetic":
        return None
    if not spec.data.path:
        raise ConfigError(f"trial {spec.number}: data.kind is pretokenized but data.path is empty; give a .npy file")
    path = Path(spec.data.path).expanduser()
    if not path.is_file():
        raise ConfigError(f"trial {spec.number}: dataset {str(path)!r} does not exist; give a .npy file of token ids")
    if path.suffix != ".npy":
        raise ConfigError(f"trial {spec.number}: dataset {str(path)!r}: only .npy token files are read; convert with numpy.save")
    return path


def plan_trial(spec: TrialSpec, world_size: int | None = None) -> TrialPlan:
    """Resolve and check a trial. `world_size` (the launcher's WORLD_SIZE) must equal spec.count."""
    if world_size is not None and world_size != spec.count:
        raise ConfigError(f"trial {spec.number}: launched with {world_size} ranks but the spec's count is {spec.count}")
    if spec.warmup_steps >= spec.steps:
        raise ConfigError(
            f"trial {spec.number}: warmup_steps {spec.warmup_steps} leaves no steps to score out of {spec.steps}; "
            f"use steps > warmup_steps (e.g. steps {spec.warmup_steps + 5})")
    model = load_model(spec.model)
    blocker = model_blocker(model)
    if blocker:
        raise BadInput(f"trial {spec.number}: the runner cannot build {model.name} ({blocker}); "
                       "predict it with `autotune estimate` or the simulate backend")
    if spec.proxy:
        model = proxy_model(model, spec.proxy)
    layout = spec_layout(spec)
    workload = spec_workload(spec)
    validate(model, workload, layout)  # IllegalLayout names every broken rule and the nearest legal layout
    missing = flex_backend_missing(layout.dispatcher)
    if missing:
        raise BadInput(missing)
    rows = layout.rows_per_microbatch(workload.seq_len)
    return TrialPlan(spec=spec, model=model, layout=layout, workload=workload, rows_per_microbatch=rows,
                     num_microbatches=layout.num_microbatches(workload.global_batch, workload.seq_len),
                     data_path=_data_path(spec, model))


def model_blocker(model: ModelSpec) -> str | None:
    """Why the runner (runner/build.py: a GPTModel with SwiGLU MLPs, RMSNorm and rotary positions) cannot
    build `model` as it is, or None. Such a model is refused before any rank starts rather than built as
    another model; the cost model still predicts it (`autotune estimate`, the simulate backend)."""
    why = [w for w, cond in (
        ("Mamba2 layers (Megatron's hybrid MambaModel; mamba-ssm kernels)", model.mamba is not None),
        ("a hybrid layer pattern", bool(model.hybrid_pattern)),
        ("an MLP without a gate (squared ReLU / GeLU)", not model.gated_mlp),
        ("LayerNorm with biases", model.norm_bias),
        ("learned absolute positions", bool(model.learned_positions)),
        ("MLP biases", model.mlp_bias),
        ("LatentMoE projections", bool(model.moe and model.moe.latent_size)),
    ) if cond]
    return ", ".join(why) or None


def gdn_blocker(cuda: bool) -> str | None:
    """Why megatron's Gated DeltaNet cannot run here, or None if it can (no torch import needed)."""
    if not cuda:
        return "no CUDA (its FLA kernels are Triton GPU kernels)"
    if not has_module("transformer_engine"):
        return "Transformer Engine is not installed (megatron's GDN block spec is TE-only)"
    if not has_module("fla"):
        return "flash-linear-attention is not installed"
    return None
