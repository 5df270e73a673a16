"""Narrow monkeypatches that let megatron-core 0.16 train on CPU over gloo.

Used only by the runner, only when CUDA is unavailable (`apply()` is a no-op otherwise), so tests on a
laptop exercise the real training step. Each patch names the upstream code it works around and why;
`tests/runner/test_cpu_patches.py` fails when an upstream change makes one unnecessary or wrong.
The upstream objects are kept in `UPSTREAM` so tests can show they still fail on CPU.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import types

import torch

__all__ = ["apply", "applied", "cuda_type_names", "PATCHES", "UPSTREAM", "CUDA_LITERAL_MODULES", "NullStream", "NULL_STREAM"]

UPSTREAM: dict[str, object] = {}  # "module:attr" -> the object before patching
_APPLIED: list[str] = []

# Modules that build small tensors with a literal device="cuda" on the training path we run:
# optimizer.optimizer (found_inf/_scale buffers), clip_grads (norm/overflow buffers), schedules
# (total_num_tokens), transformer.utils (the causal mask of the local DotProductAttention), utils
# (local_multi_tensor_l2_norm, the grad norm without Apex/TE).
CUDA_LITERAL_MODULES = (
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.transformer.utils",
    "megatron.core.utils",
)

_CUDA_TYPE_NAMES = {
    "torch.FloatTensor": "torch.cuda.FloatTensor",
    "torch.HalfTensor": "torch.cuda.HalfTensor",
    "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor",
}


def _set(module, name: str, value) -> None:
    UPSTREAM.setdefault(f"{module.__name__}:{name}", getattr(module, name, None))
    setattr(module, name, value)


class NullEvent:
    """Stands in for torch.cuda.Event: CPU work is synchronous, so every event has already happened."""

    def record(self, *args, **kwargs): ...

    def synchronize(self): ...

    def wait(self, *args, **kwargs): ...

    def query(self):
        return True


class NullStream:
    """Stands in for torch.cuda.Stream: there is one (synchronous) CPU stream."""

    def wait_stream(self, other): ...

    def wait_event(self, event): ...

    def synchronize(self): ...

    def record_event(self, event=None):
        return event or NullEvent()


NULL_STREAM = NullStream()


def _patch_rng_tracker() -> None:
    # CudaRNGStatesTracker.add/fork read and write torch.cuda RNG states (AssertionError "Torch not
    # compiled with CUDA enabled"). Keep the same named, seeded streams on the CPU generator instead;
    # checkpoint recompute saves the CPU state itself, so the CUDA get/set become no-ops.
    from megatron.core.tensor_parallel import random as mrandom

    base = UPSTREAM.get("megatron.core.tensor_parallel.random:CudaRNGStatesTracker") or mrandom.CudaRNGStatesTracker

    class CpuRNGStatesTracker(base):  # type: ignore[misc, valid-type]
        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            orig = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(orig)

    _set(mrandom, "CudaRNGStatesTracker", CpuRNGStatesTracker)
    _set(mrandom, "_get_cuda_rng_state", lambda *a, **k: None)
    _set(mrandom, "_set_cuda_rng_state", lambda *a, **k: None)
    mrandom.initialize_rng_tracker(force_reset=True)


def _patch_cuda_runtime() -> None:
    # Megatron allocates with device=torch.cuda.current_device() throughout (grad buffers, router,
    # all-to-all outputs) and calls torch.cuda.synchronize() after batched p2p (batch_p2p_sync) and
    # torch.cuda.current_stream() in the alltoall dispatcher: on CPU there is one device and one stream.
    _set(torch.cuda, "current_device", lambda: torch.device("cpu"))
    _set(torch.cuda, "synchronize", lambda device=None: None)
    _set(torch.cuda, "current_stream", lambda device=None: NULL_STREAM)


def _patch_alltoall_dispatcher() -> None:
    # MoEAlltoAllTokenDispatcher.__init__ creates a class-wide torch.cuda.Stream() for device-to-host
    # copies of the split sizes; a pre-set class attribute skips that. Its split sizes stay tensors on
    # CPU (maybe_move_tensor_to_cpu converts only CUDA tensors to numpy), and all_to_all_single's
    # binding accepts only lists of ints, so hand it lists.
    from megatron.core.transformer.moe import token_dispatcher as td

    _set(td.MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", NULL_STREAM)
    upstream_a2a = UPSTREAM.get("megatron.core.transformer.moe.token_dispatcher:all_to_all") or td.all_to_all

    def all_to_all(group, input_, output_split_sizes_=None, input_split_sizes=None):
        return upstream_a2a(group, input_, _as_list(output_split_sizes_), _as_list(input_split_sizes))

    _set(td, "all_to_all", all_to_all)


def _as_list(sizes):
    return sizes.tolist() if hasattr(sizes, "tolist") else sizes


def _patch_te_general_gemm() -> None:
    # moe_utils binds te_general_gemm only inside its `try: import transformer_engine` block, yet
    # RouterGatingLinearFunction reads the name unconditionally: NameError without TE.
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        _set(moe_utils, "te_general_gemm", None)


def _patch_torch_norm_sp() -> None:
    # WrappedTorchNorm (the norm of the local spec without Apex) asserts not sequence_parallel, but a
    # torch RMSNorm works on a sequence shard as well; what SP needs is the `sequence_parallel` mark
    # so finalize_model_grads sums the norm's weight grads over TP ranks (as TE's norms do).
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    upstream_new = UPSTREAM.get("megatron.core.transformer.torch_norm:__new__") or WrappedTorchNorm.__new__
    UPSTREAM.setdefault("megatron.core.transformer.torch_norm:__new__", upstream_new)

    def __new__(cls, config, hidden_size, eps=1e-5, **kw):
        if not config.sequence_parallel:
            return upstream_new(cls, config, hidden_size, eps, **kw)
        local = copy.copy(config)
        local.sequence_parallel = False
        norm = upstream_new(cls, local, hidden_size, eps, **kw)
        for p in norm.parameters():
            p.sequence_parallel = True
        return norm

    WrappedTorchNorm.__new__ = staticmethod(__new__)


class _CudaLiteralTorch(types.ModuleType):
    """`torch` as one megatron module sees it: factories map device="cuda" to the CPU."""

    def __getattr__(self, name):
        return getattr(torch, name)


def _cpu_device(fn):
    @functools.wraps(fn)
    def factory(*args, **kwargs):
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return fn(*args, **kwargs)

    return factory


def _patch_cuda_literals() -> None:
    # See CUDA_LITERAL_MODULES: these build tensors with device="cuda" / device='cuda' literals. Each
    # gets its own `torch` whose factories allocate on the CPU; the real torch stays untouched.
    proxy = _CudaLiteralTorch("torch")
    for name in ("tensor", "zeros", "ones", "empty", "full"):
        setattr(proxy, name, _cpu_device(getattr(torch, name)))
    for modname in CUDA_LITERAL_MODULES:
        _set(importlib.import_module(modname), "torch", proxy)


@contextlib.contextmanager
def cuda_type_names():
    """Within the block, Tensor.type() of a CPU float tensor reports its torch.cuda.* name."""
    upstream_type = torch.Tensor.type

    def type_(self, *args, **kwargs):
        result = upstream_type(self, *args, **kwargs)
        return _CUDA_TYPE_NAMES.get(result, result) if not args and not kwargs else result

    torch.Tensor.type = type_
    try:
        yield
    finally:
        torch.Tensor.type = upstream_type


def _under_cuda_type_names(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with cuda_type_names():
            return fn(*args, **kwargs)

    return wrapper


def _patch_type_checks() -> None:
    # The optimizers sort parameters by Tensor.type() strings ('torch.cuda.FloatTensor', ...) and
    # raise TypeError (or assert) on anything else: the distributed optimizer's param groups, the
    # bf16 optimizer's __init__, and clip_grad_by_total_norm_fp32.
    from megatron.core.optimizer import clip_grads, distrib_optimizer
    from megatron.core.optimizer import optimizer as mopt

    dopt = distrib_optimizer.DistributedOptimizer
    build = dopt.__dict__["_build_model_and_main_param_groups"].__func__
    _set(dopt, "_build_model_and_main_param_groups", classmethod(_under_cuda_type_names(build)))
    _set(dopt, "__init__", _under_cuda_type_names(dopt.__init__))
    f16 = mopt.Float16OptimizerWithFloat16Params
    _set(f16, "__init__", _under_cuda_type_names(f16.__init__))
    clip = _under_cuda_type_names(clip_grads.clip_grad_by_total_norm_fp32)
    _set(clip_grads, "clip_grad_by_total_norm_fp32", clip)
    _set(mopt, "clip_grad_by_total_norm_fp32", clip)  # optimizer.py imported the name


def _patch_checkpoint_without_output() -> None:
    # CheckpointWithoutOutput.__init__ sets `self.fp8 = fp8 is not None`, so the default fp8=False
    # turns FP8 on and forward() calls FP8GlobalStateManager, which exists only with TE (NameError in
    # selective recompute of layernorm / moe_act). Without TE there is no FP8.
    from megatron.core.tensor_parallel import random as mrandom

    cls = mrandom.CheckpointWithoutOutput
    upstream_init = cls.__init__

    def __init__(self, fp8=False):
        upstream_init(self, fp8)
        self.fp8 = False

    _set(cls, "__init__", __init__)


def _patch_uneven_gather() -> None:
    # With ETP > 1 the alltoall dispatcher all-gathers token blocks of different sizes over the
    # expert-TP group (output_split_sizes): a list all_gather that NCCL accepts and gloo refuses
    # ("invalid tensor size"). On gloo, pad every block to the largest and cut after the gather.
    # (The matching uneven reduce_scatter works on gloo as it is.)
    from megatron.core.tensor_parallel import mappings

    upstream = mappings._gather_along_first_dim

    def gather(input_, group, output_split_sizes=None, use_global_buffer=False):
        if output_split_sizes is None or group.size() == 1:
            return upstream(input_, group, output_split_sizes, use_global_buffer)
        sizes = [int(n) for n in output_split_sizes]
        padded = input_.new_zeros((max(sizes), *input_.shape[1:]))
        padded[: input_.shape[0]] = input_
        blocks = [torch.empty_like(padded) for _ in sizes]
        torch.distributed.all_gather(blocks, padded, group=group)
        return torch.cat([b[:n] for b, n in zip(blocks, sizes)], dim=0)

    _set(mappings, "_gather_along_first_dim", gather)


def _patch_tied_embedding_sync() -> None:
    # With tied embeddings and PP > 1 the last stage keeps a copy of the word embeddings, and
    # LanguageModule.setup_embeddings_and_output_layer moves it with `weight.data.cuda()` before
    # all-reducing it over the embedding group: on CPU that raises. Run that one method with
    # Tensor.cuda as the identity (nothing else sees the change).
    from megatron.core.models.common.language_module.language_module import LanguageModule

    upstream = LanguageModule.setup_embeddings_and_output_layer

    def setup_embeddings_and_output_layer(self, *args, **kwargs):
        cuda = torch.Tensor.cuda
        torch.Tensor.cuda = lambda tensor, *a, **k: tensor
        try:
            return upstream(self, *args, **kwargs)
        finally:
            torch.Tensor.cuda = cuda

    _set(LanguageModule, "setup_embeddings_and_output_layer", setup_embeddings_and_output_layer)


PATCHES = {
    "rng_tracker_on_cpu_generator": _patch_rng_tracker,
    "cuda_device_stream_sync_on_cpu": _patch_cuda_runtime,
    "alltoall_null_stream_and_list_splits": _patch_alltoall_dispatcher,
    "te_general_gemm_none": _patch_te_general_gemm,
    "torch_norm_sequence_parallel": _patch_torch_norm_sp,
    "cuda_device_literals": _patch_cuda_literals,
    "cuda_tensor_type_checks": _patch_type_checks,
    "checkpoint_without_output_fp8": _patch_checkpoint_without_output,
    "uneven_all_gather_on_gloo": _patch_uneven_gather,
    "tied_embedding_sync_on_cpu": _patch_tied_embedding_sync,
}


def applied() -> list[str]:
    return list(_APPLIED)


def apply(force: bool = False) -> list[str]:
    """Apply every patch once, when CUDA is unavailable (or `force`). Returns the names applied."""
    if _APPLIED or (torch.cuda.is_available() and not force):
        return list(_APPLIED)
    for name, fn in PATCHES.items():
        fn()
        _APPLIED.append(name)
    return list(_APPLIED)
