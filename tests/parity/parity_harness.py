"""Megatron-core on CPU over gloo, one process per rank, for the parity checks (tests/parity).

`run_world(layout, fn, *args)` starts `layout.world` ranks from a forkserver that has megatron-core
imported already (a rank then starts in well under a second instead of ~5 s of imports), starts gloo
and megatron's parallel state at the layout on each, applies the runner's CPU patches, calls `fn(*args)`
and returns every rank's result in rank order. `count_params` builds the GPTModel chunks of one rank the
way the runner does (runner.build: transformer_config and the layer spec) with the weights left
uninitialised: counting needs only shapes, and real widths then cost no time and no resident memory.
`predicted_params` is autotune's count for the same rank's pipeline stage.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import socket
import sys
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

from autotune.catalog import ClusterSpec, ModelSpec, Workload, load_model
from autotune.catalog.model import FULL
from autotune.layout import Layout, LayoutTable, validate

__all__ = ["run_world", "count_params", "predicted_params", "make_plan", "rank_coords", "shrink", "build_chunks",
           "runner_overrides", "WORKLOAD"]

WORKLOAD = Workload(seq_len=128, global_batch=8, steps=2, window=(1, 1))
_PRELOAD = ["torch", "megatron.core.models.gpt", "megatron.core.parallel_state", "autotune.runner.build",
            "autotune.runner.cpu_patches", "parity_harness", "activation_parity"]
# bench/activation_parity.py holds the activation measurement; the forkserver takes sys.path as it is when
# it starts, so the folder goes on it here, at collection time, before any rank starts
_BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if _BENCH not in sys.path:
    sys.path.append(_BENCH)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _rank_main(rank: int, layout: Layout, port: int, fn, args, out) -> None:
    try:
        import torch
        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel

        from autotune.runner import cpu_patches

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // layout.world))
        cpu_patches.apply()
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                             world_size=layout.world)
        ps.initialize_model_parallel(
            tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
            context_parallel_size=layout.cp, expert_model_parallel_size=layout.ep,
            expert_tensor_parallel_size=layout.etp)
        torch.manual_seed(1234)
        tensor_parallel.model_parallel_cuda_manual_seed(1234)
        out.put((rank, True, fn(*args)))
    except BaseException:  # noqa: BLE001 - the parent raises it with the rank's traceback
        out.put((rank, False, traceback.format_exc()))
    finally:
        out.close()
        out.join_thread()
        os._exit(0)  # leave without a gloo teardown that could wait on a failed peer


def run_world(layout: Layout, fn, *args, timeout: float = 120.0) -> list:
    """Run fn(*args) on every rank of `layout` (megatron parallel state set up); results in rank order."""
    ctx = _context()
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, layout, port, fn, args, out), daemon=True)
             for r in range(layout.world)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    try:
        while len(results) < layout.world:
            try:
                rank, ok, value = out.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"{layout.label()}: ranks {sorted(set(range(layout.world)) - set(results))} "
                                   f"did not answer within {timeout:.0f} s") from None
            if not ok:
                raise RuntimeError(f"rank {rank} of {layout.label()} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(layout.world)]


def shrink(name: str, layers: int, experts: int | None = None, full_attention_only: bool = False,
           first_dense: int | None = None) -> ModelSpec:
    """A catalog model at its real widths with fewer layers (and experts), as a ModelSpec.
    `full_attention_only` turns Gated DeltaNet layers into the model's full attention (megatron's GDN
    needs TE and CUDA); `first_dense` keeps that many leading dense layers (DeepSeek's first_k_dense)."""
    m = load_model(name)
    types = (FULL,) * layers if full_attention_only else m.layer_types[:layers]
    ch: dict = dict(num_layers=layers, layer_types=types, mtp_layers=0)
    if full_attention_only:
        ch["linear"] = None
    if m.moe is not None:
        n = experts or m.moe.num_experts
        dense = tuple(range(first_dense)) if first_dense is not None else tuple(d for d in m.moe.dense_layers if d < layers)
        ch["moe"] = replace(m.moe, num_experts=n, top_k=min(m.moe.top_k, n), dense_layers=dense)
    return replace(m, **ch)


@dataclass(frozen=True)
class _Spec:  # what runner.build reads of a TrialSpec
    steps: int = 2


def make_plan(model: ModelSpec, layout: Layout, workload: Workload = WORKLOAD):
    """A TrialPlan for the runner's builders, after autotune's own legality check of the layout."""
    from autotune.trials.plan import TrialPlan

    validate(model, workload, layout)
    return TrialPlan(spec=_Spec(), model=model, layout=layout, workload=workload,  # type: ignore[arg-type]
                     rows_per_microbatch=1, num_microbatches=max(1, workload.global_batch // max(1, layout.dp)))


def rank_coords() -> dict:
    from megatron.core import parallel_state as ps

    return {"tp": ps.get_tensor_model_parallel_rank(), "pp": ps.get_pipeline_model_parallel_rank(),
            "ep": ps.get_expert_model_parallel_rank(), "etp": ps.get_expert_tensor_parallel_rank(),
            "dp": ps.get_data_parallel_rank()}


def build_chunks(model: ModelSpec, layout: Layout, dtype_name: str = "bf16", initialise: bool = False,
                 overrides: dict | None = None) -> tuple:
    """This rank's GPTModel chunks (one per virtual stage), as runner.build makes them, and the config.
    `overrides` sets TransformerConfig fields the runner does not set yet (see runner_overrides)."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    from autotune.catalog import padded_vocab
    from autotune.runner.build import _layer_spec, transformer_config

    plan = make_plan(model, layout)
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    config, use_te = transformer_config(plan, False, dtype, [])
    config.perform_initialization = initialise
    for k, v in (overrides or {}).items():
        setattr(config, k, v)
    chunks = []
    for v in range(layout.vpp):
        vp = v if layout.vpp > 1 else None
        spec = _layer_spec(config, use_te, vp)
        if model.mla is not None:
            _stub_core_attention(spec)
        if model.is_hybrid:
            _gated_deltanet_stand_in(spec, config, model, vp)
        with _tensor_cuda_is_identity():
            chunks.append(GPTModel(
                config, spec, vocab_size=padded_vocab(model, layout.tp),
                max_sequence_length=plan.workload.seq_len,
                pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
                post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
                share_embeddings_and_output_weights=model.tie_embeddings, position_embedding_type="rope",
                rotary_percent=model.rotary_fraction, vp_stage=vp))
    return chunks, config


def _gated_deltanet_stand_in(block_spec, config, model: ModelSpec, vp: int | None) -> None:
    """Without TE (and FLA, and CUDA) the runner builds a hybrid model's Gated DeltaNet layers as
    standard attention, and megatron's GDN block spec is TE-only. For counting, the linear-attention
    layers of this stage get megatron's own GatedDeltaNet with local linears standing in for TE's:
    in_proj a ColumnParallelLinear (TE's LayerNormColumnParallelLinear also holds the input norm's
    weight, which the local spec keeps in input_layernorm: the same count), out_norm the layer's norm
    class, out_proj a RowParallelLinear. GatedDeltaNet.__init__ refuses to start without FLA, whose
    kernels only the forward pass uses: the flag is set. Counting only: such a model does not run."""
    from megatron.core.ssm import gated_delta_net as gdn
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from autotune.catalog.model import LINEAR

    la = model.linear
    for k, v in dict(linear_conv_kernel_dim=la.conv_kernel, linear_key_head_dim=la.key_head_dim,
                     linear_value_head_dim=la.value_head_dim, linear_num_key_heads=la.num_key_heads,
                     linear_num_value_heads=la.num_value_heads).items():
        setattr(config, k, v)  # as runner.build sets them when GDN can run
    gdn.HAVE_FLA = True
    offset = get_transformer_layer_offset(config, vp_stage=vp)
    for i, layer in enumerate(block_spec.layer_specs):
        if model.layer_types[offset + i] != LINEAR:
            continue
        attention = ModuleSpec(module=gdn.GatedDeltaNet, submodules=gdn.GatedDeltaNetSubmodules(
            in_proj=ColumnParallelLinear, out_norm=layer.submodules.input_layernorm, out_proj=RowParallelLinear))
        block_spec.layer_specs[i] = replace(layer, submodules=replace(layer.submodules, self_attention=attention))


@contextlib.contextmanager
def _tensor_cuda_is_identity():
    """With tied embeddings and PP > 1, LanguageModule.setup_embeddings_and_output_layer moves the
    shared weight with `weight.data.cuda()` before all-reducing it over the embedding group: on CPU
    that raises. Not among runner.cpu_patches yet (reported), so the build here keeps it on the CPU."""
    import torch

    upstream = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.cuda = upstream


def runner_overrides(model: ModelSpec) -> dict:
    """TransformerConfig fields that runner.build.transformer_config does not set for this model but
    megatron needs to build the model's real parameter set (reported as runner changes):
    - linear biases (gpt-oss): add_bias_linear builds linear_proj.bias, router.bias and the experts'
      fc1/fc2 biases; the runner sets add_bias_linear=False for every model.
    - MLA latent norms (DeepSeek-V3): megatron builds MLASelfAttention.q_layernorm / kv_layernorm only
      with qk_layernorm=True (gpt_layer_specs: `qk_norm if qk_layernorm else IdentityOp`), as
      Megatron's DeepSeek-V3 recipes pass --qk-layernorm; the runner sets qk_layernorm=model.qk_norm."""
    out = {}
    if model.attention_bias and model.moe is not None and model.moe.expert_bias:
        out["add_bias_linear"] = True
    if model.mla is not None:
        out["qk_layernorm"] = True
    return out


def _stub_core_attention(block_spec) -> None:
    """Without TE, megatron-core 0.16.1 cannot build an MLA layer: the local DotProductAttention takes no
    k_channels/v_channels (which MLASelfAttention passes), and MLASelfAttention.__init__ asks
    `HAVE_TE and isinstance(self.linear_proj, TELinear)` where, without TE, HAVE_TE is True and TELinear
    a MagicMock placeholder (extensions/transformer_engine.py). Core attention has no parameters and the
    check only picks fp8 input saving, so for counting a parameter-free stand-in takes core attention's
    place and the check is switched off. Counting only: such a model does not run."""
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.spec_utils import ModuleSpec

    from megatron.core.post_training.modelopt.layers import Linear

    multi_latent_attention.HAVE_TE = False
    for layer in block_spec.layer_specs:
        sub = layer.submodules.self_attention.submodules
        sub.core_attention = ModuleSpec(module=_no_core_attention_class())
        # TE's spec builds the latent down-projections as TELinear(parallel_mode="duplicated"), whole
        # on every TP rank; the local spec's ColumnParallelLinear would split them over TP. modelopt's
        # Linear (a plain torch Linear that MLASelfAttention accepts) stands in for the TE one.
        sub.linear_q_down_proj = sub.linear_kv_down_proj = Linear


def count_params(model: ModelSpec, layout: Layout) -> dict:
    """On a rank: its coordinates, its parameter count (all chunks) and the count by parameter name."""
    chunks, _ = build_chunks(model, layout, overrides=runner_overrides(model))
    by_name: dict[str, int] = {}
    for v, chunk in enumerate(chunks):
        for name, p in chunk.named_parameters():
            by_name[f"{v}.{name}" if len(chunks) > 1 else name] = p.numel()
    return {**rank_coords(), "count": sum(by_name.values()), "by_name": by_name}


def predicted_params(model: ModelSpec, layout: Layout, stage: int) -> float:
    """autotune's parameters per GPU on pipeline stage `stage`: the bf16 weights term / 2 bytes."""
    from autotune.cost import estimate_memory

    r = estimate_memory(model, WORKLOAD, ClusterSpec.of("H100", layout.world), LayoutTable.from_layouts([layout]))
    return float(r.terms["weights"][0, stage]) / 2


def _no_core_attention_class():
    import torch

    class NoCoreAttention(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()

    return NoCoreAttention
